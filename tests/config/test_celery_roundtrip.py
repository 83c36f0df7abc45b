"""A task goes through the real broker to a real worker process and back (not eager mode)."""

import os

import pytest

from config.celery import app, ping

pytestmark = [pytest.mark.worker]


def test_it_is_not_eager():
    assert not app.conf.task_always_eager


def test_a_task_round_trips_through_a_real_worker(celery_worker):
    result = ping.apply_async(args=["hello"], queue="default")
    reply = result.get(timeout=60)
    assert reply["echo"] == "hello"
    assert reply["pid"] != os.getpid()
    assert reply["pid"] in {celery_worker.process.pid} | _children(celery_worker.process.pid)


def test_it_uses_the_services_named_in_the_environment():
    """CI exports PostgreSQL and Redis URLs; the suite must really run on them."""
    from django.db import connection

    on_postgres = os.environ.get("DATABASE_URL", "").startswith("postgres")
    expected_db = "postgresql" if on_postgres else "sqlite"
    assert connection.vendor == expected_db
    broker = os.environ.get("CELERY_BROKER_URL", "filesystem://")
    expected_transport = "redis" if broker.startswith("redis") else "filesystem"
    with app.connection_for_write() as conn:
        assert conn.transport.driver_type == expected_transport


def _children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return {int(p) for p in fh.read().split()}
    except OSError:
        return set()
