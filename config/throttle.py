"""Throttles for the doors that cost a password hash: logging in, changing a password and
signing up.

Each attempt costs a PBKDF2 hash (about 0.3 s of CPU at Django 5.2's 10^6 iterations), so a
script posting passwords can hold a web worker. Attempts are counted in the cache (Redis when
CACHE_URL is set, so every gunicorn worker shares the counts) in fixed windows and checked
*before* any hash is computed. Log-ins (the site's and the admin's, `login_throttled`) and the
old password on the password-change form (`password_change_throttled`) count:

- failures per client address (LOGIN_FAILURES_PER_IP);
- failures per (account, address) (LOGIN_FAILURES_PER_ACCOUNT): an attacker's address is
  stopped, the owner's is not;
- failures per account from any address, a ceiling (LOGIN_FAILURES_PER_ACCOUNT_CEILING) and,
  once the account has LOGIN_FAILURES_PER_ACCOUNT failures, a delay of LOGIN_ACCOUNT_DELAY_S
  after each one. Both apply only to addresses the account has not logged in from before
  (remembered LOGIN_KNOWN_ADDRESS_DAYS), so guessing from rotating addresses is slowed to one
  try per delay while the owner, at home, still gets in;
- every hashed attempt per address and every successful log-in per account, per minute, so one
  account logging in again and again cannot keep the hash slots from everyone else;
- suspect attempts across the whole site, per minute (LOGIN_SUSPECT_CHECKS_PER_MIN): from an
  address the account has not logged in from, for an account under attack (LOGIN_FAILURES_PER_
  ACCOUNT failures from other addresses in the window) or from an address with failures. A spray
  of real names from rotating addresses is held to that many password checks a minute in all,
  while a learner on a new address whose account is not attacked is never counted nor refused by
  it, and hashes ahead of the spray (slot_tier).

The owner of an attacked account, on an address it has not used, is refused with what to do:
log in from a network the account has used before (the attacker has none), or wait.

The account is the one the typed name logs in as (`account_key`): Django's username field strips
and NFKC-normalises the name, so " victim2" and "ｖictim2" are victim2 and count as victim2.

Why not django-axes or django-ratelimit: axes locks (account, address) pairs and records every
failure as a database row, a write per guess under attack, and has no notion of hash slots,
successful-log-in budgets or a delay instead of a lock-out; ratelimit is a decorator over the
same cache counters as below, so it would save the twenty lines of counting but not the parts
that matter here (which account a name resolves to, which proxy to believe, who is exempt).
The counting stays here, in one small module with its own tests.

If the cache is unreachable the throttle lets requests through and logs it: logging in must keep
working when Redis is down, as the quiz does.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UsernameField
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse

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


def _trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in _trusted_networks(tuple(settings.TRUSTED_PROXIES)))


@functools.cache
def _trusted_networks(
    proxies: tuple[str, ...],
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(p, strict=False) for p in proxies]


def client_ip(request: HttpRequest) -> str:
    """The client's address. REMOTE_ADDR, unless the peer is one of TRUSTED_PROXIES: then the
    header it sets (CLIENT_IP_HEADER, X-Forwarded-For by default, or X-Real-IP) is read from the
    right, skipping our own proxies; the first address that is not one is the client's. The
    entries left of it were written by the client and are never believed, and a client that
    reaches gunicorn directly cannot choose its address by writing the header."""
    remote = str(request.META.get("REMOTE_ADDR", "") or "unknown")[:64]
    header = settings.CLIENT_IP_HEADER
    if not header or not _trusted(remote):
        return remote
    if not header.startswith("HTTP_"):
        header = "HTTP_" + header.upper().replace("-", "_")  # as Django names request headers
    client = remote
    for entry in reversed(str(request.META.get(header, "")).split(",")[-32:]):
        entry = entry.strip()
        try:
            ipaddress.ip_address(entry)
        except ValueError:
            break  # not an address: believe the last hop that was one
        client = entry
        if not _trusted(entry):
            break
    return client[:64]


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


# At most this many password hashes at once in one process. A check that finds no free slot
# within LOGIN_HASH_WAIT_S is answered "busy, try again" at once: waiting longer would park the
# worker's threads one by one until quiz requests and /healthz had none left.
#
# A freed slot goes to the most trusted waiter (`slot_tier`): a name from an address it logged
# in from before, then an account with no failures in the window, then everyone else
# (names of no account, addresses that failed, sign-ups). Guesses for random names from rotating
# addresses then cost a learner at most the one hash in progress, not a place behind all of them.
# The price: under such a flood, how soon a name is served hints that it is an account's.
class _Slots:
    def __init__(self, count: int) -> None:
        self._free = max(1, count)
        self._cond = threading.Condition()
        self._waiting = [0, 0, 0]  # waiters per tier

    def acquire(self, tier: int, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._waiting[tier] += 1
            try:
                while self._free == 0 or any(self._waiting[:tier]):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
                self._free -= 1
                return True
            finally:
                self._waiting[tier] -= 1
                self._cond.notify_all()  # a tier that stopped waiting may unblock the next

    def release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()

    # `with _hash_slots:` holds a slot (the tests stand in for another thread hashing).
    def __enter__(self) -> None:
        self.acquire(LOWEST_TIER, None)

    def __exit__(self, *exc: object) -> None:
        self.release()


LOWEST_TIER = 2
_hash_slots = _Slots(settings.LOGIN_HASH_CONCURRENCY)


class Busy(Exception):
    """Every password-hash slot of this process is taken."""


@contextmanager
def hash_slot(tier: int = LOWEST_TIER) -> Iterator[None]:
    if not _hash_slots.acquire(tier, settings.LOGIN_HASH_WAIT_S):
        raise Busy("Many people are logging in right now. Try again in a few seconds.")
    try:
        yield
    finally:
        _hash_slots.release()


def signup_limit() -> Limit:
    return Limit("signup-ip", settings.SIGNUPS_PER_IP, settings.SIGNUP_THROTTLE_WINDOW_S)


# -- log-in ----------------------------------------------------------------------------------


def account_key(raw_username: object) -> str:
    """Who a typed name logs in as: "user:<pk>" when it names an account, "name:<name>" when it
    does not, "" when it is no name at all. The name is cleaned as the log-in form cleans it
    (stripped, NFKC) and matched as ModelBackend matches it (exactly), falling back to a match
    that ignores case, as sign-up refuses names differing only in case."""
    field = UsernameField(max_length=150)
    try:
        name = field.clean(str(raw_username)[:300])
    except ValidationError:
        return ""
    users = get_user_model()._default_manager
    username_field = get_user_model().USERNAME_FIELD
    pk = users.filter(**{username_field: name}).values_list("pk", flat=True).first()
    if pk is None:
        pk = (
            users.filter(**{f"{username_field}__iexact": name})
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
    return f"user:{pk}" if pk is not None else f"name:{name}"


@dataclass(frozen=True)
class LoginAttempt:
    ip: str
    account: str  # account_key(); "" when no usable name was typed

    @property
    def pair(self) -> str:
        return f"{self.account}|{self.ip}"


def _limits() -> dict[str, Limit]:
    window = settings.LOGIN_THROTTLE_WINDOW_S
    return {
        "ip": Limit("login-ip", settings.LOGIN_FAILURES_PER_IP, window),
        "pair": Limit("login-account-ip", settings.LOGIN_FAILURES_PER_ACCOUNT, window),
        "account": Limit("login-user", settings.LOGIN_FAILURES_PER_ACCOUNT_CEILING, window),
        "logins-account": Limit("login-ok-user", settings.LOGINS_PER_ACCOUNT_PER_MIN, 60),
        "tries-ip": Limit("login-tries-ip", settings.LOGIN_ATTEMPTS_PER_IP_PER_MIN, 60),
        "suspect": Limit("login-suspect", settings.LOGIN_SUSPECT_CHECKS_PER_MIN, 60),
    }


def _cache_get(key: str) -> object:
    try:
        return cache.get(key)
    except Exception:
        logger.warning("throttle cache unavailable; letting the request through", exc_info=True)
        return None


def _cache_set(key: str, timeout_s: int) -> None:
    try:
        cache.set(key, 1, timeout=timeout_s)
    except Exception:
        logger.warning("throttle cache unavailable; mark not kept", exc_info=True)


def _known_key(attempt: LoginAttempt) -> str:
    return "throttle:login-known:" + hashlib.sha256(attempt.pair.encode()).hexdigest()[:32]


def _delay_key(attempt: LoginAttempt) -> str:
    return "throttle:login-delay:" + hashlib.sha256(attempt.account.encode()).hexdigest()[:32]


def login_check(attempt: LoginAttempt, what: str = "log-ins") -> None:
    """Raise Throttled if this attempt must not be hashed now; otherwise count it as a try of
    its address. (An account's successful log-ins are counted by login_record: counting its
    failed ones too would let an attacker use up the owner's.) `what` names the checks in the
    refusal: "log-ins", or "password checks" on the password-change form."""
    limits = _limits()
    check(
        limits["ip"],
        attempt.ip,
        f"Too many failed {what} from your address. Try again in {{minutes}} min.",
    )
    check(
        limits["tries-ip"],
        attempt.ip,
        f"Too many {what} from your address. Try again in {{minutes}} min.",
    )
    if attempt.account:
        check(
            limits["pair"],
            attempt.pair,
            f"Too many failed {what} for this account from "
            "your address. Try again in {minutes} min.",
        )
        if not _cache_get(_known_key(attempt)):
            check(
                limits["account"],
                attempt.account,
                f"Too many failed {what} for this account. "
                "Try again in {minutes} min, or from an address you have logged in from before. "
                + OWNER_HELP,
            )
            if _cache_get(_delay_key(attempt)):
                delay_s = settings.LOGIN_ACCOUNT_DELAY_S
                raise Throttled(
                    f"Several {what} for this account failed just now. Wait {delay_s} s, "
                    "then try again, or log in from an address you have logged in from before. "
                    + OWNER_HELP,
                    retry_after_s=delay_s,
                )
    if _suspect(attempt, limits):
        check(
            limits["suspect"],
            "site",
            "Many log-ins are failing across the site just now, and this one comes from an"
            " address this account has not logged in from. Try again in {minutes} min, or"
            " from an address you have logged in from before. " + OWNER_HELP,
        )
        hit(limits["suspect"], "site")
    if attempt.account:
        check(
            limits["logins-account"],
            attempt.account,
            "This account has logged in many times in the last minute. Try again in {minutes} min.",
        )
    hit(limits["tries-ip"], attempt.ip)


# Said to whoever an attacked account's throttle stops: the owner must know it is not their
# password, and what gets them in without helping the guesser (who has no such address).
OWNER_HELP = (
    "If this is your account: someone else has been guessing its password from other"
    " addresses; nobody has logged in, and your password still works from a network you have"
    " used this account from before (at home, at work)."
)


def _failures(limit: Limit, who: str) -> int:
    return _count(_key(limit, who)[0])


def _attacked(attempt: LoginAttempt, limits: dict[str, Limit]) -> bool:
    """The account has LOGIN_FAILURES_PER_ACCOUNT failures in the window from addresses other
    than this one (its owner's own typos from here do not make it attacked)."""
    others = _failures(limits["account"], attempt.account) - _failures(limits["pair"], attempt.pair)
    return others >= settings.LOGIN_FAILURES_PER_ACCOUNT


def _suspect(attempt: LoginAttempt, limits: dict[str, Limit]) -> bool:
    """Whether the site-wide cap on suspect checks applies: not for an account's known address,
    nor for an unattacked name tried from an address without failures."""
    failing_address = _failures(limits["ip"], attempt.ip) > 0
    if not attempt.account:
        return failing_address
    if _cache_get(_known_key(attempt)):
        return False
    # A name of no account is judged as an account is (its failures are counted by name), so a
    # fresh address cannot tell the two apart by which one the cap refuses.
    return failing_address or _attacked(attempt, limits)


def login_record(attempt: LoginAttempt, *, succeeded: bool) -> None:
    """Count a failure (per address, per pair, per account, and start the account's delay), or
    remember the address an account logged in from."""
    limits = _limits()
    if succeeded:
        if attempt.account:
            hit(limits["logins-account"], attempt.account)
            _cache_set(_known_key(attempt), settings.LOGIN_KNOWN_ADDRESS_DAYS * 86400)
        return
    hit(limits["ip"], attempt.ip)
    if not attempt.account:
        return
    hit(limits["pair"], attempt.pair)
    hit(limits["account"], attempt.account)
    key, _ = _key(limits["account"], attempt.account)
    if (_count(key) >= settings.LOGIN_FAILURES_PER_ACCOUNT) and settings.LOGIN_ACCOUNT_DELAY_S:
        _cache_set(_delay_key(attempt), settings.LOGIN_ACCOUNT_DELAY_S)


def slot_tier(attempt: LoginAttempt) -> int:
    """0: a name from an address it logged in from before; 1: an account with no failure in
    the window (from any address); 2: anything else (see _Slots), so a spray of real names from
    fresh addresses waits behind a learner once each name has failed once."""
    if not attempt.account.startswith("user:"):
        return LOWEST_TIER
    if _cache_get(_known_key(attempt)):
        return 0
    return LOWEST_TIER if _failures(_limits()["account"], attempt.account) else 1


def _password_throttled(
    view: Callable[..., HttpResponse],
    refuse: Callable[[HttpRequest, Exception, int, int], HttpResponse],
    attempt_of: Callable[[HttpRequest], LoginAttempt | None],
    outcome: Callable[[HttpRequest, HttpResponse], bool | None],
    what: str,
) -> Callable[..., HttpResponse]:
    """A view that checks a password: checked before the hash, waits for a hash slot, and is
    counted after as a success or failure (`outcome`; None counts neither). `attempt_of` gives
    None for a request that checks no password."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        attempt = attempt_of(request)
        if attempt is None:
            return view(request, *args, **kwargs)
        try:
            login_check(attempt, what)
        except Throttled as exc:
            return refuse(request, exc, 429, exc.retry_after_s)
        try:
            with hash_slot(slot_tier(attempt)):
                response = view(request, *args, **kwargs)
        except Busy as exc:
            return refuse(request, exc, 503, 2)
        succeeded = outcome(request, response)
        if succeeded is not None:
            login_record(attempt, succeeded=succeeded)
        return response

    return wrapped


def login_throttled(
    view: Callable[..., HttpResponse],
    refuse: Callable[[HttpRequest, Exception, int, int], HttpResponse],
) -> Callable[..., HttpResponse]:
    """Wrap a log-in view (the site's, the admin's). `refuse(request, reason, status,
    retry_after_s)` renders the refusal."""

    def attempt_of(request: HttpRequest) -> LoginAttempt | None:
        if request.method != "POST" or request.user.is_authenticated:
            return None
        return LoginAttempt(
            ip=client_ip(request), account=account_key(request.POST.get("username", ""))
        )

    def outcome(request: HttpRequest, response: HttpResponse) -> bool:
        return request.user.is_authenticated

    return _password_throttled(view, refuse, attempt_of, outcome, "log-ins")


def password_change_throttled(
    view: Callable[..., HttpResponse],
    refuse: Callable[[HttpRequest, Exception, int, int], HttpResponse],
) -> Callable[..., HttpResponse]:
    """Wrap the password-change view: its old password is a password check like a log-in's, so
    a wrong one counts as the account's failed log-in from this address (a stolen session
    cannot guess the password faster than the log-in form can) and hashes in the same slots."""

    def attempt_of(request: HttpRequest) -> LoginAttempt | None:
        if request.method != "POST" or not request.user.is_authenticated:
            return None
        return LoginAttempt(ip=client_ip(request), account=f"user:{request.user.pk}")

    def outcome(request: HttpRequest, response: HttpResponse) -> bool | None:
        if response.status_code == 302:
            return True
        form = (getattr(response, "context_data", None) or {}).get("form")
        if form is not None and "old_password" in form.errors:
            return False
        return None  # the old password was right; the new one was refused

    return _password_throttled(view, refuse, attempt_of, outcome, "password checks")
