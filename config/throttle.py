"""Throttles for the two doors that cost a password hash: logging in and signing up.

Each attempt costs a PBKDF2 hash (about 0.3 s of CPU at Django 5.2's 10^6 iterations), so a
script posting passwords can hold a web worker. Attempts are counted in the cache (Redis when
CACHE_URL is set, so every gunicorn worker shares the counts) in fixed windows, per client
address and per account, and checked *before* any hash is computed.

If the cache is unreachable the throttle lets requests through and logs it: logging in must keep
working when Redis is down, as the quiz does.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limit:
    scope: str  # "login-ip", "login-user", "signup-ip"
    count: int
    window_s: int


class Throttled(Exception):
    def __init__(self, message: str, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


def client_ip(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or the header the proxy sets (CLIENT_IP_HEADER, such
    as X-Real-IP or HTTP_X_REAL_IP) when the site is behind one. Of a list (X-Forwarded-For) the
    last address counts: it is the one our proxy appended, the earlier ones the client wrote."""
    header = settings.CLIENT_IP_HEADER
    if header and not header.startswith("HTTP_"):
        header = "HTTP_" + header.upper().replace("-", "_")  # as Django names request headers
    raw = request.META.get(header, "") if header else ""
    raw = raw or request.META.get("REMOTE_ADDR", "") or "unknown"
    return raw.split(",")[-1].strip()[:64]


def _key(limit: Limit, who: str) -> tuple[str, int]:
    window = int(time.time()) // limit.window_s
    digest = hashlib.sha256(who.lower().encode()).hexdigest()[:32]
    return f"throttle:{limit.scope}:{digest}:{window}", limit.window_s - int(time.time()) % (
        limit.window_s
    )


def _count(key: str) -> int:
    try:
        return int(cache.get(key) or 0)
    except Exception:
        logger.warning("throttle cache unavailable; letting the request through", exc_info=True)
        return 0


def check(limit: Limit, who: str, message: str) -> None:
    """Raise Throttled when `who` has used up `limit` in the current window."""
    key, left_s = _key(limit, who)
    if _count(key) >= limit.count:
        minutes = max(1, round(left_s / 60))
        raise Throttled(message.format(minutes=minutes), retry_after_s=left_s)


def hit(limit: Limit, who: str) -> None:
    """Count one attempt of `who` against `limit`."""
    key, left_s = _key(limit, who)
    try:
        if not cache.add(key, 1, timeout=left_s + 1):
            cache.incr(key)
    except Exception:
        logger.warning("throttle cache unavailable; attempt not counted", exc_info=True)


# At most this many password hashes at once in one process. A log-in that finds no free slot
# within LOGIN_HASH_WAIT_S is answered "busy, try again" at once: waiting longer would park the
# worker's threads one by one until quiz requests and /healthz had none left.
_hash_slots = threading.BoundedSemaphore(max(1, settings.LOGIN_HASH_CONCURRENCY))


class Busy(Exception):
    """Every password-hash slot of this process is taken."""


@contextmanager
def hash_slot() -> Iterator[None]:
    if not _hash_slots.acquire(timeout=settings.LOGIN_HASH_WAIT_S):
        raise Busy("Many people are logging in right now. Try again in a few seconds.")
    try:
        yield
    finally:
        _hash_slots.release()


def login_limits() -> tuple[Limit, Limit]:
    per_ip, per_user = settings.LOGIN_FAILURES_PER_IP, settings.LOGIN_FAILURES_PER_ACCOUNT
    window = settings.LOGIN_THROTTLE_WINDOW_S
    return Limit("login-ip", per_ip, window), Limit("login-user", per_user, window)


def signup_limit() -> Limit:
    return Limit("signup-ip", settings.SIGNUPS_PER_IP, settings.SIGNUP_THROTTLE_WINDOW_S)
