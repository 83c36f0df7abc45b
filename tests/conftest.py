from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.worker import WorkerProcess, purge, start_worker, stop_shared

# What a test asks for that makes it talk to the database, the broker or a worker process: CI's
# second pass (SQLite and the filesystem broker) runs these alone (`-m integration`).
INTEGRATION_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "live_server",
    "celery_worker",
    "sim_worker",
}


def pytest_collection_modifyitems(config, items):
    from tests import budget

    for item in items:
        # A module that scales its random counts (tests/budget.py) runs them in full under
        # `make test-deep-ci`, which selects it by this mark.
        if getattr(getattr(item, "module", None), "examples", None) is budget.examples:
            item.add_marker(pytest.mark.scaled)
        if (
            item.get_closest_marker("django_db")
            or item.get_closest_marker("worker")
            or item.get_closest_marker("browser")
            or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.integration)
    # Browser tests last: they are the slowest, and the rest should report first.
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


def pytest_sessionstart(session):
    # The suite's filesystem broker is a new folder (tests/settings.py): make its queue folders
    # as `make setup` does for the app's, or a run sent before any worker starts is lost.
    from django.conf import settings

    if settings.BROKER_DIR is not None:
        from config.preflight import check_broker

        check_broker()


def pytest_sessionfinish(session, exitstatus):
    # pytest-django deletes the SQLite test database file but not its WAL side files.
    from django.conf import settings

    name = settings.DATABASES["default"].get("TEST", {}).get("NAME")
    if name and settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        for suffix in ("-wal", "-shm"):
            Path(name + suffix).unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache: the log-in and sign-up throttles count in it, and
    the browser tests all sign up from 127.0.0.1."""
    from django.core.cache import cache

    cache.clear()


def make_user(username: str = "alice", *, password: str = "a-long-passphrase-1", **extra):
    return get_user_model().objects.create_user(username=username, password=password, **extra)


@pytest.fixture
def alice(db):
    return make_user("alice")


@pytest.fixture
def bob(db):
    return make_user("bob")


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


SIM_QUEUES = ["default", "labs.sim"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # The shared worker serves a run of consecutive tests that ask for it, and is stopped before
    # the last one's tables are flushed: no other test ever has a worker taking its messages or
    # a heartbeat saying one is online.
    uses = "celery_worker" in getattr(item, "fixturenames", ())
    if uses and "celery_worker" not in getattr(nextitem, "fixturenames", ()):
        stop_shared(SIM_QUEUES)
    yield


@pytest.fixture(scope="session")
def sim_worker(django_db_setup, django_db_blocker):
    """A real `celery worker` process on the default and sim queues, shared by consecutive tests
    that ask for it (stopped after the last of them, see pytest_runtest_teardown) and started
    again if a test stopped or killed it. It beats every second, so its heartbeat row is back
    soon after a test's flush of the tables."""
    started: list[WorkerProcess] = []

    def get() -> WorkerProcess:
        if not started or not started[-1].alive():
            with django_db_blocker.unblock():
                started.append(
                    start_worker(
                        SIM_QUEUES, extra_env={"LABS_WORKER_HEARTBEAT_S": "1"}, shared=True
                    )
                )
        return started[-1]

    yield get
    for worker in started:
        worker.stop()


@pytest.fixture
def celery_worker(transactional_db, sim_worker):
    """A real `celery worker` process on the default and sim queues, against the test database:
    the test process's shared one (sim_worker), announced (its heartbeat row written again after
    the last test's flush) and with no message left from the last test."""
    from labs.models import WorkerHeartbeat

    worker = sim_worker()
    purge(SIM_QUEUES)
    deadline = time.monotonic() + 60  # a limit for a busy machine, not a speed check
    while not WorkerHeartbeat.objects.filter(hostname__startswith=worker.name).exists():
        assert worker.alive(), worker.log()[-3000:]
        assert time.monotonic() < deadline, f"no heartbeat from the worker:\n{worker.log()[-3000:]}"
        time.sleep(0.1)
    return worker
