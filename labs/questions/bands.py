"""How close a prediction must be: the band a measured figure is graded within, and the grade.

One function, `expected_band`, answers "how far may a measurement of this figure be from the
truth": for the simulator, its error against published vLLM runs of this GPU
(labs.explanation.accuracy); for a real engine, its run-to-run spread on this device, from repeated
runs of the same settings. A prediction within that band is Good, within a factor of 2 Hard, else
Again.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from labs.backends import is_simulated
from labs.explanation import accuracy
from labs.questions.figures import Figure

GOOD, HARD, AGAIN = 3, 2, 1
RATING_NAMES = {GOOD: "Good", HARD: "Hard", AGAIN: "Again"}
FACTOR = 2.0  # Hard: within this factor of the measurement
MIN_BAND = 0.02  # a band is never tighter than this: the figures are rounded to 3 digits
# A count (sequences running) is set by the scheduler's rules, which no published run checks:
# its band is the count's own grain, one sequence, or this share of it.
COUNT_BAND = 0.05
# Without any estimate (no published run of this kind, no repeated real run): a wide band,
# said to be a default.
DEFAULT_BAND = 0.20


@dataclass(frozen=True)
class Band:
    relative: float  # a measurement may be this far (a fraction) from the truth
    words: str  # "±19%: the simulator's median error on throughput ..."
    source: str  # "published" | "count" | "default" | "device-spread" | "device-default"


def _pct(value: float) -> str:
    return f"{value * 100:.3g}%"


def _published(gpu: str, kind: str) -> tuple[float, str] | None:
    """labs.explanation.accuracy's estimate for this GPU and kind: (median |error|, where it comes
    from)."""
    estimate = accuracy.expected_error(gpu, kind, accuracy.load_errors())
    if estimate is None:
        return None
    runs = f"{estimate.runs} published run{'s' if estimate.runs != 1 else ''}"
    where = f"{runs} on this GPU" if estimate.own_gpu else f"{runs} on other GPUs"
    return estimate.median, where


def simulated_band(figure: Figure, params: Mapping[str, Any]) -> Band:
    """The simulator's expected error for `figure` on the run's GPU (labs.explanation.accuracy)."""
    if figure.kind is None:
        if figure.unit == "sequences":
            return Band(COUNT_BAND, _count_words(), "count")
        return Band(DEFAULT_BAND, _default_words(figure), "default")
    gpu = str(params.get("gpu") or "")
    # E2E is TTFT + TPOT × (n − 1): its relative error is at most the larger of theirs.
    kinds = ("TTFT", "TPOT") if figure.kind == "E2E" else (figure.kind,)
    found = [(kind, _published(gpu, kind)) for kind in kinds]
    known = [(kind, est) for kind, est in found if est is not None]
    if not known:
        return Band(DEFAULT_BAND, _default_words(figure), "default")
    kind, (median, where) = max(known, key=lambda item: item[1][0])
    relative = max(median, MIN_BAND)
    via = " (E2E is TTFT + TPOT × (n − 1), so the larger of their errors)" if len(kinds) > 1 else ""
    return Band(
        relative,
        f"±{_pct(relative)}: the simulator's median error on {kind} against {where}{via}",
        "published",
    )


def _count_words() -> str:
    return (
        f"±1 sequence or ±{_pct(COUNT_BAND)}: a count the scheduler's rules set, which no "
        "published run checks"
    )


def _default_words(figure: Figure) -> str:
    return (
        f"±{_pct(DEFAULT_BAND)}: no published run checks the simulator on {figure.phrase}, so a "
        "wide default"
    )


def device_band(figure: Figure, repeats: Iterable[float], *, ratio_repeats: int = 1) -> Band:
    """A real engine's run-to-run spread: the largest distance of `repeats` (the same figure from
    runs of the same settings on the same device) from their median. For a ratio both of its
    runs vary, so their spreads add (`ratio_repeats` 2)."""
    values = [v for v in repeats if v > 0]
    if len(values) < 2:
        return Band(
            DEFAULT_BAND,
            f"±{_pct(DEFAULT_BAND)}: no repeated run of these settings on this device yet to "
            "measure its run-to-run spread, so a wide default",
            "device-default",
        )
    middle = statistics.median(values)
    spread = max(abs(v / middle - 1) for v in values) * ratio_repeats
    relative = max(spread, MIN_BAND)
    return Band(
        relative,
        f"±{_pct(relative)}: this device's run-to-run spread over {len(values)} runs of these "
        "settings",
        "device-spread",
    )


def expected_band(
    figure: Figure, params: Mapping[str, Any], backend: str, repeats: Iterable[float] = ()
) -> Band:
    """The band a measurement of `figure` is graded within: the simulator's published error, or a
    real engine's spread over `repeats` (earlier runs of the same settings on the device)."""
    if is_simulated(backend):
        return simulated_band(figure, params)
    return device_band(figure, repeats, ratio_repeats=2 if figure.ratio else 1)


@dataclass(frozen=True)
class Grade:
    rating: int  # GOOD, HARD or AGAIN (the quiz's 3, 2, 1)
    name: str
    words: str  # which band applied, and how far the prediction was


def within_band(value: float, measured: float, band: Band, *, count: bool = False) -> bool:
    allowed = band.relative * abs(measured)
    if count:
        allowed = max(allowed, 1.0)
    return abs(value - measured) <= allowed


def grade(value: float, measured: float, band: Band, *, count: bool = False) -> Grade:
    """Good within the band, Hard within a factor of 2, else Again; the words say which."""
    if measured <= 0:
        raise ValueError("a measurement to grade against must be positive")
    if within_band(value, measured, band, count=count):
        return Grade(GOOD, "Good", f"within the expected error of the measurement ({band.words})")
    ratio = value / measured if value > 0 else 0.0
    far = "above" if value > measured else "below"
    if value > 0 and 1 / FACTOR <= ratio <= FACTOR:
        return Grade(
            HARD,
            "Hard",
            f"{ratio:.2g}× the measurement: outside its expected error ({band.words}) but "
            f"within a factor of {FACTOR:g}",
        )
    how = f"{ratio:.2g}× the measurement" if value > 0 else "not a positive figure"
    return Grade(AGAIN, "Again", f"{how}, more than a factor of {FACTOR:g} {far} it")
