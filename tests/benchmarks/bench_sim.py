"""How fast the simulator runs: simulated seconds per wall second, and how wall time grows.

1,000 requests of 1,024 prompt and 256 output tokens, all at once, max_num_seqs 256, on the
default llama-3-8b / H100 (the target: at least 100x faster than real time), then 2,000 and
4,000 (the target: linear growth). Each figure is the median of a few runs of the whole sim
backend (workload, simulation, run record).

Not part of the default run (pytest collects test_*.py only). Run it with
    .venv/bin/pytest tests/benchmarks/bench_sim.py -s
or  .venv/bin/python -m tests.benchmarks.bench_sim
"""

from __future__ import annotations

import statistics
import time

from labs.backends.sim import SimBackend
from labs.params import parse_lab_params

SIZES = (1000, 2000, 4000)
REPEATS = {1000: 5, 2000: 3, 4000: 3}


def measure(num_prompts: int, repeats: int) -> tuple[float, float, float]:
    """Median wall and CPU seconds of a whole sim run, and the run's simulated seconds. (CPU
    time shows the trend when other processes share the machine.)"""
    params = parse_lab_params(
        {
            "num_prompts": num_prompts,
            "prompt_tokens": 1024,
            "output_tokens": 256,
            "max_num_seqs": 256,
        }
    )
    walls, cpus, simulated = [], [], 0.0
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        record = SimBackend().run(params)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        assert all(r.output_tokens == 256 for r in record.requests)
        simulated = record.duration_s
    return statistics.median(walls), statistics.median(cpus), simulated


def report() -> dict[int, tuple[float, float, float]]:
    results = {n: measure(n, REPEATS[n]) for n in SIZES}
    wall_1k, _, sim_1k = results[1000]
    print("\n1,000 requests x (1,024 in, 256 out), max_num_seqs 256, llama-3-8b on h100-sxm")
    print(f"  simulated {sim_1k:.1f} s in {wall_1k:.3f} s wall: {sim_1k / wall_1k:,.0f}x real time")
    for n, (wall, cpu, sim) in results.items():
        print(
            f"  {n:>5,} requests: wall {wall:.3f} s (x{wall / wall_1k:.2f} of 1,000), "
            f"CPU {cpu:.3f} s, simulated {sim:.1f} s, {sim / wall:,.0f}x real time"
        )
    return results


def test_simulated_seconds_per_wall_second():
    results = report()
    assert all(sim > 0 for _, _, sim in results.values())


if __name__ == "__main__":
    report()
