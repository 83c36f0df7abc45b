"""The Celery app. Workers: `celery -A config worker -Q labs.sim` (see README)."""

from __future__ import annotations

import os
import sys

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(name="config.ping", ignore_result=False)
def ping(payload: str) -> dict:
    """Round trip through broker, worker and result backend; used by health checks and tests."""
    import socket

    return {"echo": payload, "hostname": socket.gethostname(), "pid": os.getpid()}


@worker_init.connect
def _check_dependencies(**_: object) -> None:
    # A worker that cannot reach the database would accept lab runs and fail each one deep inside;
    # stop at start-up with the variable and address instead.
    from config.preflight import PreflightError, check_broker, check_database

    try:
        check_database()
        check_broker()
    except PreflightError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.stderr.flush()
        os._exit(2)
