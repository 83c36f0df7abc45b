"""How accurately the load generator times a stream: its TTFT and inter-chunk gaps against the
fake vLLM server's own record of when it sent each chunk (target: within 2 ms, 1 and 256 streams).

The accuracy depends on the machine being quiet: on a loaded machine Linux can hold loopback
packets for its softirq thread for a scheduler slice (~20 ms), and no client can see a chunk
earlier than it lands. So this lives here, not in the default run; tests/labs/vllm/test_loadgen.py
keeps the checks a busy CPU cannot break (chunks counted, times attributed to the right request,
nothing stamped before it was sent). Run it with `make bench` or
    .venv/bin/pytest tests/benchmarks/bench_loadgen.py -s
and read the printed error medians and maxima.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from labs.backends.vllm.loadgen import LoadOptions, run_load
from tests.labs.vllm.timing import CHUNKS, TIMING, Timing, compare, cpu_ms, planned

BOUND_MS = 2.0
ATTEMPTS = 5
CROWDED = 0.25  # other processes' share of the CPUs above which a run proves nothing


def others_share(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> float:
    """The share of all CPUs that processes other than the test's used between two readings."""
    others = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
    return others / (wall_s * 1000 * (os.cpu_count() or 1))


@pytest.mark.parametrize("streams", [1, 256])
def test_it_measures_ttft_and_gaps_within_2ms(fake_server: Any, streams: int) -> None:
    # A run whose worst error is over the bound is repeated (up to 5 runs), and if every run was
    # crowded (other processes used more than a quarter of the CPUs) the check is skipped with
    # the figures rather than failed. Medians must be within the bound on every run.
    attempts: list[Timing] = []
    for _ in range(ATTEMPTS):
        server = fake_server(TIMING)
        pids = [os.getpid(), server.process.pid]
        before = cpu_ms(pids)
        result = asyncio.run(
            run_load(server.base_url, "lab", planned(streams), LoadOptions(metrics_poll_s=0.5))
        )
        timing = compare(result.requests, result.t0, server.get("/fake/log"))
        timing.others_share = others_share(before, cpu_ms(pids), result.wall_s)
        attempts.append(timing)
        assert result.count_sources == {"usage": streams * CHUNKS}
        if timing.worst_ms() <= BOUND_MS:
            break
    report = "\n".join(t.line(streams) for t in attempts)
    print("\n" + report)
    for timing in attempts:
        assert Timing.summary(timing.ttft_ms)[0] < BOUND_MS, report
        assert Timing.summary(timing.itl_ms)[0] < BOUND_MS, report
    if min(t.worst_ms() for t in attempts) > BOUND_MS and all(
        t.others_share > CROWDED for t in attempts
    ):
        pytest.skip("every run shared the CPUs with other busy processes:\n" + report)
    assert min(t.worst_ms() for t in attempts) <= BOUND_MS, report


def test_chunks_are_timed_by_arrival_even_while_the_client_is_busy(fake_server: Any) -> None:
    # The event loop stalls for 8 ms every 25 ms (as when the worker thread holding the GIL
    # writes progress to the database). Chunks are stamped by the kernel when they arrive, so
    # the stalls do not show; stamping them when parsed would be up to 8 ms late.
    server = fake_server({**TIMING, "itl_ms": [30]})

    async def with_stalls() -> Any:
        load = asyncio.create_task(
            run_load(server.base_url, "lab", planned(8), LoadOptions(metrics_poll_s=0))
        )
        while not load.done():
            await asyncio.sleep(0.025)
            time.sleep(0.008)  # blocks the loop
        return load.result()

    pids = [os.getpid(), server.process.pid]
    before = cpu_ms(pids)
    result = asyncio.run(with_stalls())
    timing = compare(result.requests, result.t0, server.get("/fake/log"), [30])
    timing.others_share = others_share(before, cpu_ms(pids), result.wall_s)
    print("\n" + timing.line(8))
    assert Timing.summary(timing.ttft_ms)[0] < BOUND_MS, timing.line(8)
    assert Timing.summary(timing.itl_ms)[0] < BOUND_MS, timing.line(8)
    if timing.worst_ms() > BOUND_MS and timing.others_share > CROWDED:
        pytest.skip("the run shared the CPUs with other busy processes:\n" + timing.line(8))
    assert timing.worst_ms() <= BOUND_MS, timing.line(8)
