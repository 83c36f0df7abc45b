"""Reading vLLM's /metrics: the text format, and run counters as after-minus-before."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from labs.backends.vllm import prom

PAGE = r"""
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="lab"} 7.0
vllm:num_preemptions_total{engine="1",model_name="lab"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="lab"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="lab"} 0.75
vllm:num_requests_running{engine="0",model_name="lab"} 12.0 1717171717000
vllm:num_requests_waiting{engine="0",model_name="lab",} 4
vllm:cache_config_info{block_size="32",cache_dtype="fp8",num_gpu_blocks="1001",engine="0"} 1.0
odd_labels{path="C:\\dir",quote="say \"hi\", {ok}",nl="a\nb"} +Inf
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="lab"} 5.0
nan_gauge NaN
"""


def test_it_parses_labels_escapes_and_special_values() -> None:
    samples = {s.name: s for s in prom.parse(PAGE)}
    odd = samples["odd_labels"]
    assert odd.labels == {"path": "C:\\dir", "quote": 'say "hi", {ok}', "nl": "a\nb"}
    assert odd.value == math.inf
    assert math.isnan(samples["nan_gauge"].value)
    # A timestamp after the value, and a trailing comma in the labels, are allowed.
    assert samples["vllm:num_requests_running"].value == 12.0
    assert samples["vllm:num_requests_waiting"].labels == {"engine": "0", "model_name": "lab"}


def test_it_adds_counters_across_engines_and_averages_kv_usage() -> None:
    snap = prom.Snapshot.from_text(PAGE)
    assert snap.total(prom.PREEMPTIONS) == 10
    assert snap.mean(prom.KV_USAGE) == 0.5
    assert snap.total("vllm:not_there") is None
    assert prom.cache_config(snap) == (1001, 32)
    sample = prom.engine_sample(1.5, snap, 1001)
    assert sample is not None
    assert (sample.t_s, sample.running, sample.waiting, sample.kv_usage) == (1.5, 12, 4, 0.5)
    assert sample.kv_blocks_used == 500  # half of the 1000 blocks besides the null block


def test_a_bad_line_names_itself() -> None:
    with pytest.raises(prom.MetricsFormatError, match="line 2"):
        prom.parse("ok 1\nbroken{a=1} 2\n")


def test_counters_are_after_minus_before_and_survive_a_restart() -> None:
    before = prom.Snapshot.from_text(
        "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40\n"
        "vllm:num_preemptions_total 9\n"
    )
    after = prom.Snapshot.from_text(
        "vllm:prefix_cache_queries_total 1100\nvllm:prefix_cache_hits_total 440\n"
        "vllm:num_preemptions_total 2\n"  # went down: the server restarted in between
    )
    counters = prom.counters_between(before, after)
    assert (counters.prefix_cache_queries, counters.prefix_cache_hits) == (1000, 400)
    assert counters.preemptions == 2
    # Not on the page, or no page at all: not reported (None), never a measured 0.
    assert counters.spec_drafts is None
    assert prom.counters_between(None, None).prefix_cache_queries is None
    assert prom.counters_between(None, None).preemptions is None


def test_the_engines_time_to_first_token_is_its_queue_and_prefill_histograms_over_the_run():
    def page(queued: float, prefill: float, count: int) -> prom.Snapshot:
        return prom.Snapshot.from_text(
            f'vllm:request_queue_time_seconds_sum{{engine="0"}} {queued}\n'
            f'vllm:request_queue_time_seconds_count{{engine="0"}} {count}\n'
            f'vllm:request_prefill_time_seconds_sum{{engine="0"}} {prefill}\n'
            f'vllm:request_prefill_time_seconds_count{{engine="0"}} {count}\n'
        )

    counters = prom.counters_between(page(0.5, 2.0, 10), page(0.75, 2.5, 14))
    assert counters.engine_first_token_s == pytest.approx(0.25 + 0.5)
    assert counters.engine_requests == 4
    # A page without the histograms (another server, or an older vLLM) reports nothing.
    bare = prom.counters_between(prom.Snapshot.from_text(""), prom.Snapshot.from_text(""))
    assert (bare.engine_first_token_s, bare.engine_requests) == (None, None)


def test_it_reads_the_fake_vllm_page_as_the_fake_counted(fake_server: Any) -> None:
    start = {"num_preemptions": 5, "prefix_cache_queries": 1000, "spec_decode_num_drafts": 3}
    server = fake_server({"counters_start": start, "ttft_ms": 1, "itl_ms": [1], "spec_k": 2})
    page = httpx.get(server.base_url + "/metrics", trust_env=False).text
    before = prom.Snapshot.from_text(page)
    assert before.total(prom.PREEMPTIONS) == 5
    assert before.total(prom.PREFIX_QUERIES) == 1000
    assert prom.cache_config(before) == (4096, 16)
    body = {"model": "lab", "prompt": list(range(100, 140)), "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        resp.read()
    after = prom.Snapshot.from_text(httpx.get(server.base_url + "/metrics").text)
    counted = server.get("/fake/state")["counters"]
    counters = prom.counters_between(before, after)
    assert counters.prefix_cache_queries == counted["prefix_cache_queries"] == 40
    assert counters.spec_drafts == counted["spec_decode_num_drafts"] == 4
    assert counters.spec_draft_tokens == 8
    assert counters.spec_accepted_tokens == 0  # one token per chunk: every draft rejected
