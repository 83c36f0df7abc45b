"""The Celery app. Workers: `celery -A config worker -Q labs.sim,default,quiz.fit` (see README)."""

from __future__ import annotations

import os
import sys

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# A fit of FSRS parameters has a queue of its own, so it never takes a lab run's place in a lab
# queue; a worker for it consumes quiz.fit (`make run`'s worker does, beside labs.sim).
app.conf.task_routes = {"quiz.fit_parameters": {"queue": "quiz.fit"}}


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
