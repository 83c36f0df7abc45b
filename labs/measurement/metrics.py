"""Run record in, serving metrics out: the same code for every backend.

Definitions are those of vLLM's own benchmark client, `vllm bench serve`:

- TTFT = first chunk - the request's first byte on the socket (arrival_s): stamped at the
  socket; `ttft_bench_s` measures from just before the POST (issued_s), as bench does, and is
  None for a record without that stamp (the simulator, older runs).
- E2E = last chunk (finish) - just before the POST (issued_s), as bench's latency is; from the
  arrival for a record without that stamp (the simulator: its requests arrive, nobody sends
  them).
- ITL = the gaps between successive chunks of a request, pooled over all requests (a chunk may
  hold several tokens, e.g. accepted drafts).
- TPOT = (last chunk - first chunk) / (output tokens - 1), only for requests with more than one
  output token: bench's (E2E - TTFT) / (output tokens - 1), both timed from its start.
- Throughputs divide by the record's `duration_s`, which is bench's: from the start of the run
  (before the first request is sent) until every request has returned, failed ones included.
  For the simulator that is first arrival (t = 0) to last finish. Goodput counts the requests
  meeting every SLO given (ttft, tpot, e2el in ms, each `<=`; TPOT counts as 0 for a request of
  one token), TTFT and E2E timed from just before the POST, as bench judges them.
- Counters a backend did not report (None in EngineCounters) stay None here: "not reported".

Each latency is summarised as mean, p50, p90, p95, p99 (numpy's linear percentiles, as bench
uses), in seconds; None when no request has the value. Pure Python + numpy, no Django.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from labs.backends.base import EngineSample, RequestRecord, RunRecord

PERCENTILES = (50, 90, 95, 99)
SLO_KEYS = ("ttft", "tpot", "e2el")
# Charts get at most this many points per series.
MAX_SERIES_POINTS = 1000
THROUGHPUT_BUCKETS = 100


def distribution(values: np.ndarray, *, reorder: bool = False) -> dict[str, float | None]:
    """{mean, p50, p90, p95, p99} of `values`; all None when there are none. With `reorder`,
    `values` is partitioned in place instead of copied (for arrays of millions)."""
    keys = ["mean", *(f"p{p}" for p in PERCENTILES)]
    if len(values) == 0:
        return dict.fromkeys(keys)
    mean = float(np.mean(values))
    stats = [mean, *(float(v) for v in np.percentile(values, PERCENTILES, overwrite_input=reorder))]
    return dict(zip(keys, stats, strict=True))


def _thin(values: np.ndarray) -> list[float]:
    """At most MAX_SERIES_POINTS values with the same distribution: evenly spaced order
    statistics (quantiles), fine for a histogram."""
    if len(values) <= MAX_SERIES_POINTS:
        return values.tolist()
    # NOTE: summarize passes arrays it owns and needs no more, so partitioning them is fine.
    points = np.linspace(0, 1, MAX_SERIES_POINTS)
    return np.quantile(values, points, overwrite_input=True).tolist()


def _ratio(part: int | None, whole: int | None) -> float | None:
    # None when either count was not reported (vLLM counters missing from /metrics).
    return part / whole if part is not None and whole else None


def _check_slos(slo_ms: Mapping[str, float]) -> None:
    unknown = [k for k in slo_ms if k not in SLO_KEYS]
    if unknown:
        raise ValueError(f"SLO keys must be among {', '.join(SLO_KEYS)}, got {', '.join(unknown)}")


# Requests whose chunks are read at once: bounds the temporary arrays of a long run.
_BATCH_REQUESTS = 4096


def _batches(done: list[RequestRecord]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(times, tokens, chunks per request) of successive groups of requests, flattened."""
    for a in range(0, len(done), _BATCH_REQUESTS):
        group = [r.chunks for r in done[a : a + _BATCH_REQUESTS]]
        counts = np.array([len(c) for c in group], dtype=np.int64)
        times = np.concatenate([c.times_s for c in group])
        tokens = np.concatenate([c.tokens for c in group])
        yield times, tokens, counts


def _chunk_stats(done: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's first chunk time and output tokens, and every inter-chunk gap (ITL),
    request by request, in chunk order."""
    num_chunks = sum(len(r.chunks) for r in done)
    first = np.empty(len(done))
    output = np.empty(len(done), dtype=np.int64)
    itl = np.empty(max(0, num_chunks - len(done)))
    i = g = 0
    for times, tokens, counts in _batches(done):
        starts = np.cumsum(counts) - counts
        first[i : i + len(counts)] = times[starts]
        output[i : i + len(counts)] = np.add.reduceat(tokens, starts, dtype=np.int64)
        # Gaps between successive chunks, except across the boundary between two requests.
        within = np.ones(len(times) - 1, dtype=bool)
        within[starts[1:] - 1] = False
        gaps = np.diff(times)[within]
        itl[g : g + len(gaps)] = gaps
        i, g = i + len(counts), g + len(gaps)
    return first, output, itl


def summarize(record: RunRecord, slo_ms: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The `measured` numbers of a run (docs/run-record.md).

    Args:
        record: any backend's run record.
        slo_ms: optional SLOs in milliseconds, keys among ttft, tpot, e2el.

    Returns:
        ttft_s, tpot_s, itl_s, e2e_s ({mean, p50, p90, p95, p99} each), ttft_bench_s (the
        same, or None), output_tokens_per_s,
        total_tokens_per_s, requests_per_s, goodput_requests_per_s (None without SLOs),
        completed, failed, max_running_seqs, preemptions, kv_usage_peak (both None when no
        /metrics poll saw a request running: gauges_unobserved), prefix_cache_hit_rate,
        spec_acceptance_rate, spec_acceptance_length, simulated_s (None unless simulated),
        duration_s, wall_s, and `series` for the charts.
    """
    if slo_ms:
        _check_slos(slo_ms)
    done = [r for r in record.requests if r.error is None and r.finish_s is not None and r.chunks]
    first, output, itl = _chunk_stats(done)
    arrival = np.array([r.arrival_s for r in done], dtype=np.float64)
    finish = np.array([r.finish_s for r in done], dtype=np.float64)
    # bench's start: just before the POST, where the record has it; else the arrival.
    start = np.array(
        [r.arrival_s if r.issued_s is None else r.issued_s for r in done], dtype=np.float64
    )
    ttft = first - arrival
    ttft_from_start = first - start
    e2e = finish - start
    stamped = bool(done) and all(r.issued_s is not None for r in done)
    ttft_bench = distribution(ttft_from_start) if stamped else None
    multi = output > 1
    tpot = (finish[multi] - first[multi]) / (output[multi] - 1)

    duration = record.duration_s
    completed = len(done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    goodput = None
    if slo_ms:
        good = np.ones(completed, dtype=bool)
        tpot_all = np.zeros(completed)
        tpot_all[multi] = tpot
        for key, measured in (("ttft", ttft_from_start), ("tpot", tpot_all), ("e2el", e2e)):
            if key in slo_ms:
                good &= measured * 1000 <= slo_ms[key]
        goodput = _per_s(int(good.sum()), duration)

    c = record.counters
    running_peak = max((s.running for s in record.samples), default=None)
    kv_peak = max((s.kv_usage for s in record.samples), default=None)
    # A real server's gauges are polled; a short run can finish between two polls, and every
    # poll then reads an idle engine. A peak of 0 beside served requests is not evidence.
    unobserved = not record.simulated and completed > 0 and not running_peak
    if unobserved:
        running_peak = kv_peak = None
    return {
        "ttft_s": distribution(ttft),
        "ttft_bench_s": ttft_bench,
        "tpot_s": distribution(tpot),
        "itl_s": distribution(itl, reorder=len(itl) > MAX_SERIES_POINTS),
        "e2e_s": distribution(e2e),
        "output_tokens_per_s": _per_s(int(output.sum()), duration),
        "total_tokens_per_s": _per_s(int(output.sum()) + prompt_tokens, duration),
        "requests_per_s": _per_s(completed, duration),
        "goodput_requests_per_s": goodput,
        "completed": completed,
        "failed": len(record.requests) - completed,
        "max_running_seqs": running_peak,
        "preemptions": c.preemptions,
        "kv_usage_peak": kv_peak,
        "gauges_unobserved": unobserved,
        "prefix_cache_hit_rate": _ratio(c.prefix_cache_hits, c.prefix_cache_queries),
        "spec_acceptance_rate": _ratio(c.spec_accepted_tokens, c.spec_draft_tokens),
        "spec_acceptance_length": (
            1 + c.spec_accepted_tokens / c.spec_drafts
            if c.spec_drafts and c.spec_accepted_tokens is not None
            else None
        ),
        "simulated_s": duration if record.simulated else None,
        "duration_s": duration,
        "wall_s": record.wall_s,
        "series": _series(record, ttft, itl, done),
    }


def _per_s(count: int, duration_s: float) -> float | None:
    return count / duration_s if duration_s > 0 else None


def _series(
    record: RunRecord, ttft: np.ndarray, itl: np.ndarray, done: list[RequestRecord]
) -> dict[str, Any]:
    """What the charts draw.

    - ttft_s, itl_s: samples for histograms (thinned to evenly spaced quantiles if many).
    - tokens_per_s: output tokens per second in THROUGHPUT_BUCKETS equal buckets over the run;
      t_s is each bucket's start, from the start of the run (t = 0, where the duration starts).
    - engine: running, waiting and kv_usage over time, from the record's samples, and
      scheduled_tokens (tokens per step) where the backend reports it. Thinned like the
      simulator's samples: each point holds the first time and the maxima of its group, so a cap
      reached in any sample is still reached in the series.
    """
    # Times count from the start of the run, where bench's duration starts too.
    start = 0.0
    duration = record.duration_s
    tokens_per_s: dict[str, Any] = {"t_s": [], "value": [], "bucket_s": None}
    if duration > 0 and done:
        bucket = duration / THROUGHPUT_BUCKETS
        edges = start + bucket * np.arange(THROUGHPUT_BUCKETS + 1)
        # The last chunk lands exactly on the last edge, which np.histogram includes.
        counts = np.zeros(THROUGHPUT_BUCKETS)
        for times, tokens, _ in _batches(done):
            # np.histogram's bins (right-open, the last closed), found by binary search instead
            # of sorting every chunk time.
            bins = np.searchsorted(edges, times, side="right") - 1
            bins[times == edges[-1]] = THROUGHPUT_BUCKETS - 1
            inside = (bins >= 0) & (bins < THROUGHPUT_BUCKETS)
            counts += np.bincount(
                bins[inside], weights=tokens[inside], minlength=THROUGHPUT_BUCKETS
            )
        tokens_per_s = {
            "t_s": (edges[:-1] - start).tolist(),
            "value": (counts / bucket).tolist(),
            "bucket_s": bucket,
        }
    return {
        "ttft_s": _thin(ttft),
        "itl_s": _thin(itl),
        "tokens_per_s": tokens_per_s,
        "engine": _engine_series(record.samples, start),
    }


def _engine_series(samples: list[EngineSample], start: float) -> dict[str, list[Any]]:
    """At most MAX_SERIES_POINTS points: groups of consecutive samples, each its first time
    and the maxima of the rest (peak detect, as labs.sim.recording thins)."""
    step = max(1, math.ceil(len(samples) / MAX_SERIES_POINTS))
    groups = [samples[i : i + step] for i in range(0, len(samples), step)]
    engine: dict[str, list[Any]] = {
        "t_s": [g[0].t_s - start for g in groups],
        "running": [max(s.running for s in g) for g in groups],
        "waiting": [max(s.waiting for s in g) for g in groups],
        "kv_usage": [max(s.kv_usage for s in g) for g in groups],
    }
    if samples and all(s.scheduled_tokens is not None for s in samples):
        engine["scheduled_tokens"] = [max(s.scheduled_tokens or 0 for s in g) for g in groups]
    return engine
