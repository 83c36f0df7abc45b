"""FSRS through our layer: a card's path over days (frozen clock), study days across DST, labels."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from quiz import scheduling, selectors, services
from quiz.models import FsrsState, ReviewLog, ReviewState
from quiz.scheduling import CardState
from tests.quiz.factories import at, make_card, make_review_state, make_settings, review, show

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def _state(user, card) -> ReviewState:
    return ReviewState.objects.get(user=user, card=card)


@pytest.mark.django_db
def test_it_walks_a_card_through_learning_graduation_a_lapse_and_relearning(alice):
    card = make_card("recall")
    t0 = at(2026, 3, 2, 9)

    review(alice, card, 3, t0)  # new -> second learning step (10 min)
    state = _state(alice, card)
    assert (state.state, state.step, state.due) == (
        FsrsState.LEARNING,
        1,
        t0 + dt.timedelta(minutes=10),
    )
    assert state.last_review == t0 and state.reps == 1

    t1 = t0 + dt.timedelta(minutes=10)
    review(alice, card, 3, t1)  # last step -> graduates to Review, whole days
    state = _state(alice, card)
    assert state.state == FsrsState.REVIEW and state.step is None
    first_interval = state.due - t1
    assert first_interval >= dt.timedelta(days=1)
    assert first_interval == dt.timedelta(days=first_interval.days)

    t2 = state.due + dt.timedelta(hours=1)
    review(alice, card, 3, t2)  # a successful review: the interval grows
    state = _state(alice, card)
    assert state.state == FsrsState.REVIEW
    assert state.due - t2 > first_interval
    stability_before_lapse = state.stability

    t3 = state.due
    review(alice, card, 1, t3)  # forgotten: a lapse, into relearning (10 min step)
    state = _state(alice, card)
    assert (state.state, state.step, state.lapses) == (FsrsState.RELEARNING, 0, 1)
    assert state.due == t3 + dt.timedelta(minutes=10)
    assert state.stability < stability_before_lapse

    t4 = t3 + dt.timedelta(minutes=10)
    review(alice, card, 3, t4)  # relearned: back to Review
    state = _state(alice, card)
    assert (state.state, state.step, state.lapses, state.reps) == (FsrsState.REVIEW, None, 1, 5)
    assert state.due - t4 >= dt.timedelta(days=1)

    kinds = list(ReviewLog.objects.order_by("reviewed_at").values_list("kind", flat=True))
    assert kinds == [
        ReviewLog.Kind.NEW,
        ReviewLog.Kind.LEARNING,
        ReviewLog.Kind.REVIEW,
        ReviewLog.Kind.REVIEW,
        ReviewLog.Kind.RELEARNING,
    ]


@pytest.mark.django_db
def test_it_applies_exactly_the_outcome_each_button_showed_even_with_fuzz(alice):
    # Fuzz is random per call; the outcome stored at reveal is the one applied.
    for rating in (1, 2, 3, 4):
        card = make_card("recall")
        now = at(2026, 5, 1, 12)
        make_review_state(
            alice, card, due=now, stability=30.0, last_review=now - dt.timedelta(days=30)
        )
        showing = show(alice, card, now)
        shown = CardState.from_json(showing.outcomes[str(rating)])
        label = scheduling.format_interval(shown.due - showing.revealed_at)
        services.review_grade(user=alice, token=showing.token, rating=rating, now=now)
        state = _state(alice, card)
        assert state.due == shown.due and state.stability == shown.stability
        assert scheduling.format_interval(state.due - now) == label


def test_it_rejects_zoneinfo_utc_by_converting_it_first():
    # py-fsrs refuses ZoneInfo("UTC"); our layer always hands it datetime.UTC.
    now = dt.datetime(2026, 1, 1, 12, tzinfo=ZoneInfo("UTC"))
    state = scheduling.new_card_state(now)
    result = scheduling.outcomes(
        state, card_id=1, now=now, scheduler=scheduling.make_scheduler(0.9)
    )
    assert result[3].due.tzinfo is dt.UTC
    assert result[1].due - scheduling.to_utc(now) == dt.timedelta(minutes=1)


@pytest.mark.parametrize(
    ("instant", "expected"),
    [
        # Spring forward in Berlin (29 March 2026, 02:00 CET -> 03:00 CEST): day 28 is 23 h long.
        (at(2026, 3, 28, 2, 59), dt.date(2026, 3, 27)),
        (at(2026, 3, 28, 3, 0), dt.date(2026, 3, 28)),  # 04:00 CET
        (at(2026, 3, 29, 1, 59), dt.date(2026, 3, 28)),
        (at(2026, 3, 29, 2, 0), dt.date(2026, 3, 29)),  # 04:00 CEST
        # Fall back (25 October 2026): day 25 starts at 04:00 CET = 03:00 UTC.
        (at(2026, 10, 25, 2, 59), dt.date(2026, 10, 24)),
        (at(2026, 10, 25, 3, 0), dt.date(2026, 10, 25)),
    ],
)
def test_it_starts_the_study_day_at_the_rollover_hour_across_dst(instant, expected):
    assert scheduling.study_date(instant, BERLIN, 4) == expected


def test_it_starts_the_day_after_a_rollover_hour_that_dst_skips():
    # New York skips 02:00-03:00 on 8 March 2026; a 2 AM rollover starts the day at 03:00 EDT.
    start = scheduling.day_start(dt.date(2026, 3, 8), NEW_YORK, 2)
    assert start == at(2026, 3, 8, 7)
    assert scheduling.study_date(at(2026, 3, 8, 6, 59), NEW_YORK, 2) == dt.date(2026, 3, 7)
    assert scheduling.study_date(at(2026, 3, 8, 7, 0), NEW_YORK, 2) == dt.date(2026, 3, 8)
    day = scheduling.day_start(dt.date(2026, 3, 7), NEW_YORK, 2)
    assert start - day == dt.timedelta(hours=24)  # 02:00 EST to 03:00 EDT is 24 real hours


@pytest.mark.django_db
def test_it_counts_a_review_due_before_the_rollover_as_due_today_across_dst(alice):
    make_settings(alice, time_zone="Europe/Berlin", rollover_hour=4)
    evening = at(2026, 3, 28, 20)  # 21:00 CET on the 28th
    before_rollover = make_card()
    after_rollover = make_card()
    make_review_state(alice, before_rollover, due=at(2026, 3, 29, 1, 30))  # 03:30 CEST
    make_review_state(alice, after_rollover, due=at(2026, 3, 29, 2, 30))  # 04:30 CEST
    queue = selectors.queue_today(user=alice, now=evening)
    assert queue.day.date == dt.date(2026, 3, 28)
    assert queue.day.end == at(2026, 3, 29, 2)
    assert queue.review_left == 1 and queue.next_card_id == before_rollover.pk

    # Reviewed at 03:45 CEST it still belongs to the 28th, and the log keeps that date.
    log = review(alice, before_rollover, 3, at(2026, 3, 29, 1, 45))
    assert log.study_date == dt.date(2026, 3, 28)
    next_morning = selectors.queue_today(user=alice, now=at(2026, 3, 29, 2, 0))
    assert next_morning.day.date == dt.date(2026, 3, 29)
    assert next_morning.next_card_id == after_rollover.pk


@pytest.mark.parametrize(
    ("delta", "label"),
    [
        (dt.timedelta(seconds=30), "<1m"),
        (dt.timedelta(minutes=1), "1m"),
        (dt.timedelta(minutes=5, seconds=30), "6m"),
        (dt.timedelta(hours=5), "5h"),
        (dt.timedelta(days=8), "8d"),
        (dt.timedelta(days=45), "1.5mo"),
        (dt.timedelta(days=730), "2y"),
    ],
)
def test_it_labels_intervals_in_ankis_units(delta, label):
    assert scheduling.format_interval(delta) == label


def test_it_flags_a_leech_at_eight_lapses_then_every_four():
    assert [n for n in range(1, 21) if scheduling.is_leech_event(n)] == [8, 12, 16, 20]
