"""Celery tasks: thin. They carry a run id; `labs.services` does the work and the DB holds the
state. The queue (labs.sim, labs.gpu) and time limits are chosen per backend when the run is
enqueued (`labs.services._enqueue`). A device calibration carries a job id the same way
(`labs.calibrations`)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

import labs.workers  # noqa: F401  (connects the worker heartbeat signals in every worker)


class _LabRunTask(Task):
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # The service records its own failures; this catches what escapes it (a lost database
        # connection at claim time, say) so the run does not sit in "running" until reaped.
        from labs.services import run_fail

        run_id = args[0] if args else kwargs.get("run_id")
        if run_id is not None:
            run_fail(run_id=int(run_id), error=f"{type(exc).__name__}: {exc}")


@shared_task(
    name="labs.run_execute",
    base=_LabRunTask,
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_execute_task(self: Task, run_id: int) -> str:
    from labs.services import run_execute

    return run_execute(run_id=int(run_id), hostname=self.request.hostname or "")


@shared_task(name="labs.reap_stale", ignore_result=True)
def reap_stale_task() -> int:
    """For a deployment that prefers celery beat; workers already reap from their heartbeat."""
    from labs.services import run_reap_stale

    return run_reap_stale()


class _CalibrationTask(Task):
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # As for a run: what escapes the service (a lost database connection) fails the job.
        from labs.calibrations import calibration_fail

        job_id = args[0] if args else kwargs.get("job_id")
        if job_id is not None:
            calibration_fail(job_id=int(job_id), error=f"{type(exc).__name__}: {exc}")


@shared_task(
    name="labs.calibrate_device",
    base=_CalibrationTask,
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def calibrate_device_task(self: Task, job_id: int) -> str:
    """Calibrate a device on the vLLM worker that has it (the staff's devices page); sent to
    that device's queue by `labs.calibrations.calibration_request`."""
    from labs.calibrations import calibration_execute

    return calibration_execute(job_id=int(job_id), hostname=self.request.hostname or "")
