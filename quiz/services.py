"""Writes: showing a card, revealing its answer, grading, undo, settings, and loading the deck.

Grading is safe against double clicks, retries and a second tab:
- each presentation has a one-time token (Showing); a second grade with the same token returns the
  first result and never writes a second log (ReviewLog.token is UNIQUE as a last line of defence);
- the review state row is locked (SELECT ... FOR UPDATE on PostgreSQL) and carries a version; a
  grade computed from an older version is refused, which also covers SQLite, where FOR UPDATE is a
  no-op (there the IMMEDIATE transaction mode serialises writers).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from config import rows
from quiz import prediction_asks, scheduling
from quiz.content import CardSpec, ContentTree
from quiz.models import (
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
    Tag,
)
from quiz.scheduling import CardState
from quiz.selectors import (
    card_cache_clear,
    card_for_quiz,
    edited_cards,
    edited_decks,
    learner_settings_get,
    study_day_for,
    undo_candidate,
)

FSRS_COLUMNS = tuple(f.name for f in fields(CardState))  # also ReviewState's column names
# Outcomes older than this are recomputed before grading rather than applied stale.
REVEAL_TTL = dt.timedelta(hours=1)
# An unanswered showing is reused on reload for this long (no new token per refresh).
SHOWING_REUSE = dt.timedelta(hours=12)
RETENTION_KEY = "retention"  # beside the four outcomes in Showing.outcomes
# Also beside them: what they were computed with, at which instant, for which study day.
CONTEXT_KEY = "context"
# Review states rewritten per statement when a learner's zone or rollover hour changes.
DUE_MOVE_BATCH = 1000


class QuizConflict(Exception):
    """The request is well formed but the card moved on (already graded, undone, stale)."""


class ShowingExpired(QuizConflict):
    """The answer was shown too long ago; its intervals must be recomputed first."""


class NothingToUndo(QuizConflict):
    pass


class UndoRefused(NothingToUndo):
    """The latest answer's card was changed since (by staff): undo would drop that change."""


# --- Showing a card ------------------------------------------------------------------------------


def _token() -> str:
    return secrets.token_urlsafe(16)


def _state_columns(state: ReviewState) -> CardState:
    return CardState(**{name: getattr(state, name) for name in FSRS_COLUMNS})


def _fsrs_values(card_state: CardState) -> dict[str, Any]:
    return {name: getattr(card_state, name) for name in FSRS_COLUMNS}


# The quiz loop's statements are written by hand (config/rows.py): built by the ORM, each cost
# more CPU to compile than the database spent running it, and every fetch, answer and grade runs
# several. Portable between PostgreSQL and SQLite (both run the suite).
_STATE, _SHOWING, _LOG, _CARD = (m._meta.db_table for m in (ReviewState, Showing, ReviewLog, Card))


@cache
def _open_showing_sql(alias: str) -> str:
    """The learner's state of a card (its version) and the newest showing of it still open for
    that version and recent enough to reuse; no row while the card has no state."""
    return (
        f"SELECT rs.version, {rows.select_list(Showing, 'sh', alias)} FROM {_STATE} rs"  # noqa: S608 - names from the models; values are bound parameters
        f" LEFT JOIN {_SHOWING} sh ON sh.id = (SELECT o.id FROM {_SHOWING} o"
        " WHERE o.user_id = rs.user_id AND o.card_id = rs.card_id AND o.used_at IS NULL"
        " AND o.state_version = rs.version AND o.created_at >= %(since)s"
        " ORDER BY o.created_at DESC, o.id DESC LIMIT 1)"
        " WHERE rs.user_id = %(user)s AND rs.card_id = %(card)s"
    )


def _open_showing(
    *, user_id: int, card_id: int, since: dt.datetime
) -> tuple[int, Showing | None] | None:
    alias = "default"
    params = {
        "user": user_id,
        "card": card_id,
        "since": connections[alias].ops.adapt_datetimefield_value(since),
    }
    with connections[alias].cursor() as cursor:
        cursor.execute(_open_showing_sql(alias), params)
        row = cursor.fetchone()
    if row is None:
        return None
    showing = None if row[1] is None else rows.from_row(Showing, row[1:], alias)
    return row[0], showing


def _new_state(*, user: AbstractBaseUser, card: Card, now: dt.datetime) -> int | None:
    """Make the learner's (new) state of `card`: its version, or None when it exists already."""
    fresh = scheduling.new_card_state(now)
    state = ReviewState(
        user_id=user.pk, card_id=card.pk, state=fresh.state, step=fresh.step, due=fresh.due
    )
    return state.version if rows.insert(state, unless_exists=("user", "card")) else None


def showing_open(
    *, user: AbstractBaseUser, card: Card, now: dt.datetime, new: bool = False
) -> Showing:
    """Present `card`: reuse the learner's open showing of it (a reload keeps its token, option
    order and revealed answer), or issue a new token. The first showing creates the (new) state.
    `new`: the card is most likely one the learner has no state of yet (the queue picked it as
    new), so the state is made first and the look-up for a showing to reuse only runs when one
    was there already. The showing returned carries `card`."""
    since = now - SHOWING_REUSE
    version = _new_state(user=user, card=card, now=now) if new else None
    # A state made just now has no showing yet to reuse.
    found: tuple[int, Showing | None] | None = (version, None) if version is not None else None
    if found is None:
        found = _open_showing(user_id=user.pk, card_id=card.pk, since=since)
    # A loop: the state another request made can be deleted (staff can, in the admin) before
    # this one reads it back; then there is none again, and this request makes it.
    while found is None:
        version = _new_state(user=user, card=card, now=now)
        if version is not None:
            found = version, None
        else:  # another request made it meanwhile
            found = _open_showing(user_id=user.pk, card_id=card.pk, since=since)
    version, showing = found
    if showing is not None:
        showing.card = card
        return showing
    option_ids = [option.pk for option in card.options.all()]
    random.SystemRandom().shuffle(option_ids)
    showing = Showing(
        user_id=user.pk,
        card_id=card.pk,
        token=_token(),
        created_at=now,
        state_version=version,
        option_order=option_ids,
    )
    rows.insert(showing)
    showing.card = card
    return showing


@dataclass(frozen=True)
class Answer:
    """What the learner gave on the question side; all None means "show me" (no attempt)."""

    option_id: int | None = None
    number: float | None = None
    raw: str = ""


def _judge(card: Card, showing: Showing, answer: Answer) -> tuple[str, bool | None]:
    if card.kind == Card.Kind.CHOICE:
        if answer.option_id is None:
            return "", False
        if answer.option_id not in showing.option_order:
            raise ValidationError({"option": "That option is not one of this card's."})
        option = next((o for o in card.options.all() if o.pk == answer.option_id), None)
        if option is None:
            raise ValidationError(
                {"option": "That option was removed from this card; pick another."}
            )
        letter = "ABCDEF"[showing.option_order.index(option.pk)]
        return f"{letter}. {option.text}", option.is_correct
    if card.kind == Card.Kind.NUMERIC:
        if answer.number is None:
            return "", False
        return answer.raw, card.numeric_accepts(answer.number)
    if card.kind == Card.Kind.PREDICTION:
        return prediction_asks.judge(card, showing, answer)
    return "", None


def learner_context(settings: LearnerSettings) -> scheduling.Context:
    """What the learner's outcomes are computed with now."""
    parameters = settings.fsrs_parameters
    return scheduling.Context(
        time_zone=settings.time_zone,
        rollover_hour=settings.rollover_hour,
        desired_retention=settings.desired_retention,
        parameters=tuple(parameters) if parameters else None,
        day_floor=settings.day_floor,
    )


def _context_key(context: scheduling.Context, day: dt.date) -> dict[str, Any]:
    return {
        **dataclasses.asdict(context),
        "parameters": context.parameters and list(context.parameters),
        "day_floor": context.day_floor and context.day_floor.isoformat(),
        "day": day.isoformat(),
    }


def _compute_outcomes(
    showing: Showing,
    state: ReviewState,
    context: scheduling.Context,
    at: dt.datetime,
    last_day: dt.date | None,
) -> dict[str, Any]:
    """The four outcomes of reviewing at `at`, plus what they were computed with (a change of
    zone, rollover, retention, parameters or study day before the grade is then noticed).
    `last_day`: the study day of the card's latest logged review (None for a new card)."""
    result = scheduling.outcomes_in(
        _state_columns(state),
        card_id=showing.card_id,
        now=at,
        context=context,
        last_day=last_day if state.last_review is not None else None,
    )
    data: dict[str, Any] = {str(rating): outcome.to_json() for rating, outcome in result.items()}
    data[RETENTION_KEY] = context.desired_retention
    data[CONTEXT_KEY] = {**_context_key(context, context.study_date(at)), "at": at.isoformat()}
    return data


@cache
def _showing_with_state_sql(alias: str, lock: str) -> str:
    """A learner's showing (by token) with their state of its card and the study day of the card's
    latest logged review. `lock` "showing" locks the showing's row, "both" the state's too
    (SELECT ... FOR UPDATE on PostgreSQL; SQLite's IMMEDIATE transactions serialise writers)."""
    features = connections[alias].features
    showing = rows.select_list(Showing, "sh", alias)
    state = rows.select_list(ReviewState, "rs", alias)
    sql = (
        f"SELECT {showing}, {state}, (SELECT l.study_date FROM {_LOG} l"  # noqa: S608 - names from the models; values are bound parameters
        " WHERE l.user_id = sh.user_id AND l.card_id = sh.card_id ORDER BY l.id DESC LIMIT 1),"
        f" (SELECT c.is_active FROM {_CARD} c WHERE c.id = sh.card_id)"
        f" FROM {_SHOWING} sh JOIN {_STATE} rs"
        " ON rs.user_id = sh.user_id AND rs.card_id = sh.card_id"
        " WHERE sh.user_id = %s AND sh.token = %s"
    )
    if features.has_select_for_update:
        of_showing = lock == "showing" and features.has_select_for_update_of
        sql += " FOR UPDATE OF sh" if of_showing else " FOR UPDATE"
    return sql


@dataclass(frozen=True)
class _Shown:
    showing: Showing
    state: ReviewState
    last_day: dt.date | None  # the study day of the card's latest logged review
    card_active: bool  # False: retired since it was shown


def _showing_with_state(*, user: AbstractBaseUser, token: str, lock: str) -> _Shown:
    """Raises Showing.DoesNotExist for a token that is not this learner's."""
    alias = "default"
    with connections[alias].cursor() as cursor:
        cursor.execute(_showing_with_state_sql(alias, lock), [user.pk, token])
        row = cursor.fetchone()
    if row is None:
        raise Showing.DoesNotExist
    n = len(rows.columns(Showing))
    state_end = n + len(rows.columns(ReviewState))
    showing = rows.from_row(Showing, row[:n], alias)
    state = rows.from_row(ReviewState, row[n:state_end], alias)
    last_day = row[state_end]
    if last_day is not None and not isinstance(last_day, dt.date):  # SQLite: text
        last_day = dt.date.fromisoformat(str(last_day))
    return _Shown(showing, state, last_day, bool(row[state_end + 1]))


def showing_reveal(
    *,
    user: AbstractBaseUser,
    token: str,
    answer: Answer,
    now: dt.datetime,
    refresh: bool = False,
    settings: LearnerSettings | None = None,
) -> Showing:
    """Record the learner's answer and compute the four outcomes with the real scheduler.

    Idempotent: revealing again returns the first answer and the same outcomes (unless `refresh`,
    used when they have gone stale). Raises Showing.DoesNotExist for another learner's token,
    QuizConflict when the showing was used or the card changed since, ValidationError for an
    option that is not the card's.
    """
    with transaction.atomic():
        shown = _showing_with_state(user=user, token=token, lock="showing")
        showing, state, last_day = shown.showing, shown.state, shown.last_day
        if showing.used_at is not None:
            raise QuizConflict("This card has already been graded.")
        if showing.revealed_at is not None and not refresh:
            return showing
        if state.version != showing.state_version:
            raise QuizConflict("This card was answered in another tab.")
        if showing.revealed_at is None:
            card = card_for_quiz(card_id=showing.card_id)
            if not set(showing.option_order) <= {option.pk for option in card.options.all()}:
                # Shown by a process with a newer copy (an option added since this one read it).
                card = card_for_quiz(card_id=showing.card_id, fresh=True)
            showing.answer, showing.correct = _judge(card, showing, answer)
            showing.card = card  # what the page shows next: read once per request
        settings = settings or learner_settings_get(user=user)
        context = learner_context(settings)
        showing.outcomes = _compute_outcomes(showing, state, context, now, last_day)
        showing.revealed_at = now
        rows.update(
            Showing,
            showing.pk,
            {
                "answer": showing.answer,
                "correct": showing.correct,
                "outcomes": showing.outcomes,
                "revealed_at": now,
            },
        )
    return showing


def suggested_rating(showing: Showing) -> int:
    """A wrong pick or number suggests Again; otherwise Good."""
    return 1 if showing.correct is False else 3


# --- Grading and undo ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GradeResult:
    log: ReviewLog
    replayed: bool = False
    became_leech: bool = False


def _snapshot(state: ReviewState) -> dict[str, Any]:
    """Everything undo must restore, not just the FSRS columns."""
    return {
        **_state_columns(state).to_json(),
        "lapses": state.lapses,
        "reps": state.reps,
        "suspended": state.suspended,
        "leech": state.leech,
    }


def _snapshot_after(before: dict[str, Any], outcome: dict[str, Any], rating: int) -> dict[str, Any]:
    """What a grade with `rating` writes over the `before` snapshot (the stored `outcome` for the
    button, the counters, a leech suspended): the grade writes exactly this, and undo compares the
    card with it to tell whether anyone changed the card since."""
    after = CardState.from_json(outcome)
    lapses = before["lapses"] + scheduling.is_lapse(CardState.from_json(before), rating)
    became_leech = _became_leech(before["lapses"], lapses)
    return {
        **after.to_json(),
        "lapses": lapses,
        "reps": before["reps"] + 1,
        "suspended": before["suspended"] or became_leech,
        "leech": before["leech"] or became_leech,
    }


def _became_leech(lapses_before: int, lapses: int) -> bool:
    """A new lapse at the threshold or at one of its later warnings (Anki's)."""
    return lapses != lapses_before and scheduling.is_leech_event(lapses)


def _snapshot_columns(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as ReviewState column values."""
    return {
        **_fsrs_values(CardState.from_json(snapshot)),
        **{name: snapshot[name] for name in ("lapses", "reps", "suspended", "leech")},
    }


def _log_kind(state: ReviewState) -> int:
    return ReviewLog.Kind.NEW if state.last_review is None else int(state.state)


def review_grade(
    *,
    user: AbstractBaseUser,
    token: str,
    rating: int,
    now: dt.datetime,
    settings: LearnerSettings | None = None,
) -> GradeResult:
    """Apply the stored outcome for `rating` to the learner's card and log the review.

    Raises Showing.DoesNotExist (not this learner's token), ValueError (rating outside 1-4),
    ShowingExpired (answer shown more than an hour ago, or on another study day or with other
    settings: the shown intervals would not be the ones applied), QuizConflict (not revealed
    yet, undone, or the card changed since it was shown).
    """
    if rating not in (1, 2, 3, 4):
        raise ValueError("rating must be 1, 2, 3 or 4")
    with transaction.atomic():
        shown = _showing_with_state(user=user, token=token, lock="both")
        showing, state = shown.showing, shown.state
        if showing.used_at is not None:
            log = ReviewLog.objects.filter(user=user, token=token).first()
            if log is None:
                raise QuizConflict("That answer was undone; the card is shown again.")
            return GradeResult(log=log, replayed=True)
        if showing.revealed_at is None or not showing.outcomes:
            raise QuizConflict("Show the answer before grading.")
        if now - showing.revealed_at > REVEAL_TTL:
            raise ShowingExpired("The answer was shown a while ago; the intervals were updated.")
        if state.suspended:
            raise QuizConflict("This card was suspended; it cannot be graded.")
        if not shown.card_active:
            raise QuizConflict(
                "This card was retired from the deck after it was shown, so it was not graded; "
                "nothing was recorded. Go on to the next card."
            )
        if state.version != showing.state_version:
            raise QuizConflict("This card changed since it was shown (graded in another tab?).")

        settings = settings or learner_settings_get(user=user)
        context = learner_context(settings)
        computed = showing.outcomes.get(CONTEXT_KEY) or {}
        if {k: v for k, v in computed.items() if k != "at"} != _context_key(
            context, context.study_date(now)
        ):
            # The study day turned, or the zone, rollover, retention or parameters changed, since
            # the reveal: the buttons' intervals are no longer what a press would apply, so
            # nothing is applied; the caller shows the buttons again with fresh intervals.
            raise ShowingExpired(
                "The study day changed (or your settings did) since the answer was shown, so the "
                "intervals were updated: press again."
            )
        # One instant for the state and the log: the one the applied outcome was computed at (the
        # reveal, on the press's study day), so the log replays exactly.
        reviewed_at = dt.datetime.fromisoformat(showing.outcomes[CONTEXT_KEY]["at"])
        before = _snapshot(state)
        after = _snapshot_after(before, showing.outcomes[str(rating)], rating)
        became_leech = _became_leech(before["lapses"], after["lapses"])
        # The version in the WHERE clause makes this safe even where the lock above is a no-op.
        updated = rows.update(
            ReviewState,
            state.pk,
            _snapshot_columns(after),
            increment=("version",),
            expect={"version": state.version},
        )
        if updated != 1:
            raise QuizConflict("This card changed since it was shown (graded in another tab?).")
        elapsed_ms = int((now - showing.created_at).total_seconds() * 1000)
        log = ReviewLog(
            user_id=showing.user_id,
            card_id=showing.card_id,
            rating=rating,
            kind=_log_kind(state),
            reviewed_at=reviewed_at,
            study_date=context.study_date(reviewed_at),
            duration_ms=max(0, min(elapsed_ms, scheduling.MAX_ANSWER_MS)),
            answer=showing.answer,
            correct=showing.correct,
            state_before=before,
            token=token,
            time_zone=context.time_zone,
            rollover_hour=context.rollover_hour,
            desired_retention=context.desired_retention,
            parameters=context.parameters and list(context.parameters),
        )
        rows.insert(log)
        showing.used_at = now
        rows.update(Showing, showing.pk, {"used_at": now})
    return GradeResult(log=log, became_leech=became_leech)


def review_undo(*, user: AbstractBaseUser, now: dt.datetime) -> int:
    """Undo the learner's latest review (today's, or one graded minutes before the rollover):
    restore the state exactly as it was before and delete the log (the quota reopens). Returns
    the card id to show again. Raises UndoRefused when the card was changed after the review."""
    settings = learner_settings_get(user=user)
    day = study_day_for(settings, now)
    with transaction.atomic():
        candidate = undo_candidate(user=user, day=day, now=now)
        if candidate is None:
            raise NothingToUndo("There is no answer to undo.")
        log = ReviewLog.objects.select_for_update().filter(pk=candidate.pk).first()
        if log is None:  # undone by a second request meanwhile
            raise NothingToUndo("There is no answer to undo.")
        states = ReviewState.objects.select_for_update().filter(user=user, card_id=log.card_id)
        state = states.first()
        if state is None:
            raise UndoRefused(
                "That answer cannot be undone: your progress on this card was reset by staff "
                "(its schedule was deleted), so there is nothing to restore; the card counts as "
                "new again."
            )
        outcomes = (
            Showing.objects.filter(user=user, token=log.token)
            .values_list("outcomes", flat=True)
            .first()
        )
        graded = outcomes and outcomes.get(str(log.rating))
        # The card must hold exactly what the grade wrote (an earlier undo of a later answer
        # restores that too): anything else is a change made since (a staff edit, a suspension
        # or unsuspension) that restoring the state before the answer would silently drop. A
        # save that changed nothing, or a version bumped by undo, is no change; nor is a new
        # zone or rollover hour, which moved a review due to the same day's new start.
        days = _days_moved(log, settings)
        if not graded or _snapshot(state) != days(
            _snapshot_after(log.state_before, graded, log.rating)
        ):
            raise UndoRefused(
                "That answer cannot be undone: the card's schedule was changed after it (by "
                "staff, or by suspending or unsuspending the card), and undoing would overwrite "
                "that change. The answer and the change both stay."
            )
        ReviewState.objects.filter(pk=state.pk).update(
            **_snapshot_columns(days(log.state_before)),
            # Bumped, not restored: showings made after the review must not grade the old state.
            version=F("version") + 1,
        )
        card_id = log.card_id
        log.delete()
    return card_id


def _days_moved(
    log: ReviewLog, settings: LearnerSettings
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A snapshot as of the log's zone and rollover hour, with a review due moved to the same
    study day under the learner's present ones (as their change moved every review due)."""
    was = ZoneInfo(log.time_zone), log.rollover_hour
    now = ZoneInfo(settings.time_zone), settings.rollover_hour

    def moved(snapshot: dict[str, Any]) -> dict[str, Any]:
        if was == now or snapshot["state"] != FsrsState.REVIEW:
            return snapshot
        due = dt.datetime.fromisoformat(snapshot["due"])
        return {**snapshot, "due": scheduling.same_day_start(due, was, now).isoformat()}

    return moved


def card_unsuspend(*, user: AbstractBaseUser, card: Card) -> None:
    ReviewState.objects.filter(user=user, card=card).update(
        suspended=False, version=F("version") + 1
    )


def learner_settings_update(
    *, user: AbstractBaseUser, now: dt.datetime | None = None, **values: Any
) -> LearnerSettings:
    """Save the learner's settings. A new zone or rollover hour keeps the learner's days as they
    are, as Anki does: today stays today (its limits are not opened again) and every review
    card stays due on the study day it was due on (its due moves to that day's new start)."""
    now = now or timezone.now()
    with transaction.atomic():
        settings, _ = LearnerSettings.objects.select_for_update().get_or_create(user=user)
        was = ZoneInfo(settings.time_zone), settings.rollover_hour
        day_was = study_day_for(settings, now).date
        for name, value in values.items():
            setattr(settings, name, value)
        settings.full_clean()
        moved = (ZoneInfo(settings.time_zone), settings.rollover_hour) != was
        if moved and study_day_for(settings, now).date < day_was:
            settings.day_floor = day_was
        settings.save()
        if moved:
            _review_dues_move(user, was, (ZoneInfo(settings.time_zone), settings.rollover_hour))
    user.quiz_settings = settings  # what this request reads from now on
    return settings


def _review_dues_move(
    user: AbstractBaseUser, was: tuple[ZoneInfo, int], now: tuple[ZoneInfo, int]
) -> None:
    """Every review card's due to the start of the same study day under the new zone and hour."""
    states = ReviewState.objects.filter(user=user, state=FsrsState.REVIEW)
    batch: list[ReviewState] = []
    for state in states.only("pk", "due").iterator(chunk_size=DUE_MOVE_BATCH):
        state.due = scheduling.same_day_start(state.due, was, now)
        batch.append(state)
        if len(batch) == DUE_MOVE_BATCH:
            ReviewState.objects.bulk_update(batch, ["due"])
            batch.clear()
    ReviewState.objects.bulk_update(batch, ["due"])


# --- Content sync --------------------------------------------------------------------------------


@dataclass
class LoadReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    decks_changed: list[str] = field(default_factory=list)
    # Cards edited in the admin since the last load whose file says otherwise: left as they are.
    conflicts: list[str] = field(default_factory=list)
    overwritten: list[str] = field(default_factory=list)  # the same, replaced because of --force
    deck_conflicts: list[str] = field(default_factory=list)  # as conflicts, for decks
    decks_overwritten: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.retired or self.decks_changed)


def _card_fields(spec: CardSpec, deck: Deck) -> dict[str, Any]:
    return {
        "deck_id": deck.pk,
        "kind": spec.kind,
        "prompt": spec.prompt,
        "answer": spec.answer,
        "steps": spec.steps,
        "explanation": spec.explanation,
        "follow_up_question": spec.follow_up_question,
        "follow_up_answer": spec.follow_up_answer,
        "numeric_value": spec.numeric_value,
        "numeric_unit": spec.numeric_unit,
        "numeric_tolerance": spec.numeric_tolerance,
        "check_json": json.dumps(spec.check, ensure_ascii=False) if spec.check else "",
        "lab_preset": spec.lab_preset,
        "source": spec.source,
        "is_active": True,
    }


def _assign(obj: Any, values: dict[str, Any]) -> bool:
    """Set only what differs; True if anything did (so unchanged rows keep their updated_at)."""
    changed = False
    for name, value in values.items():
        if getattr(obj, name) != value:
            setattr(obj, name, value)
            changed = True
    return changed


def _sync_options(card: Card, spec: CardSpec, existing: list[ChoiceOption]) -> bool:
    changed = False
    for position, option in enumerate(spec.choice):
        values = {
            "text": option.text,
            "is_correct": option.correct,
            "why": option.why,
            "position": position,
        }
        if position < len(existing):
            row = existing[position]
            if _assign(row, values):
                row.save()
                changed = True
        else:
            ChoiceOption.objects.create(card=card, **values)
            changed = True
    surplus = [row.pk for row in existing[len(spec.choice) :]]
    if surplus:
        ChoiceOption.objects.filter(pk__in=surplus).delete()
        changed = True
    return changed


def _related_lists(tree: ContentTree) -> dict[str, list[str]]:
    """Each card's related slugs: its own list, then cards that list it but it does not (sorted),
    so links go both ways and a well-formed deck keeps its written order."""
    out = {card.slug: list(card.related) for card in tree.cards}
    back: dict[str, set[str]] = {slug: set() for slug in out}
    for card in tree.cards:
        for other in card.related:
            back[other].add(card.slug)
    for slug, listed in out.items():
        listed.extend(sorted(back[slug] - set(listed)))
    return out


def _admin_edits(tree: ContentTree, report: LoadReport, *, force: bool) -> set[str]:
    """Slugs of cards edited in the admin that this load must leave alone (reported as conflicts).

    An edited card whose file now says the same (it was exported) is simply clear again; with
    `force` every edited card is loaded from its file (and reported as overwritten)."""
    edited = edited_cards()
    if not edited:
        return set()
    files = {spec.slug: spec for spec in tree.cards}
    related = _related_lists(tree)
    keep: set[str] = set()
    for slug, (in_db, active) in edited.items():
        in_file = files.get(slug)
        if in_file is not None:
            in_file = dataclasses.replace(in_file, related=related[slug])
        # A card retired in the admin differs from its file too (loading would bring it back);
        # an inactive card the files lack (a draft, say) is not the load's to change.
        if (in_file, in_file is not None) == (in_db, active) or (in_file is None and not active):
            continue
        if force:
            report.overwritten.append(slug)
        else:
            keep.add(slug)
            report.conflicts.append(slug)
    Card.objects.filter(edited_since_load=True).exclude(slug__in=keep).update(
        edited_since_load=False
    )
    return keep


def _admin_deck_edits(tree: ContentTree, report: LoadReport, *, force: bool) -> set[str]:
    """Slugs of decks edited in the admin that this load must leave alone, as _admin_edits does
    for cards. A deck the files lack is not the load's to change (it never deletes decks)."""
    files = {spec.slug: spec for spec in tree.decks}
    keep = {slug for slug, in_db in edited_decks().items() if files.get(slug, in_db) != in_db}
    if force:
        report.decks_overwritten.extend(sorted(keep))
        keep = set()
    report.deck_conflicts.extend(sorted(keep))
    Deck.objects.filter(edited_since_load=True).exclude(slug__in=keep).update(
        edited_since_load=False
    )
    return keep


@transaction.atomic
def content_load(*, tree: ContentTree, force: bool = False) -> LoadReport:
    """Upsert decks and cards by slug, retire cards that left the files, link related cards both
    ways. Loading the same tree twice writes nothing the second time. A card or deck edited in the
    admin since the last load is left as it is and reported, unless `force`."""
    report = LoadReport()
    keep = _admin_edits(tree, report, force=force)
    keep_decks = _admin_deck_edits(tree, report, force=force)
    decks = {d.slug: d for d in Deck.objects.all()}
    for deck_spec in tree.decks:
        if deck_spec.slug in keep_decks:
            continue
        values = {"title": deck_spec.title, "description": deck_spec.description}
        deck = decks.get(deck_spec.slug)
        if deck is None:
            decks[deck_spec.slug] = Deck.objects.create(slug=deck_spec.slug, **values)
            report.decks_changed.append(deck_spec.slug)
        elif _assign(deck, values):
            deck.save()
            report.decks_changed.append(deck_spec.slug)

    tags = {t.slug: t for t in Tag.objects.all()}
    for slug in sorted({tag for card in tree.cards for tag in card.tags} - set(tags)):
        tags[slug] = Tag.objects.create(slug=slug)

    # Personal cards are not the files' to update or retire.
    shared = Card.objects.filter(owner__isnull=True)
    cards = {c.slug: c for c in shared.prefetch_related("options", "card_tags")}
    touched: set[str] = set()
    for spec in tree.cards:
        if spec.slug in keep:
            continue
        values = _card_fields(spec, decks[spec.deck])
        card = cards.get(spec.slug)
        if card is None:
            card = cards[spec.slug] = Card.objects.create(slug=spec.slug, **values)
            report.created.append(spec.slug)
            _sync_options(card, spec, [])
            have_tags: list[int] = []
        else:
            if _assign(card, values):
                card.save()
                touched.add(spec.slug)
            if _sync_options(card, spec, list(card.options.all())):
                touched.add(spec.slug)
            have_tags = [ct.tag_id for ct in card.card_tags.all()]
        wanted_tags = [tags[slug].pk for slug in spec.tags]
        if wanted_tags != have_tags:
            CardTag.objects.filter(card=card).delete()
            CardTag.objects.bulk_create(
                CardTag(card=card, tag_id=tag_id, position=i)
                for i, tag_id in enumerate(wanted_tags)
            )
            touched.add(spec.slug)

    # Parents and related cards need every card to exist first.
    relations: dict[int, list[int]] = {}
    for rel in CardRelation.objects.order_by("from_card", "position", "id"):
        relations.setdefault(rel.from_card_id, []).append(rel.to_card_id)
    parents = {spec.slug: spec.parent for spec in tree.cards}
    for slug, related in _related_lists(tree).items():
        if slug in keep:
            continue
        card = cards[slug]
        parent_id = cards[parents[slug]].pk if parents[slug] else None
        if card.parent_id != parent_id:
            card.parent_id = parent_id
            card.save(update_fields=["parent", "updated_at"])
            touched.add(slug)
        wanted = [cards[other].pk for other in related]
        if relations.get(card.pk, []) != wanted:
            CardRelation.objects.filter(from_card=card).delete()
            CardRelation.objects.bulk_create(
                CardRelation(from_card=card, to_card_id=to_id, position=i)
                for i, to_id in enumerate(wanted)
            )
            touched.add(slug)
    report.updated = sorted(touched - set(report.created))

    for slug, card in sorted(cards.items()):
        if slug not in parents and card.is_active and slug not in keep:
            card.is_active = False
            card.save(update_fields=["is_active", "updated_at"])
            report.retired.append(slug)
    # Bulk writes above send no signals: drop this process's cached cards explicitly.
    transaction.on_commit(card_cache_clear)
    return report
