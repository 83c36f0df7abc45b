"""The test suite's settings: the app's settings, with a VAR_DIR and broker of the tests' own.

`make run` keeps its SQLite file and filesystem broker under the checkout's var/. Tests that used
the same folder beside a running app had their tasks taken by the app's worker, and their purge
dropped the learner's queued runs. Here the suite gets a fresh folder under the system's
temporary directory (removed when the suite ends); a worker process a test starts inherits it.
A broker named on the command line (CELERY_BROKER_URL, e.g. CI's Redis) is used as given, but
one that would only come from the .env file is not: that is the running app's broker.

Under pytest-xdist each test process (gw0, gw1, ...) gets a folder, a filesystem broker and a
Redis database of its own, so one process's purge or worker never touches another's tasks
(pytest-django already gives each its own test database).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from urllib.parse import urlsplit, urlunsplit

# Set by pytest-xdist in each test process, and inherited by the workers a test starts.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
# Set by the first process of a suite (of each xdist process); its children keep its folder.
OWNER = f"SERVING_SCHOOL_TESTS_VAR_DIR{'_' + XDIST_WORKER if XDIST_WORKER else ''}"
# The broker URL as the person running the suite gave it (before this module changed it).
GIVEN_BROKER = "SERVING_SCHOOL_TESTS_GIVEN_BROKER"


def _own_redis_db(url: str, worker: str) -> str:
    """redis://h:p/N -> redis://h:p/N+10+k for xdist process gwk (Redis has 16 databases; the
    tests that use Redis for the cache or sessions name 1 and 7 themselves)."""
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    db = (base + 10 + int(worker.removeprefix("gw"))) % 16
    return urlunsplit(parts._replace(path=f"/{db}"))


if OWNER not in os.environ:
    _var_dir = tempfile.mkdtemp(prefix=f"serving-school-tests-{XDIST_WORKER}")
    atexit.register(shutil.rmtree, _var_dir, ignore_errors=True)
    os.environ[OWNER] = _var_dir
    os.environ["VAR_DIR"] = _var_dir
    os.environ.setdefault(GIVEN_BROKER, os.environ.get("CELERY_BROKER_URL", ""))
    given = os.environ[GIVEN_BROKER]
    if not given or (XDIST_WORKER and given.startswith("filesystem")):
        os.environ["CELERY_BROKER_URL"] = f"filesystem://{_var_dir}/broker"
    elif XDIST_WORKER and given.startswith(("redis://", "rediss://")):
        os.environ["CELERY_BROKER_URL"] = _own_redis_db(given, XDIST_WORKER)
        os.environ.pop("CELERY_RESULT_BACKEND", None)

from config.settings import *  # noqa: E402, F403

# A PBKDF2 hash costs about 0.3 s of CPU and the suite makes users and logs them in by the
# hundred; MD5 costs microseconds. The app keeps Django's PBKDF2 (tests/test_settings.py checks),
# and the throttle tests count hashes rather than time them.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# A worker a test starts must not calibrate its device on its own: its sweep would take the
# engine from the test's runs. The tests of self-calibration turn it on.
LABS_SELF_CALIBRATE = False
