"""How close a numeric answer must be, one rule for the quiz's grading, its pages and the Anki
export.

A card's tolerance is absolute, in its unit. A figure is rough when the question asks for a
rough one ("by roughly what factor", "approximately how many"), or when the card's answer opens
by giving the card's own figure as approximate ("About 4.8 ms": worked from rounded inputs, it
is no more exact than that) and the author allowed some tolerance (a tolerance of 0 asks for an
exact count: "About 54 conversations" fit, and 55 do not). A rough figure is graded as such: an
answer within ROUGH_SHARE of the value is right too (21× asked roughly accepts 20× and 22×;
"About 4.8 ms" accepts 5 ms), whatever tighter tolerance the author wrote for the exact working.
"""

from __future__ import annotations

import re

ROUGH_SHARE = 0.05
ROUGH_WORDING = re.compile(
    r"\b(roughly|approximately|about how (much|many|long|big)|estimate)\b|≈\s*what",
    re.IGNORECASE,
)


# A card's answer that opens with a figure given as approximate, and that figure.
ROUGH_ANSWER = re.compile(
    r"^\W*(?:about|approximately|roughly|around|≈|~)\s*(\d[\d,]*(?:\.\d+)?)", re.IGNORECASE
)


def asks_roughly(prompt: str) -> bool:
    return bool(ROUGH_WORDING.search(prompt or ""))


def answers_roughly(answer: str, value: float | None, tolerance: float | None) -> bool:
    """The card's answer gives its own figure (`value`) as approximate, and the author allowed
    a tolerance: "About 4.8 ms" for 4.8 ± 0.1, not "About 38 replicas × 4 = 152 GPUs" for 152."""
    found = ROUGH_ANSWER.search(answer or "")
    if found is None or value is None or not tolerance:
        return False
    return float(found.group(1).replace(",", "")) == value


def accepted_tolerance(
    value: float | None, tolerance: float | None, prompt: str, answer: str = ""
) -> float:
    """The distance from `value` an answer may be and still be right (`prompt` and `answer`:
    the card's, which say whether the figure is a rough one)."""
    given = tolerance or 0.0
    rough = asks_roughly(prompt) or answers_roughly(answer, value, tolerance)
    if value is None or not rough:
        return given
    return max(given, abs(value) * ROUGH_SHARE)


def answer_accepted(
    given: float, value: float | None, tolerance: float | None, prompt: str, answer: str = ""
) -> bool:
    if value is None:
        return False
    return abs(given - value) <= accepted_tolerance(value, tolerance, prompt, answer)


def tolerance_text(
    value: float | None, tolerance: float | None, prompt: str, unit: str, answer: str = ""
) -> str:
    """'±5 %' for a rough figure the share decides, '±0.5 KiB' or '±1×' otherwise; '' for an
    exact answer."""
    from quiz.templatetags.quiz_tags import num, with_unit

    accepted = accepted_tolerance(value, tolerance, prompt, answer)
    if not accepted:
        return ""
    if accepted > (tolerance or 0.0):
        return f"±{num(ROUGH_SHARE * 100)}\u00a0%"
    return f"±{with_unit(num(accepted), unit)}"
