"""The quiz loop's own cost, in one process: CPU per request of each step against a logged-in
/healthz.

With Django's test client against the database the settings name (PostgreSQL for the figures
that count: DATABASE_URL=postgres://...), the real deck loaded (content/), learners with a high
new-card limit, and production's caches: the card cache on (QUIZ_CARD_CACHE_S=30), sessions in
Redis written through to the database (config/sessions.py; BENCH_QUIZ_REDIS_URL, by default
redis://127.0.0.1:6379/5, which the benchmark flushes). Each loop is what the browser's htmx
sends: a logged-in GET /healthz, then today's card (GET /quiz/), its answer (POST
/quiz/answer/<token>/) and its grade (POST /quiz/grade/<token>/). Each request is timed by
time.process_time() (this process only: the database server's CPU is not in it; the test
client's own work is, for /healthz as for the quiz). Templates render as in production, not
through the test environment's instrumented renderer (whose receiver in the test client copies
every template's context). Prints the median per step over the loops, the queries each step ran
(one loop, counted apart from the timed ones), each step's ratio to /healthz and the load
average.

Run with
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/serving_school \
      .venv/bin/pytest tests/benchmarks/bench_quiz_loop.py -p no:cacheprovider -s \
      -o python_files='bench_*.py'
or `make bench` (all the benchmarks). BENCH_QUIZ_LOOPS sets the number of timed loops (600),
BENCH_QUIZ_CARD_CACHE_S the card cache (30; 0 as under DEBUG).
The aim (issue 61): every step within 3x /healthz.
"""

from __future__ import annotations

import gc
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.http import HttpResponse
from django.template.base import Template
from django.test import Client
from django.test.utils import CaptureQueriesContext, _TestState

from quiz import selectors
from quiz.models import LearnerSettings

LOOPS = int(os.environ.get("BENCH_QUIZ_LOOPS", "600"))
REDIS = os.environ.get("BENCH_QUIZ_REDIS_URL", "redis://127.0.0.1:6379/5")
# Production's card cache (seconds); 0 measures the loop as `make run` serves it (DEBUG).
CARD_CACHE_S = int(os.environ.get("BENCH_QUIZ_CARD_CACHE_S", "30"))
# Loops before the timed ones: more than the first learner's whole deck (79 cards, each shown
# twice), so every card has been read once, as in a server that has been up a while.
WARM_UP = 200
HX = {"HTTP_HX_REQUEST": "true"}
TOKEN = re.compile(r"/quiz/answer/([\w-]+)/")
GRADE = re.compile(r"/quiz/grade/([\w-]+)/")
OPTION = re.compile(r'name="option" value="(\d+)"')
STEPS = ("healthz", "today", "answer", "grade")


def _post(client: Client, url: str, data: dict[str, object]) -> HttpResponse:
    # As htmx sends a form (the test client's default is multipart, dearer to parse).
    body = urlencode(data)
    return client.post(url, body, content_type="application/x-www-form-urlencoded", **HX)


class Learners:
    """Logged-in clients, one after another: a learner whose deck is done for the day (every
    card shown) hands over to the next, so every timed loop shows a card."""

    def __init__(self) -> None:
        self.made = 0
        self.client = self._next()

    def _next(self) -> Client:
        user = get_user_model().objects.create_user(f"bench{self.made}", password="x" * 20)
        LearnerSettings.objects.create(user=user, new_per_day=999)
        self.made += 1
        client = Client()
        client.force_login(user)
        return client

    def loop(self, timed: Callable[[str, Callable[[], object]], object]) -> None:
        client = self.client
        timed("healthz", lambda: client.get("/healthz"))
        panel = timed("today", lambda: client.get("/quiz/", **HX)).content.decode()
        token = TOKEN.search(panel)
        if token is None:  # this learner is done for today: the next one takes over
            self.client = self._next()
            return self.loop(timed)
        option = OPTION.search(panel)
        data = {"option": option.group(1)} if option else {"value": "1"}
        url = f"/quiz/answer/{token.group(1)}/"
        answer = timed("answer", lambda: _post(client, url, data)).content.decode()
        graded = GRADE.search(answer)
        assert graded, "the answer side has no grade buttons"
        url = f"/quiz/grade/{graded.group(1)}/"
        assert timed("grade", lambda: _post(client, url, {"rating": 3})).status_code == 200


def _run(learners: Learners, loops: int) -> dict[str, list[float]]:
    cpu: dict[str, list[float]] = {step: [] for step in STEPS}

    def timed(step: str, request: Callable[[], object]) -> object:
        started = time.process_time()
        response = request()
        cpu[step].append(1000 * (time.process_time() - started))
        assert response.status_code == 200, (step, response.status_code)
        return response

    for _ in range(loops):
        learners.loop(timed)
    return cpu


def _queries(learners: Learners) -> dict[str, int]:
    counts: dict[str, int] = {}

    def counted(step: str, request: Callable[[], object]) -> object:
        with CaptureQueriesContext(connection) as queries:
            response = request()
        counts[step] = len(queries)
        return response

    learners.loop(counted)
    return counts


@pytest.mark.django_db(transaction=True)
def test_quiz_loop_cpu_against_healthz(settings, monkeypatch):
    # Production's (settings.py turns the card cache off under DEBUG, and Redis is a CACHE_URL).
    settings.QUIZ_CARD_CACHE_S = CARD_CACHE_S
    settings.SESSION_ENGINE = "config.sessions"
    settings.CACHES = {"default": {"BACKEND": "config.cache.RedisCache", "LOCATION": REDIS}}
    from django.core.cache import cache

    cache.clear()
    monkeypatch.setattr(Template, "_render", _TestState.saved_data.template_render)
    selectors.card_cache_clear()
    call_command("load_content", verbosity=0)
    learners = Learners()
    _run(learners, WARM_UP)
    queries = _queries(learners)
    gc.collect()
    cpu = _run(learners, LOOPS)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    healthz = statistics.median(cpu["healthz"])
    print(
        f"\nquiz loop, {LOOPS} loops, {learners.made} learners, database "
        f"{connection.vendor}, sessions {settings.SESSION_ENGINE} at {REDIS}, card cache "
        f"{CARD_CACHE_S} s; load average {load}"
    )
    print("| step | CPU ms median | p90 | queries | / healthz |")
    print("| --- | --- | --- | --- | --- |")
    for step in STEPS:
        median = statistics.median(cpu[step])
        p90 = statistics.quantiles(cpu[step], n=10)[-1]
        print(f"| {step} | {median:.2f} | {p90:.2f} | {queries[step]} | {median / healthz:.1f}x |")
    loop = sum(statistics.median(cpu[step]) for step in STEPS[1:]) / 3
    print(f"quiz request, mean of the three medians: {loop:.2f} ms = {loop / healthz:.1f}x healthz")
    selectors.card_cache_clear()
