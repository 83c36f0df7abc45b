"""The Celery app. Workers: `celery -A config worker -Q labs.sim,default` for labs, and
`celery -A config worker -Q quiz.fit --concurrency=1` for parameter fits (see README)."""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def _closed_redis_channel_raises_a_connection_error() -> None:
    """Keep a prefork worker alive when Redis goes away while a task is unacknowledged.

    On a lost connection Celery 5.7 collects the connection (which drops the transport) and then
    closes it; closing the Redis channel then tries to put the unacknowledged message back and
    asks the dropped transport for its address, an AttributeError ('NoneType' object has no
    attribute 'hostname'). That is not one of the connection errors Celery ignores while closing,
    so the worker logs "CRITICAL ... Unrecoverable error" and exits instead of reconnecting.
    Reported as the connection error it is, the close is ignored and the worker reconnects; the
    message stays in Redis's unacked set (restored after the visibility timeout, as after a crash).
    """
    try:
        from kombu.transport import redis as kombu_redis
        from redis.exceptions import ConnectionError as RedisConnectionError
    except ImportError:  # no redis client: the filesystem broker only
        return
    connparams = kombu_redis.Channel._connparams
    if getattr(connparams, "_serving_school", False):
        return

    def _connparams(self: Any, asynchronous: bool = False) -> dict:
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection is closed")
        return connparams(self, asynchronous=asynchronous)

    _connparams._serving_school = True  # type: ignore[attr-defined]
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]


_closed_redis_channel_raises_a_connection_error()

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# A fit of FSRS parameters has a queue of its own, consumed by a worker of its own (`make run`
# starts one), so it never takes a lab run's place in a lab queue nor a lab worker's slot.
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
