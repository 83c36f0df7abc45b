"""Sessions read from the cache (Redis) and written through to the database.

Every logged-in request reads its session; from Redis that is a key lookup, from PostgreSQL a
query. Django's cached_db does this but lets some cache failures escape (a log-in or log-out
with Redis down would be a 500). Here every cache call that fails falls back to the database and
is logged, so an outage costs a query per request, never a page. A cached copy lives at most
SESSION_CACHE_S seconds: a log-out whose cache delete failed ends that session within that time.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.sessions.backends import cached_db

logger = logging.getLogger(__name__)


class SessionStore(cached_db.SessionStore):
    def _cache_ttl(self, expiry_age: int) -> int:
        return max(0, min(expiry_age, settings.SESSION_CACHE_S))

    def load(self) -> dict:
        try:
            data = self._cache.get(self.cache_key)
        except Exception:
            logger.warning("session cache unavailable; reading the database", exc_info=True)
            data = None
        if data is not None:
            return data
        stored = self._get_session_from_db()
        if not stored:
            return {}
        data = self.decode(stored.session_data)
        ttl = self._cache_ttl(self.get_expiry_age(expiry=stored.expire_date))
        try:
            self._cache.set(self.cache_key, data, ttl)
        except Exception:
            logger.warning("session cache unavailable; not cached", exc_info=True)
        return data

    def exists(self, session_key: str) -> bool:
        try:
            if session_key and (self.cache_key_prefix + session_key) in self._cache:
                return True
        except Exception:
            logger.warning("session cache unavailable; asking the database", exc_info=True)
        return super(cached_db.SessionStore, self).exists(session_key)

    def save(self, must_create: bool = False) -> None:
        super(cached_db.SessionStore, self).save(must_create)
        try:
            self._cache.set(self.cache_key, self._session, self._cache_ttl(self.get_expiry_age()))
        except Exception:
            logger.warning("session cache unavailable; saved to the database only", exc_info=True)

    def delete(self, session_key: str | None = None) -> None:
        super(cached_db.SessionStore, self).delete(session_key)
        key = session_key or self.session_key
        if key is None:
            return
        try:
            self._cache.delete(self.cache_key_prefix + key)
        except Exception:
            logger.error(
                "session cache unavailable; a cached copy of a deleted session may answer for "
                "up to SESSION_CACHE_S more seconds",
                exc_info=True,
            )
