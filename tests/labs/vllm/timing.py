"""Helpers shared by the load generator's tests (tests/labs/vllm/test_loadgen.py) and its
timing-accuracy benchmark (tests/benchmarks/bench_loadgen.py): the fake's truth log keyed by
request, and the client's times compared with it."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labs.backends.base import RequestRecord
from labs.backends.vllm.loadgen import PlannedRequest

# Uneven gaps and multi-token chunks (as speculative decoding sends them).
TIMING: dict[str, Any] = {"ttft_ms": 80, "itl_ms": [20, 35, 50], "chunk_tokens": [1, 3, 2, 4]}
OUTPUT_TOKENS = 24
CHUNKS = 11  # 1 (the prefill step's token), then 1, 3, 2, 4, 1, 3, 2, 4, 1 and the last 2
# Kernel stamps are wall-clock and converted to the monotonic clock with an offset each process
# measures to a few microseconds; this much slack covers that and nothing else.
CLOCK_SLACK_S = 0.0002


def planned(n: int, output_tokens: int = OUTPUT_TOKENS) -> list[PlannedRequest]:
    return [PlannedRequest(str(i), list(range(1000, 1064)), output_tokens, 0.0) for i in range(n)]


def by_index(log: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fake's log keyed by request index (the end of X-Request-Id)."""
    return {key.rsplit("-", 1)[-1]: entry for key, entry in log.items()}


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


def check_causal(record: RequestRecord, t0: float, entry: dict[str, Any]) -> None:
    """What holds however busy the machine is: every chunk is seen, with its token count, in
    order; the request left the client before the fake received it; and no chunk is stamped
    before the fake started sending it. (A busy CPU only ever makes things later.)"""
    assert record.error is None, record.error
    sends = entry["sends"]  # [before_s, after_s, tokens]
    assert [n for _, n in record.chunks] == [n for _, _, n in sends]
    assert t0 + record.arrival_s <= entry["recv_s"] + CLOCK_SLACK_S, "arrival after the fake got it"
    times = [t for t, _ in record.chunks]
    assert times == sorted(times)
    for got, (before, _, _) in zip(times, sends, strict=True):
        assert t0 + got >= before - CLOCK_SLACK_S, "a chunk was stamped before it was sent"


def compare(
    records: list[RequestRecord], t0: float, log: dict[str, Any], itl_ms: list[float] | None = None
) -> Timing:
    """Measured times against the fake's: each chunk left the fake between the readings it took
    before and after writing it, so a true time is an interval, usually ~20 us wide."""
    truth = by_index(log)
    ttft, itl, late = [], [], []
    for record in records:
        entry = truth[record.req_id]
        check_causal(record, t0, entry)
        sends = entry["sends"]
        received = [t0 + t for t, _ in record.chunks]
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
