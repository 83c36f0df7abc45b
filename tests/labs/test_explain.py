"""'Why they differ' is derived from the two breakdowns (labs/explain.py), checked over random
simulated runs: what it names has a non-zero size pushing the way the difference went, the named
parts cover at least half of it or the text says "not explained", and the reading names the row
with the largest shown difference."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from labs.catalog import GPUS
from labs.explain import OCCUPANCY, OUTPUT_LENGTH, explain_time
from labs.metrics import summarize
from labs.params import ParamError, align_run_batch, parse_lab_params
from labs.predict import lab_prediction
from labs.results import compare, format_value, headline
from labs.sim.lab import build_simulator, run_breakdown
from tests.budget import examples

# 2,000 in `make test-deep`, 200 in `make test` (tests/budget.py); LABS_EXPLAIN_RUNS=20000 for a
# longer pass.
NUM_RUNS = int(os.environ.get("LABS_EXPLAIN_RUNS", examples(2000)))
SMALL_MODELS = ("qwen2.5-0.5b", "llama-3-8b", "mistral-7b", "mixtral-8x7b")
TIME_KEYS = {"TTFT, mean": "ttft_s", "TPOT, mean": "tpot_s", "E2E latency, mean": "e2e_s"}
# Parts the formulas never have: named only when the run had them.
FORMULA_NEVER = ("communication", "prefill_interference", "preemption")


def _random_params(rng: np.random.Generator) -> dict[str, object]:
    # Small runs (a few dozen steps each), so that 2,000 take seconds.
    prompt = int(rng.integers(8, 1500))
    output = int(rng.integers(2, 25))
    data: dict[str, object] = {
        "model": str(rng.choice(SMALL_MODELS)),
        "gpu": str(rng.choice(list(GPUS))),
        "sim_profile": str(rng.choice(["realistic", "ideal"])),
        "max_num_seqs": int(rng.choice([1, 2, 4, 8, 16, 64, 256])),
        "max_num_batched_tokens": int(rng.choice([256, 512, 2048, 8192])),
        "chunked_prefill": bool(rng.random() < 0.8),
        "prefix_caching": bool(rng.random() < 0.5),
        "shared_prefix_tokens": int(rng.integers(0, prompt)) if rng.random() < 0.4 else 0,
        "block_size": int(rng.choice([16, 32])),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "max_tokens": output + int(rng.integers(0, 200)),
        "context_tokens": prompt + output,
        "num_prompts": int(rng.integers(2, 13)),
        "input_range_ratio": float(rng.choice([0.0, 0.0, 0.3, 0.9])),
        "output_range_ratio": float(rng.choice([0.0, 0.0, 0.5])),
        "seed": int(rng.integers(0, 2**31)),
    }
    if rng.random() < 0.3:
        data["request_rate"] = float(rng.choice([0.5, 4.0, 50.0]))
    else:
        data["concurrency"] = int(rng.integers(1, 16))
    if rng.random() < 0.3:
        # A small pool, so that some runs preempt.
        data["kv_capacity_tokens"] = int(rng.integers(1, 6)) * (prompt + output + 64)
    if rng.random() < 0.25:
        data["spec_tokens"] = int(rng.integers(1, 5))
        data["acceptance"] = float(rng.choice([0.3, 0.7, 0.9]))
        data["draft_cost"] = float(rng.choice([0.0, 0.05, 0.2]))
    if rng.random() < 0.2:
        data["step_overhead_ms"] = float(rng.choice([0.5, 3.0]))
        data["compute_efficiency"] = float(rng.choice([0.5, 0.8]))
    return data


def _simulated_rows(data: dict[str, object]):
    """The run page's rows and reading for one simulated run, or None for settings the
    simulator refuses (as the page would, before running)."""
    try:
        params = parse_lab_params(align_run_batch(data))
        simulator = build_simulator(params)
    except ParamError:
        return None
    record = simulator.run()
    summary = summarize(record)
    summary["breakdown"] = run_breakdown(params, record, summary)
    prediction = lab_prediction(params)
    rows = compare(summary, prediction, params.as_dict())
    return params, summary, prediction, rows, headline(rows, summary["breakdown"])


def _check_row(row, summary, prediction) -> None:
    e = row.explanation
    difference = e.difference
    for cause in e.causes:
        assert cause.size != 0, (row.label, e.text)
        assert math.copysign(1, cause.size) == math.copysign(1, difference), (row.label, e.text)
        if row.label in TIME_KEYS and cause.key != "unexplained":
            key = TIME_KEYS[row.label]
            ran = summary["breakdown"][key]["parts"][cause.key]
            formula = prediction["breakdown"][key]["parts"][cause.key]
            # The size named is the difference of the two breakdowns' parts, not a guess.
            assert cause.size == pytest.approx(ran - formula, rel=1e-9, abs=1e-15)
            if cause.key in FORMULA_NEVER:
                assert ran > 0, (row.label, e.text)
        if row.label == "Output tokens/s" and cause.key in FORMULA_NEVER:
            assert summary["breakdown"]["e2e_s"]["parts"][cause.key] > 0, e.text
        parts = summary["breakdown"]["e2e_s"]["parts"]
        assert cause.key in (*parts, "unexplained", OCCUPANCY, OUTPUT_LENGTH)
    slower = difference > 0 if row.label != "Output tokens/s" else difference < 0
    for counter in e.counters:
        assert counter.value != 0, (row.label, e.text)
        if counter.key == "preemptions":
            assert slower and summary["preemptions"] > 0, e.text
        if counter.key == "kv_pool_full":
            assert row.label == "Running sequences, peak" and difference < 0
            assert summary["preemptions"] > 0 and summary["kv_usage_peak"] >= 0.95
        if counter.key == "requests":
            assert row.label == "Running sequences, peak" and difference < 0
            assert (
                counter.value
                == summary["completed"] + summary["failed"]
                < prediction["running_seqs"]
            )
        if counter.key == "prefix_cache_hit_rate":
            fewer_hits = summary["prefix_cache_hit_rate"] < prediction.get("prefix_hit_rate", 0)
            assert fewer_hits == slower, e.text
    named = sum(c.size for c in e.causes if c.key != "unexplained")
    covers_half = abs(named) >= 0.5 * abs(difference) - 1e-12 * abs(difference)
    assert covers_half or "not explained" in e.text, (row.label, e.text)
    if difference:
        assert format_value(abs(difference), "").strip() and e.text


def _shown_percent(diff: str) -> int:
    return int(re.sub(r"[^\d]", "", diff))


def test_explanations_over_random_simulated_runs_are_derived_from_the_runs_evidence():
    rng = np.random.default_rng(20261202)
    checked = explained = with_counters = not_explained = 0
    while checked < NUM_RUNS:
        got = _simulated_rows(_random_params(rng))
        if got is None:
            continue
        params, summary, prediction, rows, reading = got
        checked += 1
        compared = [r for r in rows if r.diff]
        for row in rows:
            if row.explanation is None:
                continue
            explained += 1
            with_counters += bool(row.explanation.counters)
            not_explained += "not explained" in row.explanation.text
            _check_row(row, summary, prediction)
        if compared:
            largest = max(_shown_percent(r.diff) for r in compared)
            named = next(r for r in compared if reading.startswith(r.label) or r.label in reading)
            assert _shown_percent(named.diff) == largest, (reading, [r.diff for r in compared])
    # The property is not vacuous: the runs were explained, some cite counters, some are not.
    assert explained >= 3 * NUM_RUNS
    assert with_counters > 0 and not_explained > 0


def test_a_prefix_cache_that_hit_nothing_is_never_the_reason():
    """The issue's case: 0% hits on fixed-length prompts; TTFT is below the formula's."""
    summary = {
        "prefix_cache_hit_rate": 0.0,
        "breakdown": {
            "source": "simulated",
            "ttft_s": {"total": 0.3, "parts": {"ideal": 0.1, "queueing": 0.2}},
        },
    }
    prediction = {
        "prefix_hit_rate": 0.0,
        "breakdown": {"ttft_s": {"total": 0.55, "parts": {"ideal": 0.05, "queueing": 0.5}}},
    }
    e = explain_time("ttft_s", 0.3, 0.55, summary, prediction, lambda v: f"{v:.2f} s")
    assert "prefix" not in e.text
    assert [c.key for c in e.causes] == ["queueing"]
    assert e.text.startswith("−0.30 s queueing before the first step (run 0.20 s, formula 0.50 s")


def test_a_difference_no_part_accounts_for_says_not_explained_with_its_size():
    summary = {"breakdown": {"ttft_s": {"total": 1.0, "parts": {"ideal": 1.0}}}}
    prediction = {"breakdown": {"ttft_s": {"total": 1.0, "parts": {"ideal": 1.0}}}}
    # The stored mean is 2 s but its parts add up to 1 s: half of it has no part.
    e = explain_time("ttft_s", 2.0, 1.0, summary, prediction, lambda v: f"{v:.1f} s")
    assert e.text == "+1.0 s not explained by the engine model."
    assert e.says_not_explained


def test_a_vllm_runs_unexplained_part_is_named_as_not_explained_by_the_engine_model():
    """A real run's breakdown is the engine model's expected parts plus what the GPU measured
    beyond them (labs.sim.lab.run_breakdown): that rest is named as such."""
    summary = {
        "breakdown": {
            "source": "expected",
            "tpot_s": {
                "total": 0.012,
                "parts": {"ideal": 0.005, "efficiency": 0.001, "unexplained": 0.006},
            },
        }
    }
    prediction = {"breakdown": {"tpot_s": {"total": 0.005, "parts": {"ideal": 0.005}}}}
    e = explain_time("tpot_s", 0.012, 0.005, summary, prediction, lambda v: f"{v * 1000:.1f} ms")
    assert [c.key for c in e.causes] == ["unexplained", "efficiency"]
    assert e.text == (
        "+6.0 ms not explained by the engine model; "
        "+1.0 ms efficiency loss (engine model expects 1.0 ms, formula 0.0 ms)."
    )
    assert e.says_not_explained


def test_a_real_runs_rows_split_into_the_engine_models_parts_and_what_it_does_not_explain():
    """A vLLM run 25% slower than the engine model expects: each latency row names the rest as
    not explained by the engine model, with a size near the 20% of the measured mean it is."""
    from tests.labs.factories import gpu_record_slower_than_the_model

    params = parse_lab_params(
        {"num_prompts": 8, "max_concurrency": 2, "prompt_tokens": 128, "output_tokens": 16}
    )
    record = gpu_record_slower_than_the_model(params, 1.25)
    summary = summarize(record)
    summary["breakdown"] = run_breakdown(params, record, summary)
    rows = {r.label: r for r in compare(summary, lab_prediction(params), params.as_dict())}
    for label, key in TIME_KEYS.items():
        e = rows[label].explanation
        rest = summary["breakdown"][key]["parts"]["unexplained"]
        assert rest == pytest.approx(0.2 * summary[key]["mean"], rel=0.05)
        named = {c.key: c.size for c in e.causes}
        assert named["unexplained"] == pytest.approx(rest, rel=1e-9)
        assert "not explained by the engine model" in e.text
        # And the engine model's own parts beside it, as it expects them.
        assert len(named) > 1 and "engine model expects" in e.text
