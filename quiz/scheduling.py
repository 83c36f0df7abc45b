"""A thin layer over py-fsrs (FSRS-6): conversions, the four outcomes, and the learner's study day.

No scheduling maths here; `fsrs.Scheduler.review_card` does all of it. This module never imports
Django models, so it can be tested with plain values.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any
from zoneinfo import ZoneInfo

from fsrs import Card as FsrsCard
from fsrs import Rating, Scheduler, State

UTC = dt.UTC  # py-fsrs accepts only this tzinfo object, not ZoneInfo("UTC")
LEARNING_STEPS = (dt.timedelta(minutes=1), dt.timedelta(minutes=10))
RELEARNING_STEPS = (dt.timedelta(minutes=10),)
MAXIMUM_INTERVAL_DAYS = 36500
# Anki's "learn ahead limit": when nothing else is left, learning cards due this soon are shown.
LEARN_AHEAD = dt.timedelta(minutes=20)
# Anki's "maximum answer seconds": longer answers are stored as this.
MAX_ANSWER_MS = 60_000
LEECH_THRESHOLD = 8
RATINGS = (Rating.Again, Rating.Hard, Rating.Good, Rating.Easy)


def to_utc(value: dt.datetime) -> dt.datetime:
    """Rows read back may carry ZoneInfo or another offset; py-fsrs wants datetime.UTC itself."""
    if value.tzinfo is None:
        raise ValueError("naive datetime: every time in the quiz must be timezone-aware")
    return value.astimezone(UTC)


@dataclass(frozen=True)
class CardState:
    """The scheduling columns of one learner's card, as plain values."""

    state: int
    step: int | None
    stability: float | None
    difficulty: float | None
    due: dt.datetime
    last_review: dt.datetime | None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["due"] = to_utc(self.due).isoformat()
        data["last_review"] = to_utc(self.last_review).isoformat() if self.last_review else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CardState:
        last = data["last_review"]
        return cls(
            state=int(data["state"]),
            step=data["step"],
            stability=data["stability"],
            difficulty=data["difficulty"],
            due=to_utc(dt.datetime.fromisoformat(data["due"])),
            last_review=to_utc(dt.datetime.fromisoformat(last)) if last else None,
        )

    def to_fsrs(self, card_id: int) -> FsrsCard:
        return FsrsCard(
            card_id=card_id,
            state=State(self.state),
            step=self.step,
            stability=self.stability,
            difficulty=self.difficulty,
            due=to_utc(self.due),
            last_review=to_utc(self.last_review) if self.last_review else None,
        )

    @classmethod
    def from_fsrs(cls, card: FsrsCard) -> CardState:
        return cls(
            state=int(card.state),
            step=card.step,
            stability=card.stability,
            difficulty=card.difficulty,
            due=to_utc(card.due),
            last_review=to_utc(card.last_review) if card.last_review else None,
        )


def new_card_state(now: dt.datetime) -> CardState:
    """A card the learner has never reviewed: py-fsrs's fresh Learning card, due now."""
    return CardState(State.Learning, 0, None, None, to_utc(now), None)


def make_scheduler(desired_retention: float, *, fuzz: bool = True) -> Scheduler:
    return Scheduler(
        desired_retention=desired_retention,
        learning_steps=LEARNING_STEPS,
        relearning_steps=RELEARNING_STEPS,
        maximum_interval=MAXIMUM_INTERVAL_DAYS,
        enable_fuzzing=fuzz,
    )


def outcomes(
    state: CardState, *, card_id: int, now: dt.datetime, scheduler: Scheduler
) -> dict[int, CardState]:
    """What each rating would do to the card if given at `now`, computed once with the real
    scheduler (fuzz included): store these and apply the chosen one, so labels match exactly."""
    card = state.to_fsrs(card_id)
    review_at = to_utc(now)
    return {
        int(rating): CardState.from_fsrs(scheduler.review_card(card, rating, review_at)[0])
        for rating in RATINGS
    }


def is_lapse(before: CardState, rating: int) -> bool:
    """A lapse is forgetting a graduated card (Again on a Review card), as in Anki."""
    return before.state == State.Review and rating == Rating.Again


def is_leech_event(lapses: int) -> bool:
    """Anki: the card becomes a leech at the threshold, then again every half-threshold."""
    if lapses < LEECH_THRESHOLD:
        return False
    return (lapses - LEECH_THRESHOLD) % (LEECH_THRESHOLD // 2) == 0


# --- The learner's day ---------------------------------------------------------------------------


def day_start(day: dt.date, tz: ZoneInfo, rollover_hour: int) -> dt.datetime:
    """The UTC instant at which study day `day` begins (its local rollover hour).

    An hour that does not exist (a spring-forward gap) resolves with the offset before the change,
    so the day starts at the first real instant after it; an hour that occurs twice uses the first.
    """
    local = dt.datetime.combine(day, dt.time(rollover_hour), tzinfo=tz)
    return local.astimezone(UTC)


def study_date(instant: dt.datetime, tz: ZoneInfo, rollover_hour: int) -> dt.date:
    """The study day an instant belongs to: days are [day_start(d), day_start(d + 1))."""
    day = instant.astimezone(tz).date()
    if instant < day_start(day, tz, rollover_hour):
        return day - dt.timedelta(days=1)
    return day


def format_interval(delta: dt.timedelta) -> str:
    """Compact label for an answer button, in Anki's units."""
    seconds = delta.total_seconds()
    if seconds < 60:
        return "<1m"
    if seconds < 3600:
        return f"{round(seconds / 60)}m"
    if seconds < 86400:
        return f"{round(seconds / 3600)}h"
    days = seconds / 86400
    if days < 30:
        return f"{round(days)}d"
    if days < 365:
        return f"{days / 30:.1f}mo".replace(".0mo", "mo")
    return f"{days / 365:.1f}y".replace(".0y", "y")
