"""How the lab pages write numbers (labs.results.format_value)."""

from __future__ import annotations

import pytest

from labs.results import format_value


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
    from labs.results import Row, headline

    def row(label: str, ratio: float) -> Row:
        pct = (ratio - 1) * 100
        diff = f"{'+' if pct >= 0 else '−'}{abs(pct):.0f}%"
        return Row(label, "", "", diff, "off", f"because of {label}", ratio)

    rows = [row("TTFT, mean", 0.64), row("TPOT, mean", 1.52), row("E2E latency, mean", 1.43)]
    assert headline(rows).startswith("TPOT, mean differs most (+52%): because of TPOT, mean")


def test_the_reasons_for_hardware_parts_fit_a_cpu_run_too():
    # A vLLM run on the CPU worker has efficiency and unexplained parts too; its Reading must
    # not blame "this GPU".
    from labs.results import PART_WHY

    for part in ("efficiency", "unexplained"):
        assert "GPU" not in PART_WHY[part], part


def test_a_peak_no_poll_saw_is_a_not_observed_row_that_no_reading_picks():
    """A 0.9 s vLLM run on the CPU worker showed "Running sequences, peak 0, −100%" and the
    Reading called it the largest difference: every /metrics poll had read an idle engine."""
    from labs.results import compare, headline

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
