"""Hand-written rows (config/rows.py) read and write exactly what the ORM would."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from config import rows
from quiz.models import ReviewLog, ReviewState, Showing
from tests.quiz.factories import make_card

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 6, 1, 9, 30, 15, 123456, tzinfo=dt.UTC)


def _read(model, pk):
    alias = "default"
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {rows.select_list(model, 't', alias)} FROM {table} t WHERE t.id = %s",  # noqa: S608
            [pk],
        )
        return rows.from_row(model, cursor.fetchone(), alias)


def _same_as_orm(ours, model) -> None:
    theirs = model.objects.get(pk=ours.pk)
    for field in model._meta.concrete_fields:
        assert getattr(ours, field.attname) == getattr(theirs, field.attname), field.name


def test_an_inserted_row_reads_back_through_the_orm_field_by_field(alice):
    card = make_card()
    log = ReviewLog(
        user_id=alice.pk,
        card_id=card.pk,
        rating=3,
        kind=ReviewLog.Kind.NEW,
        reviewed_at=NOW,
        study_date=NOW.date(),
        duration_ms=1234,
        answer="B. ünïcode “quotes”",
        correct=None,
        state_before={"due": NOW.isoformat(), "stability": None, "nested": [1, {"a": 2.5}]},
        token="tok-1",
    )
    assert rows.insert(log) is True
    assert log.pk is not None and not log._state.adding
    _same_as_orm(log, ReviewLog)
    # And read back by hand: aware datetimes, real dates, booleans and JSON, on SQLite too.
    ours = _read(ReviewLog, log.pk)
    _same_as_orm(ours, ReviewLog)
    assert ours.reviewed_at == NOW and ours.reviewed_at.tzinfo is not None
    assert ours.state_before["nested"] == [1, {"a": 2.5}] and ours.correct is None


def test_an_insert_unless_exists_leaves_the_row_there_alone(alice):
    card = make_card()
    first = ReviewState(user_id=alice.pk, card_id=card.pk, due=NOW, stability=1.5)
    assert rows.insert(first, unless_exists=("user", "card")) is True
    second = ReviewState(user_id=alice.pk, card_id=card.pk, due=NOW, stability=9.0)
    assert rows.insert(second, unless_exists=("user", "card")) is False
    assert second.pk is None
    assert ReviewState.objects.get().stability == 1.5


def test_an_update_sets_increments_and_holds_to_the_expected_version(alice):
    card = make_card()
    state = ReviewState.objects.create(user=alice, card=card, due=NOW, reps=4, version=7)
    later = NOW + dt.timedelta(days=3)
    changed = rows.update(
        ReviewState,
        state.pk,
        {"due": later, "stability": 3.25, "leech": True},
        increment=("reps", "version"),
        expect={"version": 7},
    )
    assert changed == 1
    state.refresh_from_db()
    assert (state.due, state.stability, state.leech, state.reps, state.version) == (
        later,
        3.25,
        True,
        5,
        8,
    )
    # A writer holding the old version changes nothing.
    assert rows.update(ReviewState, state.pk, {"stability": 0.1}, expect={"version": 7}) == 0
    state.refresh_from_db()
    assert state.stability == 3.25


def test_json_lists_go_in_and_come_out_as_the_orm_stores_them(alice):
    card = make_card()
    showing = Showing(user_id=alice.pk, card_id=card.pk, token="t", created_at=NOW, state_version=0)
    showing.option_order = [3, 1, 2]
    rows.insert(showing)
    rows.update(Showing, showing.pk, {"outcomes": {"1": {"due": "x"}, "retention": 0.9}})
    ours = _read(Showing, showing.pk)
    _same_as_orm(ours, Showing)
    assert ours.option_order == [3, 1, 2] and ours.outcomes["retention"] == 0.9
