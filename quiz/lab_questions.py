"""Lab questions in the quiz: a prediction graded in a lab is a review of that question, and the
quiz asks it again at a neighbouring setting when FSRS says it is due.

Each learner who committed a prediction gets one personal card per question (kind "prediction",
in the "my-runs" deck, owned by them): its review state, log, undo and place in Today's queue are
the quiz's own, as for any card. Labs tells the quiz of a graded prediction through labs.hooks
(`prediction_graded`, registered in QuizConfig.ready); the quiz reaches labs only through
labs.api, in plain data:

- a graded prediction is recorded as a review with labs' rating (Again, Hard or Good);
- when the card is shown, labs says what to ask (`question_ask`: a neighbouring point whose
  simulation is stored, in turn; else the learner's own run) and the showing keeps it
  (`PredictionAsk`), so a reload asks the same and the answer is graded against what was shown;
- the answer is graded by labs (`question_answer`: within the band Good, within a factor of 2
  Hard, else Again), and that grade is the suggested button (quiz/prediction_asks.py).
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from labs import api as labs_api
from quiz import services
from quiz.models import Card, Showing, personal_deck
from quiz.prediction_asks import card_slug

logger = logging.getLogger(__name__)


def _card_for(user: Any, question: str, title: str) -> Card:
    """The learner's card of the question, made (or reactivated) now."""
    slug = card_slug(user.pk, question)
    found = Card.objects.filter(slug=slug, owner=user).first()
    if found is not None:
        if not found.is_active:
            found.is_active = True
            found.save(update_fields=["is_active", "updated_at"])
        return found
    deck = personal_deck()
    about = labs_api.question_card(question) or {}
    prompt = f"Predict: {title}."
    if about.get("prompt"):
        prompt += f"\n\n{about['prompt']}"
    try:
        with transaction.atomic():
            return Card.objects.create(
                owner=user,
                deck=deck,
                slug=slug,
                kind=Card.Kind.PREDICTION,
                prompt=prompt,
                answer="Graded against a simulation of the setting asked, made on the lab worker.",
                source=f"lab question “{title}”",
            )
    except IntegrityError:  # made meanwhile by another grade of the same learner
        return Card.objects.get(slug=slug, owner=user)


def prediction_graded(data: dict[str, Any]) -> bool:
    """labs.hooks.prediction_graded: record a graded prediction as a review of the learner's card
    of the question (made now if it is their first), with labs' rating. False (logged) when the
    card could not be graded now: suspended, or being answered in another tab."""
    user = get_user_model().objects.get(pk=data["user_id"])
    card = _card_for(user, str(data["question"]), str(data["title"]))
    now = timezone.now()
    showing = services.showing_open(user=user, card=card, now=now)
    try:
        services.showing_reveal(user=user, token=showing.token, answer=services.Answer(), now=now)
        # What the learner committed, as the review log's answer.
        correct = {3: True, 1: False}.get(int(data["rating"]))
        Showing.objects.filter(pk=showing.pk).update(answer=str(data["answer"]), correct=correct)
        try:
            services.review_grade(
                user=user, token=showing.token, rating=int(data["rating"]), now=now
            )
        except services.ShowingExpired:
            services.showing_reveal(
                user=user, token=showing.token, answer=services.Answer(), now=now, refresh=True
            )
            services.review_grade(
                user=user, token=showing.token, rating=int(data["rating"]), now=now
            )
    except services.QuizConflict as exc:
        logger.warning("prediction %s not recorded as a review: %s", data.get("prediction"), exc)
        return False
    return True
