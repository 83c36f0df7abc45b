"""Sessions read from the cache and written through to the database (config/sessions.py)."""

from __future__ import annotations

import socket

import pytest
from django.contrib.sessions.models import Session
from django.core.cache.backends.locmem import LocMemCache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _cache_not_paused():
    # The pause after a cache failure is per process: no test may leave it on for the next.
    from config import sessions

    sessions._skip_cache_until = 0.0
    yield
    sessions._skip_cache_until = 0.0


PASSWORD = "a-long-passphrase-1"  # noqa: S105 - the test users' password (tests/conftest.py)


def _closed_port() -> int:
    # A port nothing listens on: a cache pointed there fails at once (connection refused).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _redis(location: str) -> dict:
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": location,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }


@pytest.fixture
def cached_sessions(settings):
    settings.SESSION_ENGINE = "config.sessions"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    from django.core.cache import caches

    caches["default"].clear()
    return settings


def _log_in(client) -> None:
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302, response.content[:300]


def test_a_logged_in_request_reads_its_session_from_the_cache(client, alice, cached_sessions):
    _log_in(client)
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("quiz:today")).status_code == 200
    assert not [q for q in ctx.captured_queries if "django_session" in q["sql"]]
    assert Session.objects.count() == 1  # and it is in the database too


def test_with_the_cache_down_sessions_fall_back_to_the_database(client, alice, settings):
    settings.SESSION_ENGINE = "config.sessions"
    settings.CACHES = _redis(f"redis://127.0.0.1:{_closed_port()}/0")
    _log_in(client)
    assert Session.objects.count() == 1
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("quiz:today")).status_code == 200
    assert [q for q in ctx.captured_queries if "django_session" in q["sql"]]
    assert client.post(reverse("logout")).status_code == 302
    assert Session.objects.count() == 0
    assert client.get(reverse("quiz:today")).status_code == 302  # logged out, to the log-in page


class CountingBrokenCache(LocMemCache):
    """A cache whose every read and write fails, counting the attempts."""

    calls = 0

    def _fail(self, *args, **kwargs):
        CountingBrokenCache.calls += 1
        raise ConnectionError("cache down")

    get = set = delete = has_key = _fail


def test_after_a_cache_failure_requests_skip_the_cache_for_a_while(client, alice, settings):
    from config import sessions

    settings.SESSION_ENGINE = "config.sessions"
    settings.CACHES = {"default": {"BACKEND": f"{__name__}.CountingBrokenCache"}}
    settings.SESSION_CACHE_RETRY_S = 60
    CountingBrokenCache.calls = 0
    _log_in(client)
    tried = CountingBrokenCache.calls
    assert tried >= 1  # the first failure started the pause
    for _ in range(3):
        assert client.get(reverse("quiz:today")).status_code == 200
    # A hanging Redis costs one timeout per process per pause, not one (or two) per request.
    assert CountingBrokenCache.calls == tried
    sessions._skip_cache_until = 0.0  # the pause is over: the next request tries again
    assert client.get(reverse("quiz:today")).status_code == 200
    assert CountingBrokenCache.calls == tried + 1
    # A log-out always tries to drop the cached copy, pause or not.
    calls = CountingBrokenCache.calls
    assert client.post(reverse("logout")).status_code == 302
    assert CountingBrokenCache.calls == calls + 1 and Session.objects.count() == 0


def test_a_cached_session_lives_at_most_session_cache_s(client, alice, settings):
    settings.SESSION_ENGINE = "config.sessions"
    settings.CACHES = _redis("redis://127.0.0.1:6379/7")
    settings.SESSION_CACHE_S = 120
    from django.core.cache import caches

    cache = caches["default"]
    try:
        cache.clear()
    except Exception:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    _log_in(client)
    key = "django.contrib.sessions.cached_db" + client.cookies["sessionid"].value
    ttl = cache._cache.get_client(key).ttl(cache.make_and_validate_key(key))
    # Two weeks in the database; two minutes in Redis, so a log-out whose cache delete failed
    # stops answering soon.
    assert 0 < ttl <= 120, ttl
    assert client.post(reverse("logout")).status_code == 302
    assert cache.get(key) is None
    cache.clear()


def test_sessions_use_the_cache_only_when_redis_is_shared(tmp_path):
    from tests.config.test_env_file import settings_of

    (tmp_path / ".env").write_text("")
    alone = settings_of(str(tmp_path / ".env"))["settings"]
    shared = settings_of(str(tmp_path / ".env"), CACHE_URL="redis://127.0.0.1:6379/1")["settings"]
    # A per-process memory cache would not see a log-out made through another process.
    assert alone["SESSION_ENGINE"] == repr("django.contrib.sessions.backends.db")
    assert shared["SESSION_ENGINE"] == repr("config.sessions")
