"""Two grades of one card at the same moment, on two real database connections: one review."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import pytest
from django.db import connection, transaction

from quiz import services
from quiz.models import ReviewLog, ReviewState, Showing
from tests.quiz.factories import at, make_card, make_review_state, show
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


def staff_edit(state_id: int, stability: float) -> Callable[[], object]:
    """What the admin's save does: the state as read at that moment, saved with a new stability."""

    def save() -> float:
        state = ReviewState.objects.get(pk=state_id)
        state.stability = stability
        state.save()
        return stability

    return save


def test_a_grade_racing_an_admin_edit_leaves_exactly_one_of_them(alice):
    outcomes = set()
    for round_ in range(12):
        card = make_card()
        state = make_review_state(alice, card, due=NOW, stability=10.0)
        showing = show(alice, card, NOW)
        results = race(grader(alice, showing.token, 3), staff_edit(state.pk, 77.0))
        graded, edited = results
        after = ReviewState.objects.get(pk=state.pk)
        logs = ReviewLog.objects.filter(card=card).count()
        if isinstance(graded, services.GradeResult):
            # The grade came first: the edit either waited and was refused (it read the old
            # version), or read the graded row and was saved on top of it, a version later.
            assert logs == 1, round_
            if isinstance(edited, ReviewState.Changed):
                assert after.version == 1 and after.stability != 77.0
                outcomes.add("grade, edit refused")
            else:
                assert (after.version, after.stability) == (2, 77.0), results
                outcomes.add("grade, then edit")
        else:
            # The edit came first: the showing's version is stale and nothing is logged.
            assert isinstance(graded, services.QuizConflict), results
            assert edited == 77.0 and logs == 0
            assert (after.version, after.stability, after.reps) == (1, 77.0, 3)
            outcomes.add("edit, grade refused")
    print(f"\norders seen: {sorted(outcomes)}")  # which occur is up to the scheduler


def test_an_admin_edit_waits_for_a_grade_holding_the_row_and_is_refused(alice):
    """PostgreSQL's path exactly: the grade holds the row (SELECT ... FOR UPDATE); the edit's
    UPDATE ... WHERE version = read waits, then finds the version moved and changes nothing."""
    card = make_card()
    state = make_review_state(alice, card, due=NOW, stability=10.0)
    showing = show(alice, card, NOW)
    stale = ReviewState.objects.get(pk=state.pk)  # read before the grade
    locked, release = threading.Event(), threading.Event()

    def grade() -> object:
        with transaction.atomic():
            result = services.review_grade(user=alice, token=showing.token, rating=3, now=NOW)
            locked.set()
            release.wait(timeout=10)
        return result

    def edit() -> object:
        locked.wait(timeout=10)
        timer = threading.Timer(0.5, release.set)  # the edit is blocked on the row meanwhile
        timer.start()
        stale.stability = 1.0
        stale.save()
        return "saved"

    graded, edited = race(grade, edit)
    assert isinstance(graded, services.GradeResult), graded
    assert isinstance(edited, ReviewState.Changed), edited
    after = ReviewState.objects.get(pk=state.pk)
    assert (after.version, after.reps) == (1, 4) and after.stability != 1.0
