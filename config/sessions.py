"""Sessions read from the cache (Redis) and written through to the database.

Every logged-in request reads its session; from Redis that is a key lookup, from PostgreSQL a
query. Django's cached_db does this but lets some cache failures escape (a log-in or log-out
with Redis down would be a 500). Here every cache call that fails falls back to the database and
is logged, so an outage costs a query per request, never a page. After a failure the process
leaves the cache alone for SESSION_CACHE_RETRY_S, so a Redis that hangs (accepts, never answers)
costs one timeout per process now and then, not one per request. A cached copy lives at most
SESSION_CACHE_S seconds: a log-out whose cache delete failed ends that session within that time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.sessions.backends import cached_db
from django.contrib.sessions.backends.db import SessionStore as DatabaseStore

logger = logging.getLogger(__name__)

_MISSING = object()
# Per process: until when the cache is left alone after a failure (time.monotonic()).
_skip_cache_until = 0.0


def _cache_call(
    what: str, call: Callable[[], Any], *, level: int = logging.WARNING, always: bool = False
) -> Any:
    """`call()`, or _MISSING when the cache failed now or (unless `always`) a moment ago."""
    global _skip_cache_until
    if not always and time.monotonic() < _skip_cache_until:
        return _MISSING
    try:
        return call()
    except Exception:
        _skip_cache_until = time.monotonic() + settings.SESSION_CACHE_RETRY_S
        logger.log(level, "session cache unavailable (%s); using the database", what, exc_info=True)
        return _MISSING


class SessionStore(cached_db.SessionStore):
    def _cache_ttl(self, expiry_age: int) -> int:
        return max(0, min(expiry_age, settings.SESSION_CACHE_S))

    def load(self) -> dict:
        data = _cache_call("read", lambda: self._cache.get(self.cache_key))
        if data is not _MISSING and data is not None:
            return data
        stored = self._get_session_from_db()
        if not stored:
            return {}
        data = self.decode(stored.session_data)
        ttl = self._cache_ttl(self.get_expiry_age(expiry=stored.expire_date))
        _cache_call("fill", lambda: self._cache.set(self.cache_key, data, ttl))
        return data

    def exists(self, session_key: str) -> bool:
        if session_key:
            cached = _cache_call(
                "exists", lambda: self.cache_key_prefix + session_key in self._cache
            )
            if cached is True:
                return True
        return DatabaseStore.exists(self, session_key)

    def save(self, must_create: bool = False) -> None:
        DatabaseStore.save(self, must_create)
        ttl = self._cache_ttl(self.get_expiry_age())
        _cache_call("write", lambda: self._cache.set(self.cache_key, self._session, ttl))

    def delete(self, session_key: str | None = None) -> None:
        DatabaseStore.delete(self, session_key)
        key = session_key or self.session_key
        if key is None:
            return
        # Always tried: a copy left behind answers for up to SESSION_CACHE_S more seconds.
        _cache_call(
            "delete",
            lambda: self._cache.delete(self.cache_key_prefix + key),
            level=logging.ERROR,
            always=True,
        )
