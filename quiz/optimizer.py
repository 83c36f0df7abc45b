"""Fitting FSRS's 21 parameters to one learner's review log, with fsrs-rs (`fsrs-rs-python`, the
Rust implementation Anki itself uses; no torch). Plain values in and out: no Django here.

The log is turned into fsrs-rs's training items as Anki does: for each card, every review made on
a later study day than the one before it ends an item holding the card's reviews up to it, each
with the study days elapsed since the previous one (same-day reviews count 0 days and stay in,
for FSRS-6's short-term terms).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import fsrs_rs_python as fsrs_rs

from quiz import scheduling

# Reviews made at least a day after the card's previous one. fsrs's own optimizer keeps the
# defaults below this many; Anki's manual asks for "a few hundred". Below it the fit is noise.
MIN_REVIEWS = 512
# Rows of the "how your intervals change" table: a new card answered with these buttons, each
# when it falls due (learning steps included).
INTERVAL_PATHS = (
    ("Good",),
    ("Good", "Good"),
    ("Good", "Good", "Good"),
    ("Good", "Good", "Good", "Good"),
    ("Easy",),
    ("Hard", "Good"),
    ("Good", "Again", "Good"),
)
_BUTTONS = {"Again": 1, "Hard": 2, "Good": 3, "Easy": 4}


@dataclass(frozen=True)
class Review:
    card_id: int
    rating: int
    study_date: dt.date


@dataclass(frozen=True)
class Fit:
    parameters: list[float]
    current: dict[str, float]  # log_loss and rmse of the parameters in force, on the same reviews
    fitted: dict[str, float]
    intervals: list[dict[str, object]]
    reviews: int


class NotEnoughReviews(ValueError):
    pass


def training_items(reviews: Iterable[Review]) -> list[fsrs_rs.FSRSItem]:
    """fsrs-rs items from a log (any order of cards; each card's reviews in the order made)."""
    by_card: dict[int, list[Review]] = {}
    for review in reviews:
        by_card.setdefault(review.card_id, []).append(review)
    items = []
    for history in by_card.values():
        sequence: list[fsrs_rs.FSRSReview] = []
        for i, review in enumerate(history):
            days = 0 if i == 0 else (review.study_date - history[i - 1].study_date).days
            sequence.append(fsrs_rs.FSRSReview(review.rating, max(0, days)))
            if i > 0 and days > 0:
                items.append(fsrs_rs.FSRSItem(list(sequence)))
    return items


def evaluate(parameters: Sequence[float], items: Sequence[fsrs_rs.FSRSItem]) -> dict[str, float]:
    """How well `parameters` predict the recalls in `items`: log loss and RMSE (binned, as Anki)."""
    result = fsrs_rs.FSRS(list(parameters)).evaluate(list(items))
    return {"log_loss": result.log_loss, "rmse": result.rmse_bins}


def interval_table(
    current: Sequence[float], fitted: Sequence[float], desired_retention: float
) -> list[dict[str, object]]:
    """The interval each path of INTERVAL_PATHS ends with, under both parameter sets: through the
    app's own scheduler (scheduling.outcomes, no fuzz), so a learning step shows as the app gives
    it ("10m"), not as the days FSRS alone would give. "current"/"fitted" are labels,
    "current_s"/"fitted_s" the same in seconds."""
    start = dt.datetime(2026, 1, 5, 12, tzinfo=dt.UTC)
    rows = []
    for path in INTERVAL_PATHS:
        row: dict[str, object] = {"path": ", ".join(path)}
        for name, parameters in (("current", current), ("fitted", fitted)):
            scheduler = scheduling.make_scheduler(
                desired_retention, parameters=parameters, fuzz=False
            )
            state, pressed = scheduling.new_card_state(start), start
            for button in path:
                pressed = state.due  # each answer given when the card falls due
                state = scheduling.outcomes(state, card_id=1, now=pressed, scheduler=scheduler)[
                    _BUTTONS[button]
                ]
            interval = state.due - pressed
            row[name] = scheduling.format_interval(interval)
            row[f"{name}_s"] = interval.total_seconds()
        rows.append(row)
    return rows


def fit(
    reviews: Sequence[Review],
    *,
    current: Sequence[float] | None,
    desired_retention: float,
    progress: Callable[[int, str], None] = lambda percent, stage: None,
) -> Fit:
    """Fit parameters to `reviews`; compare them with `current` (None: fsrs's defaults) on the
    same reviews. Raises NotEnoughReviews below MIN_REVIEWS reviews made on a later day."""
    progress(5, "Reading your reviews")
    items = training_items(reviews)
    if len(items) < MIN_REVIEWS:
        raise NotEnoughReviews(
            f"Optimizing needs at least {MIN_REVIEWS} reviews made a day or more after the card's"
            f" previous one; you have {len(items)}."
        )
    current = list(current or scheduling.DEFAULT_PARAMETERS)
    progress(20, f"Fitting to {len(items)} reviews")
    fitted = list(fsrs_rs.FSRS(current).compute_parameters(items))
    scheduling.make_scheduler(desired_retention, parameters=fitted)  # py-fsrs accepts them
    progress(80, "Comparing with your current parameters")
    return Fit(
        parameters=fitted,
        current=evaluate(current, items),
        fitted=evaluate(fitted, items),
        intervals=interval_table(current, fitted, desired_retention),
        reviews=len(items),
    )


def count_long_term(reviews: Iterable[Review]) -> int:
    """How many reviews count towards MIN_REVIEWS (cheap: no items built)."""
    last: dict[int, dt.date] = {}
    n = 0
    for review in reviews:
        previous = last.get(review.card_id)
        if previous is not None and review.study_date > previous:
            n += 1
        last[review.card_id] = review.study_date
    return n


WORKLOAD_RETENTIONS = (0.80, 0.85, 0.90, 0.95)
WORKLOAD_DAYS = 365


def workload(
    parameters: Sequence[float], *, deck_size: int, new_per_day: int
) -> list[dict[str, float]]:
    """Anki's workload/retention trade-off: fsrs-rs simulates a year of study of `deck_size`
    cards (`new_per_day` new ones a day, no review cap) at each desired retention. Reviews a day
    are the year's average; "remembered" is the expected number of cards known at its end."""
    config = fsrs_rs.default_simulator_config()
    config.deck_size = deck_size
    config.learn_span = WORKLOAD_DAYS
    config.learn_limit = max(1, new_per_day)
    config.max_cost_perday = 1e9  # no time cap: count every review the schedule asks for
    rows = []
    for retention in WORKLOAD_RETENTIONS:
        result = fsrs_rs.simulate(list(parameters), retention, config, 28)
        reviews = result.review_cnt_per_day
        rows.append(
            {
                "retention": retention,
                "reviews_per_day": sum(reviews) / len(reviews),
                "remembered": result.memorized_cnt_per_day[-1],
            }
        )
    return rows
