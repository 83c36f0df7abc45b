"""The load generator against the fake vLLM: timing, token counting, and failures.

Timing is checked against what the fake reports it did (the monotonic time of each request's
arrival, from the kernel, and the time just before it wrote each chunk), not against the delays
it was asked for: on a busy machine its timers fire late, and that is not the client's error.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from labs.backends.base import RequestRecord
from labs.backends.vllm.loadgen import LoadOptions, PlannedRequest, plan_requests, run_load
from labs.params import parse_lab_params
from labs.sim.workload import lab_workload

# Uneven gaps and multi-token chunks (as speculative decoding sends them).
TIMING = {"ttft_ms": 80, "itl_ms": [20, 35, 50], "chunk_tokens": [1, 3, 2, 4]}
OUTPUT_TOKENS = 24
CHUNKS = 11  # 1 (the prefill step's token), then 1, 3, 2, 4, 1, 3, 2, 4, 1 and the last 2
BOUND_MS = 2.0
ATTEMPTS = 5
CROWDED = 0.25  # other processes' share of the CPUs above which a run proves nothing


def cpu_ms(pids: list[int]) -> tuple[float, float]:
    """(CPU time all processes used, CPU time `pids` used), in ms so far (Linux /proc)."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        # user, nice, system: what processes ran. Interrupt and softirq time is left out, since
        # much of it is this test's own loopback traffic.
        busy = sum(int(v) for v in fields[:3]) * tick_ms
        ours = 0.0
        for pid in pids:
            stat = Path(f"/proc/{pid}/stat").read_text()
            utime, stime = stat[stat.rfind(")") + 2 :].split()[11:13]
            ours += (int(utime) + int(stime)) * tick_ms
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    return busy, ours


def planned(n: int, output_tokens: int = OUTPUT_TOKENS) -> list[PlannedRequest]:
    return [PlannedRequest(str(i), list(range(1000, 1064)), output_tokens, 0.0) for i in range(n)]


def by_index(log: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fake's log keyed by request index (the end of X-Request-Id)."""
    return {key.rsplit("-", 1)[-1]: entry for key, entry in log.items()}


@dataclass
class Timing:
    ttft_ms: list[float]  # measured minus true TTFT, per request
    itl_ms: list[float]  # measured minus true gap, per pair of chunks
    fake_late_ms: float  # median lateness of the fake's sends behind its programmed schedule
    others_share: float = 0.0  # share of all CPUs other processes used during the attempt

    @staticmethod
    def summary(errors: list[float]) -> tuple[float, float]:
        absolute = [abs(e) for e in errors]
        return statistics.median(absolute), max(absolute)

    def worst_ms(self) -> float:
        return max(self.summary(self.ttft_ms)[1], self.summary(self.itl_ms)[1])

    def line(self, streams: int) -> str:
        (tm, tx), (im, ix) = self.summary(self.ttft_ms), self.summary(self.itl_ms)
        return (
            f"{streams} streams: TTFT error median {tm:.3f} ms max {tx:.3f} ms; "
            f"ITL error median {im:.3f} ms max {ix:.3f} ms ({len(self.itl_ms)} gaps); "
            f"fake late by {self.fake_late_ms:.3f} ms (median); "
            f"other processes used {self.others_share:.0%} of the CPUs"
        )


def off_by(value: float, low: float, high: float) -> float:
    """How far `value` lies outside [low, high] (0 inside), signed."""
    return value - low if value < low else value - high if value > high else 0.0


def compare(
    records: list[RequestRecord], t0: float, log: dict[str, Any], itl_ms: list[float] | None = None
) -> Timing:
    """Measured times against the fake's: each chunk left the fake between the readings it took
    before and after writing it, so a true time is an interval, usually ~20 us wide."""
    truth = by_index(log)
    ttft, itl, late = [], [], []
    for record in records:
        assert record.error is None, record.error
        entry = truth[record.req_id]
        sends = entry["sends"]  # [before_s, after_s, tokens]
        # Every chunk is seen, with the right number of tokens, in order.
        assert [n for _, n in record.chunks] == [n for _, _, n in sends]
        received = [t0 + t for t, _ in record.chunks]
        for got, (before, _, _) in zip(received, sends, strict=True):
            assert got >= before - 0.0002, "a chunk was stamped before it was sent"
        measured_ttft = record.chunks[0][0] - record.arrival_s
        first_low, first_high = sends[0][0] - entry["recv_s"], sends[0][1] - entry["recv_s"]
        ttft.append(off_by(measured_ttft, first_low, first_high) * 1000)
        for i in range(1, len(sends)):
            gap = received[i] - received[i - 1]
            low, high = sends[i][0] - sends[i - 1][1], sends[i][1] - sends[i - 1][0]
            itl.append(off_by(gap, low, high) * 1000)
        # The fake's schedule: first chunk ttft_ms after admission, then the cycled gaps.
        gaps = itl_ms or TIMING["itl_ms"]
        due = entry["admit_s"] + TIMING["ttft_ms"] / 1000
        for i, (before, _, _) in enumerate(sends):
            if i:
                due += gaps[(i - 1) % len(gaps)] / 1000
            late.append((before - due) * 1000)
    return Timing(ttft, itl, statistics.median(late))


@pytest.mark.parametrize("streams", [1, 256])
def test_it_measures_ttft_and_gaps_within_2ms(fake_server: Any, streams: int) -> None:
    # When other processes keep the CPUs busy, Linux sometimes holds loopback packets for its
    # softirq thread, which then waits a scheduler slice (~20 ms) for a CPU: the chunk really
    # reaches this side that late, and no client can see it earlier. So a run whose worst error
    # is over the bound is repeated (up to 5 runs), and if every run was crowded (other
    # processes used more than a quarter of the CPUs) the test is skipped with the figures
    # rather than failed. Medians must be within the bound on every run.
    attempts: list[Timing] = []
    for _ in range(ATTEMPTS):
        server = fake_server(TIMING)
        pids = [os.getpid(), server.process.pid]
        busy, ours = cpu_ms(pids)
        result = asyncio.run(
            run_load(server.base_url, "lab", planned(streams), LoadOptions(metrics_poll_s=0.5))
        )
        timing = compare(result.requests, result.t0, server.get("/fake/log"))
        busy_after, ours_after = cpu_ms(pids)
        others = max(0.0, (busy_after - busy) - (ours_after - ours))
        timing.others_share = others / (result.wall_s * 1000 * (os.cpu_count() or 1))
        attempts.append(timing)
        assert result.count_sources == {"token_ids": streams * CHUNKS}
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

    busy, ours = cpu_ms([os.getpid(), server.process.pid])
    result = asyncio.run(with_stalls())
    timing = compare(result.requests, result.t0, server.get("/fake/log"), [30])
    busy_after, ours_after = cpu_ms([os.getpid(), server.process.pid])
    others = max(0.0, (busy_after - busy) - (ours_after - ours))
    timing.others_share = others / (result.wall_s * 1000 * (os.cpu_count() or 1))
    print("\n" + timing.line(8))
    assert Timing.summary(timing.ttft_ms)[0] < BOUND_MS, timing.line(8)
    assert Timing.summary(timing.itl_ms)[0] < BOUND_MS, timing.line(8)
    if timing.worst_ms() > BOUND_MS and timing.others_share > CROWDED:
        pytest.skip("the run shared the CPUs with other busy processes:\n" + timing.line(8))
    assert timing.worst_ms() <= BOUND_MS, timing.line(8)


def test_it_counts_tokens_from_usage_when_chunks_carry_no_token_ids(fake_server: Any) -> None:
    server = fake_server({**TIMING, "ttft_ms": 5, "itl_ms": [2], "send_token_ids": False})
    result = asyncio.run(
        run_load(server.base_url, "lab", planned(3), LoadOptions(metrics_poll_s=0))
    )
    truth = by_index(server.get("/fake/log"))
    for record in result.requests:
        assert [n for _, n in record.chunks] == [n for _, _, n in truth[record.req_id]["sends"]]
        assert record.output_tokens == OUTPUT_TOKENS
        assert record.finish_s == record.chunks[-1][0]
    assert set(result.count_sources) == {"usage"}
    assert result.usage_mismatches == 0


def test_it_sends_what_vllm_needs_with_skip_tokenizer_init(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    request = PlannedRequest("0", [5, 6, 7], 4, 0.0)
    options = LoadOptions(metrics_poll_s=0, cache_salt="salt-1")
    result = asyncio.run(run_load(server.base_url, "lab", [request], options))
    assert result.requests[0].error is None
    from labs.backends.vllm.loadgen import request_body

    body = json.loads(request_body("lab", request, "salt-1"))
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 4
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["return_token_ids"] is True and body["cache_salt"] == "salt-1"


def test_each_failure_is_recorded_with_its_reason_and_the_run_continues(fake_server: Any) -> None:
    server = fake_server(
        {
            "ttft_ms": 5,
            "itl_ms": [5],
            "requests": {
                "1": {"cut_after_tokens": 5},
                "2": {"status": 500},
                "3": {"stall_after_tokens": 3},
                "4": {"error_after_tokens": 2},
            },
        }
    )
    options = LoadOptions(metrics_poll_s=0, read_timeout_s=1.0)
    result = asyncio.run(run_load(server.base_url, "lab", planned(6, 10), options))
    errors = {r.req_id: r.error for r in result.requests}
    assert errors == {
        "0": None,
        "1": "stream cut after 5 tokens",
        "2": "HTTP 500: fake internal error",
        "3": "timed out after 3 tokens (read timeout)",
        "4": "server error after 2 tokens: fake engine failure",
        "5": None,
    }
    by_id = {r.req_id: r for r in result.requests}
    assert by_id["1"].output_tokens == 5 and by_id["1"].finish_s is None
    assert by_id["2"].chunks == [] and by_id["5"].output_tokens == 10


def test_a_server_that_is_not_there_fails_every_request_quickly() -> None:
    from labs.backends.vllm.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    options = LoadOptions(metrics_poll_s=0, connect_timeout_s=2)
    result = asyncio.run(run_load(url, "lab", planned(2), options))
    assert all(r.error and r.error.startswith("could not connect") for r in result.requests)


def test_a_closed_loop_keeps_at_most_max_concurrency_in_flight(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 20, "itl_ms": [10]})
    options = LoadOptions(max_concurrency=2, metrics_poll_s=0)
    result = asyncio.run(run_load(server.base_url, "lab", planned(6, 3), options))
    spans = sorted((r.arrival_s, r.finish_s) for r in result.requests)
    for start, _ in spans:
        in_flight = sum(1 for s, f in spans if s <= start < f)
        assert in_flight <= 2


def test_the_plan_is_the_simulators_workload_with_a_shared_prefix() -> None:
    params = parse_lab_params(
        {
            "num_prompts": 20,
            "prompt_tokens": 100,
            "output_tokens": 30,
            "max_tokens": 64,
            "input_range_ratio": 0.5,
            "shared_prefix_tokens": 48,
            "request_rate": 10,
            "seed": 7,
        }
    )
    plan = plan_requests(params.workload, vocab_size=params.model.vocab_size)
    assert plan == plan_requests(params.workload, vocab_size=params.model.vocab_size)
    sim = lab_workload(params.workload)
    assert [len(p.prompt) for p in plan] == sim.prompt_tokens.tolist()
    assert [p.output_tokens for p in plan] == sim.output_tokens.tolist()
    assert [p.send_at_s for p in plan] == sim.intended_arrival_s.tolist()
    assert len({tuple(p.prompt[:48]) for p in plan}) == 1
    assert len({tuple(p.prompt[48:56]) for p in plan}) == 20
    assert all(1000 <= t < 32000 for p in plan for t in p.prompt)
