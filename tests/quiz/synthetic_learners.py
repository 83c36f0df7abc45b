"""Synthetic learners whose true forgetting follows FSRS parameters unlike the defaults.

Each card is scheduled by the app's rules with the default parameters (as a new learner is), but
whether the learner recalls it is drawn from the retrievability their *true* parameters give: so
the log carries the signal an optimizer should find. Used by tests/quiz/test_optimizer.py and
tests/benchmarks/bench_optimizer.py.
"""

from __future__ import annotations

import datetime as dt
import random

from fsrs import Card, Rating, Scheduler

from quiz import optimizer, scheduling

START = dt.datetime(2026, 1, 1, 9, tzinfo=dt.UTC)


def true_parameters(kind: str) -> list[float]:
    """A forgetful, a retentive and a fast-decaying learner (valid FSRS-6 parameters)."""
    params = list(scheduling.DEFAULT_PARAMETERS)
    if kind == "forgetful":  # initial stabilities a third of the defaults, slower growth
        params[:4] = [w * 0.35 for w in params[:4]]
        params[8] *= 0.7
    elif kind == "retentive":  # 2.5 times the initial stabilities, faster growth
        params[:4] = [w * 2.5 for w in params[:4]]
        params[8] *= 1.3
    elif kind == "steep":  # a steeper forgetting curve, lapses cost more
        params[20] = 0.6
        params[10] *= 0.5
    else:
        raise ValueError(f"unknown learner {kind!r}")
    return params


def review_log(kind: str, reviews: int, seed: int) -> list[optimizer.Review]:
    """`reviews` reviews of cards of 3-12 reviews each, one review per study day at most."""
    rng = random.Random(seed)
    truth = Scheduler(parameters=true_parameters(kind), enable_fuzzing=False)
    app = Scheduler(enable_fuzzing=False, learning_steps=(), relearning_steps=())
    log: list[optimizer.Review] = []
    card_id = 0
    while len(log) < reviews:
        card_id += 1
        true_card, app_card = Card(card_id=card_id), Card(card_id=card_id)
        now = START + dt.timedelta(days=rng.randrange(200))
        for n in range(rng.randint(3, 12)):
            if n == 0:
                rating = rng.choice([1, 2, 3, 3, 3, 4])
            else:
                recalled = rng.random() < truth.get_card_retrievability(true_card, now)
                rating = rng.choice([2, 3, 3, 3, 3, 4]) if recalled else 1
            log.append(optimizer.Review(card_id, rating, now.date()))
            true_card, _ = truth.review_card(true_card, Rating(rating), now)
            app_card, _ = app.review_card(app_card, Rating(rating), now)
            now = max(app_card.due, now + dt.timedelta(days=1))
            if len(log) == reviews:
                break
    return log
