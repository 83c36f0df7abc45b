"""The quiz's per-learner queries use indexes at 10,000 learners (PostgreSQL's planner, EXPLAIN).

Skipped on SQLite: its planner is not the production one.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from quiz import selectors
from quiz.models import FsrsState, ReviewLog, ReviewState
from tests.quiz.factories import at, make_card

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]
NOW = at(2026, 6, 1, 9)
LEARNERS = 10_000
CARDS = 5


@pytest.fixture
def crowd():
    if connection.vendor != "postgresql":
        pytest.skip("EXPLAIN is checked on PostgreSQL")
    User = get_user_model()
    users = User.objects.bulk_create(
        User(username=f"learner{i}", password="!")
        for i in range(LEARNERS)  # noqa: S106
    )
    cards = [make_card() for _ in range(CARDS)]
    ReviewState.objects.bulk_create(
        ReviewState(
            user=u,
            card=c,
            state=FsrsState.REVIEW,
            due=NOW + dt.timedelta(days=(u.pk + c.pk) % 20 - 5),
            last_review=NOW - dt.timedelta(days=3),
            stability=5.0,
            difficulty=5.0,
        )
        for u in users
        for c in cards
    )
    ReviewLog.objects.bulk_create(
        ReviewLog(
            user=u,
            card=c,
            rating=3,
            kind=2,
            reviewed_at=NOW - dt.timedelta(days=c.pk % 7),
            study_date=(NOW - dt.timedelta(days=c.pk % 7)).date(),
            duration_ms=1000,
            state_before={},
            token=f"t{u.pk}-{c.pk}",
        )
        for u in users
        for c in cards
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return users


def _plans(queries) -> list[tuple[str, str]]:
    out = []
    with connection.cursor() as cursor:
        for query in queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN " + sql)
            out.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
    return out


def test_the_queue_and_the_streak_read_one_learner_through_indexes(crowd):
    learner = crowd[LEARNERS // 2]
    with CaptureQueriesContext(connection) as ctx:
        selectors.queue_today(user=learner, now=NOW)
        selectors.studied_dates(user=learner, since=NOW.date() - dt.timedelta(days=400))
    plans = _plans(ctx.captured_queries)
    assert len(plans) == 3  # the settings, the queue (one query), the streak
    for sql, plan in plans:
        for table in ("quiz_reviewstate", "quiz_reviewlog"):
            assert f"Seq Scan on {table}" not in plan, f"{sql}\n{plan}"
    joined = "\n".join(plan for _, plan in plans)
    # Which of the review-state indexes on the learner the planner picks depends on its
    # statistics (user and due, user and card, or the user foreign key); any of them will do.
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'quiz_reviewstate'")
        state_indexes = {row[0] for row in cursor.fetchall()} - {"quiz_reviewstate_pkey"}
    assert any(name in joined for name in state_indexes), joined
    assert "quiz_log_user_day" in joined, joined


def test_the_showing_reveal_and_grade_read_one_learner_through_indexes(crowd):
    from quiz import services
    from quiz.models import Card, Showing

    # Every learner has an open showing of every card, as after a busy day.
    Showing.objects.bulk_create(
        Showing(
            user_id=state.user_id,
            card_id=state.card_id,
            token=f"s{state.user_id}-{state.card_id}",
            created_at=NOW - dt.timedelta(hours=1),
            state_version=0,
        )
        for state in ReviewState.objects.all().only("user_id", "card_id")
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    learner = crowd[LEARNERS // 2]
    card = Card.objects.order_by("id").first()
    with CaptureQueriesContext(connection) as ctx:
        showing = services.showing_open(user=learner, card=card, now=NOW)
        services.showing_reveal(
            user=learner, token=showing.token, answer=services.Answer(), now=NOW
        )
        services.review_grade(user=learner, token=showing.token, rating=3, now=NOW)
    plans = _plans(ctx.captured_queries)
    # The loop's own reads: the open showing with its state, then (reveal, grade) the showing with
    # its state and the card's last review; the rest read the card and the settings.
    ours = [sql for sql, _ in plans if sql.startswith(("SELECT rs.version", 'SELECT sh."id"'))]
    assert len(ours) == 3, [sql[:60] for sql, _ in plans]
    for sql, plan in plans:
        for table in ("quiz_reviewstate", "quiz_reviewlog", "quiz_showing"):
            assert f"Seq Scan on {table}" not in plan, f"{sql}\n{plan}"
