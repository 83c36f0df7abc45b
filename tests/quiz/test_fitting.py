"""quiz/fitting.py: a fit runs in a process of its own, capped in memory, and never outlives
the worker's wait for it."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from quiz import fitting, optimizer


def long_cards_log(reviews: int) -> list[optimizer.Review]:
    """Cards of 128 reviews two days apart (the most a fit uses of a card): each review ends an
    item holding the card's whole history, so the fit's memory grows fast with the log."""
    start = dt.date(2024, 1, 1)
    log = [
        optimizer.Review(
            card, 1 if (card + i) % 5 == 0 else 3, start + dt.timedelta(days=card % 50 + 2 * i)
        )
        for card in range(reviews // optimizer.MAX_CARD_REVIEWS + 1)
        for i in range(optimizer.MAX_CARD_REVIEWS)
    ][:reviews]
    return sorted(log, key=lambda review: review.study_date)


def _rows(log):
    return ((r.card_id, r.rating, r.study_date) for r in log)


def _run(log, **options):
    options = {"memory_limit_mb": 2048, "cpu_limit_s": 120, **options}
    return fitting.run(_rows(log), current=None, desired_retention=0.9, new_per_day=20, **options)


@pytest.fixture
def children(monkeypatch):
    """The fit processes started meanwhile."""
    started: list[subprocess.Popen] = []
    popen = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(fitting.subprocess, "Popen", recording)
    return started


def test_a_fit_past_its_memory_limit_ends_its_own_process_not_the_callers(children):
    log = long_cards_log(10_000)
    with pytest.raises(fitting.OutOfMemory, match="more than 16 MB"):
        _run(log, memory_limit_mb=16)
    assert children[0].returncode != 0
    # The same log under the default limit fits: the limit alone stopped it.
    result = _run(log)
    assert result["reviews"] > 5000 and len(result["parameters"]) == 21
    assert [row["retention"] for row in result["workload"]] == [0.80, 0.85, 0.90, 0.95]


def test_a_fit_interrupted_by_the_time_limit_kills_its_process(children):
    def soft_time_limit(percent, stage):
        raise SoftTimeLimitExceeded()

    with pytest.raises(SoftTimeLimitExceeded):
        _run(long_cards_log(10_000), progress=soft_time_limit)
    assert children[0].poll() is not None  # killed and reaped, not left fitting


def test_a_log_too_small_is_refused_with_the_optimizers_message():
    with pytest.raises(ValueError, match="at least 512"):
        _run(long_cards_log(300))
