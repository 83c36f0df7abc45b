"""How the lab pages write numbers (labs.explanation.results.format_value)."""

from __future__ import annotations

import pytest

from labs.explanation.results import format_value


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (1, "seqs", "1 seq"),
        (2, "seqs", "2 seqs"),
        (1.0, "tokens", "1 token"),
        (1, "blocks", "1 block"),
        (1, "GPUs", "1 GPU"),
        (0, "seqs", "0 seqs"),
        (1, "tok/s", "1 tok/s"),
    ],
)
def test_it_writes_one_of_a_count_in_the_singular(value, unit, text):
    assert format_value(value, unit) == text


def test_differs_most_is_the_row_with_the_largest_percentage_shown():
    """Issue 23: "differs most (−36%)" sat above rows at +52% and +43% (largest as a ratio,
    |log 0.64| > |log 1.52|, but the page shows percentages)."""
    from labs.explanation.results import Row, headline

    def row(label: str, ratio: float) -> Row:
        pct = (ratio - 1) * 100
        diff = f"{'+' if pct >= 0 else '−'}{abs(pct):.0f}%"
        return Row(label, "", "", diff, "off", f"because of {label}", ratio)

    rows = [row("TTFT, mean", 0.64), row("TPOT, mean", 1.52), row("E2E latency, mean", 1.43)]
    assert headline(rows).startswith("TPOT, mean differs most (+52%): because of TPOT, mean")


def test_the_reasons_for_hardware_parts_fit_a_cpu_run_too():
    # A vLLM run on the CPU worker has efficiency and unexplained parts too; its Reading must
    # not blame "this GPU".
    from labs.explanation.results import PART_WHY

    for part in ("efficiency", "unexplained"):
        assert "GPU" not in PART_WHY[part], part


def test_a_peak_no_poll_saw_is_a_not_observed_row_that_no_reading_picks():
    """A 0.9 s vLLM run on the CPU worker showed "Running sequences, peak 0, −100%" and the
    Reading called it the largest difference: every /metrics poll had read an idle engine."""
    from labs.explanation.results import compare, headline

    summary = {
        "ttft_s": {"mean": 0.2},
        "max_running_seqs": None,
        "kv_usage_peak": None,
        "gauges_unobserved": True,
        "completed": 16,
    }
    rows = {r.label: r for r in compare(summary, {"ttft_s": 0.2, "running_seqs": 8}, {})}
    for label in ("Running sequences, peak", "KV usage, peak"):
        assert rows[label].measured == "not observed" and rows[label].ratio is None
        assert "No /metrics poll fell while requests were running" in rows[label].reading
    assert "Running sequences" not in headline(list(rows.values()))
    # Seen by a poll: a number, compared with the prediction.
    seen = compare(
        {**summary, "max_running_seqs": 8, "gauges_unobserved": False}, {"running_seqs": 8}, {}
    )
    assert [r.measured for r in seen if r.label == "Running sequences, peak"] == ["8"]


def test_when_the_model_expected_more_than_measured_no_share_passes_100_percent():
    """A CPU run's expected parts summed to 2.27 s against 334 ms measured, and the Reading said
    the largest part took "492%" of the mean E2E."""
    import re

    from labs.explanation.results import breakdown_sentence

    parts = {"ideal": 0.599, "efficiency": 1.64, "overhead": 0.0308, "unexplained": -1.94}
    breakdown = {"source": "expected", "e2e_s": {"total": 0.334, "parts": parts}}
    text = breakdown_sentence(breakdown)
    assert text.startswith("The engine model expected 2.27 s for the mean end-to-end latency, ")
    assert "6.8× the 334 ms measured" in text
    assert "largest part it expected (72%) is efficiency loss" in text
    assert all(int(p) <= 100 for p in re.findall(r"(\d+)%", text))
    # Expected parts within the measured total: shares of the measured mean, as before.
    parts = {"ideal": 0.2, "efficiency": 0.1, "unexplained": 0.034}
    text = breakdown_sentence({"source": "expected", "e2e_s": {"total": 0.334, "parts": parts}})
    assert text.startswith("The largest part of the mean end-to-end latency (60%) is expected")


def test_the_bars_of_an_over_expected_run_give_shares_of_what_the_model_expected():
    from labs.explanation.results import breakdown_bars

    parts = {"ideal": 0.599, "efficiency": 1.64, "overhead": 0.0308, "unexplained": -1.94}
    (bar,) = breakdown_bars({"source": "expected", "e2e_s": {"total": 0.334, "parts": parts}})
    assert bar["total"] == "334 ms" and bar["expected_total"] == "2.27 s"
    shares = {p["name"]: p["share"] for p in bar["parts"]}
    assert shares["efficiency"] == "72%" and shares["ideal"] == "26%"
    assert shares["unexplained"] == "the engine model expected this much more"
    # Parts within the measured total: shares of it, no note.
    parts = {"ideal": 0.2, "efficiency": 0.1, "unexplained": 0.034}
    (bar,) = breakdown_bars({"source": "expected", "e2e_s": {"total": 0.334, "parts": parts}})
    assert bar["expected_total"] == "" and bar["parts"][0]["share"] == "60%"


def test_a_rates_diff_and_its_sentence_are_in_points_and_a_cold_first_request_explains_it():
    """Issue 50: "−5%" in the Diff column beside "−2.7%" in the sentence; and a 73.4% hit rate
    against the formula's 75% was "not explained by the model", where the first of 48
    requests finds a cold cache (75% x 47 / 48 = 73.4%)."""
    from labs.explanation.results import compare

    summary = {"prefix_cache_hit_rate": 0.734375, "preemptions": 0, "completed": 48}
    params = {"num_prompts": 48, "input_range_ratio": 0.0}
    (row,) = [r for r in compare(summary, {"prefix_hit_rate": 0.75}, params) if r.diff]
    assert row.diff == "−1.56 pt" and row.diff_class == "agree"
    assert row.reading == (
        "−1.56 pt: the first request found the cache cold: the formula's 75% on the other 47 of "
        "48 requests is 73.4%."
    )
    # Prompts of random lengths: the same figures prove nothing.
    mixed = compare(summary, {"prefix_hit_rate": 0.75}, {**params, "input_range_ratio": 0.3})
    assert [r.reading for r in mixed if r.diff] == ["−1.56 pt not explained by the model."]


def test_hits_the_formula_never_has_come_from_recomputing_preempted_sequences():
    """Issue 50: a 5.82% hit rate after 20 preemptions, on a run with no shared prefix, was
    "not explained by the model"; the formula's rate is 0%, so the Diff column had nothing."""
    from labs.explanation.results import compare

    summary = {"prefix_cache_hit_rate": 0.0582, "preemptions": 20}
    (row,) = [r for r in compare(summary, {"prefix_hit_rate": 0.0}, {}) if r.diff]
    assert row.diff == "+5.82 pt"
    assert row.reading.startswith("+5.82 pt: 20 preemptions: a preempted sequence finds its own")


def test_a_real_runs_expected_parts_say_whether_constants_fitted_to_its_device_priced_them():
    from labs.measurement.metrics import summarize
    from labs.parameters.params import parse_lab_params
    from labs.sim.lab import run_breakdown
    from tests.labs.factories import gpu_record_slower_than_the_model

    small = {"num_prompts": 4, "concurrency": 2, "prompt_tokens": 64, "output_tokens": 8}
    # H100 SXM has published vLLM runs; L40S borrows other GPUs' constants.
    for gpu, calibrated in (("h100-sxm", True), ("l40s", False)):
        params = parse_lab_params({**small, "gpu": gpu})
        record = gpu_record_slower_than_the_model(params)
        breakdown = run_breakdown(params, record, summarize(record))
        assert breakdown["calibrated"] is calibrated, gpu


def test_every_part_of_where_the_time_went_has_a_colour_on_the_run_page():
    """A part without its .part-<name> rule draws as an empty segment of the stacked bar."""
    from pathlib import Path

    from labs.prediction.predict import BREAKDOWN_PARTS

    css = (Path(__file__).resolve().parents[3] / "static" / "css" / "labs.css").read_text()
    missing = [p for p in (*BREAKDOWN_PARTS, "unexplained") if f".part-{p} {{" not in css]
    assert not missing, missing
