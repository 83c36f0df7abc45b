"""The Redis cache keeps one client per connection pool (config/cache.py)."""

from __future__ import annotations

import pytest
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache

from config.cache import RedisCache

LOCATION = "redis://127.0.0.1:6379/7"


def test_it_reuses_one_client_where_djangos_builds_one_per_call():
    ours = RedisCache(LOCATION, {})
    assert ours._cache.get_client("k") is ours._cache.get_client("other", write=True)
    stock = DjangoRedisCache(LOCATION, {})
    assert stock._cache.get_client("k") is not stock._cache.get_client("k")


def test_the_reused_client_reads_and_writes():
    cache = RedisCache(LOCATION, {"OPTIONS": {"socket_connect_timeout": 0.5}})
    try:
        cache.set("config-cache-test", {"n": 1}, 30)
    except Exception:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    assert cache.get("config-cache-test") == {"n": 1}
    cache.delete("config-cache-test")
    assert cache.get("config-cache-test") is None


def test_production_settings_use_it(settings):
    from tests.config.test_env_file import settings_of

    dumped = settings_of("", CACHE_URL=LOCATION)["settings"]
    assert "'config.cache.RedisCache'" in dumped["CACHES"]
