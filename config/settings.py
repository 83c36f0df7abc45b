"""Settings: every deployment choice comes from the environment (see .env.example).

A `.env` file beside manage.py is read first (variables already in the environment win).
Unset, everything is embedded: SQLite and Celery's filesystem broker under var/, DEBUG on.
"""

from __future__ import annotations

import ipaddress
import os
import zoneinfo
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int, env_list, env_str, load_env_file

BASE_DIR = Path(__file__).resolve().parent.parent
ENV_FILE = load_env_file(BASE_DIR / ".env")
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", True)

_DEV_SECRET = "dev-only-insecure-key-do-not-use-in-production-0123456789abcdef"  # noqa: S105 - only used while DEBUG is on
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG=0 (a long random string).")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

TIME_ZONE = env_str("TIME_ZONE", "UTC")
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise ImproperlyConfigured(
        f"TIME_ZONE must be an IANA zone such as Europe/Paris, got {TIME_ZONE!r}"
    ) from None
USE_TZ = True
USE_I18N = False
LANGUAGE_CODE = "en-us"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "config",  # project package; listed for its management commands (preflight)
    "quiz",
    "labs",
]

MIDDLEWARE = [
    # First: a body too big for any form is refused before anything reads it.
    "config.uploads.RequestSizeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "config.middleware.HtmxLoginRedirectMiddleware",
    "csp.middleware.CSPMiddleware",
    "config.middleware.PrivacyHeadersMiddleware",
]

if not DEBUG:
    # Production serves static files itself (collectstatic into STATIC_ROOT, compressed).
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
        "whitenoise.middleware.WhiteNoiseMiddleware",
    )

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")
# A new PostgreSQL connection per request costs several ms of server CPU: keep them (seconds),
# and check one is alive before reusing it so a database restart costs one reconnect, not a 500.
_IS_SQLITE = DATABASE_URL.startswith("sqlite")
try:
    _db = dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("DB_CONN_MAX_AGE", 0 if _IS_SQLITE else 300),
        conn_health_checks=env_bool("DB_CONN_HEALTH_CHECKS", True),
    )
except ValueError as exc:
    raise ImproperlyConfigured(
        f"DATABASE_URL is not a database URL ({exc}): {DATABASE_URL!r}"
    ) from None
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so two graders of one card queue up instead of
    # both reading the old state (SQLite has no SELECT ... FOR UPDATE). WAL lets the web server
    # read while the lab worker writes.
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL;",
    }
    # A file, not :memory:, so a worker process started by a test sees the test database; one
    # per test process, so two suites running side by side do not share it.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")}
elif _db["ENGINE"] == "django.db.backends.postgresql":
    _db.setdefault("OPTIONS", {})["connect_timeout"] = env_int("DB_CONNECT_TIMEOUT", 5)
    # Prepared statements: PostgreSQL spent more CPU planning the quiz's queries than running
    # them. With parameters sent apart from the query (server-side binding), psycopg prepares a
    # query once it has run 5 times on a connection and PostgreSQL reuses its plan. Django leaves
    # this off for connection poolers: set DB_PREPARED_STATEMENTS=0 behind a transaction-pooling
    # PgBouncer. A migration that changes a column's type needs the web processes restarted (as
    # any deploy does): a plan prepared before it cannot change its result type.
    if env_bool("DB_PREPARED_STATEMENTS", True):
        _db["OPTIONS"]["server_side_binding"] = True
        _db["OPTIONS"]["prepare_threshold"] = 5
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth -------------------------------------------------------------------------------------
# ModelBackend, loading the session's user with its quiz settings in one query (config/backends.py).
AUTHENTICATION_BACKENDS = ["config.backends.ModelBackendWithSettings"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Log-in and sign-up throttles (config/throttle.py, which says what each counts): failures per
# client address, per (account, address) and per account; hashed tries per minute; sign-ups per
# address; password hashes at once per process.
LOGIN_FAILURES_PER_IP = env_int("LOGIN_FAILURES_PER_IP", 20)
LOGIN_FAILURES_PER_ACCOUNT = env_int("LOGIN_FAILURES_PER_ACCOUNT", 5)
LOGIN_FAILURES_PER_ACCOUNT_CEILING = env_int("LOGIN_FAILURES_PER_ACCOUNT_CEILING", 50)
LOGIN_ACCOUNT_DELAY_S = env_int("LOGIN_ACCOUNT_DELAY_S", 10)
LOGIN_KNOWN_ADDRESS_DAYS = env_int("LOGIN_KNOWN_ADDRESS_DAYS", 30)
LOGINS_PER_ACCOUNT_PER_MIN = env_int("LOGINS_PER_ACCOUNT_PER_MIN", 10)
LOGIN_ATTEMPTS_PER_IP_PER_MIN = env_int("LOGIN_ATTEMPTS_PER_IP_PER_MIN", 60)
# Password checks a minute, site-wide, of suspect log-ins (config/throttle.py): a spray of real
# names from rotating addresses; never a learner's first try at an unattacked account.
LOGIN_SUSPECT_CHECKS_PER_MIN = env_int("LOGIN_SUSPECT_CHECKS_PER_MIN", 30)
LOGIN_THROTTLE_WINDOW_S = env_int("LOGIN_THROTTLE_WINDOW_S", 900)
SIGNUPS_PER_IP = env_int("SIGNUPS_PER_IP", 5)
SIGNUP_THROTTLE_WINDOW_S = env_int("SIGNUP_THROTTLE_WINDOW_S", 3600)
LOGIN_HASH_CONCURRENCY = env_int("LOGIN_HASH_CONCURRENCY", 1)
LOGIN_HASH_WAIT_S = float(env_int("LOGIN_HASH_WAIT_MS", 500)) / 1000
# Behind a proxy: the header it sets to the client's address, believed only when the request
# comes from one of TRUSTED_PROXIES (addresses or networks); from anyone else, REMOTE_ADDR.
CLIENT_IP_HEADER = env_str("CLIENT_IP_HEADER", "X-Forwarded-For")
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", ["127.0.0.1", "::1"])
for _proxy in TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"TRUSTED_PROXIES must list addresses or networks (10.0.0.0/8), got {_proxy!r}"
        ) from None

# --- Cache (throttle counts) --------------------------------------------------------------------
# Redis shares the counts between gunicorn workers; unset, each process counts for itself.
CACHE_URL = env_str("CACHE_URL", "")
if CACHE_URL:
    if urlsplit(CACHE_URL).scheme not in {"redis", "rediss"}:
        raise ImproperlyConfigured(f"CACHE_URL must be redis://host:port/db, got {CACHE_URL!r}")
    CACHES = {
        "default": {
            "BACKEND": "config.cache.RedisCache",
            "LOCATION": CACHE_URL,
            # A down Redis must cost little: the throttle lets requests through when it fails.
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Sessions: every logged-in request reads one. With Redis they are read from it and written
# through to the database (config/sessions.py falls back to the database when Redis is down);
# without it, each process's memory cache cannot see another's log-out, so the database alone.
SESSION_CACHE_S = env_int("SESSION_CACHE_S", 300)
# After a Redis failure, a process reads sessions from the database alone for this long.
SESSION_CACHE_RETRY_S = env_int("SESSION_CACHE_RETRY_S", 5)
SESSION_ENGINE = "config.sessions" if CACHE_URL else "django.contrib.sessions.backends.db"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "quiz:today"
LOGOUT_REDIRECT_URL = "login"

# --- Static files -----------------------------------------------------------------------------
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- Uploads ------------------------------------------------------------------------------------
# The largest file a form takes (a study document in the admin). A body beyond it and the form's
# slack is refused from its Content-Length before it is read (config.uploads).
UPLOAD_MAX_BYTES = env_int("UPLOAD_MAX_BYTES", 1_000_000)

# --- Security (production) ------------------------------------------------------------------------
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    # Off only for a plain-HTTP run on loopback (the load test); always on behind TLS.
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
X_FRAME_OPTIONS = "DENY"
# Only the site's own scripts, styles and images: no inline script, style or handler anywhere
# (htmx's indicator style is turned off in base.html; chart data travels as JSON blocks).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# Features no page uses are off for every page (config.middleware.PrivacyHeadersMiddleware).
PERMISSIONS_POLICY = (
    "accelerometer=(), camera=(), geolocation=(), gyroscope=(), magnetometer=(), "
    "microphone=(), payment=(), usb=()"
)

# --- Celery -----------------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", f"filesystem://{VAR_DIR / 'broker'}")
_broker = urlsplit(CELERY_BROKER_URL)
BROKER_DIR: Path | None  # the filesystem broker's folder (config.preflight checks it); else None
if _broker.scheme == "filesystem":
    # One variable names the folder: filesystem:///abs/path (Celery itself takes no path here).
    _broker_dir = Path(_broker.path or str(VAR_DIR / "broker"))
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
        # An idle worker lists the queue folder this often (kombu's default is 1 s): a sweep's
        # points, each a fraction of a second of simulation, would otherwise wait ~1 s apiece.
        "polling_interval": env_int("CELERY_BROKER_POLLING_MS", 100) / 1000,
    }
    CELERY_RESULT_BACKEND = f"file://{_broker_dir / 'results'}"
    BROKER_DIR = _broker_dir
elif _broker.scheme in {"redis", "rediss"}:
    # Redis redelivers an unacked message after the visibility timeout; it must exceed the longest
    # task's hard time limit or a slow lab would run twice.
    # A hung Redis (accepts, never answers) must not hold a web thread in apply_async: each
    # socket call gives up after a few seconds and the submit is refused as "queue unavailable".
    # A worker's BRPOP waits 1 s for a message (kombu), so the timeout must be longer than that.
    _broker_socket_timeout_s = env_int("CELERY_BROKER_SOCKET_TIMEOUT_S", 2)
    if _broker_socket_timeout_s < 2:
        raise ImproperlyConfigured(
            "CELERY_BROKER_SOCKET_TIMEOUT_S must be at least 2 (seconds), "
            f"got {_broker_socket_timeout_s}"
        )
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 2 * 3600),
        "socket_connect_timeout": _broker_socket_timeout_s,
        "socket_timeout": _broker_socket_timeout_s,
    }
    CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
    BROKER_DIR = None
else:
    raise ImproperlyConfigured(
        "CELERY_BROKER_URL must be redis://host:port/db or filesystem:///path, "
        f"got {env_str('CELERY_BROKER_URL')!r}"
    )
CELERY_BROKER_DISPLAY = env_str("CELERY_BROKER_URL", f"filesystem://{VAR_DIR / 'broker'}")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker whose broker went away keeps trying to reconnect (every few seconds, at most 30 s
# apart) for as long as it takes, rather than giving up after 100 tries and exiting.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# One quick retry of a publish (a broker restart), not Celery's default three: a web request
# waits for it, and a broker still down after that is reported to the learner.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_RESULT_EXPIRES = 3600
CELERY_TIMEZONE = "UTC"

# --- Logging ----------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # httpx logs every request at INFO: a lab run or `lab calibrate` makes thousands.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

# --- Quiz -------------------------------------------------------------------------------------
# Seconds each process keeps a card it has read (quiz.selectors.card_for_quiz); edits made through
# the ORM clear it at once in that process. Off while DEBUG, so a local edit shows immediately.
QUIZ_CARD_CACHE_S = env_int("QUIZ_CARD_CACHE_S", 0 if DEBUG else 30)
# At most this many cards in that cache (the deck and the personal cards read recently).
QUIZ_CARD_CACHE_MAX = env_int("QUIZ_CARD_CACHE_MAX", 2000)

# "Optimize my parameters" (quiz.parameters): the fit's soft time limit (the hard one is 30 s
# later), and how long a fit may wait queued before it counts as lost.
QUIZ_FIT_TIME_LIMIT_S = env_int("QUIZ_FIT_TIME_LIMIT_S", 600)
QUIZ_FIT_QUEUED_STALE_S = env_int("QUIZ_FIT_QUEUED_STALE_S", 3600)
# A running fit's worker marks it alive this often; the page fails a running fit silent for
# QUIZ_FIT_STALE_S (its worker was killed), whatever time limit the fit worker runs it under.
QUIZ_FIT_HEARTBEAT_S = env_int("QUIZ_FIT_HEARTBEAT_S", 10)
QUIZ_FIT_STALE_S = env_int("QUIZ_FIT_STALE_S", 45)
# The memory (address space) of a fit's own process (quiz.fitting); a fit that needs more fails
# and says so. A fit of 600,000 reviews peaks at about 0.9 GB (128 reviews a card, the most used).
QUIZ_FIT_MEMORY_LIMIT_MB = env_int("QUIZ_FIT_MEMORY_LIMIT_MB", 2048)

# --- Labs -------------------------------------------------------------------------------------
# Each lab backend has its own queue; a worker serves a backend by consuming its queue (`celery -A
# config worker -Q labs.sim`, a GPU worker `-Q labs.gpu`). A GPU worker also consumes
# `labs.gpu.<kind>.x<n>` for each count n of its GPUs it can serve (labs.runs.workers), and a vLLM
# run is sent to the queue of its GPU kind and tp (labs.runs.submission._precheck); Celery creates
# such queues on first use.
LABS_BACKEND_QUEUES = {"sim": "labs.sim", "vllm": "labs.gpu"}
# Workers write a heartbeat row this often and count as online for LABS_WORKER_ONLINE_S after it.
LABS_WORKER_HEARTBEAT_S = env_int("LABS_WORKER_HEARTBEAT_S", 10)
LABS_WORKER_ONLINE_S = env_int("LABS_WORKER_ONLINE_S", 30)
# A running run bumps heartbeat_at this often; the reaper (run from every worker's heartbeat
# thread) fails a running run whose heartbeat is older than LABS_RUN_STALE_S (a killed worker).
LABS_RUN_HEARTBEAT_S = env_int("LABS_RUN_HEARTBEAT_S", 5)
LABS_RUN_STALE_S = env_int("LABS_RUN_STALE_S", 60)
# A queued run nobody picked up this long, while no worker for its backend is online, is failed.
LABS_QUEUED_STALE_S = env_int("LABS_QUEUED_STALE_S", 3600)
# Quotas: runs a learner may have queued or running (each point of a sweep counts, and a full
# sweep of LABS_SWEEP_MAX_VALUES fits); GPU runs in flight.
LABS_MAX_ACTIVE_PER_LEARNER = env_int("LABS_MAX_ACTIVE_PER_LEARNER", 12)
# A learner who has not answered this many quiz cards (nor is staff) has this smaller allowance.
LABS_NEW_LEARNER_MAX_ACTIVE = env_int("LABS_NEW_LEARNER_MAX_ACTIVE", 4)
LABS_ESTABLISHED_AFTER_REVIEWS = env_int("LABS_ESTABLISHED_AFTER_REVIEWS", 10)
# No learner holds more than LABS_SIM_QUEUE_CAP / LABS_SIM_QUEUE_SHARES of the simulator queue.
LABS_SIM_QUEUE_SHARES = env_int("LABS_SIM_QUEUE_SHARES", 16)
LABS_GPU_QUEUE_CAP = env_int("LABS_GPU_QUEUE_CAP", 4)
LABS_SWEEP_MAX_VALUES = env_int("LABS_SWEEP_MAX_VALUES", 12)
# Soft time limits (prefork pool); both below the Redis visibility timeout above.
LABS_SIM_TIME_LIMIT_S = env_int("LABS_SIM_TIME_LIMIT_S", 900)
LABS_GPU_TIME_LIMIT_S = env_int("LABS_GPU_TIME_LIMIT_S", 3600)
# A vLLM worker whose device has no calibration queues a short one to itself when it starts
# (labs.calibration.jobs.calibration_self_request), bounded by its own time limit.
LABS_SELF_CALIBRATE = env_bool("LABS_SELF_CALIBRATE", True)
LABS_SELF_CALIBRATE_TIME_LIMIT_S = env_int("LABS_SELF_CALIBRATE_TIME_LIMIT_S", 900)
# Memory one simulated run may use (estimated in O(1) at submit, checked again in the worker,
# which also caps its own growth while the run lasts). Each field's limit follows from it.
LABS_SIM_MAX_RUN_MB = env_int("LABS_SIM_MAX_RUN_MB", 1024)
# Runs queued or running on the simulator, all learners together (a sweep counts each value).
LABS_SIM_QUEUE_CAP = env_int("LABS_SIM_QUEUE_CAP", 200)
# A queued run whose backend has had an idle worker online for this long lost its turn on the way
# (a broker restarted empty, a failed send): the reaper sends it one again, and fails it (so it
# does not hold the learner's quota) only if that one is lost as well.
LABS_QUEUED_LOST_S = env_int("LABS_QUEUED_LOST_S", 60)
# A running lab's final write retries this long through a database outage (a restart); its
# heartbeat and progress writes keep trying meanwhile, so it is not reaped as dead.
LABS_DB_RETRY_S = env_int("LABS_DB_RETRY_S", 60)
