"""A thin layer over py-fsrs (FSRS-6): conversions, the four outcomes, and the learner's study day.

No scheduling maths here; `fsrs.Scheduler.review_card` does all of it. This module never imports
Django models, so it can be tested with plain values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from fsrs import Card as FsrsCard
from fsrs import Rating, Scheduler, State
from fsrs.scheduler import DEFAULT_PARAMETERS, FUZZ_RANGES

UTC = dt.UTC  # py-fsrs accepts only this tzinfo object, not ZoneInfo("UTC")
LEARNING_STEPS = (dt.timedelta(minutes=1), dt.timedelta(minutes=10))
RELEARNING_STEPS = (dt.timedelta(minutes=10),)
MAXIMUM_INTERVAL_DAYS = 36500
# Anki's "learn ahead limit": when nothing else is left, learning cards due this soon are shown.
LEARN_AHEAD = dt.timedelta(minutes=20)
# Anki's "maximum answer seconds": longer answers are stored as this.
MAX_ANSWER_MS = 60_000
LEECH_THRESHOLD = 8
FUZZ_FROM_DAYS = 3  # fsrs leaves intervals under 2.5 days unfuzzed
RATINGS = (Rating.Again, Rating.Hard, Rating.Good, Rating.Easy)
UTC_ZONE = ZoneInfo("UTC")  # a learner's default zone


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
        # Plain values, so no deep copy: asdict copying four outcomes was 14% of a reveal.
        return {
            "state": self.state,
            "step": self.step,
            "stability": self.stability,
            "difficulty": self.difficulty,
            "due": to_utc(self.due).isoformat(),
            "last_review": to_utc(self.last_review).isoformat() if self.last_review else None,
        }

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


def make_scheduler(
    desired_retention: float, *, parameters: Sequence[float] | None = None, fuzz: bool = True
) -> Scheduler:
    """The app's fsrs scheduler; `parameters` None means fsrs's defaults (FSRS-6, 21 floats)."""
    return Scheduler(
        parameters=tuple(parameters) if parameters is not None else DEFAULT_PARAMETERS,
        desired_retention=desired_retention,
        learning_steps=LEARNING_STEPS,
        relearning_steps=RELEARNING_STEPS,
        maximum_interval=MAXIMUM_INTERVAL_DAYS,
        enable_fuzzing=fuzz,
    )


def outcomes(
    state: CardState,
    *,
    card_id: int,
    now: dt.datetime,
    scheduler: Scheduler,
    tz: ZoneInfo = UTC_ZONE,
    rollover_hour: int = 0,
    last_day: dt.date | None = None,
    today: dt.date | None = None,
) -> dict[int, CardState]:
    """What each rating would do to the card if given at `now`, computed once with the real
    scheduler (fuzz included): store these and apply the chosen one, so labels match exactly.
    The same inputs always give the same outcomes (the fuzz is seeded).

    Three things differ from calling fsrs directly, all as Anki does (docs/scheduling.md):
    - elapsed time is counted in the learner's study days, not in 24-hour blocks: fsrs is handed a
      `last_review` exactly that many days before `now` (`last_day` is the study day of the
      previous review as logged; without it, the study day of `state.last_review`);
    - an interval of whole days ends at the start of the study day it names, in the learner's zone
      (DST-safe), not a multiple of 24 h after `now` (`today`: the study day of `now`, when it is
    not the one `now` falls in, see Context.day_floor);
    - passing intervals grow with the button: Hard < Good < Easy in days (capped at the maximum);
      Easy from a (re)learning step is longer than Good's interval would be (at least 2 days);
    - a passing Review interval is not shorter than the card's previous one unless it shrank by
      more than its fuzz range (`no_shrink_minimum`, Anki's rule, fuzz or not).
    """
    review_at = to_utc(now)
    today = today or study_date(review_at, tz, rollover_hour)
    card = state.to_fsrs(card_id)
    previous_interval = 0  # the card's current interval in study days (Review cards only)
    if state.last_review is not None:
        previous = last_day or study_date(to_utc(state.last_review), tz, rollover_hour)
        card.last_review = review_at - dt.timedelta(days=max(0, (today - previous).days))
        if state.state == State.Review:
            previous_interval = (study_date(to_utc(state.due), tz, rollover_hour) - previous).days
    exact = dataclasses.replace(scheduler, enable_fuzzing=False)
    results = {int(r): exact.review_card(card, r, review_at)[0] for r in RATINGS}
    # Fuzz seeded by the card and the review instant (Anki seeds by card and reps), so the log
    # replays to the same due date.
    rng = random.Random(f"{card_id}:{review_at.isoformat()}")
    floor = 0  # the previous passing button's interval in days
    out: dict[int, CardState] = {}
    for rating, result in results.items():
        if result.state == State.Review:
            days = round((result.due - review_at) / dt.timedelta(days=1))  # whole days
            low, high = days, days
            if scheduler.enable_fuzzing and days >= FUZZ_FROM_DAYS:
                low, high = fuzz_bounds(days, scheduler.maximum_interval)
            unrounded = unrounded_interval(scheduler, result.stability or 0.0)
            minimum = no_shrink_minimum(unrounded, previous_interval, scheduler.maximum_interval)
            low = min(max(low, minimum, floor + 1, 1), scheduler.maximum_interval)
            high = max(high, low)
            days = rng.randint(low, max(low, high))
            floor = days
            result.due = day_start(today + dt.timedelta(days=days), tz, rollover_hour)
        elif rating == Rating.Good and result.stability is not None:
            # Good is a (re)learning step: as Anki, Easy still beats the interval Good's
            # stability would earn (at least a day), so Easy is at least 2 days.
            floor = max(floor, 1, exact._next_interval(stability=result.stability))
        result.last_review = review_at
        out[rating] = CardState.from_fsrs(result)
    return out


def no_shrink_minimum(interval: float, previous: int, maximum: int) -> int:
    """Anki's floor for a passing review interval (minimum_review_fuzz_interval), fuzz or not:
    one that grew stays above the card's previous interval; one that shrank by no more than its
    fuzz range (Hard, often) keeps the previous interval; one that shrank further (new
    parameters or retention) may shrink. `interval` is unrounded, as Anki passes it: the range
    is around it, not around the whole days it rounds to."""
    if _round_half_up(interval) > previous:
        return previous + 1
    return previous if previous <= _anki_fuzz_upper(interval, maximum) else 0


def _round_half_up(value: float) -> int:
    """Rust's f32::round for a positive value (Python's round() goes to even: 2.5 -> 2)."""
    return math.floor(value + 0.5)


def _anki_fuzz_upper(interval: float, maximum: int) -> int:
    """The top of Anki's fuzz range around an unrounded interval (constrained_fuzz_bounds with a
    minimum of 1 day): no fuzz under 2.5 days, and a range of at least two days above 2."""
    interval = min(max(interval, 1.0), float(maximum))
    spread = _fuzz_spread(interval) if interval >= 2.5 else 0.0
    lower = min(max(_round_half_up(interval - spread), 1), maximum)
    upper = min(max(_round_half_up(interval + spread), 1), maximum)
    if upper == lower and 2 < upper < maximum:
        upper += 1
    return upper


def _fuzz_spread(interval: float) -> float:
    """How far fuzz reaches either side of an interval: one day plus a share of each band of
    the interval (fsrs's FUZZ_RANGES, the same as Anki's)."""
    return 1.0 + sum(
        band["factor"] * max(min(interval, band["end"]) - band["start"], 0.0)
        for band in FUZZ_RANGES
    )


def unrounded_interval(scheduler: Scheduler, stability: float) -> float:
    """The interval in days FSRS gives a stability before fsrs rounds it to whole days."""
    decay = -scheduler.parameters[20]
    factor = 0.9 ** (1 / decay) - 1
    return stability / factor * (scheduler.desired_retention ** (1 / decay) - 1)


def fuzz_bounds(days: int, maximum: int) -> tuple[int, int]:
    """The range fsrs fuzzes an interval of `days` into: one day plus a share of each band of
    the interval (fsrs's FUZZ_RANGES), at least 2 days, at most `maximum`."""
    spread = _fuzz_spread(float(days))
    high = min(round(days + spread), maximum)
    return min(max(2, round(days - spread)), high), high


def interval_shown(
    outcome: CardState,
    revealed_at: dt.datetime,
    tz: ZoneInfo,
    hour: int,
    today: dt.date | None = None,
) -> dt.timedelta:
    """The interval a button stands for: whole study days for a Review outcome (as Anki counts
    them, not the hours left until that day starts), else the time until it is due. `today`:
    the study day the outcome was computed on, when not the one `revealed_at` falls in (see
    Context.day_floor)."""
    if outcome.state == State.Review:
        today = today or study_date(revealed_at, tz, hour)
        return dt.timedelta(days=(study_date(outcome.due, tz, hour) - today).days)
    return outcome.due - revealed_at


def interval_label(
    outcome: CardState,
    revealed_at: dt.datetime,
    tz: ZoneInfo,
    hour: int,
    today: dt.date | None = None,
) -> str:
    """A button's label (interval_shown, in Anki's units)."""
    return format_interval(interval_shown(outcome, revealed_at, tz, hour, today))


def same_day_start(
    due: dt.datetime, was: tuple[ZoneInfo, int], now: tuple[ZoneInfo, int]
) -> dt.datetime:
    """A review due date (the start of a study day under the zone and rollover hour `was`) moved
    to the start of the same study day under `now`: Anki keeps a card's due day as a day
    number, so a change of zone or rollover moves when the day starts, not which day it is."""
    return day_start(study_date(to_utc(due), *was), *now)


@dataclass(frozen=True)
class Context:
    """What an outcome is computed with besides the card: the learner's day and scheduler.
    Stored with the showing (to notice a change before the grade) and on each log row (replay)."""

    time_zone: str
    rollover_hour: int
    desired_retention: float
    parameters: tuple[float, ...] | None = None  # None: fsrs's defaults
    # The study day never goes back: a change of zone or rollover hour that puts the present in
    # an earlier study day (a later hour, a zone to the west) keeps the learner on the day they
    # were on until the new settings reach it, so its limits are not opened again.
    day_floor: dt.date | None = None

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)

    def scheduler(self) -> Scheduler:
        return make_scheduler(self.desired_retention, parameters=self.parameters)

    def study_date(self, instant: dt.datetime) -> dt.date:
        day = study_date(to_utc(instant), self.tz, self.rollover_hour)
        return max(day, self.day_floor) if self.day_floor else day


@dataclass(frozen=True)
class LoggedReview:
    """One review log row as replay needs it: when, which button, and what it was computed with."""

    reviewed_at: dt.datetime
    rating: int
    study_date: dt.date
    context: Context


def outcomes_in(
    state: CardState,
    *,
    card_id: int,
    now: dt.datetime,
    context: Context,
    last_day: dt.date | None,
    today: dt.date | None = None,
) -> dict[int, CardState]:
    """`outcomes` with everything but the card taken from `context` (`today` too, unless given)."""
    return outcomes(
        state,
        card_id=card_id,
        now=now,
        scheduler=context.scheduler(),
        tz=context.tz,
        rollover_hour=context.rollover_hour,
        last_day=last_day,
        today=today or context.study_date(now),
    )


def replay(history: Sequence[LoggedReview], *, card_id: int) -> CardState:
    """The state a card reaches from its review log (oldest first) through the same conversion
    grading uses, each review with the zone, rollover, retention and parameters it was made with
    (seeded fuzz included): the stored state."""
    if not history:
        raise ValueError("an empty history has no state")
    state = new_card_state(history[0].reviewed_at)
    last_day: dt.date | None = None
    for review in history:
        state = outcomes_in(
            state,
            card_id=card_id,
            now=review.reviewed_at,
            context=review.context,
            last_day=last_day,
            today=review.study_date,  # as logged: the day it was made on
        )[review.rating]
        last_day = review.study_date
    return state


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


@functools.lru_cache(maxsize=64)
def reviews_in_first_days(desired_retention: float, days: int = 30) -> int:
    """How many times one new card is shown in its first `days` days when every answer is
    Good: its learning steps, then each review the scheduler gives it (no fuzz). The settings
    page's workload estimate rests on this, not on a rule of thumb."""
    scheduler = make_scheduler(desired_retention, fuzz=False)
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    end = start + dt.timedelta(days=days)
    state, shown = new_card_state(start), 0
    while state.due < end:
        shown += 1
        state = outcomes(state, card_id=1, now=state.due, scheduler=scheduler)[int(Rating.Good)]
    return shown
