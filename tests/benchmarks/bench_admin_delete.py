"""The admin's delete of a learner with 600,000 reviews, on PostgreSQL, in one web process.

It creates a fresh database (DATABASE_URL's server, named BENCH_DB, default i61b_admin_delete),
migrates it, seeds one learner with REVIEWS reviews over 300 cards by COPY (seconds, not
minutes), then drives the real admin views with Django's test client in this process, logged in
as a superuser: the user's delete confirmation page (GET) and the delete itself (POST). For each
it prints the time (perf_counter) and this process's resident memory before, at its peak
(sampled every 5 ms from /proc/self/statm) and the growth, and the load average. With `stock` it
does the same with Django's own confirmation and delete (config/admin_delete.py turned off),
for comparison. settings.DEBUG is turned off after set-up, as in production, so Django keeps no
log of the queries.

Not part of `make test` (wall-clock and memory figures, minutes of seeding). Run it with
    .venv/bin/python -m tests.benchmarks.bench_admin_delete [reviews] [stock]
e.g. `... bench_admin_delete 600000`; DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432.
"""

from __future__ import annotations

import datetime as dt
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SERVER = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB_NAME = os.environ.get("BENCH_DB", "i61b_admin_delete")
REVIEWS = 600_000
CARDS = 300
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


def measured(name: str, call: Callable[[], Any]) -> Any:
    """Run `call`, printing its time and this process's memory before, at peak and growth."""
    peak = [_rss_mib()]
    before = peak[0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    peak[0] = max(peak[0], _rss_mib())
    print(
        f"{name}: {elapsed:.2f} s, RSS {before:.0f} -> peak {peak[0]:.0f} MiB"
        f" (+{peak[0] - before:.0f} MiB)",
        flush=True,
    )
    return result


def _fresh_database() -> None:
    import psycopg

    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin_db:
        admin_db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        admin_db.execute(f'CREATE DATABASE "{DB_NAME}"')


def _seed(reviews: int) -> tuple[int, int]:
    """A superuser and a learner with `reviews` reviews over CARDS cards (and their states)."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from quiz.models import Card, Deck, ReviewState

    User = get_user_model()
    staff = User.objects.create_superuser("bench-staff", password="bench-staff-0123")
    learner = User.objects.create_user("bench-learner", password="bench-learner-0123")
    deck = Deck.objects.create(slug="bench-deck", title="Bench deck")
    cards = Card.objects.bulk_create(
        Card(deck=deck, slug=f"bench-{i}", kind="recall", prompt=f"Q{i}?", answer=f"A{i}.")
        for i in range(CARDS)
    )
    now = dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)
    ReviewState.objects.bulk_create(
        ReviewState(user=learner, card=card, due=now, last_review=now) for card in cards
    )
    columns = (
        "user_id, card_id, rating, kind, reviewed_at, study_date, duration_ms, answer,"
        " state_before, token, time_zone, rollover_hour, desired_retention"
    )
    started = time.perf_counter()
    with connection.cursor() as cursor:
        raw = cursor.connection.cursor()
        with raw.copy(f"COPY quiz_reviewlog ({columns}) FROM STDIN") as copy:
            for i in range(reviews):
                at = now - dt.timedelta(minutes=i)
                copy.write_row(
                    (learner.pk, cards[i % CARDS].pk, 1 + i % 4, 2, at, at.date(), 4000, "",
                     "{}", f"bench-{i}", "UTC", 4, 0.9)
                )  # fmt: skip
        raw.execute("ANALYZE quiz_reviewlog")
    print(f"seeded {reviews:,} reviews by COPY in {time.perf_counter() - started:.1f} s")
    return staff.pk, learner.pk


def main(reviews: int, stock: bool) -> None:
    os.environ["DATABASE_URL"] = f"{SERVER}/{DB_NAME}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    _fresh_database()
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    from config import admin_delete
    from quiz.models import ReviewLog

    call_command("migrate", verbosity=0)
    staff_pk, learner_pk = _seed(reviews)
    settings.DEBUG = False
    if stock:
        # Django's own: the confirmation lists every row, the delete is one collector.
        admin_delete.LIST_LIMIT = 10**12
        admin_delete.delete_in_batches = lambda objs: admin_delete._as_queryset(objs).delete()
    client = Client(HTTP_HOST="localhost")
    client.force_login(get_user_model().objects.get(pk=staff_pk))
    client.get(reverse("admin:index"))  # the first request of a process loads the admin
    url = reverse("admin:auth_user_delete", args=[learner_pk])
    label = "stock Django" if stock else "bounded"
    page = measured(f"{label} confirmation page (GET)", lambda: client.get(url))
    assert page.status_code == 200, page.status_code
    print(f"  page: {len(page.content):,} bytes")
    done = measured(f"{label} delete (POST)", lambda: client.post(url, {"post": "yes"}))
    assert done.status_code == 302, done.status_code
    assert not ReviewLog.objects.filter(user_id=learner_pk).exists()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"process peak RSS (getrusage, incl. seeding): {peak_kib / 1024:.0f} MiB")
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args and args[0].isdigit() else REVIEWS, "stock" in args)
