"""'Why they differ' on a real engine (labs/explanation/explain.py): the breakdown is the engine
model's expected parts plus what the run had beyond them. Over random runs faster and slower than
the model expects: no part larger than the difference unless the row shows why (the engine model's
expectation against the formula, then the run against the engine model, each with its figures); the
named parts and the rest add up to the difference; and the throughput row's occupancy is the run's
own gauge, never more sequences than ran."""

from __future__ import annotations

import numpy as np
import pytest

from labs.explanation.explain import ENGINE_TIME, OCCUPANCY, running_mean
from labs.explanation.results import compare
from labs.measurement.metrics import summarize
from labs.parameters.params import ParamError, align_run_batch, parse_lab_params
from labs.prediction.predict import lab_prediction
from labs.sim.lab import run_breakdown
from tests.budget import examples
from tests.labs.factories import gpu_record_slower_than_the_model

NUM_RUNS = examples(300)
TIME_ROWS = ("TTFT, mean", "TPOT, mean", "E2E latency, mean")


def _random_params(rng: np.random.Generator) -> dict[str, object]:
    prompt = int(rng.integers(16, 600))
    output = int(rng.integers(4, 40))
    data: dict[str, object] = {
        "model": str(rng.choice(["qwen2.5-0.5b", "llama-3-8b"])),
        "gpu": str(rng.choice(["h100-sxm", "l4", "a100-80gb"])),
        "max_num_seqs": int(rng.choice([1, 2, 4, 16])),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "max_tokens": output + 16,
        "num_prompts": int(rng.integers(2, 12)),
        "seed": int(rng.integers(0, 2**31)),
        "concurrency": int(rng.choice([1, 1, 2, 4, 8])),
    }
    if rng.random() < 0.3:
        data.update(spec_tokens=3, acceptance=0.7, draft_cost=0.1)
    return data


def _real_rows(rng: np.random.Generator):
    try:
        params = parse_lab_params(align_run_batch(_random_params(rng)))
    except ParamError:
        return None
    # A device faster or slower than the engine model expects, by up to 3x.
    record = gpu_record_slower_than_the_model(params, float(rng.choice([0.35, 0.7, 1.0, 1.4, 3])))
    summary = summarize(record)
    summary["breakdown"] = run_breakdown(params, record, summary)
    if summary["breakdown"] is None or not summary["breakdown"]["calibrated"]:
        return None
    prediction = lab_prediction(params)
    return params, summary, compare(summary, prediction, params.as_dict())


def test_no_part_is_larger_than_the_difference_unless_the_row_shows_why():
    rng = np.random.default_rng(60)
    checked = two_steps = occupancies = 0
    while checked < NUM_RUNS:
        got = _real_rows(rng)
        if got is None:
            continue
        params, summary, rows = got
        checked += 1
        for row in rows:
            e = row.explanation
            if e is None or not e.difference:
                continue
            assert sum(c.size for c in e.causes) + e.rest == pytest.approx(
                e.difference, abs=1e-9 * abs(e.difference)
            ), e.text
            larger = [c for c in e.causes if abs(c.size) > abs(e.difference) * (1 + 1e-9)]
            if row.label in TIME_ROWS and larger:
                # Shown why: the model's expectation and the run against it, with figures.
                two_steps += 1
                assert "the engine model expected" in e.text, e.text
                assert "against the engine model (not explained by it" in e.text, e.text
                residual = summary["breakdown"][
                    {"TTFT, mean": "ttft_s", "TPOT, mean": "tpot_s"}.get(row.label, "e2e_s")
                ]["parts"]["unexplained"]
                assert [c for c in e.causes if c.key == "unexplained"][0].size == pytest.approx(
                    residual
                )
            if row.label == "Output tokens/s":
                keys = {c.key for c in e.causes}
                # The run's own figures: occupancy from its gauge, time in the engine by
                # Little's law; none of the engine model's guessed parts.
                assert keys <= {OCCUPANCY, ENGINE_TIME, "output_length", "ramp", "unexplained"}
                if OCCUPANCY in keys:
                    occupancies += 1
                    level = running_mean(summary)
                    assert level is not None
                    assert level <= max(summary["series"]["engine"]["running"]) + 1e-9
                    assert level <= (params.workload.max_concurrency or 10**9) + 1e-9
                    # Said as measured, or past ramp-up and drain: what the ends lost put back.
                    said = float(e.text.split("on average", 1)[1].split(": ", 1)[1].split(",")[0])
                    assert said == pytest.approx(level, abs=0.05) or "past ramp-up" in e.text
    # Not vacuous: some rows needed both steps, and some named the run's occupancy.
    assert two_steps > 0 and occupancies > 0


def test_a_run_at_concurrency_1_never_says_more_than_one_sequence_ran():
    params = parse_lab_params(
        align_run_batch({"model": "qwen2.5-0.5b", "gpu": "l4", "num_prompts": 6, "concurrency": 1,
                         "prompt_tokens": 64, "output_tokens": 24, "max_tokens": 32})
    )  # fmt: skip
    record = gpu_record_slower_than_the_model(params, 0.4)
    summary = summarize(record)
    summary["breakdown"] = run_breakdown(params, record, summary)
    rows = {r.label: r for r in compare(summary, lab_prediction(params), params.as_dict())}
    level = running_mean(summary)
    assert level is not None and level <= 1.0
    text = rows["Output tokens/s"].explanation.text
    assert "sequences in the engine on average (the engine's own running gauge, polled)" in (
        text
    ) or OCCUPANCY not in {c.key for c in rows["Output tokens/s"].explanation.causes}
