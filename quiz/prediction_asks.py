"""What one showing of a lab-question card asks, and how its answer grades (quiz/lab_questions.py
says how these cards come about). Kept apart from the services so that grading a card
(services._judge) can call it without a cycle."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from labs import api as labs_api
from quiz.models import Card, PredictionAsk, ReviewState, Showing

_PREFIX = "-q-"


def card_slug(user_id: int, question: str) -> str:
    return f"mine-{user_id}{_PREFIX}{question}"[:120]


def question_of(card: Card) -> str:
    """The lab question a prediction card asks ("" for any other card)."""
    if card.kind != Card.Kind.PREDICTION or _PREFIX not in card.slug:
        return ""
    return card.slug.split(_PREFIX, 1)[1]


def _turn(showing: Showing) -> int:
    """How many times the learner was asked this question before (their first review was the
    lab's, so the quiz's first ask is turn 0)."""
    reps = (
        ReviewState.objects.filter(user_id=showing.user_id, card_id=showing.card_id)
        .values_list("reps", flat=True)
        .first()
    )
    return max(int(reps or 0) - 1, 0)


def ask_for(card: Card, showing: Showing) -> PredictionAsk | None:
    """What this showing asks, fixed the first time it is shown; None when labs has nothing to
    grade an answer against (a retired question)."""
    found = PredictionAsk.objects.filter(showing=showing).first()
    if found is not None:
        return found
    question = question_of(card)
    turn = _turn(showing)
    asked = labs_api.question_ask(question, user_id=showing.user_id, turn=turn)
    if asked is None:
        return None
    asked["turn"] = turn
    try:
        with transaction.atomic():
            return PredictionAsk.objects.create(showing=showing, question=question, asked=asked)
    except IntegrityError:  # a second tab showed it at the same moment
        return PredictionAsk.objects.get(showing=showing)


def judge(card: Card, showing: Showing, answer: Any) -> tuple[str, bool | None]:
    """services._judge for a prediction card: the learner's figure graded by labs against what
    the showing asked. (answer text, True for Good, None for Hard, False for Again.)"""
    ask = PredictionAsk.objects.filter(showing=showing).first()
    if ask is None:
        return "", None  # recorded from a lab run: the caller writes the answer itself
    if answer.number is None or answer.number <= 0:
        PredictionAsk.objects.filter(pk=ask.pk).update(value=None, rating=1, grade_words="")
        return "", False
    # One kept prediction per turn of the card: an answer undone and given again replaces it.
    kept_as = f"card-{showing.card_id}-turn-{ask.asked.get('turn', 0)}"
    grade = labs_api.question_answer(
        owner=showing.user, asked=ask.asked, value=answer.number, token=kept_as
    )
    PredictionAsk.objects.filter(pk=ask.pk).update(
        value=answer.number, rating=grade["rating"], grade_words=grade["words"][:400]
    )
    text = labs_api.question_figure_text(ask.asked["figure"], answer.number)
    return text, {3: True, 1: False}.get(grade["rating"])


def today_context(card: Card, showing: Showing, context: dict[str, Any]) -> dict[str, Any]:
    """What Today's panel adds for a prediction card: the ask, and once answered the three
    figures side by side and the grade, which is the suggested button."""
    ask = ask_for(card, showing)
    if ask is None:
        return {"ask": None}
    if showing.revealed_at is not None:
        ask.refresh_from_db()
    asked = ask.asked
    figure = str(asked["figure"])
    extra: dict[str, Any] = {
        "ask": ask,
        "asked": asked,
        "run_url": labs_api.question_url(ask.question, int(asked["at"])),
        "measured_text": labs_api.question_figure_text(figure, asked.get("measured")),
        "formulas_text": labs_api.question_figure_text(figure, asked.get("formulas")),
        "yours_text": labs_api.question_figure_text(figure, ask.value) if ask.value else "",
        "rating_name": {1: "Again", 2: "Hard", 3: "Good"}.get(ask.rating or 0, ""),
    }
    buttons = context.get("buttons")
    if buttons and ask.rating:
        for button in buttons:
            button["suggested"] = button["rating"] == ask.rating
    return extra
