"""'Why they differ' is derived from the two breakdowns and the run's engine series
(labs/explanation/explain.py, labs/explanation/limits.py), checked over random simulated runs:
every row's named parts and the rest it states add up to its difference, no part left out is larger
than one named; the cap a sentence says held admission stood at its limit in the run's own series,
and one it says never bound never did; ramp-up and drain are said only where the running series
ramps; a rate's sentence is in the Diff column's unit; and the reading names the row with the
largest shown difference."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from labs.explanation.explain import (
    COVER,
    LIMIT,
    MAX_CAUSES,
    MIN_SHARE,
    OCCUPANCY,
    OUTPUT_LENGTH,
    RAMP,
    SHOWN_REST,
    explain_time,
)
from labs.explanation.limits import ARRIVALS, BUDGET, HELD, KV, SEQS
from labs.explanation.results import compare, headline
from labs.measurement.metrics import summarize
from labs.parameters.catalog import GPUS
from labs.parameters.params import ParamError, align_run_batch, parse_lab_params
from labs.prediction.predict import lab_prediction
from labs.sim.lab import build_simulator, run_breakdown
from tests.budget import examples

# 2,000 in `make test-deep`, 200 in `make test` (tests/budget.py); LABS_EXPLAIN_RUNS=20000 for a
# longer pass.
NUM_RUNS = int(os.environ.get("LABS_EXPLAIN_RUNS", examples(2000)))
SMALL_MODELS = ("qwen2.5-0.5b", "llama-3-8b", "mistral-7b", "mixtral-8x7b")
TIME_KEYS = {"TTFT, mean": "ttft_s", "TPOT, mean": "tpot_s", "E2E latency, mean": "e2e_s"}
RATE_ROWS = ("Prefix-cache hit rate", "Draft tokens accepted")
# Parts the formulas never have: named only when the run had them.
FORMULA_NEVER = ("communication", "preemption")


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


def _time_contributions(row, summary, prediction) -> dict[str, float]:
    """A time row's difference split over the parts of the two breakdowns."""
    key = TIME_KEYS[row.label]
    ran = summary["breakdown"][key]["parts"]
    formula = prediction["breakdown"][key]["parts"]
    parts = {n: ran.get(n, 0.0) - formula.get(n, 0.0) for n in dict.fromkeys([*ran, *formula])}
    rest = row.explanation.difference - sum(parts.values())
    parts["unexplained"] = parts.get("unexplained", 0.0) + rest
    return parts


def _check_adds_up(row, summary, prediction) -> None:
    """The named parts and the rest the sentence states are the difference; a part left out is
    no larger than one named; the rest is small unless the sentence names its most parts."""
    e = row.explanation
    d = abs(e.difference)
    assert sum(c.size for c in e.causes) + e.rest == pytest.approx(e.difference, abs=1e-12 * d)
    if abs(e.rest) > SHOWN_REST * d:
        assert "in the other parts" in e.text, (row.label, e.text)
    if row.label not in TIME_KEYS or not e.causes:
        return
    parts = _time_contributions(row, summary, prediction)
    named = {c.key for c in e.causes}
    smallest = min(abs(c.size) for c in e.causes)
    left = [abs(v) for k, v in parts.items() if k not in named]
    assert all(v <= smallest * (1 + 1e-9) for v in left), (row.label, e.text, parts)
    covered = abs(e.rest) <= COVER * d * (1 + 1e-9)
    small = all(v < MIN_SHARE * d for v in left)
    assert covered or small or len(e.causes) == MAX_CAUSES, (row.label, e.text, parts)


def _engine(summary):
    engine = summary["series"]["engine"]
    return engine["running"], engine["waiting"], engine["kv_usage"], engine["scheduled_tokens"]


def _check_limit(limit, params, summary, prediction) -> None:
    """The cap the sentence names stood at its limit in the run's own series; a cap it says
    never bound never did."""
    running, waiting, usage, tokens = _engine(summary)
    engine, work = params.engine, params.workload
    bs = engine.block_size
    num_blocks = prediction["kv_capacity_tokens"] // bs
    need = max(work.prompt_tokens - (prediction.get("prefix_cached_tokens") or 0), 1)
    longest = math.ceil(work.prompt_tokens * (1 + work.input_range_ratio))
    if engine.kv_allocation == "contiguous":
        longest += work.max_tokens
    budget = engine.max_num_batched_tokens
    if limit.key == SEQS:
        assert max(running) >= engine.max_num_seqs, limit.text
    if limit.key == KV:
        assert any((1 - u) * num_blocks < math.ceil(longest / bs) for u in usage), limit.text
    if limit.key == BUDGET:
        if engine.chunked_prefill:
            assert max(tokens) >= budget, limit.text
        else:
            assert any(budget - t < need for t in tokens), limit.text
    if limit.key == ARRIVALS:
        # Requests waited (at any step a sample stands for) for less than HELD of the run.
        times = summary["series"]["engine"]["t_s"]
        end = max(summary["duration_s"], times[-1])
        spans = [b - a for a, b in zip(times, [*times[1:], end], strict=True)]
        queued = sum(s for s, w in zip(spans, waiting, strict=True) if w > 0)
        assert queued < HELD * sum(spans), limit.text
    never = limit.text.rsplit("; ", 1)[-1] if limit.text.endswith("never bound") else ""
    if f"max_num_seqs {engine.max_num_seqs:,}" in never:
        assert max(running) < engine.max_num_seqs, limit.text
    if "the KV pool (peak" in never:
        assert not summary["preemptions"], limit.text
        prompt_blocks = math.ceil(
            (work.prompt_tokens + (work.max_tokens if engine.kv_allocation == "contiguous" else 0))
            / bs
        )
        assert all((1 - u) * num_blocks >= prompt_blocks - 1e-9 for u in usage), limit.text
    if "token budget" in never:
        if engine.chunked_prefill:
            assert max(tokens) < budget, limit.text
        else:
            assert all(budget - t >= need for t in tokens), limit.text


def _check_ramp(row, ramp, summary) -> None:
    """Ramp-up and drain only where the running series sits below its plateau at an end."""
    e = row.explanation
    if "ramp-up and drain" not in e.text:
        return
    assert row.label == "Output tokens/s" and RAMP in {c.key for c in e.causes}, e.text
    assert ramp is not None and ramp.shown and ramp.lost > 0, e.text
    engine = summary["series"]["engine"]
    times, running = engine["t_s"], engine["running"]
    end = max(summary["duration_s"], times[-1])
    below = [r < 0.9 * ramp.level for r in running]
    up = [b for t, b in zip(times, below, strict=True) if t < ramp.up_s]
    assert all(up), e.text
    if ramp.down_s > 0:
        last = [b for t, b in zip(times, below, strict=True) if t >= end - ramp.down_s - 1e-9]
        assert last and all(last), e.text
    assert ramp.up_s > 0 or ramp.down_s > 0


def _check_row(row, params, summary, prediction) -> None:
    e = row.explanation
    difference = e.difference
    for cause in e.causes:
        assert cause.size != 0, (row.label, e.text)
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
        assert cause.key in (
            *parts,
            "unexplained",
            OCCUPANCY,
            RAMP,
            OUTPUT_LENGTH,
            LIMIT,
            "prefix_cache_hit_rate",
        )
    slower = difference > 0 if row.label != "Output tokens/s" else difference < 0
    for counter in e.counters:
        assert counter.value != 0, (row.label, e.text)
        if counter.key == "preemptions":
            assert slower and summary["preemptions"] > 0, e.text
        if counter.key in ("kv_pool_full", "requests"):
            # Said only of a run without an engine series; the simulator's always has one.
            raise AssertionError(e.text)
        if counter.key == "prefix_cache_hit_rate":
            fewer_hits = summary["prefix_cache_hit_rate"] < prediction.get("prefix_hit_rate", 0)
            assert fewer_hits == slower, e.text
    if "preempted sequence finds its own blocks" in e.text:
        assert summary["preemptions"] > 0, e.text
    if "found the cache cold" in e.text:
        assert not summary["preemptions"], e.text
        assert summary["prefix_cache_hit_rate"] < prediction["prefix_hit_rate"], e.text
    if row.label in RATE_ROWS and difference:
        # The Diff column and the sentence in one unit: points.
        assert row.diff.endswith(" pt") and e.text.startswith(row.diff), (row.diff, e.text)
    elif difference:
        assert "%" not in e.text.split(" ", 1)[0], (row.diff, e.text)
    if difference:
        _check_adds_up(row, summary, prediction)
        assert e.text
    if e.limit is not None:
        assert e.limit.text[1:] in e.text
        named = {c.key for c in e.causes}
        assert named & {"queueing", OCCUPANCY, LIMIT}, e.text
        _check_limit(e.limit, params, summary, prediction)


def _reading_row(reading: str, compared):
    """The row the reading says differs most (or agrees least)."""
    if " differs most (" in reading:
        label = reading.split(" differs most (", 1)[0]
    else:
        said = reading.split("(largest difference: ", 1)[1].split(").", 1)[0]
        label = said.rsplit(", ", 1)[0]
    return next(r for r in compared if r.label == label)


def test_explanations_over_random_simulated_runs_are_derived_from_the_runs_evidence():
    rng = np.random.default_rng(20261202)
    checked = explained = with_counters = limits = ramps = 0
    held: dict[str, int] = {}
    while checked < NUM_RUNS:
        got = _simulated_rows(_random_params(rng))
        if got is None:
            continue
        params, summary, prediction, rows, reading = got
        checked += 1
        compared = [r for r in rows if r.diff]
        evidence = rows[0].evidence
        if evidence.limit is not None:
            held[evidence.limit.key] = held.get(evidence.limit.key, 0) + 1
        for row in rows:
            if row.explanation is None:
                continue
            explained += 1
            with_counters += bool(row.explanation.counters)
            limits += row.explanation.limit is not None
            ramps += "ramp-up and drain" in row.explanation.text
            _check_row(row, params, summary, prediction)
            _check_ramp(row, evidence.ramp, summary)
        if compared:
            largest = max(abs(r.shown_percent) for r in compared)
            assert abs(_reading_row(reading, compared).shown_percent) == largest, reading
    # The property is not vacuous: the runs were explained, some cite counters, name the cap
    # that held admission (each kind of cap in some run), and ramp.
    assert explained >= 3 * NUM_RUNS
    assert with_counters > 0 and limits > 0 and ramps > 0
    assert {SEQS, BUDGET, ARRIVALS} <= set(held), held


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
    # The ideal part (+0.05 s) is a fifth of the difference: named, so the two add up to it.
    assert [c.key for c in e.causes] == ["queueing", "ideal"]
    assert e.text.startswith("−0.30 s queueing before the first step (run 0.20 s, formula 0.50 s")
    assert "+0.05 s ideal compute/memory" in e.text and "other parts" not in e.text


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
