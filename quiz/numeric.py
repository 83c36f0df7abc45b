"""How close a numeric answer must be, one rule for the quiz's grading, its pages and the Anki
export.

A card's tolerance is absolute, in its unit. A question that asks for a rough figure ("by
roughly what factor", "approximately how many") is graded as rough: an answer within
ROUGH_SHARE of the value is right too (21× asked roughly accepts 20× and 22×), whatever tighter
tolerance the card's author wrote for the exact working.
"""

from __future__ import annotations

import re

ROUGH_SHARE = 0.05
ROUGH_WORDING = re.compile(
    r"\b(roughly|approximately|about how (much|many|long|big)|estimate)\b|≈\s*what",
    re.IGNORECASE,
)


def asks_roughly(prompt: str) -> bool:
    return bool(ROUGH_WORDING.search(prompt or ""))


def accepted_tolerance(value: float | None, tolerance: float | None, prompt: str) -> float:
    """The distance from `value` an answer may be and still be right."""
    given = tolerance or 0.0
    if value is None or not asks_roughly(prompt):
        return given
    return max(given, abs(value) * ROUGH_SHARE)


def answer_accepted(
    answer: float, value: float | None, tolerance: float | None, prompt: str
) -> bool:
    if value is None:
        return False
    return abs(answer - value) <= accepted_tolerance(value, tolerance, prompt)


def tolerance_text(value: float | None, tolerance: float | None, prompt: str, unit: str) -> str:
    """'±5 %' for a rough question the share decides, '±0.5 KiB' or '±1×' otherwise; '' for an
    exact answer."""
    from quiz.templatetags.quiz_tags import num, with_unit

    accepted = accepted_tolerance(value, tolerance, prompt)
    if not accepted:
        return ""
    if accepted > (tolerance or 0.0):
        return f"±{num(ROUGH_SHARE * 100)}\u00a0%"
    return f"±{with_unit(num(accepted), unit)}"
