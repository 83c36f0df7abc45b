"""Calibrating a device on its own vLLM engine and storing the result, from the command line or
from the staff's devices page.

`calibrate_and_store` is the core both share: the sweep (labs/calibration/sweep.py)
measured on the vLLM backend, its fit, and a `labs.models.DeviceCalibration` row. `manage.py lab
calibrate` calls it in its own process; the devices page queues a `CalibrationJob` and the Celery
task `labs.calibrate_device` calls it on the vLLM worker that has the device
(`calibration_execute`). A vLLM worker whose device has no calibration queues a shorter one to
itself when it starts (`calibration_self_request`, from labs.worker_signals).

A job's state changes are conditional UPDATEs, as a lab run's are (labs.runs.submission): a
duplicate message does not calibrate twice, and a dead worker's job is failed, not left running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from labs.backends import check_can_start, device_label, get_backend
from labs.backends import this_device as backend_device
from labs.backends.base import Device, Placement
from labs.calibration.sweep import (
    SWEEP,
    Runs,
    check_changes,
    cpu_times,
    fit_device,
    measure_changes,
    measure_sweep,
    point_params,
    run_summary,
    setting_label,
    steal_share,
)
from labs.models import CalibrationJob, DeviceCalibration, RunState, WorkerHeartbeat
from labs.parameters.catalog import CPU_KIND, GPUS, LAB_MODEL_SHAPES, MODELS
from labs.parameters.device_calibration import CONSTANT_BOUNDS, DeviceConstants, announced_cpu_key
from labs.parameters.params import LabParams, ParamError, parse_lab_params
from labs.runs.busy import progress_note, time_limit
from labs.runs.queueing import QueueUnavailable
from labs.runs.workers import announced_cpu_figures, placement_queue, served_queues, start_command

logger = logging.getLogger(__name__)

# The documented CPU calibration (`LABS_VLLM_DEVICE=cpu manage.py lab calibrate --gpu cpu
# --model lab-llama-20m ... --repeats 5 --rounds 6`): the tiny model and the CPU build's rules;
# the worker's measured figures (hbm_gb, bandwidth_tbs, tflops) are added to it.
CPU_BASE: dict[str, Any] = {
    "model": "lab-llama-20m",
    "gpu": CPU_KIND,
    "block_size": 128,
    "kv_capacity_tokens": 8192,
    "max_num_seqs": 8,
}
REPEATS = 5
ROUNDS = 6
# A worker's own first calibration (calibration_self_request): two repeats and four rounds, a
# few minutes on a 2-core CPU worker rather than the staff sweep's quarter hour; a staff
# calibration later replaces it.
SELF_REPEATS = 2
SELF_ROUNDS = 4
WHERE = "this worker"  # the label's "calibrated on this worker, <date>, ..."
_ERROR_LINE = 300


# -- the core: measure, fit, store -------------------------------------------------------------


class CalibrationTimeout(Exception):
    """The calibration ran past its deadline; raised before the next run starts."""


@dataclass(frozen=True)
class Calibrated:
    row: DeviceCalibration
    constants: DeviceConstants
    points: list[dict[str, Any]]  # id, role, what, metric, measured, predicted, error
    changes: list[dict[str, Any]]  # the lessons' changes, measured and simulated (check_changes)


def calibrate_and_store(
    base: Mapping[str, Any],
    device: str,
    *,
    repeats: int,
    rounds: int,
    where: str,
    log: Callable[[str], None],
    base_url: str | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> Calibrated:
    """Run SWEEP (and the lessons' changes) on the vLLM backend with `base` settings, fit the
    device's constants, store them as `device`'s newest DeviceCalibration, and check the changes
    with them. `base_url`: a vLLM server already running; else the backend starts its own.
    `deadline` (time.monotonic()): no run starts after it (CalibrationTimeout). `progress`:
    called before each run with (runs done, runs planned, what the run is)."""
    backend = get_backend("vllm", **({"base_url": base_url} if base_url else {}))

    def measured_run(params: LabParams) -> dict[str, Any]:
        # The GPU worker's solo pool enforces no Celery time limit: the sweep keeps its own.
        if deadline is not None and time.monotonic() > deadline:
            raise CalibrationTimeout
        before = cpu_times()
        summary = run_summary(backend.run(params))
        summary["steal_share"] = steal_share(before, cpu_times())
        return summary

    def on_run(done: int, planned: int, params: LabParams) -> None:
        if progress is not None:
            progress(done, planned, setting_label(base, params))

    runs = Runs(measured_run, repeats, warmups=1, on_run=on_run)
    before = cpu_times()
    measured = measure_sweep(base, runs, log)
    changes = measure_changes(base, runs, log)
    stolen = steal_share(before, cpu_times())
    if stolen is not None:
        # A sweep's figures are only as steady as the machine: on a shared VM whose neighbours
        # are busy, the hypervisor takes CPU time from the engine mid-run.
        log(
            f"the hypervisor took {stolen:.1%} of this machine's CPU time during the runs "
            "(steal, /proc/stat; 0 on a quiet machine)"
        )
    result = fit_device(
        device, measured, on=timezone.localdate(), where=where, rounds=rounds, log=log
    )
    c = result.constants
    row = DeviceCalibration.objects.create(
        device=device,
        where=where,
        # An optional constant the fit left unset stays out: the published value applies.
        constants={
            name: value for name in CONSTANT_BOUNDS if (value := getattr(c, name)) is not None
        },
        fit_error=c.fit_error,
        held_out_error=c.held_out_error,
        points=result.points,
    )
    return Calibrated(row, c, result.points, check_changes(changes, c))


def this_device(params: LabParams) -> str:
    """The device these settings calibrate on this machine: the GPU kind; for gpu cpu this
    machine's CPU as its CPU worker announces itself (model and cores), the key its runs look
    their calibration up by (labs.runs.selectors.device_key)."""
    return backend_device("vllm", params)


# -- what the online vLLM workers can calibrate ------------------------------------------------


@dataclass(frozen=True)
class CalibrationTarget:
    """One device the online vLLM workers have, and how it would be calibrated."""

    device: str  # the key its calibration is stored under ("" when it has none)
    label: str
    workers: tuple[str, ...]
    queue: str = ""  # where its task goes: the queue of a tp-1 run on that device
    base: dict[str, Any] | None = None  # the sweep's base settings; None: it cannot be
    why_not: str = ""  # why it cannot be calibrated

    @property
    def settings_text(self) -> str:
        """ "model lab-llama-20m, gpu cpu, hbm_gb 23.4, ...": the sweep's base settings."""
        base = self.base or {}
        return ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in base.items()
        )


def gpu_calibration_model(device: Device) -> str | None:
    """The model a GPU kind is calibrated with, or None if no catalog model's sweep starts."""
    # The smallest published model whose every sweep point starts on one GPU of this kind
    # (qwen2.5-0.5b on every catalog GPU, the documented command's model): short runs, and weight
    # reads large enough to time; the lab-llama models stay with CPU workers, since on a GPU a
    # 40 MB weight read hides under a step's fixed costs and its bandwidth would go unfitted.
    published = sorted(
        (m for m in MODELS.values() if m.name not in LAB_MODEL_SHAPES),
        key=lambda m: (m.params, m.name),
    )
    one = Device(device.kind, 1, device.memory_bytes)
    for model in published:
        base = {"model": model.name, "gpu": device.kind}
        try:
            for point in SWEEP:
                check_can_start("vllm", point_params(base, point), [one])
        except ParamError:
            continue
        return model.name
    return None


def _target(gpus: Mapping[str, Any]) -> CalibrationTarget:
    """A worker's device (its heartbeat's `gpus`) as a target; `workers` is filled by the caller."""
    device = Device.from_announced(gpus)
    if device is None:
        return CalibrationTarget(
            device="",
            label="no device announced",
            workers=(),
            why_not="it announced no device (it measures a vLLM server elsewhere)",
        )
    queue = placement_queue(settings.LABS_BACKEND_QUEUES["vllm"], Placement(device.kind, 1))
    if device.kind == CPU_KIND:
        name, cores = str(gpus.get("name") or ""), int(gpus.get("cores") or 0)
        key = announced_cpu_key(gpus)
        label = f"{name or 'unknown CPU'}, {cores} core{'' if cores == 1 else 's'} (CPU)"
        figures = announced_cpu_figures(dict(gpus))
        if not figures:
            why = "it announced no measured bandwidth and matmul FLOP/s to price its runs with"
            return CalibrationTarget(key, label, (), queue, why_not=why)
        return CalibrationTarget(key, label, (), queue, {**CPU_BASE, **figures})
    label = device_label(
        "vllm",
        {
            **gpus,
            "count": device.count,
            "name": str(gpus.get("name") or device.kind),
            "memory_bytes": device.memory_bytes,
        },
    )
    if device.kind not in GPUS:
        why = "its GPU is not in the catalog, so nothing predicts or simulates it"
        return CalibrationTarget("", label, (), queue, why_not=why)
    model = gpu_calibration_model(device)
    if model is None:
        why = "no catalog model's sweep fits on one of its GPUs"
        return CalibrationTarget(device.kind, label, (), queue, why_not=why)
    return CalibrationTarget(device.kind, label, (), queue, {"model": model, "gpu": device.kind})


def calibration_targets(now: datetime | None = None) -> list[CalibrationTarget]:
    """Each device the online vLLM workers have, once (workers of one device together), newest
    heartbeat first."""
    beats = WorkerHeartbeat.objects.online(now).filter(backend="vllm").order_by("-last_seen")
    targets: dict[str, CalibrationTarget] = {}
    for beat in beats:
        target = _target(beat.gpus or {})
        key = target.device or f"{target.label} @ {beat.hostname}"
        seen = targets.get(key)
        workers = (*(seen.workers if seen else ()), beat.hostname)
        targets[key] = replace(seen or target, workers=workers)
    return list(targets.values())


def worker_start_commands() -> dict[str, str]:
    """How to start a vLLM worker, as the README gives it: on a GPU, and on this CPU."""
    command = start_command(settings.LABS_BACKEND_QUEUES["vllm"])
    return {"gpu": command, "cpu": f"LABS_VLLM_DEVICE=cpu {command} --loglevel=INFO"}


# -- jobs: request, execute, fail, reap --------------------------------------------------------


class CalibrationRefused(Exception):
    """The job cannot be queued now. `kind`: "no-device", "busy" or "queue-down"."""

    def __init__(self, reason: str, *, kind: str) -> None:
        self.reason, self.kind = reason, kind
        super().__init__(reason)


def _busy(device: str) -> CalibrationRefused:
    return CalibrationRefused(
        f"A calibration of {device} is already queued or running, so nothing was queued. "
        "Wait for it to finish.",
        kind="busy",
    )


def _enqueue(job_id: int, queue: str, *, self_started: bool = False) -> None:
    """Send the job to its device's worker.

    Raises:
        QueueUnavailable: the broker did not take it (down, refused, timed out).
    """
    limit = time_limit(self_started)
    try:
        calibrate_device_task.apply_async(
            args=[job_id], queue=queue, soft_time_limit=limit, time_limit=limit + 60
        )
    except Exception as exc:
        logger.warning("could not send calibration %s to %s: %r", job_id, queue, exc)
        raise QueueUnavailable(str(exc)) from exc


def calibration_request(*, device: str, user: Any) -> CalibrationJob:
    """Queue a calibration of `device` on the online vLLM worker that has it; sent after commit.

    Raises:
        CalibrationRefused: no online worker has that device (or it cannot be calibrated), one
            is already queued or running for it, or the broker is down (the job is then saved
            as failed, saying so).
    """
    target = next((t for t in calibration_targets() if t.device and t.device == device), None)
    if target is None or target.base is None:
        why = f": {target.why_not}" if target is not None else ""
        raise CalibrationRefused(
            f"No online vLLM worker can calibrate {device[:200]!r}{why}, so nothing was queued.",
            kind="no-device",
        )
    created: list[CalibrationJob] = []
    try:
        with transaction.atomic():
            if CalibrationJob.objects.active().filter(device=device).exists():
                raise _busy(device)
            job = CalibrationJob.objects.create(
                device=device,
                requested_by=user,
                queue=target.queue,
                base=target.base,
                repeats=REPEATS,
                rounds=ROUNDS,
            )
            created.append(job)
            transaction.on_commit(lambda: _enqueue(job.pk, job.queue))
    except IntegrityError:
        raise _busy(device) from None  # another press saved its job first
    except QueueUnavailable as exc:
        reason = "The lab queue was unavailable, so the calibration was never sent"
        calibration_fail(job_id=created[0].pk, error=f"{reason} ({exc}).")
        raise CalibrationRefused(
            "The lab queue is unavailable right now, so nothing was queued (the job is marked "
            "failed). Try again in a minute.",
            kind="queue-down",
        ) from None
    return created[0]


def calibration_self_request(*, hostname: str) -> CalibrationJob | None:
    """On a vLLM worker's start: queue a short calibration of its own device (SELF_REPEATS,
    SELF_ROUNDS, LABS_SELF_CALIBRATE_TIME_LIMIT_S) when the device has no DeviceCalibration and
    no job queued or running, so its predictions stop resting on the start-up probe. Returns the
    job, or None when nothing was queued (off, calibrated, busy, or nothing to calibrate)."""
    if not settings.LABS_SELF_CALIBRATE:
        return None
    beat = WorkerHeartbeat.objects.filter(hostname=hostname[:200], backend="vllm").first()
    if beat is None:
        return None
    target = _target(beat.gpus or {})
    if not target.device or target.base is None:
        return None
    if DeviceCalibration.objects.filter(device=target.device).exists():
        return None
    created: list[CalibrationJob] = []
    try:
        with transaction.atomic():
            if CalibrationJob.objects.active().filter(device=target.device).exists():
                return None
            job = CalibrationJob.objects.create(
                device=target.device,
                queue=target.queue,
                base=target.base,
                repeats=SELF_REPEATS,
                rounds=SELF_ROUNDS,
                self_started=True,
            )
            created.append(job)
            transaction.on_commit(lambda: _enqueue(job.pk, job.queue, self_started=True))
    except IntegrityError:
        return None  # another worker of this device queued its job first
    except QueueUnavailable as exc:
        calibration_fail(
            job_id=created[0].pk,
            error=f"The lab queue was unavailable, so the calibration was never sent ({exc}).",
        )
        return None
    logger.info("labs: %s has no calibration; queued a short one", target.label)
    return created[0]


def _one_line(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= _ERROR_LINE else line[: _ERROR_LINE - 1] + "\u2026"


def calibration_fail(*, job_id: int, error: str) -> bool:
    """Mark a queued or running job failed with `error` (its first line); False if it had
    already ended."""
    return bool(
        CalibrationJob.objects.filter(
            pk=job_id, state__in=[RunState.QUEUED, RunState.RUNNING]
        ).update(state=RunState.FAILED, finished_at=timezone.now(), error=_one_line(error))
    )


def calibration_execute(*, job_id: int, hostname: str) -> str:
    """Claim a queued job, calibrate its device on this worker, and store the result. Returns
    the final state. A second delivery finds the job no longer queued and returns."""
    claimed = CalibrationJob.objects.filter(pk=job_id, state=RunState.QUEUED).update(
        state=RunState.RUNNING, started_at=timezone.now(), worker=hostname[:200]
    )
    if not claimed:
        state = CalibrationJob.objects.filter(pk=job_id).values_list("state", flat=True).first()
        logger.info("calibration %s not claimed (state %s): duplicate", job_id, state)
        return str(state)
    job = CalibrationJob.objects.get(pk=job_id)

    def log(line: str) -> None:
        logger.info("calibration %s: %s", job_id, line)
        CalibrationJob.objects.filter(pk=job_id, state=RunState.RUNNING).update(
            note=_one_line(line)
        )

    try:
        here = this_device(parse_lab_params(job.base))
        if here != job.device:
            # Several CPU models share the CPU kind's queue: another's measurements would be
            # stored as this device's.
            raise RuntimeError(f"this worker's device is {here}, not {job.device}")
        limit = time_limit(job.self_started)
        began = time.monotonic()

        def progress(done: int, planned: int, what: str) -> None:
            log(progress_note(done, planned, what, time.monotonic() - began, limit))

        stored = calibrate_and_store(
            job.base,
            job.device,
            repeats=job.repeats,
            rounds=job.rounds,
            where=WHERE,
            log=log,
            deadline=began + limit,
            progress=progress,
        )
    except (SoftTimeLimitExceeded, CalibrationTimeout):
        limit = time_limit(job.self_started)
        calibration_fail(
            job_id=job_id, error=f"It took longer than the worker's time limit ({limit} s)."
        )
        return RunState.FAILED
    except Exception as exc:
        logger.exception("calibration %s failed", job_id)
        calibration_fail(job_id=job_id, error=f"{type(exc).__name__}: {exc}")
        return RunState.FAILED
    finished = CalibrationJob.objects.filter(pk=job_id, state=RunState.RUNNING).update(
        state=RunState.DONE,
        finished_at=timezone.now(),
        calibration=stored.row,
        note=_one_line(f"stored: {stored.constants.label()}"),
    )
    return RunState.DONE if finished else str(CalibrationJob.objects.get(pk=job_id).state)


def calibration_reap_stale(*, now: datetime | None = None) -> int:
    """Fail the jobs no worker will finish: running on a worker that is no longer online or
    has restarted since it began, or queued for LABS_QUEUED_STALE_S with no online worker
    consuming their queue. Returns how many were failed."""
    now = now or timezone.now()
    online = list(WorkerHeartbeat.objects.online(now).filter(backend="vllm"))
    up_since = {beat.hostname: beat.started_at for beat in online}
    reaped = 0
    for job in CalibrationJob.objects.filter(state=RunState.RUNNING):
        started = up_since.get(job.worker)
        if started is not None and (job.started_at is None or started <= job.started_at):
            continue
        why = "is no longer online" if started is None else "restarted"
        reaped += CalibrationJob.objects.filter(pk=job.pk, state=RunState.RUNNING).update(
            state=RunState.FAILED,
            finished_at=now,
            error=f"The worker {job.worker or '(unknown)'} {why} while calibrating.",
        )
    served: set[str] = set()
    for beat in online:
        served |= served_queues(beat.backend, beat.queue, beat.gpus)
    cutoff = now - timedelta(seconds=settings.LABS_QUEUED_STALE_S)
    for job in CalibrationJob.objects.filter(state=RunState.QUEUED, created_at__lt=cutoff):
        if job.queue in served:
            continue
        reaped += CalibrationJob.objects.filter(pk=job.pk, state=RunState.QUEUED).update(
            state=RunState.FAILED,
            finished_at=now,
            error=f"No worker took it within {settings.LABS_QUEUED_STALE_S // 60} minutes and "
            f"none that consumes its queue ({job.queue}) is online.",
        )
    return reaped


# -- the Celery task (labs.tasks lists it for the workers) --------------------------------------


class _CalibrationTask(Task):
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # As for a run: what escapes the service (a lost database connection) fails the job.
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
    that device's queue by `calibration_request`."""
    return calibration_execute(job_id=int(job_id), hostname=self.request.hostname or "")


# -- the page ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRow:
    target: CalibrationTarget
    calibration: DeviceCalibration | None
    calibration_label: str
    job: CalibrationJob | None

    @property
    def points(self) -> list[dict[str, str]]:
        """The stored sweep points as shown: the command's precision (labs.cli.calibrate)."""
        shown = []
        for p in (self.calibration.points if self.calibration else None) or []:
            shown.append(
                {
                    "id": str(p.get("id", "")),
                    "role": str(p.get("role", "")).replace("_", "-"),
                    "what": str(p.get("what", "")),
                    "metric": str(p.get("metric", "")),
                    "measured": _number(p.get("measured"), ".5g"),
                    "simulated": _number(p.get("predicted"), ".5g"),
                    "error": _number(p.get("error"), "+.1%"),
                }
            )
        return shown


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "\u2014"


def devices_page() -> list[DeviceRow]:
    """Each online vLLM worker's device with its newest calibration and its latest job."""
    rows = []
    for target in calibration_targets():
        calibration = job = None
        label = ""
        if target.device:
            calibration = (
                DeviceCalibration.objects.filter(device=target.device)
                .order_by("-fitted_at", "-id")
                .first()
            )
            job = CalibrationJob.objects.filter(device=target.device).first()
        if calibration is not None:
            try:
                label = calibration.to_constants().label()
            except ValueError as exc:
                label = f"stored constants unreadable: {exc}"
        rows.append(DeviceRow(target, calibration, label, job))
    return rows
