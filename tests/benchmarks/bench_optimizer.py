"""How long fitting FSRS parameters to 5,000 reviews takes on the worker, and that the pages do
not wait for it.

Not part of the default run. `make bench` (or
    .venv/bin/pytest tests/benchmarks/bench_optimizer.py -o python_files='bench_*.py' -s)
prints the fit's time in seconds, the time from "Optimize" to "done" through a real worker, and
the slowest response of the parameters page while the fit ran.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.urls import reverse

from quiz import optimizer, parameters
from quiz.models import ParameterFit
from tests.quiz.synthetic_learners import review_log
from tests.quiz.test_optimizer import _store
from tests.worker import start_worker


def test_fitting_5000_reviews_in_process():
    log = review_log("forgetful", 5000, 11)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        fit = optimizer.fit(log, current=None, desired_retention=0.9)
        times.append(time.perf_counter() - started)
    print(f"\nfit of 5,000 reviews ({fit.reviews} items): best {min(times):.2f} s of 3")
    assert fit.training["fitted"]["log_loss"] < fit.training["current"]["log_loss"]


@pytest.fixture
def fit_worker(transactional_db):
    """A worker of the fit's own queue (quiz.fit), which the shared test worker does not serve."""
    worker = start_worker(["quiz.fit"])
    yield worker
    worker.stop()


@pytest.mark.django_db(transaction=True)
def test_the_worker_fits_5000_reviews_while_pages_answer(alice, client, fit_worker):
    _store(alice, review_log("forgetful", 5000, 12))
    client.force_login(alice)
    client.get(reverse("quiz:parameters"))  # warm: the first request of a process is slow
    started = time.perf_counter()
    fit = parameters.fit_start(user=alice)
    enqueued = time.perf_counter() - started
    slowest = 0.0
    pages = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        t = time.perf_counter()
        assert client.get(reverse("quiz:parameters")).status_code == 200
        slowest = max(slowest, time.perf_counter() - t)
        pages += 1
        fit.refresh_from_db()
        if fit.status not in parameters.RUNNING:
            break
        time.sleep(0.1)
    total = time.perf_counter() - started
    assert fit.status == ParameterFit.Status.DONE, fit.error
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        client.get(reverse("quiz:parameters"))
        warm.append(time.perf_counter() - t)
    print(
        f"\nworker: optimize -> done {total:.2f} s (the request itself {enqueued * 1000:.0f} ms);"
        f" {pages} page loads meanwhile, slowest {slowest * 1000:.0f} ms;"
        f" the page afterwards: median {sorted(warm)[2] * 1000:.0f} ms"
    )
    assert fit.finished_at - fit.created_at < dt.timedelta(minutes=2)
