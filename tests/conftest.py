from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.worker import start_worker


def pytest_collection_modifyitems(config, items):
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


@pytest.fixture
def celery_worker(transactional_db):
    """A real `celery worker` process on the default and sim queues, against the test database."""
    worker = start_worker(["default", "labs.sim"])
    yield worker
    worker.stop()
