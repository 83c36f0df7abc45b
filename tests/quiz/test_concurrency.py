"""Two grades of one card at the same moment, on two real database connections: one review."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
from django.db import connection

from quiz import services
from quiz.models import ReviewLog, ReviewState, Showing
from tests.quiz.factories import at, make_card, show
from tests.threads import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
NOW = at(2026, 6, 1, 9)


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row locking is exercised on PostgreSQL (SQLite serialises all writers)")


def grader(user, token: str, rating: int) -> Callable[[], object]:
    return partial(services.review_grade, user=user, token=token, rating=rating, now=NOW)


def test_it_grades_once_when_two_requests_carry_the_same_token(alice):
    for round_ in range(10):
        card = make_card()
        showing = show(alice, card, NOW)
        results = race(grader(alice, showing.token, 3), grader(alice, showing.token, 1))
        assert all(isinstance(r, services.GradeResult) for r in results), results
        assert sorted(r.replayed for r in results) == [False, True], round_
        assert results[0].log.pk == results[1].log.pk
        assert ReviewLog.objects.filter(card=card).count() == 1
        assert ReviewState.objects.get(user=alice, card=card).reps == 1


def test_it_grades_once_when_two_tabs_grade_the_same_card(alice):
    for round_ in range(10):
        card = make_card()
        one = show(alice, card, NOW)
        Showing.objects.create(
            user=alice, card=card, token=f"tab-two-{round_}", created_at=NOW, state_version=0
        )
        two = services.showing_reveal(
            user=alice, token=f"tab-two-{round_}", answer=services.Answer(), now=NOW
        )
        results = race(grader(alice, one.token, 3), grader(alice, two.token, 4))
        graded = [r for r in results if isinstance(r, services.GradeResult)]
        refused = [r for r in results if isinstance(r, services.QuizConflict)]
        assert (len(graded), len(refused)) == (1, 1), results
        assert ReviewLog.objects.filter(card=card).count() == 1
        state = ReviewState.objects.get(user=alice, card=card)
        assert (state.reps, state.version) == (1, 1)
