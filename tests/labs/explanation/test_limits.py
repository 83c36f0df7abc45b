"""Which cap held admission, and whether the running series ramps (labs/explanation/limits.py),
decided on small engine series written by hand: each case is what the run page of issue 50 got
wrong."""

from __future__ import annotations

import pytest

from labs.explanation.limits import (
    ARRIVALS,
    BUDGET,
    KV,
    SEQS,
    UNCLEAR,
    Caps,
    binding_limit,
    formula_batch_reason,
    ramp,
)

H100_POOL_BLOCKS = 426_784 // 16


def _caps(**overrides) -> Caps:
    values = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "chunked_prefill": True,
        "prompt_tokens": 4096,
        "prompt_blocks": 256,
        "num_blocks": H100_POOL_BLOCKS,
        "in_flight": 256,
        "request_rate": None,
        "num_prompts": 2000,
    }
    return Caps(**{**values, **overrides})


def _summary(running, waiting, kv, tokens=None, duration=None) -> dict:
    n = len(running)
    engine = {"t_s": [float(i) for i in range(n)], "running": running, "waiting": waiting}
    engine["kv_usage"] = kv if isinstance(kv, list) else [kv] * n
    if tokens is not None:
        engine["scheduled_tokens"] = tokens if isinstance(tokens, list) else [tokens] * n
    return {"duration_s": float(duration or n), "series": {"engine": engine}}


def test_a_full_token_budget_with_a_queue_is_what_held_the_2000_prompt_batching_run():
    """Issue 50: running 64 of 256, KV 62.5%, 192 waiting, every step at its 2,048 tokens. The
    page said "waited for a free slot (max_num_seqs, KV blocks)"; neither was reached."""
    summary = _summary([64] * 100, [192] * 100, 0.625, 2048)
    limit = binding_limit(summary, _caps())
    assert limit.key == BUDGET and limit.held[BUDGET] == 1.0
    assert limit.text == (
        "the step's token budget (max_num_batched_tokens 2,048) admits half a 4,096-token "
        "prompt per step: 64 ran at once; max_num_seqs 256 and the KV pool (peak 62.5%) never "
        "bound"
    )


def test_without_chunked_prefill_a_whole_prompt_needs_the_whole_budget():
    """Issue 50's second run: 4,096-token prompts, budget 4,096, chunked prefill off: one decode
    leaves 4,095 tokens, too few for a prompt, so one request runs at a time."""
    summary = _summary([1] * 50, [15] * 50, 0.0099, [4096, 1, 1, 1, 1] * 10)
    limit = binding_limit(summary, _caps(max_num_batched_tokens=4096, chunked_prefill=False))
    assert limit.key == BUDGET
    assert limit.text.startswith(
        "the step's token budget (max_num_batched_tokens 4,096, chunked prefill off) takes a "
        "4,096-token prompt only whole, so only into a step with nothing else: 1 ran at once"
    )
    assert limit.text.endswith("max_num_seqs 256 and the KV pool (peak 0.99%) never bound")
    # A budget of two prompts leaves room beside 4,096 decodes, and holds once they take more.
    wide = _caps(max_num_batched_tokens=8192, chunked_prefill=False, max_num_seqs=8192)
    busy = _summary([4100] * 10, [15] * 10, 0.5, 4100)
    assert "beside at most 4,096 decoding sequences" in binding_limit(busy, wide).text
    # Nor does a queue with no cap at its limit blame one, or the arrivals.
    unclear = binding_limit(summary, wide)
    assert unclear.key == "" and unclear.text.startswith(
        "requests waited for the engine 100% of the run with no cap at its limit in its series"
    )


def test_max_num_seqs_holds_when_the_batch_is_at_it_with_a_queue():
    summary = _summary([8] * 10, [56] * 10, 0.02, 8)
    limit = binding_limit(summary, _caps(max_num_seqs=8, prompt_tokens=512, prompt_blocks=32))
    assert limit.key == SEQS
    assert limit.text == (
        "max_num_seqs 8 held admission: 8 ran at once while up to 56 waited; the KV pool "
        "(peak 2%) and the step's token budget (max_num_batched_tokens 2,048) never bound"
    )


def test_the_kv_pool_holds_when_a_waiting_prompt_no_longer_fits_it():
    caps = _caps(prompt_tokens=512, prompt_blocks=32, num_blocks=1000)
    # 98% used leaves 20 blocks, fewer than the prompt's 32.
    summary = _summary([23] * 10, [9] * 10, 0.98, 30)
    limit = binding_limit(summary, caps)
    assert limit.key == KV
    assert limit.text.startswith("the KV pool held admission: it filled (peak 98%): 23 ran")
    # 96% leaves 40 blocks: the prompt fits, the pool did not hold it.
    assert binding_limit(_summary([23] * 10, [9] * 10, 0.96, 30), caps).key != KV


def test_the_arrivals_hold_when_nobody_waits():
    summary = _summary([8] * 20, [0] * 20, 0.03, 8)
    limit = binding_limit(summary, _caps(in_flight=8, prompt_tokens=512, prompt_blocks=32))
    assert limit.key == ARRIVALS and limit.waited == 0
    assert limit.text.startswith(
        "the arrivals held admission: concurrency 8 keeps at most 8 in flight, and no request "
        "waited for the engine: 8 ran at once"
    )
    poisson = _caps(in_flight=None, request_rate=4.0, prompt_tokens=512, prompt_blocks=32)
    assert "Poisson arrivals at 4 req/s" in binding_limit(summary, poisson).text


def test_a_cap_reached_only_briefly_leaves_admission_to_the_arrivals():
    # max_num_seqs reached with a queue for a tenth of the run.
    running, waiting = [8] * 10 + [4] * 90, [3] * 10 + [0] * 90
    limit = binding_limit(_summary(running, waiting, 0.01, 8), _caps(max_num_seqs=8))
    assert limit.key == ARRIVALS and limit.held[SEQS] == pytest.approx(0.1)
    assert "max_num_seqs 8 held it too for 10% of the run" in limit.text


def test_without_tokens_per_step_the_budget_is_said_only_where_the_decodes_leave_no_prompt():
    """A vLLM run: its gauges say running, waiting and KV, not tokens per step."""
    queued = _summary([64] * 10, [100] * 10, 0.6)
    limit = binding_limit(queued, _caps())
    assert limit.key == BUDGET and limit.tokens_peak is None
    assert "(tokens per step not reported)" in limit.text
    # 64 decodes + a 512-token prompt fit a 2,048 budget: a queue then is not the budget's.
    short = binding_limit(queued, _caps(prompt_tokens=512, prompt_blocks=32))
    assert short.key == UNCLEAR and short.held[BUDGET] == 0
    # And it never claims the budget "never bound" without evidence.
    assert "token budget" not in short.text


def test_caps_of_a_stored_run_read_its_parameters_and_prediction():
    params = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "chunked_prefill": True,
        "prompt_tokens": 2048,
        "block_size": 16,
        "num_prompts": 48,
        "concurrency": 8,
        "max_concurrency": 8,
        "request_rate": None,
    }
    caps = Caps.of_run(params, {"prefix_cached_tokens": 1536, "kv_capacity_tokens": 16384})
    assert (caps.prompt_tokens, caps.prompt_blocks, caps.num_blocks) == (512, 128, 1024)
    assert caps.in_flight == 8 and caps.request_rate is None
    # The record's own pool wins over the prediction's.
    assert (
        Caps.of_run(params, {"kv_capacity_tokens": 16384}, {"num_gpu_blocks": 99}).num_blocks == 99
    )
    assert Caps.of_run({}, {}) is None


def test_a_flat_running_series_has_no_ramp_and_a_ramping_one_says_its_size():
    """Issue 50: "(ramp-up and drain)" was said of a run whose average (62.0) is almost its
    peak (64), chart flat."""
    flat = ramp(_summary([64] * 100, [0] * 100, 0.5))
    assert flat.level == 64 and not flat.shown
    # Up from 0 in steps of 6 for 10 s, 80 s at 64, down from 60 for 10 s: the ends are where
    # fewer than 58 (90% of 64) ran.
    running = [6 * i for i in range(10)] + [64] * 80 + [60 - 6 * i for i in range(10)]
    ramped = ramp(_summary(running, [0] * 100, 0.5))
    assert ramped.shown and ramped.level == 64
    assert (ramped.up_s, ramped.down_s) == (10.0, 9.0)
    ends = running[:10] + running[91:]
    assert ramped.lost == pytest.approx(sum(64 - r for r in ends) / 100)
    assert ramped.words() == (
        "ramp-up and drain (fewer than 58 running for the first 10 s and the last 9 s, "
        f"{ramped.lost:.2g} fewer on average)"
    )


def test_what_sets_the_formulas_batch():
    caps = _caps(in_flight=16, max_num_seqs=256)
    assert formula_batch_reason({"running_seqs": 16}, caps) == "concurrency 16"
    assert formula_batch_reason({"running_seqs": 256}, _caps(in_flight=1000)) == (
        "max_num_seqs 256"
    )
    fit = {"running_seqs": 101, "max_concurrent_seqs": 101}
    assert formula_batch_reason(fit, _caps(in_flight=256)) == (
        "the sequences that fit the KV pool at their full length"
    )
    budget = {"running_seqs": 63, "running_seqs_without_budget": 101}
    assert formula_batch_reason(budget, caps).startswith(
        "what the step's token budget (max_num_batched_tokens 2,048) keeps in the engine"
    )
