"""Today's queue: order, daily limits, learn-ahead, follow-ups; stats."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from quiz import selectors, services
from quiz.models import FsrsState
from tests.quiz.factories import at, make_card, make_review_state, make_settings, review

pytestmark = pytest.mark.django_db
NOW = at(2026, 6, 1, 9)


def test_it_puts_due_reviews_before_new_cards(alice):
    new = make_card()
    due = make_card()
    make_review_state(alice, due, due=NOW - dt.timedelta(days=1))
    queue = selectors.queue_today(user=alice, now=NOW)
    assert (queue.review_left, queue.new_left, queue.next_card_id) == (1, 1, due.pk)
    review(alice, due, 3, NOW)
    assert selectors.queue_today(user=alice, now=NOW).next_card_id == new.pk


def test_it_says_whether_the_next_card_is_new_without_a_state_yet(alice):
    due, new = make_card(), make_card()
    make_review_state(alice, due, due=NOW - dt.timedelta(days=1))
    assert not selectors.queue_today(user=alice, now=NOW).next_is_new  # a review comes first
    review(alice, due, 3, NOW)
    queue = selectors.queue_today(user=alice, now=NOW)
    assert (queue.next_card_id, queue.next_is_new) == (new.pk, True)
    # Shown once, never answered: new still, but with a state (and maybe a showing to reuse).
    services.showing_open(user=alice, card=new, now=NOW)
    queue = selectors.queue_today(user=alice, now=NOW)
    assert (queue.next_card_id, queue.next_is_new) == (new.pk, False)
    assert not selectors.queue_today(user=alice, now=NOW, pick_next=False).next_is_new


def test_it_stops_new_cards_at_the_daily_new_limit(alice):
    make_settings(alice, new_per_day=2)
    cards = [make_card() for _ in range(4)]
    assert selectors.queue_today(user=alice, now=NOW).new_left == 2
    review(alice, cards[0], 4, NOW)
    review(alice, cards[1], 4, NOW)
    queue = selectors.queue_today(user=alice, now=NOW)
    assert queue.new_left == 0 and queue.next_card_id is None
    # The quota comes back with the next study day (04:00 UTC by default).
    tomorrow = selectors.queue_today(user=alice, now=at(2026, 6, 2, 4))
    assert tomorrow.new_left == 2


def test_it_stops_reviews_at_the_daily_review_limit_and_new_cards_with_them(alice):
    make_settings(alice, reviews_per_day=2, new_per_day=5)
    make_card()  # a new card, held back because reviews fill the day
    due = [make_card() for _ in range(3)]
    for card in due:
        make_review_state(alice, card, due=NOW - dt.timedelta(hours=1))
    queue = selectors.queue_today(user=alice, now=NOW)
    assert (queue.review_left, queue.new_left) == (2, 0)
    review(alice, due[0], 3, NOW)
    review(alice, due[1], 3, NOW)
    queue = selectors.queue_today(user=alice, now=NOW)
    assert (queue.review_left, queue.new_left, queue.next_card_id) == (0, 0, None)


def test_new_cards_answered_count_against_the_review_limit_so_the_counter_is_what_is_shown(alice):
    # 4 new a day and 3 reviews: "new left" said 3 while 4 new cards were shown.
    make_settings(alice, reviews_per_day=3, new_per_day=4)
    cards = {card.pk: card for card in (make_card() for _ in range(5))}
    counters, shown = [], 0
    queue = selectors.queue_today(user=alice, now=NOW)
    while queue.next_card_id is not None:
        counters.append(queue.new_left)
        review(alice, cards[queue.next_card_id], 4, NOW)  # Easy: no learning step
        shown += 1
        queue = selectors.queue_today(user=alice, now=NOW)
    assert counters == [3, 2, 1] and shown == 3 and queue.new_left == 0


def test_it_shows_learning_cards_early_only_when_nothing_else_is_left(alice):
    learning, other = make_card(), make_card()
    review(alice, learning, 3, NOW)  # due again in 10 minutes
    soon = NOW + dt.timedelta(minutes=1)
    assert selectors.queue_today(user=alice, now=soon).next_card_id == other.pk
    review(alice, other, 4, soon)  # Easy: graduates, nothing else is left
    queue = selectors.queue_today(user=alice, now=soon)
    assert (queue.next_card_id, queue.learning_left) == (learning.pk, 1)


def test_a_card_failed_with_again_counts_as_learning_at_once(alice):
    failed, other = make_card(), make_card()
    review(alice, failed, 1, NOW)  # Again: back in a minute or more, not due this instant
    queue = selectors.queue_today(user=alice, now=NOW)
    assert queue.next_card_id == other.pk and queue.learning_left == 0
    assert queue.learning_today == 1


def test_it_says_when_a_learning_card_comes_back_beyond_the_learn_ahead_limit(alice):
    card = make_card()
    make_review_state(
        alice, card, due=NOW + dt.timedelta(hours=1), state=FsrsState.RELEARNING, step=0
    )
    queue = selectors.queue_today(user=alice, now=NOW)
    assert queue.next_card_id is None and queue.next_learning_due == NOW + dt.timedelta(hours=1)


def test_it_waits_with_a_follow_up_until_its_parent_was_reviewed(alice):
    parent = make_card()
    child = make_card(parent=parent)
    make_settings(alice, new_per_day=10)
    assert selectors.queue_today(user=alice, now=NOW).new_left == 1
    review(alice, parent, 4, NOW)
    queue = selectors.queue_today(user=alice, now=NOW)
    assert (queue.new_left, queue.next_card_id) == (1, child.pk)


def test_it_skips_suspended_and_retired_cards(alice):
    suspended, retired = make_card(), make_card(is_active=False)
    make_review_state(alice, suspended, due=NOW, suspended=True)
    make_review_state(alice, retired, due=NOW)
    queue = selectors.queue_today(user=alice, now=NOW)
    assert queue.total_left == 0 and queue.next_card_id is None


def test_it_keeps_each_learners_queue_apart(alice, bob):
    card = make_card()
    make_review_state(alice, card, due=NOW)
    assert selectors.queue_today(user=alice, now=NOW).review_left == 1
    bob_queue = selectors.queue_today(user=bob, now=NOW)
    assert (bob_queue.review_left, bob_queue.new_left) == (0, 1)


def test_it_computes_true_retention_from_first_reviews_each_day(alice):
    card_a = make_card(tags=("kv-memory",))
    card_b = make_card(tags=("batching",))
    make_review_state(alice, card_a, due=NOW)
    make_review_state(alice, card_b, due=NOW)
    review(alice, card_a, 1, NOW)  # first review today: a fail
    review(alice, card_b, 3, NOW)  # a pass
    review(alice, card_a, 3, NOW + dt.timedelta(minutes=10))  # a relearning step: not counted
    stats = selectors.stats_for(user=alice, now=NOW + dt.timedelta(minutes=11))
    assert stats.true_retention == 0.5 and stats.true_retention_n == 2
    assert stats.reviews_per_day[-1] == 3 and stats.again_per_day[-1] == 1
    assert stats.streak == 1
    assert [(t.tag, t.pass_rate) for t in stats.weak_tags] == [
        ("kv-memory", 0.0),
        ("batching", 1.0),
    ]


def test_it_forecasts_due_cards_per_study_day_with_overdue_ones_today(alice):
    for due in (
        NOW - dt.timedelta(days=3),
        NOW + dt.timedelta(hours=2),
        NOW + dt.timedelta(days=2),
    ):
        make_review_state(alice, make_card(), due=due)
    make_review_state(alice, make_card(), due=NOW + dt.timedelta(days=40))
    forecast = selectors.stats_for(user=alice, now=NOW).forecast
    assert len(forecast) == 30 and forecast[:3] == [2, 0, 1] and sum(forecast) == 3


def test_it_counts_a_streak_of_consecutive_study_days(alice):
    for days_ago in (0, 1, 2, 4):
        review(alice, make_card(), 3, NOW - dt.timedelta(days=days_ago))
    assert selectors.stats_for(user=alice, now=NOW).streak == 3
    # Before today's first review the streak still counts up to yesterday.
    assert selectors.stats_for(user=alice, now=NOW + dt.timedelta(days=1)).streak == 3


def test_the_streak_query_returns_one_row_per_study_day_in_one_query(alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cards = [make_card() for _ in range(3)]
    for days_ago in (0, 1, 3):
        for card in cards:  # three reviews on each of those days
            review(alice, card, 1, NOW - dt.timedelta(days=days_ago, minutes=card.pk))
    since = NOW.date() - dt.timedelta(days=400)
    with CaptureQueriesContext(connection) as ctx:
        days = selectors.studied_dates(user=alice, since=since)
    assert len(ctx) == 1
    # Nine log rows, three days: distinct over the day alone, not the log's default ordering.
    assert sorted(days) == sorted(set(days)) and len(days) == 3
    assert "reviewed_at" not in ctx.captured_queries[0]["sql"].split("FROM")[0]


def test_a_card_is_read_once_per_process_until_it_is_edited(alice, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.QUIZ_CARD_CACHE_S = 60
    selectors.card_cache_clear()
    card = make_card("choice")
    first = selectors.card_for_quiz(card_id=card.pk)
    with CaptureQueriesContext(connection) as ctx:
        again = selectors.card_for_quiz(card_id=card.pk)
    assert len(ctx) == 0 and again is first
    option = first.options.all()[0]
    option.text = "Edited in the admin"
    option.save()  # the signal drops the copy
    edited = selectors.card_for_quiz(card_id=card.pk)
    assert edited is not first
    assert "Edited in the admin" in [o.text for o in edited.options.all()]
    settings.QUIZ_CARD_CACHE_S = 0
    selectors.card_cache_clear()


def test_the_card_cache_keeps_at_most_its_limit_dropping_the_oldest_read(alice, settings):
    settings.QUIZ_CARD_CACHE_S, settings.QUIZ_CARD_CACHE_MAX = 60, 3
    selectors.card_cache_clear()
    cards = [make_card() for _ in range(5)]
    for card in cards[:3]:
        selectors.card_for_quiz(card_id=card.pk)
    selectors.card_for_quiz(card_id=cards[0].pk, fresh=True)  # read again: now the newest
    for card in cards[3:]:
        selectors.card_for_quiz(card_id=card.pk)
    assert set(selectors._card_cache) == {cards[0].pk, cards[3].pk, cards[4].pk}
    # Expired copies go first, whatever their order.
    settings.QUIZ_CARD_CACHE_S = 1
    for key, (_, card) in list(selectors._card_cache.items()):
        if key != cards[4].pk:
            selectors._card_cache[key] = (time.monotonic() - 5, card)
    selectors.card_for_quiz(card_id=cards[1].pk)
    assert set(selectors._card_cache) == {cards[4].pk, cards[1].pk}
    settings.QUIZ_CARD_CACHE_S = 0
    selectors.card_cache_clear()
