"""Reads: today's queue, the card to show, stats, and the deck as content specs.

Every function here runs a fixed number of queries whatever the deck size (a test counts them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import connection
from django.db.models import Count, Prefetch, Q
from django.urls import NoReverseMatch, reverse
from django.utils.dateparse import parse_datetime

from quiz import scheduling
from quiz.content import CardSpec, ContentTree, DeckSpec, OptionSpec
from quiz.models import (
    PERSONAL_DECK,
    Card,
    CardRelation,
    CardTag,
    ChoiceOption,
    Deck,
    FsrsState,
    LearnerSettings,
    ReviewLog,
    ReviewState,
    Showing,
)

INTRADAY = (FsrsState.LEARNING, FsrsState.RELEARNING)


def learner_settings_get(*, user: AbstractBaseUser) -> LearnerSettings:
    """The learner's settings, or unsaved defaults (reading a page must not write). A request's
    user has them already (config.backends loads them with it); else one query, kept on `user`."""
    relation = get_user_model().quiz_settings  # `user` may be a request's lazy proxy
    if not relation.is_cached(user):
        found = LearnerSettings.objects.filter(user=user).first()
        relation.related.set_cached_value(user, found)
    try:
        return user.quiz_settings
    except LearnerSettings.DoesNotExist:
        return LearnerSettings(user=user)


@dataclass(frozen=True)
class StudyDay:
    tz: ZoneInfo
    rollover_hour: int
    date: dt.date
    start: dt.datetime
    end: dt.datetime


def study_day_for(settings: LearnerSettings, now: dt.datetime) -> StudyDay:
    tz = ZoneInfo(settings.time_zone)
    day = scheduling.study_date(now, tz, settings.rollover_hour)
    if settings.day_floor and settings.day_floor > day:  # see scheduling.Context.day_floor
        day = settings.day_floor
    return StudyDay(
        tz=tz,
        rollover_hour=settings.rollover_hour,
        date=day,
        start=scheduling.day_start(day, tz, settings.rollover_hour),
        end=scheduling.day_start(day + dt.timedelta(days=1), tz, settings.rollover_hour),
    )


@dataclass(frozen=True)
class TodayQueue:
    settings: LearnerSettings
    day: StudyDay
    new_left: int
    learning_left: int
    review_left: int
    next_card_id: int | None
    # When nothing is left now but a learning card comes due later today.
    next_learning_due: dt.datetime | None
    # Reviews logged this study day, any kind (there is something to undo when > 0).
    reviewed_today: int = 0
    # Learning and relearning cards that come back before the day ends, due now or not: the
    # "learning" counter (a card just failed with Again counts at once, as in Anki).
    learning_today: int = 0
    # The next card is new and has no state yet: showing it makes one (no showing to reuse).
    next_is_new: bool = False

    @property
    def total_left(self) -> int:
        return self.new_left + self.learning_left + self.review_left


def _visible_to(user: AbstractBaseUser) -> Q:
    """The shared deck's cards and the learner's own personal cards, never anyone else's."""
    return Q(owner__isnull=True) | Q(owner=user)


# The queue in one round trip (the quiz's hottest read: every fetch, answer and grade needs it).
# Hand-written because the ORM spent more CPU building these aggregates than the database spent
# running them. Portable between PostgreSQL and SQLite (both run the suite).
_LIVE_STATES = f"""
    FROM {ReviewState._meta.db_table} rs JOIN {Card._meta.db_table} c ON c.id = rs.card_id
    WHERE rs.user_id = %(user)s AND NOT rs.suspended AND c.is_active"""
_INTRADAY_SQL = (
    f"rs.state IN ({', '.join(str(int(s)) for s in INTRADAY)}) AND rs.last_review IS NOT NULL"
)
_NEW_CARDS = f"""
    FROM {Card._meta.db_table} c LEFT JOIN {Card._meta.db_table} p ON p.id = c.parent_id
    WHERE c.is_active AND (c.owner_id IS NULL OR c.owner_id = %(user)s)
      AND (c.parent_id IS NULL OR NOT p.is_active OR EXISTS (
        SELECT 1 FROM {ReviewState._meta.db_table} ps
        WHERE ps.user_id = %(user)s AND ps.card_id = c.parent_id AND ps.last_review IS NOT NULL))
      AND NOT EXISTS (
        SELECT 1 FROM {ReviewState._meta.db_table} ss
        WHERE ss.user_id = %(user)s AND ss.card_id = c.id
          AND (ss.last_review IS NOT NULL OR ss.suspended))"""  # noqa: S608 - as below
# The next new card: one the learner made from a run comes before the deck's unseen ones.
_QUEUE_COUNTS = """
SELECT d.done_new, d.done_review, d.done_total,
  s.learning_now, s.learning_ahead, s.review_due, s.learning_next,
  n.new_cards, COALESCE(n.first_own, n.first_shared), s.learning_today"""
# The next learning or review card: the earliest due (then the oldest state); and whether the
# next new card has a state yet (shown before, never answered), so showing it can make one first.
_QUEUE_PICKS = f""",
  (SELECT rs.card_id {_LIVE_STATES} AND {_INTRADAY_SQL} AND rs.due <= %(now)s
    ORDER BY rs.due, rs.id LIMIT 1),
  (SELECT rs.card_id {_LIVE_STATES} AND rs.state = {FsrsState.REVIEW} AND rs.due < %(end)s
    ORDER BY rs.due, rs.id LIMIT 1),
  (SELECT rs.card_id {_LIVE_STATES} AND {_INTRADAY_SQL} AND rs.due <= %(ahead)s
    ORDER BY rs.due, rs.id LIMIT 1),
  (SELECT 1 FROM {ReviewState._meta.db_table} ns
    WHERE ns.user_id = %(user)s AND ns.card_id = COALESCE(n.first_own, n.first_shared))"""  # noqa: S608 - names from code; values are bound parameters
_QUEUE_FROM = f"""
FROM (
  SELECT
    COUNT(CASE WHEN {_INTRADAY_SQL} AND rs.due <= %(now)s THEN 1 END) AS learning_now,
    COUNT(CASE WHEN {_INTRADAY_SQL} AND rs.due <= %(ahead)s THEN 1 END) AS learning_ahead,
    COUNT(CASE WHEN rs.state = {FsrsState.REVIEW} AND rs.due < %(end)s THEN 1 END) AS review_due,
    MIN(CASE WHEN {_INTRADAY_SQL} AND rs.due < %(end)s THEN rs.due END) AS learning_next,
    COUNT(CASE WHEN {_INTRADAY_SQL} AND rs.due < %(end)s THEN 1 END) AS learning_today
  {_LIVE_STATES}
) s CROSS JOIN (
  SELECT
    COUNT(CASE WHEN kind = {ReviewLog.Kind.NEW} THEN 1 END) AS done_new,
    COUNT(CASE WHEN kind = {ReviewLog.Kind.REVIEW} THEN 1 END) AS done_review,
    COUNT(*) AS done_total
  FROM {ReviewLog._meta.db_table} WHERE user_id = %(user)s AND study_date = %(date)s
) d CROSS JOIN (
  SELECT COUNT(*) AS new_cards,
    MIN(CASE WHEN c.owner_id IS NOT NULL THEN c.id END) AS first_own,
    MIN(CASE WHEN c.owner_id IS NULL THEN c.id END) AS first_shared
  {_NEW_CARDS}
) n"""  # noqa: S608 - as above


def _queue_row(*, user_id: int, day: StudyDay, now: dt.datetime, pick_next: bool) -> tuple:
    ops = connection.ops
    params = {
        "user": user_id,
        "date": ops.adapt_datefield_value(day.date),
        "now": ops.adapt_datetimefield_value(now),
        "ahead": ops.adapt_datetimefield_value(now + scheduling.LEARN_AHEAD),
        "end": ops.adapt_datetimefield_value(day.end),
    }
    sql = _QUEUE_COUNTS + (_QUEUE_PICKS if pick_next else "") + _QUEUE_FROM
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _as_datetime(value: object) -> dt.datetime | None:
    # SQLite hands back MIN(due) as text; PostgreSQL as an aware datetime.
    if value is None or isinstance(value, dt.datetime):
        return value
    parsed = parse_datetime(str(value))
    return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def queue_today(
    *,
    user: AbstractBaseUser,
    now: dt.datetime,
    settings: LearnerSettings | None = None,
    pick_next: bool = True,
) -> TodayQueue:
    """What is left today and which card comes next: one query (two without `settings`); while a
    card is on screen (`pick_next` False) the query skips choosing the next one.

    Order, as in Anki: learning cards already due, then reviews due before the day ends, then new
    cards; learning cards due within the learn-ahead limit only when nothing else is left. New
    cards stop when the review limit is reached (Anki's default).
    """
    settings = settings or learner_settings_get(user=user)
    day = study_day_for(settings, now)
    row = _queue_row(user_id=user.pk, day=day, now=now, pick_next=pick_next)
    done_new, done_review, done_total = row[0], row[1], row[2]
    learning_now, learning_ahead, review_due, learning_next, new_cards, first_new = row[3:9]
    learning_today = row[9]
    picks = row[10:] if pick_next else (None, None, None, None)

    # New cards answered today count against the review limit too, as in Anki (unless its "new
    # cards ignore review limit"): otherwise "new left" said 3 while a 4th new card was shown.
    review_quota = max(0, settings.reviews_per_day - done_review - done_new)
    review_left = min(review_due, review_quota)
    new_quota = max(0, min(settings.new_per_day - done_new, review_quota - review_left))
    new_left = min(new_cards, new_quota)

    learning_left = learning_now
    next_is_new = False
    if learning_now:
        next_id = picks[0]
    elif review_left:
        next_id = picks[1]
    elif new_left:
        next_id = first_new if pick_next else None
        next_is_new = next_id is not None and picks[3] is None
    elif learning_ahead:
        learning_left = learning_ahead
        next_id = picks[2]
    else:
        next_id = None
    nothing_now = next_id is None and not (learning_left or review_left or new_left)
    return TodayQueue(
        settings=settings,
        day=day,
        new_left=new_left,
        learning_left=learning_left,
        review_left=review_left,
        next_card_id=next_id,
        next_learning_due=_as_datetime(learning_next) if nothing_now else None,
        reviewed_today=done_total,
        learning_today=learning_today,
        next_is_new=next_is_new,
    )


def _active_relations() -> Prefetch:
    return Prefetch(
        "relations_out",
        queryset=CardRelation.objects.filter(to_card__is_active=True).select_related("to_card"),
    )


# Cards change only when staff edit them, and every learner reads the same few dozen: each process
# keeps a card with its options, tags and related cards for QUIZ_CARD_CACHE_S seconds (0: off).
# Saving or deleting a card or one of its parts clears this process's copy at once
# (card_cache_clear, connected in quiz.apps); other processes see an edit within that time.
# At most QUIZ_CARD_CACHE_MAX cards are kept: personal cards grow with the learners, and a long-
# lived process must not keep every card it ever read (oldest read first out).
_card_cache: dict[int, tuple[float, Card]] = {}
_card_cache_lock = threading.Lock()


def card_cache_clear(**_: object) -> None:
    with _card_cache_lock:
        _card_cache.clear()


def card_for_quiz(*, card_id: int, fresh: bool = False) -> Card:
    """A card with what both sides show: options, tags and active related cards (4 queries, or
    none while the process's copy is fresh; `fresh` reads it again). Read-only: the same instance
    serves many requests."""
    ttl = settings.QUIZ_CARD_CACHE_S
    if ttl and not fresh:
        hit = _card_cache.get(card_id)
        if hit is not None and time.monotonic() - hit[0] < ttl:
            return hit[1]
    card = (
        Card.objects.select_related("deck")
        .prefetch_related(
            Prefetch("options", queryset=ChoiceOption.objects.order_by("position", "id")),
            Prefetch("card_tags", queryset=CardTag.objects.select_related("tag")),
            _active_relations(),
        )
        .get(pk=card_id)
    )
    if ttl:
        _card_cache_keep(card_id, card, ttl)
    return card


def _card_cache_keep(card_id: int, card: Card, ttl: int) -> None:
    now = time.monotonic()
    with _card_cache_lock:
        _card_cache.pop(card_id, None)  # to the end: the cache is kept in order of reading
        _card_cache[card_id] = (now, card)
        if len(_card_cache) <= settings.QUIZ_CARD_CACHE_MAX:
            return
        for key in [key for key, (read_at, _) in _card_cache.items() if now - read_at >= ttl]:
            del _card_cache[key]
        while len(_card_cache) > settings.QUIZ_CARD_CACHE_MAX:
            del _card_cache[next(iter(_card_cache))]


def card_detail_get(*, slug: str, user: AbstractBaseUser) -> tuple[Card, ReviewState | None]:
    card = card_for_quiz(card_id=Card.objects.get(_visible_to(user), slug=slug, is_active=True).pk)
    state = ReviewState.objects.filter(user=user, card=card).first()
    return card, state


def showing_get(*, user: AbstractBaseUser, token: str) -> Showing:
    """A learner's own showing; anyone else's token is simply not found."""
    return Showing.objects.get(user=user, token=token)


# A grade pressed this recently can be undone even when a rollover came in between.
def undo_candidate(*, user: AbstractBaseUser, day: StudyDay, now: dt.datetime) -> ReviewLog | None:
    """The learner's latest review if it may be undone, Anki-style (latest first): any of today's,
    and the last answer of an earlier day however long ago, until another card is answered (or
    undone) after it."""
    log = ReviewLog.objects.filter(user=user).order_by("-id").first()
    if log is None or log.study_date == day.date:
        return log
    pressed = Showing.objects.filter(user=user, token=log.token).values_list("used_at", flat=True)
    graded_at = pressed.first() or log.reviewed_at
    # Every grade stamps its showing, and an undone one keeps the stamp: a press after this log's
    # means another card was answered since (or this stack was already undone past it).
    later = Showing.objects.filter(user=user, used_at__gt=graded_at).exclude(token=log.token)
    return None if later.exists() else log


def logged_review(log: ReviewLog) -> scheduling.LoggedReview:
    """A log row as replay takes it: the review and everything its outcome was computed with."""
    return scheduling.LoggedReview(
        reviewed_at=log.reviewed_at,
        rating=log.rating,
        study_date=log.study_date,
        context=scheduling.Context(
            time_zone=log.time_zone,
            rollover_hour=log.rollover_hour,
            desired_retention=log.desired_retention,
            parameters=tuple(log.parameters) if log.parameters else None,
        ),
    )


def card_replayed(*, user: AbstractBaseUser, card_id: int) -> scheduling.CardState:
    """The learner's state of a card recomputed from its review log alone, a review due on the
    same study day under the learner's present zone and rollover hour (where a change of them
    since the last review moved it, services.learner_settings_update)."""
    logs = list(ReviewLog.objects.filter(user=user, card_id=card_id).order_by("id"))
    state = scheduling.replay([logged_review(log) for log in logs], card_id=card_id)
    settings = learner_settings_get(user=user)
    was = ZoneInfo(logs[-1].time_zone), logs[-1].rollover_hour
    now = ZoneInfo(settings.time_zone), settings.rollover_hour
    if state.state != FsrsState.REVIEW or was == now:
        return state
    return dataclasses.replace(state, due=scheduling.same_day_start(state.due, was, now))


def undo_available(
    *, user: AbstractBaseUser, day: StudyDay, now: dt.datetime | None = None
) -> bool:
    if now is None:
        return ReviewLog.objects.filter(user=user, study_date=day.date).exists()
    return undo_candidate(user=user, day=day, now=now) is not None


# --- Stats ---------------------------------------------------------------------------------------


@dataclass
class TagStat:
    tag: str
    reviews: int
    passed: int

    @property
    def pass_rate(self) -> float:
        return self.passed / self.reviews if self.reviews else 0.0


@dataclass
class Stats:
    settings: LearnerSettings
    today: dt.date
    days: list[str] = field(default_factory=list)
    reviews_per_day: list[int] = field(default_factory=list)
    again_per_day: list[int] = field(default_factory=list)
    retention_per_day: list[float | None] = field(default_factory=list)
    true_retention: float | None = None
    true_retention_n: int = 0
    forecast_days: list[str] = field(default_factory=list)
    forecast: list[int] = field(default_factory=list)
    streak: int = 0
    reviews_today: int = 0
    total_reviews: int = 0
    cards_seen: int = 0
    leeches: list[Card] = field(default_factory=list)
    weak_tags: list[TagStat] = field(default_factory=list)

    def chart_data(self) -> dict[str, Any]:
        return {
            "days": self.days,
            "reviews": self.reviews_per_day,
            "again": self.again_per_day,
            "retention": self.retention_per_day,
            "desired": self.settings.desired_retention,
            "forecastDays": self.forecast_days,
            "forecast": self.forecast,
            "tags": [t.tag for t in self.weak_tags],
            "tagPass": [round(t.pass_rate, 3) for t in self.weak_tags],
            "tagReviews": [t.reviews for t in self.weak_tags],
        }


def stats_for(*, user: AbstractBaseUser, now: dt.datetime, days: int = 30) -> Stats:
    """The stats page: a fixed handful of queries, aggregated in Python over the last `days`."""
    settings = learner_settings_get(user=user)
    day = study_day_for(settings, now)
    first = day.date - dt.timedelta(days=days - 1)
    stats = Stats(settings=settings, today=day.date)

    logs = list(
        ReviewLog.objects.filter(user=user, study_date__gte=first)
        .order_by("reviewed_at", "id")
        .values("card_id", "study_date", "rating", "kind")
    )
    per_day = Counter(log["study_date"] for log in logs)
    again = Counter(log["study_date"] for log in logs if log["rating"] == 1)
    # True retention (Anki): only the first review of a card each day, only cards in Review;
    # Again fails, Hard/Good/Easy pass.
    firsts: dict[tuple[int, dt.date], dict[str, Any]] = {}
    for log in logs:
        if log["kind"] == ReviewLog.Kind.REVIEW:
            firsts.setdefault((log["card_id"], log["study_date"]), log)
    passed_day: dict[dt.date, list[bool]] = defaultdict(list)
    for log in firsts.values():
        passed_day[log["study_date"]].append(log["rating"] > 1)
    for offset in range(days):
        d = first + dt.timedelta(days=offset)
        stats.days.append(d.isoformat())
        stats.reviews_per_day.append(per_day[d])
        stats.again_per_day.append(again[d])
        outcomes = passed_day.get(d)
        stats.retention_per_day.append(
            round(sum(outcomes) / len(outcomes), 3) if outcomes else None
        )
    all_firsts = [passed for outcomes in passed_day.values() for passed in outcomes]
    stats.true_retention_n = len(all_firsts)
    if all_firsts:
        stats.true_retention = sum(all_firsts) / len(all_firsts)
    stats.reviews_today = per_day[day.date]

    totals = ReviewLog.objects.filter(user=user).aggregate(
        n=Count("id"), cards=Count("card", distinct=True)
    )
    stats.total_reviews, stats.cards_seen = totals["n"], totals["cards"]

    # Streak: consecutive study days with a review, ending today (or yesterday, before studying).
    studied = set(studied_dates(user=user, since=day.date - dt.timedelta(days=400)))
    cursor = day.date if day.date in studied else day.date - dt.timedelta(days=1)
    while cursor in studied:
        stats.streak += 1
        cursor -= dt.timedelta(days=1)

    # Forecast: reviewed cards falling due on each of the next 30 study days (overdue → today).
    dues = ReviewState.objects.filter(
        user=user, suspended=False, card__is_active=True, last_review__isnull=False
    ).values_list("due", flat=True)
    horizon: Counter[int] = Counter()
    for due in dues:
        offset = max(0, (scheduling.study_date(due, day.tz, day.rollover_hour) - day.date).days)
        if offset < 30:
            horizon[offset] += 1
    for offset in range(30):
        stats.forecast_days.append((day.date + dt.timedelta(days=offset)).isoformat())
        stats.forecast.append(horizon[offset])

    stats.leeches = list(
        Card.objects.filter(review_states__user=user, review_states__leech=True).order_by("slug")
    )
    stats.weak_tags = _weak_tags(firsts.values())
    return stats


def studied_dates(*, user: AbstractBaseUser, since: dt.date) -> list[dt.date]:
    """The distinct study days with a review since `since`: one row per day. The explicit
    order_by() matters: ReviewLog's default ordering would add reviewed_at and id to the
    DISTINCT and return every log row."""
    return list(
        ReviewLog.objects.filter(user=user, study_date__gte=since)
        .order_by()
        .values_list("study_date", flat=True)
        .distinct()
    )


def _weak_tags(firsts) -> list[TagStat]:
    """Tags ranked by true-retention pass rate over the window, worst first."""
    firsts = list(firsts)
    card_ids = {log["card_id"] for log in firsts}
    tags_of: dict[int, list[str]] = defaultdict(list)
    for card_id, tag in CardTag.objects.filter(card_id__in=card_ids).values_list(
        "card_id", "tag__slug"
    ):
        tags_of[card_id].append(tag)
    by_tag: dict[str, TagStat] = {}
    for log in firsts:
        for tag in tags_of[log["card_id"]]:
            stat = by_tag.setdefault(tag, TagStat(tag=tag, reviews=0, passed=0))
            stat.reviews += 1
            stat.passed += log["rating"] > 1
    return sorted(by_tag.values(), key=lambda s: (s.pass_rate, -s.reviews, s.tag))[:8]


# --- Content export ------------------------------------------------------------------------------


def _for_specs(cards):
    """`cards` with everything _card_spec reads, in a fixed number of queries."""
    return cards.select_related("deck", "parent").prefetch_related(
        Prefetch("options", queryset=ChoiceOption.objects.order_by("position", "id")),
        Prefetch("card_tags", queryset=CardTag.objects.select_related("tag")),
        _active_relations(),
    )


def edited_cards() -> dict[str, tuple[CardSpec, bool]]:
    """Cards changed in the admin since the last load: slug -> (content spec, is_active)."""
    cards = _for_specs(Card.objects.filter(edited_since_load=True, owner__isnull=True))
    return {card.slug: (_card_spec(card), card.is_active) for card in cards}


def edited_decks() -> dict[str, DeckSpec]:
    """Decks changed in the admin since the last load: slug -> content spec."""
    decks = Deck.objects.filter(edited_since_load=True).exclude(slug=PERSONAL_DECK)
    return {d.slug: DeckSpec(d.slug, d.title, d.description) for d in decks}


def content_snapshot() -> tuple[ContentTree, set[str]]:
    """The deck as content specs (active cards) and the slugs of retired cards."""
    # Personal cards (made from a learner's runs) and their deck are nobody else's content.
    shared_decks = Deck.objects.exclude(slug=PERSONAL_DECK).order_by("id")
    decks = [DeckSpec(d.slug, d.title, d.description) for d in shared_decks]
    cards = _for_specs(Card.objects.filter(is_active=True, owner__isnull=True)).order_by("slug")
    specs = [_card_spec(card) for card in cards]
    retired = set(
        Card.objects.filter(is_active=False, owner__isnull=True).values_list("slug", flat=True)
    )
    return ContentTree(decks=decks, cards=specs), retired


def card_edit_times(*, user: AbstractBaseUser | None = None) -> dict[str, float]:
    """Each shared card's last edit, Unix seconds, by slug (the Anki export's note times), and
    `user`'s own cards' too."""
    owners = Q(owner__isnull=True) | (Q(owner=user) if user is not None else Q(pk__in=[]))
    cards = Card.objects.filter(owners, is_active=True)
    return {slug: at.timestamp() for slug, at in cards.values_list("slug", "updated_at")}


@dataclass(frozen=True)
class PersonalExport:
    """What of a learner's own cards goes into their Anki download, and what cannot."""

    deck: DeckSpec | None
    cards: list[CardSpec]
    # Prediction cards: each showing asks a neighbouring setting labs chooses then and grades
    # against a simulation the quiz runs, which a fixed Anki note cannot do.
    left_out: int


def personal_export_counts(*, user: AbstractBaseUser) -> dict[str, int]:
    """For the stats page, in one query: {"cards": the learner's own cards their Anki download
    holds, "left_out": their prediction cards it cannot (PersonalExport)}."""
    prediction = Q(kind=Card.Kind.PREDICTION)
    return Card.objects.filter(owner=user, is_active=True).aggregate(
        cards=Count("id", filter=~prediction), left_out=Count("id", filter=prediction)
    )


def personal_export(*, user: AbstractBaseUser) -> PersonalExport:
    """The learner's active cards made from their runs, as content specs for the Anki export,
    and how many of their prediction cards are left out of it."""
    own = Card.objects.filter(owner=user, is_active=True)
    cards = _for_specs(own.exclude(kind=Card.Kind.PREDICTION)).order_by("slug")
    specs = [_card_spec(card) for card in cards]
    left_out = own.filter(kind=Card.Kind.PREDICTION).count()
    deck = Deck.objects.filter(slug=PERSONAL_DECK).first()
    spec = DeckSpec(deck.slug, deck.title, deck.description) if deck and specs else None
    return PersonalExport(deck=spec, cards=specs, left_out=left_out)


def _card_spec(card: Card) -> CardSpec:
    parent = card.parent.slug if card.parent and card.parent.is_active else None
    return CardSpec(
        slug=card.slug,
        deck=card.deck.slug,
        kind=card.kind,
        prompt=card.prompt,
        answer=card.answer,
        tags=[ct.tag.slug for ct in card.card_tags.all()],
        source=card.source,
        parent=parent,
        numeric_value=card.numeric_value,
        numeric_unit=card.numeric_unit,
        numeric_tolerance=card.numeric_tolerance,
        choice=[OptionSpec(o.text, o.is_correct, o.why) for o in card.options.all()],
        steps=list(card.steps or []),
        explanation=card.explanation,
        follow_up_question=card.follow_up_question,
        follow_up_answer=card.follow_up_answer,
        related=[rel.to_card.slug for rel in card.relations_out.all()],
        lab_preset=card.lab_preset,
        check=json.loads(card.check_json) if card.check_json else None,
    )


@dataclass(frozen=True)
class Workload:
    """The settings page's estimate of the next `days` days, from this learner's own deck."""

    not_started: int  # cards the learner can study and has not started
    days_to_start: int  # at new_per_day
    reviews_per_day: int  # over the next `days` days, answered Good
    days: int = 30


def workload_estimate(
    *, user: AbstractBaseUser, settings: LearnerSettings, now: dt.datetime, days: int = 30
) -> Workload:
    """Cards not started yet, each shown `reviews_in_first_days` times once started (as many as
    new_per_day allows within `days`), plus the reviews already due within `days`."""
    started = ReviewState.objects.filter(user=user, last_review__isnull=False).values("card_id")
    not_started = (
        Card.objects.filter(_visible_to(user), is_active=True).exclude(pk__in=started).count()
    )
    per_day = max(1, settings.new_per_day)
    days_to_start = -(-not_started // per_day) if settings.new_per_day else 0
    starting = min(not_started, settings.new_per_day * days)
    shows = scheduling.reviews_in_first_days(settings.desired_retention, days)
    already_due = ReviewState.objects.filter(
        user=user,
        suspended=False,
        card__is_active=True,
        last_review__isnull=False,
        due__lt=now + dt.timedelta(days=days),
    ).count()
    total = starting * shows + already_due
    return Workload(
        not_started=not_started,
        days_to_start=days_to_start,
        reviews_per_day=-(-total // days),
        days=days,
    )


# -- what labs asks (quiz/apps.py registers these with labs.api) ---------------------------------


def reviews_at_least(user_id: int, count: int) -> bool:
    """Whether the learner has answered at least `count` cards."""
    return ReviewLog.objects.filter(user_id=user_id).values("pk")[:count].count() >= count


def cards_using_presets(presets: Sequence[str]) -> list[dict[str, Any]]:
    """The active cards that open one of these lab presets (at most 12), for a lab's page."""
    cards = Card.objects.filter(lab_preset__in=presets, is_active=True).order_by("slug")
    return [
        {
            "slug": c.slug,
            "title": c.title,
            "prompt": c.prompt,
            "url": _card_url(c.slug),
            "preset": c.lab_preset,
        }
        for c in cards[:12]
    ]


def _card_url(slug: str) -> str | None:
    for name in ("quiz:card-detail", "quiz:card"):
        try:
            return reverse(name, args=[slug])
        except NoReverseMatch:
            continue
    return None
