"""Plain factory functions for quiz tests: make_<thing>(**overrides)."""

from __future__ import annotations

import datetime as dt
from itertools import count
from typing import Any

from quiz import services
from quiz.models import Card, ChoiceOption, Deck, LearnerSettings, ReviewLog, Showing, Tag

_seq = count(1)
UTC = dt.UTC


def make_deck(slug: str = "test-deck", **overrides: Any) -> Deck:
    deck, _ = Deck.objects.get_or_create(slug=slug, defaults={"title": "Test deck", **overrides})
    return deck


def make_card(kind: str = "recall", *, tags: tuple[str, ...] = (), **overrides: Any) -> Card:
    n = next(_seq)
    values: dict[str, Any] = {
        "deck": overrides.pop("deck", None) or make_deck(),
        "slug": f"card-{n}",
        "kind": kind,
        "prompt": f"Question {n}?",
        "answer": f"Answer {n}.",
        "steps": ["Step one.", "Step two."],
    }
    if kind == "numeric":
        values.update(numeric_value=128.0, numeric_unit="KiB", numeric_tolerance=0.5)
    values.update(overrides)
    card = Card.objects.create(**values)
    if kind == "choice":
        for position, (text, correct) in enumerate(
            [("Right", True), ("Wrong one", False), ("Wrong two", False)]
        ):
            ChoiceOption.objects.create(
                card=card,
                text=text,
                is_correct=correct,
                why="" if correct else "Because.",
                position=position,
            )
    for position, slug in enumerate(tags):
        tag, _ = Tag.objects.get_or_create(slug=slug)
        card.card_tags.create(tag=tag, position=position)
    return card


def make_settings(user, **overrides: Any) -> LearnerSettings:
    settings, _ = LearnerSettings.objects.update_or_create(user=user, defaults=overrides)
    return settings


def at(*args: int) -> dt.datetime:
    """A UTC instant: at(2026, 3, 1, 9) is 09:00 UTC on 1 March 2026."""
    return dt.datetime(*args, tzinfo=UTC)


def show(user, card: Card, now: dt.datetime, **answer: Any) -> Showing:
    """Show a card and reveal its answer, as the page does."""
    showing = services.showing_open(user=user, card=card, now=now)
    return services.showing_reveal(
        user=user, token=showing.token, answer=services.Answer(**answer), now=now
    )


def review(user, card: Card, rating: int, now: dt.datetime, **answer: Any) -> ReviewLog:
    """Show, reveal and grade one card at `now` (a frozen clock)."""
    showing = show(user, card, now, **answer)
    return services.review_grade(user=user, token=showing.token, rating=rating, now=now).log


def make_review_state(user, card: Card, *, due: dt.datetime, **overrides: Any):
    """A graduated (Review) card for `user`, due at `due`."""
    from quiz.models import FsrsState, ReviewState

    values: dict[str, Any] = {
        "state": FsrsState.REVIEW,
        "step": None,
        "stability": 10.0,
        "difficulty": 5.0,
        "due": due,
        "last_review": due - dt.timedelta(days=10),
        "reps": 3,
    }
    values.update(overrides)
    return ReviewState.objects.create(user=user, card=card, **values)


def synthetic_review_rows(user: Any, log: Any, card_pks: dict[int, int], token_prefix: str) -> Any:
    """The ReviewLog rows of a synthetic learner's log (tests/quiz/synthetic_learners.py), each
    review at 09:00 UTC of its study date, on the card row `card_pks` maps its card to."""
    return (
        ReviewLog(
            user=user,
            card_id=card_pks[r.card_id],
            rating=r.rating,
            kind=ReviewLog.Kind.REVIEW,
            reviewed_at=dt.datetime.combine(r.study_date, dt.time(9), tzinfo=UTC),
            study_date=r.study_date,
            duration_ms=5000,
            state_before={},
            token=f"{token_prefix}-{i}",
        )
        for i, r in enumerate(log)
    )
