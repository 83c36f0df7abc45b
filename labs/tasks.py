"""The Celery tasks of labs, for the workers to find (Celery's autodiscovery imports this module).

Each task is defined beside the service that does its work, and is thin: it carries an id (or a
queue's name), the service does the work and the database holds the state.

- `labs.run_next`: a turn on a lab queue (labs.sim or labs.gpu.*): the worker takes the work
  whose turn it is there (labs.runs.turns), a lab run or a card being made. labs.runs.submission
  sends one for each run it queues, with the queue's time limits; `labs.run_execute` is the same
  for a message sent before turns, which names a run;
- `labs.reap_stale`: the stale-run reaper, for a deployment that prefers celery beat;
- `labs.calibrate_device`: a device calibration job (labs.calibration.jobs).

Importing this module also connects the worker's signals (labs.worker_signals: its heartbeat and
GPU-kind queues) in every worker.
"""

from __future__ import annotations

import labs.worker_signals  # noqa: F401  (connects the worker signals in every worker)
from labs.calibration.jobs import calibrate_device_task
from labs.runs.tasks import reap_stale_task, run_execute_task, run_next_task

__all__ = ["calibrate_device_task", "reap_stale_task", "run_execute_task", "run_next_task"]
