"""How fast the simulator runs: simulated seconds per wall second, how wall time grows, and what a
long run costs in time and memory.

1. The benchmark case: 1,000 requests of 1,024 prompt and 256 output tokens, all at once,
   max_num_seqs 256, on the default llama-3-8b / H100. Target: at least 1,000x faster than real
   time. Then 4,000 requests; target: at most 4.3x the wall time of 1,000. Both for the fast
   path (the default) and for step-by-step mode (every step through the scheduler), measured
   interleaved in the same run so machine load hits both alike. Each figure is the median of
   several runs of the whole sim backend (workload, simulation, run record).
2. 100,000 requests with Poisson arrivals (same lengths, 30 requests/s, near the engine's
   capacity) in a fresh process: target under 30 s on one core and a peak RSS under 1 GB
   (resource.getrusage's ru_maxrss of that process).

Not part of the default run (pytest collects test_*.py only). Run it with
    .venv/bin/pytest tests/benchmarks/bench_sim.py -s
or  .venv/bin/python -m tests.benchmarks.bench_sim [--profile realistic|ideal]
The engine model's profile is `realistic` (the labs' default) unless --profile or the
SIM_BENCH_PROFILE environment variable says otherwise.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from labs.backends.sim import SimBackend
from labs.parameters.params import parse_lab_params
from labs.sim.lab import build_simulator

PROFILE = os.environ.get("SIM_BENCH_PROFILE", "realistic")
BENCH_CASE = {
    "prompt_tokens": 1024,
    "output_tokens": 256,
    "max_num_seqs": 256,
    "sim_profile": PROFILE,
}
REPEATS = {1000: 9, 4000: 5}
LONG_RUN = {**BENCH_CASE, "num_prompts": 100_000, "request_rate": 30}


def one_run(num_prompts: int, step_by_step: bool) -> tuple[float, float, float]:
    """Wall and CPU seconds of a whole sim run, and the run's simulated seconds."""
    params = parse_lab_params({**BENCH_CASE, "num_prompts": num_prompts})
    start, cpu = time.perf_counter(), time.process_time()
    if step_by_step:
        sim = build_simulator(params)
        sim.step_by_step = True
        record = sim.run()
    else:
        record = SimBackend().run(params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(r.output_tokens == 256 for r in record.requests)
    return wall, cpu, record.duration_s


def measure() -> dict[tuple[int, str], tuple[float, float, float]]:
    """Median wall and CPU per (size, mode); the modes alternate run by run."""
    runs: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    for n, repeats in REPEATS.items():
        for _ in range(repeats):
            for mode in ("fast", "step-by-step"):
                runs.setdefault((n, mode), []).append(one_run(n, mode == "step-by-step"))
    return {
        key: (
            statistics.median(w for w, _, _ in values),
            statistics.median(c for _, c, _ in values),
            values[0][2],
        )
        for key, values in runs.items()
    }


def long_run() -> dict[str, float]:
    """The 100,000-request run, in this process (call it in a fresh one: ru_maxrss is a peak)."""
    params = parse_lab_params(LONG_RUN)
    start, cpu = time.perf_counter(), time.process_time()
    sim = build_simulator(params)
    record = sim.run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    from labs.measurement.metrics import summarize

    summary = summarize(record)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_s": record.duration_s,
        "steps": sim.num_steps,
        "peak_rss_mb": peak_kib / 1024,
        "completed": summary["completed"],
        "output_tokens": sum(r.output_tokens for r in record.requests),
    }


def long_run_in_child() -> dict[str, float]:
    code = "import json, tests.benchmarks.bench_sim as b; print(json.dumps(b.long_run()))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def report() -> tuple[dict[tuple[int, str], tuple[float, float, float]], dict[str, float]]:
    results = measure()
    print(
        "\n1,000 requests x (1,024 in, 256 out), max_num_seqs 256, llama-3-8b on h100-sxm, "
        f"profile {PROFILE}"
    )
    print(f"  (medians; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    for mode in ("fast", "step-by-step"):
        wall_1k, cpu_1k, sim_1k = results[(1000, mode)]
        wall_4k, cpu_4k, sim_4k = results[(4000, mode)]
        print(
            f"  {mode:>12}: 1,000 in {wall_1k * 1000:.1f} ms wall ({cpu_1k * 1000:.1f} ms CPU): "
            f"{sim_1k / wall_1k:,.0f}x real time by wall, {sim_1k / cpu_1k:,.0f}x by CPU; "
            f"4,000 in {wall_4k * 1000:.1f} ms wall = x{wall_4k / wall_1k:.2f} of 1,000 "
            f"(CPU x{cpu_4k / cpu_1k:.2f})"
        )
    fast, slow = results[(1000, "fast")], results[(1000, "step-by-step")]
    print(f"  fast path vs step-by-step at 1,000: {slow[0] / fast[0]:.1f}x less wall")
    big = long_run_in_child()
    print(
        f"\n100,000 requests, Poisson at 30/s (1,024 in, 256 out, {PROFILE}): "
        f"{big['wall_s']:.1f} s wall, "
        f"{big['cpu_s']:.1f} s CPU, simulated {big['simulated_s']:,.0f} s in {big['steps']:,} "
        f"steps, peak RSS {big['peak_rss_mb']:.0f} MB, {big['completed']:,} completed"
    )
    return results, big


def test_simulated_seconds_per_wall_second():
    results, big = report()
    assert all(sim > 0 for _, _, sim in results.values())
    assert big["completed"] == 100_000 and big["output_tokens"] == 100_000 * 256


if __name__ == "__main__":
    if "--profile" in sys.argv:
        # The child process of the long run reads the profile from the environment too.
        os.environ["SIM_BENCH_PROFILE"] = sys.argv[sys.argv.index("--profile") + 1]
        PROFILE = BENCH_CASE["sim_profile"] = LONG_RUN["sim_profile"] = os.environ[
            "SIM_BENCH_PROFILE"
        ]
    report()
