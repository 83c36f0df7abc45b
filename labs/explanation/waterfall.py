"""A metric's "why they differ" as a waterfall: from the formulas' figure to the measured one, one
bar per part the explanation names (labs/explanation/explain.py), then the smaller parts it did not
name and what the engine model does not explain, last. The bars add up exactly to the measured
figure: they are the explanation's own sizes, so the picture and the sentence cannot disagree.

Geometry is computed here (percentages of the axis), so the page draws it as SVG with no
script and no inline style. Pure functions over stored JSON; no Django.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labs.explanation import results
from labs.explanation.explain import (
    LIMIT,
    OCCUPANCY,
    OUTPUT_LENGTH,
    PART_LABELS,
    RAMP,
    SHOWN_REST,
    Explanation,
)

# Short names for the bars (the full words are in the text one click away).
BAR_LABELS = {
    **PART_LABELS,
    "queueing": "queueing",
    "prefill_interference": "prefill in decode steps",
    "preemption": "preemption",
    "speculation": "speculation",
    OCCUPANCY: "sequences in the engine",
    RAMP: "ramp-up and drain",
    OUTPUT_LENGTH: "output tokens per request",
    LIMIT: "the cap that held admission",
    "unexplained": "not explained by the engine model",
}
REST_LABEL = "smaller parts, not named"


@dataclass(frozen=True)
class Bar:
    label: str
    value: str  # the figure shown at its end: a total, or a signed change
    kind: str  # "total" | "up" | "down"
    start: float  # in the metric's unit
    end: float
    x: float = 0.0  # percent of the axis
    width: float = 0.0

    @property
    def svg_x(self) -> str:
        return f"{self.x:.2f}"  # never localised: an SVG attribute

    @property
    def svg_width(self) -> str:
        return f"{self.width:.2f}"


@dataclass(frozen=True)
class Waterfall:
    label: str
    bars: tuple[Bar, ...]
    short: str  # the binding limit and the largest part
    text: str  # the full explanation

    @property
    def aria(self) -> str:
        return "; ".join(f"{b.label} {b.value}" for b in self.bars)


def _signed(value: float, fmt: Callable[[float], str]) -> str:
    return ("+" if value >= 0 else "−") + fmt(abs(value))


def _placed(bars: list[Bar]) -> tuple[Bar, ...]:
    low = min(0.0, *(min(b.start, b.end) for b in bars))
    high = max(*(max(b.start, b.end) for b in bars))
    span = (high - low) or 1.0
    placed = []
    for b in bars:
        left, right = sorted((b.start, b.end))
        width = (right - left) / span * 100
        placed.append(
            Bar(
                b.label,
                b.value,
                b.kind,
                b.start,
                b.end,
                x=round((left - low) / span * 100, 2),
                width=round(max(width, 0.4), 2),  # a hairline, so a tiny part is still seen
            )
        )
    return tuple(placed)


def build(
    label: str,
    measured: float,
    predicted: float,
    explanation: Explanation,
    fmt: Callable[[float], str],
    limit_text: str = "",
) -> Waterfall | None:
    """The waterfall of one metric; None when the explanation names no part."""
    if not explanation.causes:
        return None
    bars = [Bar("predicted by the formulas", fmt(predicted), "total", 0.0, predicted)]
    level = predicted
    named = [c for c in explanation.causes if c.key != "unexplained"]
    unexplained = sum(c.size for c in explanation.causes if c.key == "unexplained")
    steps = [(BAR_LABELS.get(c.key, c.key), c.size) for c in named]
    if abs(explanation.rest) > SHOWN_REST * abs(explanation.difference):
        steps.append((REST_LABEL, explanation.rest))
    if unexplained:
        steps.append((BAR_LABELS["unexplained"], unexplained))
    for name, size in steps:
        bars.append(
            Bar(name, _signed(size, fmt), "up" if size >= 0 else "down", level, level + size)
        )
        level += size
    bars.append(Bar("measured", fmt(measured), "total", 0.0, measured))
    largest = max(named or explanation.causes, key=lambda c: abs(c.size))
    short = (
        f"{_signed(explanation.difference, fmt)} in all; the largest part: "
        f"{BAR_LABELS.get(largest.key, largest.key)}, {_signed(largest.size, fmt)}."
    )
    if limit_text:
        first = limit_text.split("; ")[0]
        short += f" {first[:1].upper()}{first[1:]}."
    return Waterfall(label, _placed(bars), short, explanation.text)


def run_waterfalls(
    summary: Mapping[str, Any] | None,
    predicted: Mapping[str, Any],
    params: Mapping[str, Any],
    rows: Sequence[results.Row] | None = None,
) -> dict[str, Waterfall]:
    """Every compared metric of a finished run that has named parts, by its row label. `rows`:
    the run's table (results.compare), when the caller has it already."""
    found: dict[str, Waterfall] = {}
    if not summary:
        return found
    expected = results.derived_predictions(predicted, params)
    metrics = {m.label: m for m in results.METRICS}
    for row in rows if rows is not None else results.compare(summary, predicted, params):
        metric = metrics.get(row.label)
        if metric is None or row.explanation is None or metric.predicted is None:
            continue
        measured = results.dig(summary, metric.measured)
        want = expected.get(metric.predicted)
        if not isinstance(measured, int | float) or not isinstance(want, int | float):
            continue
        unit = metric.unit

        def fmt(value: float, unit: str = unit) -> str:
            return results.points(value) if unit == "ratio" else results.format_value(value, unit)

        limit = row.evidence.limit if row.evidence is not None else None
        built = build(
            row.label,
            float(measured),
            float(want),
            row.explanation,
            fmt,
            limit.text if limit is not None else "",
        )
        if built is not None:
            found[row.label] = built
    return found
