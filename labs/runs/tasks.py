"""The Celery tasks of lab runs, thin: each carries a queue's name or a run's id.

The task names (`labs.run_next`, `labs.run_execute`, `labs.reap_stale`) are the routing keys of
messages already queued: they stay as they are wherever the functions live. labs/tasks.py
imports this module for Celery's autodiscovery.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task

from labs.models import LabRun
from labs.runs import execution, queueing, reaping

logger = logging.getLogger(__name__)


@shared_task(
    name=queueing.RUN_NEXT,
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_next_task(self: Task, queue: str) -> str:
    return execution.run_next(queue=str(queue), hostname=self.request.hostname or "")


@shared_task(
    name="labs.run_execute",
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_execute_task(self: Task, run_id: int) -> str:
    """A message sent before turns names its run: it is a turn on that run's queue, so runs
    waiting in the broker across an upgrade are all run, in turn."""
    row = LabRun.objects.filter(pk=int(run_id)).values_list("backend", "queue").first()
    if row is None:
        return f"run {run_id} is gone"
    return execution.run_next(queue=reaping._sent_to(*row), hostname=self.request.hostname or "")


@shared_task(name="labs.reap_stale", ignore_result=True)
def reap_stale_task() -> int:
    """For a deployment that prefers celery beat; workers already reap from their heartbeat."""
    return reaping.run_reap_stale()
