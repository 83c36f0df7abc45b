"""quiz/numeric.py: one rule for how close a numeric answer must be."""

from __future__ import annotations

import pytest
from django.urls import reverse

from quiz.numeric import accepted_tolerance, answer_accepted, asks_roughly, tolerance_text
from tests.quiz.factories import make_card

ROUGH = "By roughly what factor does total decode throughput rise?"
EXACT = "How many KiB of KV does one token take?"


@pytest.mark.parametrize(
    ("prompt", "rough"),
    [
        (ROUGH, True),
        ("Approximately how many GPUs?", True),
        ("About how many blocks?", True),
        ("≈ what fraction is wasted?", True),
        (EXACT, False),
        ("What is the throughput, thoroughly measured?", False),
    ],
)
def test_it_reads_a_rough_question_from_its_wording(prompt, rough):
    assert asks_roughly(prompt) is rough


def test_a_rough_question_accepts_answers_within_five_percent():
    assert accepted_tolerance(21, 0.5, ROUGH) == pytest.approx(1.05)
    assert answer_accepted(20, 21, 0.5, ROUGH) and answer_accepted(22, 21, 0.5, ROUGH)
    assert not answer_accepted(19.9, 21, 0.5, ROUGH)
    assert tolerance_text(21, 0.5, ROUGH, "x") == "±5\u00a0%"


def test_an_exact_question_keeps_the_authors_tolerance_with_its_unit():
    assert not answer_accepted(20, 21, 0.5, EXACT)
    assert tolerance_text(64, 0.5, EXACT, "KiB") == "±0.5\u00a0KiB"
    assert tolerance_text(21, 1, EXACT, "x") == "±1×"
    assert tolerance_text(76, 0, EXACT, "GPUs") == ""
    # A wider tolerance than the share is kept for a rough question too.
    assert tolerance_text(21, 3, ROUGH, "x") == "±3×"


def test_the_card_page_says_what_the_grading_accepts(alice_client):
    card = make_card("numeric", prompt=ROUGH, numeric_value=21, numeric_unit="x")
    card.numeric_tolerance = 0.5
    card.save()
    html = alice_client.get(reverse("quiz:card-detail", args=[card.slug])).content.decode()
    assert "21× (±5\u00a0%)" in html
    assert card.numeric_accepts(20)
