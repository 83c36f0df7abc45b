"""The Celery tasks of labs, for the workers to find (Celery's autodiscovery imports this module).

Each task is defined beside the service that does its work, and is thin: it carries an id, the
service does the work and the database holds the state.

- `labs.run_execute`, `labs.reap_stale`: a lab run (labs.services, which chooses its queue,
  labs.sim or labs.gpu.*, and time limits when it enqueues it);
- `labs.calibrate_device`: a device calibration job (labs.device_calibration_jobs).

Importing this module also connects the worker's signals (labs.worker_signals: its heartbeat and
GPU-kind queues) in every worker.
"""

from __future__ import annotations

import labs.worker_signals  # noqa: F401  (connects the worker signals in every worker)
from labs.device_calibration_jobs import calibrate_device_task
from labs.services import reap_stale_task, run_execute_task

__all__ = ["calibrate_device_task", "reap_stale_task", "run_execute_task"]
