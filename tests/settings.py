"""The test suite's settings: the app's settings, with a VAR_DIR and broker of the tests' own.

`make run` keeps its SQLite file and filesystem broker under the checkout's var/. Tests that used
the same folder beside a running app had their tasks taken by the app's worker, and their purge
dropped the learner's queued runs. Here the suite gets a fresh folder under the system's
temporary directory (removed when the suite ends); a worker process a test starts inherits it.
A broker named on the command line (CELERY_BROKER_URL, e.g. CI's Redis) is used as given, but
one that would only come from the .env file is not: that is the running app's broker.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Set by the first process of a suite; its children (workers, `manage.py` runs) keep its folder.
OWNER = "SERVING_SCHOOL_TESTS_VAR_DIR"

if OWNER not in os.environ:
    _var_dir = tempfile.mkdtemp(prefix="serving-school-tests-")
    atexit.register(shutil.rmtree, _var_dir, ignore_errors=True)
    os.environ[OWNER] = _var_dir
    os.environ["VAR_DIR"] = _var_dir
    os.environ.setdefault("CELERY_BROKER_URL", f"filesystem://{_var_dir}/broker")

from config.settings import *  # noqa: E402, F403
