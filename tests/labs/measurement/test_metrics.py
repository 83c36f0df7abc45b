"""labs.measurement.metrics.summarize on hand-made records: every number worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from labs.backends.base import EngineCounters, EngineSample, RequestRecord, RunRecord
from labs.measurement.metrics import summarize

# A: issued 0, chunks at 1, 2, 4 (the last with 2 tokens): TTFT 1, E2E 4, 4 tokens,
#    TPOT (4 - 1) / 3 = 1, gaps 1, 2.
# B: issued 1, one chunk at 3: TTFT 2, E2E 2, 1 token: no TPOT, no gap.
# C: issued 2, chunks at 4, 5: TTFT 2, E2E 3, 2 tokens, TPOT 1, gap 1.
# D: failed before its first token.
REQUESTS = [
    RequestRecord("A", 10, 4, 0.0, [(1.0, 1), (2.0, 1), (4.0, 2)], 4.0),
    RequestRecord("B", 20, 1, 1.0, [(3.0, 1)], 3.0),
    RequestRecord("C", 30, 2, 2.0, [(4.0, 1), (5.0, 1)], 5.0),
    RequestRecord("D", 40, 8, 3.0, [], None, error="HTTP 500: boom"),
]


def make_record(**overrides) -> RunRecord:
    fields = {
        "backend": "sim",
        "where": "simulated on CPU",
        "simulated": True,
        "requests": REQUESTS,
        "samples": [
            EngineSample(0.0, 1, 2, 0.1),
            EngineSample(1.0, 3, 0, 0.9),
            EngineSample(2.0, 2, 0, 0.5),
        ],
        "counters": EngineCounters(
            preemptions=2,
            prefix_cache_queries=100,
            prefix_cache_hits=25,
            spec_drafts=4,
            spec_draft_tokens=8,
            spec_accepted_tokens=6,
        ),
        "duration_s": 10.0,
        "wall_s": 0.5,
        "meta": {},
    }
    return RunRecord(**{**fields, **overrides})


def test_latencies_follow_vllm_bench_serve():
    m = summarize(make_record())
    # TTFT [1, 2, 2]: linear percentiles of 3 values sit at positions 0.5, 0.9 ... x 2.
    assert m["ttft_s"] == pytest.approx(
        {"mean": 5 / 3, "p50": 2.0, "p90": 2.0, "p95": 2.0, "p99": 2.0}
    )
    # E2E sorted [2, 3, 4]: p90 at position 1.8 -> 3.8.
    assert m["e2e_s"] == pytest.approx(
        {"mean": 3.0, "p50": 3.0, "p90": 3.8, "p95": 3.9, "p99": 3.98}
    )
    # TPOT only for A and C (B has one token).
    assert m["tpot_s"] == pytest.approx(
        {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p95": 1.0, "p99": 1.0}
    )
    # ITL pooled [1, 2, 1], never across two requests; sorted [1, 1, 2].
    assert m["itl_s"] == pytest.approx(
        {"mean": 4 / 3, "p50": 1.0, "p90": 1.8, "p95": 1.9, "p99": 1.98}
    )


def test_throughputs_divide_by_the_duration_and_count_only_completed_requests():
    m = summarize(make_record())
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["output_tokens_per_s"] == pytest.approx(7 / 10)
    assert m["total_tokens_per_s"] == pytest.approx((7 + 60) / 10)
    assert m["requests_per_s"] == pytest.approx(3 / 10)
    assert m["goodput_requests_per_s"] is None


@pytest.mark.parametrize(
    ("slo_ms", "good"),
    [
        ({"ttft": 1500}, 1),  # A only
        ({"ttft": 2000, "tpot": 500}, 1),  # B only: its TPOT counts as 0
        ({"e2el": 3000}, 2),  # B and C
        ({"ttft": 2000, "tpot": 1000, "e2el": 4000}, 3),  # all three, `<=` at each edge
    ],
)
def test_goodput_counts_requests_meeting_every_slo(slo_ms, good):
    assert summarize(make_record(), slo_ms)["goodput_requests_per_s"] == pytest.approx(good / 10)


def test_unknown_slo_keys_are_refused():
    with pytest.raises(ValueError, match="ttft, tpot, e2el"):
        summarize(make_record(), {"latency": 100})


def test_engine_numbers_come_from_samples_and_counters():
    m = summarize(make_record())
    assert m["max_running_seqs"] == 3
    assert m["kv_usage_peak"] == pytest.approx(0.9)
    assert m["preemptions"] == 2
    assert m["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert m["spec_acceptance_rate"] == pytest.approx(0.75)
    assert m["spec_acceptance_length"] == pytest.approx(1 + 6 / 4)
    assert (m["simulated_s"], m["duration_s"], m["wall_s"]) == (10.0, 10.0, 0.5)


def test_a_real_backend_has_no_simulated_seconds_and_missing_counters_are_none():
    m = summarize(make_record(simulated=False, samples=[], counters=EngineCounters()))
    assert m["simulated_s"] is None
    assert m["max_running_seqs"] is None and m["kv_usage_peak"] is None
    assert m["prefix_cache_hit_rate"] is None and m["spec_acceptance_rate"] is None


def test_gauge_peaks_no_poll_saw_running_are_not_observed_rather_than_zero():
    # A short vLLM run finished between /metrics polls: every poll read an idle engine.
    idle = [EngineSample(0.0, 0, 0, 0.0), EngineSample(1.0, 0, 0, 0.0)]
    m = summarize(make_record(simulated=False, samples=idle))
    assert m["max_running_seqs"] is None and m["kv_usage_peak"] is None
    assert m["gauges_unobserved"] is True
    # A poll that caught a request running is evidence, whatever it read for the pool.
    seen = [EngineSample(0.0, 0, 0, 0.0), EngineSample(1.0, 2, 0, 0.0)]
    m = summarize(make_record(simulated=False, samples=seen))
    assert (m["max_running_seqs"], m["kv_usage_peak"], m["gauges_unobserved"]) == (2, 0.0, False)
    # The simulator samples every step: its zero would be its own truth, never "unobserved".
    assert summarize(make_record(samples=idle))["gauges_unobserved"] is False


def test_a_run_where_everything_failed_has_empty_distributions():
    failed = [RequestRecord("X", 5, 5, 0.0, [], None, error="refused")]
    m = summarize(make_record(requests=failed, duration_s=0.0))
    assert m["ttft_s"] == dict.fromkeys(("mean", "p50", "p90", "p95", "p99"))
    assert (m["completed"], m["failed"], m["output_tokens_per_s"]) == (0, 1, None)


def test_series_hold_every_token_and_sample():
    m = summarize(make_record())
    series = m["series"]
    assert sorted(series["ttft_s"]) == [1.0, 2.0, 2.0]
    assert sorted(series["itl_s"]) == [1.0, 1.0, 2.0]
    rate = series["tokens_per_s"]
    assert len(rate["t_s"]) == len(rate["value"]) == 100
    assert sum(rate["value"]) * rate["bucket_s"] == pytest.approx(7)
    assert series["engine"]["running"] == [1, 3, 2]
    assert json.loads(json.dumps(m)) == m


def test_a_long_engine_series_is_thinned_keeping_each_groups_peaks_and_tokens_per_step():
    """A cap reached in one sample stays reached in the series the explanations read
    (labs/explanation/limits.py); tokens per step appear only where every sample reports them."""
    from labs.measurement.metrics import MAX_SERIES_POINTS

    n = 3 * MAX_SERIES_POINTS
    samples = [
        EngineSample(float(i), i % 3, 0, 0.0, scheduled_tokens=2048 * (i % 3 == 1))
        for i in range(n)
    ]
    engine = summarize(make_record(samples=samples))["series"]["engine"]
    assert len(engine["t_s"]) == MAX_SERIES_POINTS and engine["t_s"][:2] == [0.0, 3.0]
    assert set(engine["running"]) == {2} and set(engine["scheduled_tokens"]) == {2048}
    # vLLM's polls: no tokens per step, no such series.
    polled = [EngineSample(float(i), 1, 0, 0.0) for i in range(5)]
    assert "scheduled_tokens" not in summarize(make_record(samples=polled))["series"]["engine"]


def test_a_record_survives_json_and_summarizes_the_same():
    record = make_record()
    again = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record
    assert summarize(again) == summarize(record)


def test_chunks_act_like_the_list_of_pairs_they_store():
    from labs.backends.base import Chunks

    chunks = Chunks([(1.0, 1), (2.0, 3)])
    chunks.append((4.0, 2))
    assert len(chunks) == 3 and chunks == [(1.0, 1), (2.0, 3), (4.0, 2)]
    assert chunks[-1] == (4.0, 2) and chunks[1:] == [(2.0, 3), (4.0, 2)]
    assert chunks.times_s.tolist() == [1.0, 2.0, 4.0] and chunks.tokens.dtype == np.int32
    assert [n for _, n in chunks] == [1, 3, 2] and chunks.to_list()[0] == [1.0, 1]


# -- against vllm bench serve's own definitions ------------------------------------------------


def bench_metrics(requests, duration_s, slo_ms):
    """What `vllm bench serve` reports for these requests, from its definitions (vllm/benchmarks/
    serve.py, lib/endpoint_request_func.py), restated here on their own: every time counts from
    `st`, taken just before the POST; ttft = first chunk - st; latency = last chunk - st; tpot =
    (latency - ttft) / (output - 1) for more than one token, else 0 for goodput; a request is
    good when it meets every SLO given (<=); goodput = good requests / duration."""
    latencies, ttfts, tpots, good = [], [], [], 0
    for r in requests:
        if r.error is not None:
            continue
        st = r.issued_s
        ttft = r.chunks[0][0] - st
        latency = r.chunks[-1][0] - st
        tokens = sum(n for _, n in r.chunks)
        tpot = (latency - ttft) / (tokens - 1) if tokens > 1 else 0.0
        latencies.append(latency)
        ttfts.append(ttft)
        if tokens > 1:
            tpots.append(tpot)
        judged = {"ttft": ttft, "tpot": tpot, "e2el": latency}
        good += all(judged[k] * 1000 <= v for k, v in slo_ms.items())
    return {
        "mean_e2el": sum(latencies) / len(latencies),
        "mean_ttft": sum(ttfts) / len(ttfts),
        "mean_tpot": sum(tpots) / len(tpots),
        "request_goodput": good / duration_s,
    }


def test_e2e_tpot_and_goodput_are_bench_serves_on_a_recorded_stream():
    """A stream recorded by the load generator where the client waited before each request
    reached the socket (a busy client, as on a shared 2-core machine): E2E, bench's TTFT, TPOT
    and goodput are bench's to the rounding; timed from the socket, as they once were, E2E was
    8% shorter and goodput counted requests bench does not."""
    lag = 0.080
    requests = []
    for i in range(6):
        issued = 0.1 * i
        arrival = issued + lag  # the first byte left this machine 80 ms after bench's start
        first = arrival + 0.300 + 0.01 * i
        chunks = [(first, 1)] + [(first + 0.02 * k, 1 if k % 3 else 2) for k in range(1, 40)]
        requests.append(
            RequestRecord(str(i), 64, 53, arrival, chunks, chunks[-1][0], issued_s=issued)
        )
    record = make_record(backend="vllm", simulated=False, requests=requests, duration_s=1.6)
    # E2E about 1.1 s from bench's start, 1.02 s from the socket: an SLO between the two.
    slo = {"ttft": 400, "e2el": 1100}
    ours = summarize(record, slo)
    bench = bench_metrics(requests, 1.6, slo)
    assert ours["e2e_s"]["mean"] == pytest.approx(bench["mean_e2el"], abs=1e-12)
    assert ours["ttft_bench_s"]["mean"] == pytest.approx(bench["mean_ttft"], abs=1e-12)
    assert ours["tpot_s"]["mean"] == pytest.approx(bench["mean_tpot"], abs=1e-12)
    assert ours["goodput_requests_per_s"] == pytest.approx(bench["request_goodput"])
    # The socket-stamped TTFT stays, beside bench's, 80 ms shorter.
    assert ours["ttft_s"]["mean"] == pytest.approx(bench["mean_ttft"] - lag)
    # What the socket's start would have said: requests bench counts as bad, counted good.
    socket_e2e = [r.finish_s - r.arrival_s for r in requests]
    socket_ttft = [r.chunks[0][0] - r.arrival_s for r in requests]
    socket_good = sum(
        t * 1000 <= 400 and e * 1000 <= 1100 for t, e in zip(socket_ttft, socket_e2e, strict=True)
    )
    assert bench["request_goodput"] * 1.6 < socket_good
