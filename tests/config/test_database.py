"""PostgreSQL keeps the plans of the quiz's queries (config/settings.py, DB_PREPARED_STATEMENTS)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from quiz import selectors

pytestmark = pytest.mark.django_db


def test_the_queue_query_is_prepared_once_it_has_run_a_few_times(alice):
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    for _ in range(7):
        selectors.queue_today(user=alice, now=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, custom_plans + generic_plans FROM pg_prepared_statements")
        prepared = cursor.fetchall()
    runs = [n for statement, n in prepared if "done_new" in statement]
    # Planned once, then reused (psycopg prepares a query on its 6th run on a connection).
    assert runs and runs[0] >= 1, prepared
