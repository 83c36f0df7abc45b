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
