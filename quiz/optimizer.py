"""Fitting FSRS's 21 parameters to one learner's review log, with fsrs-rs (`fsrs-rs-python`, the
Rust implementation Anki itself uses; no torch). Plain values in and out: no Django here.

The log is turned into fsrs-rs's training items as Anki does: for each card, every review made on
a later study day than the one before it ends an item holding the card's reviews up to it, each
with the study days elapsed since the previous one (same-day reviews count 0 days and stay in,
for FSRS-6's short-term terms).

An item holds the card's whole history, so the items' size grows with the square of a card's
reviews. Two rules keep it linear: a card's study date never goes back (a review dated before
the card's previous one, after a change of time zone, counts as the same day, so dates going
back and forth do not make every review "a day later"), and only a card's first
MAX_CARD_REVIEWS reviews are used.

The fit is judged on reviews it did not see: the latest HELD_OUT of the reviews, by time, are
held out; the fit sees the items ending before them, and both parameter sets are scored on the
items ending in them (each with the card's earlier history, as a prediction would have).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import fsrs_rs_python as fsrs_rs

from quiz import scheduling

# Reviews made at least a day after the card's previous one. fsrs's own optimizer keeps the
# defaults below this many; Anki's manual asks for "a few hundred". Below it the fit is noise.
MIN_REVIEWS = 512
# Beyond this many reviews a card adds nothing a fit needs (FSRS intervals grow quickly, so a
# real card rarely has 50 on later days); it bounds each item's length.
MAX_CARD_REVIEWS = 128
# The latest quarter of the reviews, by time, is held out to judge the fit.
HELD_OUT = 0.25
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
    # {"current": {...}, "fitted": {...}}, each log_loss and rmse: "current" is the parameter set
    # in force (fsrs's defaults if none). Training: on the items the fit saw; held out: on the
    # latest reviews, which it did not.
    training: dict[str, dict[str, float]]
    held_out: dict[str, dict[str, float]]
    intervals: list[dict[str, object]]
    reviews: int  # training items
    held_out_reviews: int

    @property
    def wins(self) -> bool:
        """Whether the fit predicts the held-out reviews better than the parameters in force:
        only then may it replace them."""
        if not self.held_out_reviews:
            return False
        return self.held_out["fitted"]["log_loss"] < self.held_out["current"]["log_loss"]


class NotEnoughReviews(ValueError):
    pass


def _items(reviews: Sequence[Review]) -> list[tuple[int, fsrs_rs.FSRSItem]]:
    """(index in `reviews` of the review that ends it, item), for each item of the log (any order
    of cards; each card's reviews in the order made)."""
    by_card: dict[int, list[int]] = {}
    for index, review in enumerate(reviews):
        by_card.setdefault(review.card_id, []).append(index)
    items = []
    for indices in by_card.values():
        sequence: list[fsrs_rs.FSRSReview] = []
        day = reviews[indices[0]].study_date
        for i, index in enumerate(indices[:MAX_CARD_REVIEWS]):
            review = reviews[index]
            days = max(0, (review.study_date - day).days)
            day = max(day, review.study_date)  # never back: see the module's docstring
            sequence.append(fsrs_rs.FSRSReview(review.rating, days))
            if i > 0 and days > 0:
                items.append((index, fsrs_rs.FSRSItem(list(sequence))))
    return items


def training_items(reviews: Sequence[Review]) -> list[fsrs_rs.FSRSItem]:
    """fsrs-rs items from a whole log (any order of cards; each card's reviews in the order
    made)."""
    return [item for _, item in _items(reviews)]


def split_by_time(
    reviews: Sequence[Review],
) -> tuple[list[fsrs_rs.FSRSItem], list[fsrs_rs.FSRSItem]]:
    """(training items, held-out items): an item is held out when the review it ends with is
    among the latest HELD_OUT of all reviews by study date (ties in the order given)."""
    by_time = sorted(range(len(reviews)), key=lambda i: reviews[i].study_date)
    held = set(by_time[len(reviews) - int(len(reviews) * HELD_OUT) :])
    train: list[fsrs_rs.FSRSItem] = []
    held_out: list[fsrs_rs.FSRSItem] = []
    for index, item in _items(reviews):
        (held_out if index in held else train).append(item)
    return train, held_out


def evaluate(parameters: Sequence[float], items: Sequence[fsrs_rs.FSRSItem]) -> dict[str, float]:
    """How well `parameters` predict the recalls in `items`: log loss and RMSE (binned, as Anki)."""
    result = fsrs_rs.FSRS(list(parameters)).evaluate(list(items))
    return {"log_loss": result.log_loss, "rmse": result.rmse_bins}


def interval_table(
    current: Sequence[float], fitted: Sequence[float], desired_retention: float
) -> list[dict[str, object]]:
    """The interval each path of INTERVAL_PATHS ends with, under both parameter sets: through the
    app's own scheduler (scheduling.outcomes, no fuzz), so a learning step shows as the app gives
    it ("10m"), not as the days FSRS alone would give, and a review interval in study days, as
    its button shows it (not the hours left from the press to the start of that day; outcomes'
    default day starts at midnight UTC).
    "current"/"fitted" are labels, "current_s"/"fitted_s" the same in seconds."""
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
            interval = scheduling.interval_shown(state, pressed, scheduling.UTC_ZONE, 0)
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
    """Fit parameters to the earlier reviews; compare them with `current` (None: fsrs's defaults)
    on those and on the latest ones, held out. Raises NotEnoughReviews below MIN_REVIEWS reviews
    made on a later day (training and held out together)."""
    progress(5, "Reading your reviews")
    train, held_out = split_by_time(reviews)
    usable = len(train) + len(held_out)
    if usable < MIN_REVIEWS:
        raise NotEnoughReviews(
            f"Optimizing needs at least {MIN_REVIEWS} reviews made a day or more after the card's"
            f" previous one; you have {usable}."
        )
    current = list(current or scheduling.DEFAULT_PARAMETERS)
    progress(20, f"Fitting to your {len(train)} earlier reviews")
    fitted = list(fsrs_rs.FSRS(current).compute_parameters(train))
    scheduling.make_scheduler(desired_retention, parameters=fitted)  # py-fsrs accepts them
    progress(80, f"Comparing on your {len(held_out)} latest reviews")
    return Fit(
        parameters=fitted,
        training={"current": evaluate(current, train), "fitted": evaluate(fitted, train)},
        held_out=(
            {"current": evaluate(current, held_out), "fitted": evaluate(fitted, held_out)}
            if held_out
            else {}
        ),
        intervals=interval_table(current, fitted, desired_retention),
        reviews=len(train),
        held_out_reviews=len(held_out),
    )


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
