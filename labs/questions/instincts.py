"""Your instincts over time: a learner's predictions against what was measured, per topic, and a
sentence that says where their model is off, only where their own points show it.

A figure's predictions lean one way when at least LEAN of them (and MIN_POINTS in all) fall
outside the band on the same side. Where the question's neighbours vary a setting, the points at
one end of it may lean while those at the other do not: the sentence then says where ("at large
batch"), with the values it saw. Pure Python; no Django.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_POINTS = 3
LEAN = 0.6


@dataclass(frozen=True)
class Point:
    question: str
    title: str
    phrase: str  # the figure in a sentence: "speculation's speedup"
    unit: str
    value: float  # the learner's
    measured: float
    band: float  # relative
    rating: int
    source: str  # "lab" | "quiz"
    varies_word: str = ""  # what the question's neighbours vary ("batch")
    varies_value: Any = None  # its value at this point
    varies_setting: str = ""  # the setting's name ("concurrency")
    count: bool = False
    value_text: str = ""  # the two figures as the pages write them, with their unit
    measured_text: str = ""

    @property
    def side(self) -> int:
        """+1 above the band, -1 below it, 0 inside."""
        allowed = self.band * abs(self.measured)
        if self.count:
            allowed = max(allowed, 1.0)
        if self.value > self.measured + allowed:
            return 1
        if self.value < self.measured - allowed:
            return -1
        return 0

    @property
    def factor(self) -> float:
        return self.value / self.measured if self.measured else math.inf


@dataclass
class Topic:
    topic: str
    points: list[Point] = field(default_factory=list)
    sentence: str = ""

    @property
    def inside(self) -> int:
        return sum(1 for p in self.points if p.side == 0)

    @property
    def share_inside(self) -> float:
        return self.inside / len(self.points) if self.points else 0.0

    @property
    def band(self) -> float:
        """The median band of the topic's points: the one the chart shades."""
        return statistics.median(p.band for p in self.points) if self.points else 0.0

    def chart(self) -> dict[str, Any]:
        values = [v for p in self.points for v in (p.value, p.measured) if v > 0]
        return {
            "points": [
                {
                    "x": p.measured,
                    "y": p.value,
                    "title": p.title,
                    "unit": p.unit,
                    "inside": p.side == 0,
                    "source": p.source,
                }
                for p in self.points
                if p.value > 0 and p.measured > 0
            ],
            "band": self.band,
            "low": min(values) / 2 if values else 1,
            "high": max(values) * 2 if values else 10,
        }


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _where(points: Sequence[Point], side: int) -> tuple[str, list[Point]]:
    """The end of the varied setting the lean sits at ("at large batch (concurrency 64 to 128)")
    and the points there; ("", points) when it does not sit at one end."""
    valued = [(p, v) for p in points if (v := _numeric(p.varies_value)) is not None]
    levels = sorted({v for _, v in valued})
    if len(levels) < 3 or not valued[0][0].varies_word:
        return "", list(points)
    middle = statistics.median(levels)
    for word, upper in (("large", True), ("small", False)):
        end = [(p, v) for p, v in valued if v != middle and (v > middle) == upper]
        rest = [p for p, v in valued if (p, v) not in end]
        if len(end) < 2 or not rest:
            continue
        leans_end = sum(p.side == side for p, _ in end) / len(end) >= LEAN
        leans_rest = sum(p.side == side for p in rest) / len(rest) >= LEAN
        if leans_end and not leans_rest:
            seen = sorted({v for _, v in end})
            span = f"{seen[0]:g}" if len(seen) == 1 else f"{seen[0]:g} to {seen[-1]:g}"
            first = valued[0][0]
            return f" at {word} {first.varies_word} ({first.varies_setting} {span})", [
                p for p, _ in end
            ]
    return "", list(points)


def reading(points: Sequence[Point]) -> str:
    """Where the learner's predictions lean, figure by figure, from their points alone; "" when
    no figure has MIN_POINTS points leaning one way."""
    by_question: dict[str, list[Point]] = {}
    for p in points:
        by_question.setdefault(p.question, []).append(p)
    found: list[tuple[float, str]] = []
    for group in by_question.values():
        if len(group) < MIN_POINTS:
            continue
        for side, verb in ((1, "overestimate"), (-1, "underestimate")):
            # An end of the varied setting that leans while the other does not, else the
            # whole figure if it leans.
            where, there = _where(group, side)
            leaning = [p for p in there if p.side == side]
            if len(leaning) / len(there) < LEAN:
                continue
            factor = statistics.median(p.factor for p in leaning)
            there_words = "there " if where else ""
            way = "above" if side > 0 else "below"
            found.append(
                (
                    len(leaning) / len(there),
                    f"You {verb} {group[0].phrase}{where}: {len(leaning)} of your {len(there)} "
                    f"predictions {there_words}were {way} the band, at {factor:.2g}× the "
                    "measurement (median).",
                )
            )
    return " ".join(text for _, text in sorted(found, key=lambda item: -item[0]))


def topics(points: Sequence[Point], topic_of: dict[str, str]) -> list[Topic]:
    """The points grouped by their question's topic (`topic_of`: question -> topic), each with its
    reading; topics with most points first."""
    grouped: dict[str, Topic] = {}
    for p in points:
        name = topic_of.get(p.question, "other")
        grouped.setdefault(name, Topic(name)).points.append(p)
    for topic in grouped.values():
        topic.sentence = reading(topic.points)
    return sorted(grouped.values(), key=lambda t: (-len(t.points), t.topic))
