"""quiz/numeric.py: one rule for how close a numeric answer must be."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.urls import reverse

from quiz import services
from quiz.models import Card
from quiz.numeric import (
    accepted_tolerance,
    answer_accepted,
    answers_roughly,
    asks_roughly,
    tolerance_text,
)
from tests.quiz.factories import at, make_card

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


@pytest.mark.parametrize(
    ("answer", "value", "tolerance", "rough"),
    [
        ("About 4.8 ms per token (≈ 210 tokens/s ideal)", 4.8, 0.1, True),
        ("≈ 2.53 tokens per pass", 2.53, 0.01, True),
        ("~1,748 slots", 1748, 10, True),
        ("128 KiB per token (131,072 bytes).", 128, 0.5, False),
        # "About" qualifies another figure than the card's.
        ("About 38 replicas × 4 = 152 GPUs", 152, 2, False),
        ("About 64 % (1,748 of 2,748 slots).", 63.6, 0.5, False),
        # A tolerance of 0 asks for an exact count, however the answer words it.
        ("About 54 conversations.", 54, 0, False),
        # "about" later in the answer qualifies something else.
        ("1,748 slots (of 2,748 reserved, about 64 %)", 1748, 10, False),
    ],
)
def test_it_reads_a_rough_figure_from_how_the_answer_gives_it(answer, value, tolerance, rough):
    assert answers_roughly(answer, value, tolerance) is rough


def test_an_answer_that_says_about_accepts_answers_within_five_percent():
    # "5 ms" was graded wrong for 4.8 ms (±0.1 ms), whose answer says "About 4.8 ms": the figure
    # is worked from "about 16 GB" of weights, so it is no more exact than that.
    exact_prompt = "What is the ideal time of one decode step at batch 1?"
    answer = "About 4.8 ms per token"
    assert answer_accepted(5, 4.8, 0.1, exact_prompt, answer)
    assert not answer_accepted(5.1, 4.8, 0.1, exact_prompt, answer)
    assert not answer_accepted(5, 4.8, 0.1, exact_prompt, "4.8 ms per token")
    assert tolerance_text(4.8, 0.1, exact_prompt, "ms", answer) == "±5\u00a0%"


@pytest.mark.django_db
def test_the_decks_decode_step_card_accepts_five_ms(alice):
    call_command("load_content", stdout=io.StringIO())
    card = Card.objects.get(slug="decode-step-llama3-8b-h100-batch1")
    assert (card.numeric_value, card.numeric_tolerance) == (4.8, 0.1)
    showing = services.showing_open(user=alice, card=card, now=at(2026, 6, 1, 9))
    shown = services.showing_reveal(
        user=alice,
        token=showing.token,
        answer=services.Answer(number=5.0, raw="5"),
        now=at(2026, 6, 1, 9),
    )
    assert shown.correct is True
