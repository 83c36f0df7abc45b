"""How far a device's calibration is, in a learner's words: the job's note while its runs go on
("run 8 of 46: ...; about 12 min left"), the minutes it has left, and why a device's engine
cannot take a run now. Read by the lab and run pages and by the submit's refusal; written by the
calibration jobs (labs.calibration.jobs), which import this module, not the other way.
"""

from __future__ import annotations

import re
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from labs.models import CalibrationJob, DeviceCalibration, RunState


def time_limit(self_started: bool) -> int:
    # A staff calibration is a series of GPU-worker runs; a worker's own first one is shorter.
    if self_started:
        return int(settings.LABS_SELF_CALIBRATE_TIME_LIMIT_S)
    return int(settings.LABS_GPU_TIME_LIMIT_S)


# The job's note while its runs go on (`progress_note`); read back by `runs_progress`.
_PROGRESS = re.compile(r"^run (\d+) of (\d+):")
# The fit and the storing, after the last run: a minute or so on a 2-core CPU worker.
FIT_ALLOWANCE_S = 60.0


def progress_note(
    done: int, planned: int, what: str, elapsed_s: float, limit_s: float | None = None
) -> str:
    """ "run 8 of 46: D2 4 sequences decoding; 3 min so far, about 12 min left", the job's note
    while its runs go on: the time left from the runs so far (the first run, which starts the
    engine, gives none), never more than its time limit leaves ("at most")."""
    so_far = f"{_minutes(elapsed_s)} so far"
    if done:
        left, estimated = _bounded(elapsed_s / done * (planned - done), elapsed_s, limit_s)
        so_far += f", {'about' if estimated else 'at most'} {_minutes(left)} left"
    return f"run {done + 1} of {planned}: {what}; {so_far}"


def _bounded(runs_left_s: float, elapsed_s: float, limit_s: float | None) -> tuple[float, bool]:
    """The time left from the runs so far plus the fit, or what the time limit leaves when
    that is less (the first runs, which start engines, overstate a run's time): (seconds,
    whether it is the estimate)."""
    left = runs_left_s + FIT_ALLOWANCE_S
    if limit_s is not None and left > limit_s - elapsed_s:
        return max(limit_s - elapsed_s, 0.0), False
    return left, True


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} min"


def runs_progress(job: CalibrationJob) -> tuple[int, int] | None:
    """(runs done, runs planned) of a running job, from its note; None before its first run or
    once its runs are over (fitting)."""
    found = _PROGRESS.match(job.note or "")
    if job.state != RunState.RUNNING or found is None:
        return None
    return int(found.group(1)) - 1, int(found.group(2))


def seconds_left(job: CalibrationJob, now: datetime | None = None) -> tuple[float, bool]:
    """How long `job` has left, and whether that is an estimate from its runs so far (True)
    or only its time limit (False: queued, or no run finished yet)."""
    now = now or timezone.now()
    limit = float(time_limit(job.self_started))
    started = job.started_at
    if started is None:
        return limit, False
    elapsed = max((now - started).total_seconds(), 0.0)
    found = runs_progress(job)
    if found is not None and found[0] > 0:
        done, planned = found
        return _bounded(elapsed / done * (planned - done), elapsed, limit)
    if job.state == RunState.RUNNING and found is None and job.note:
        return FIT_ALLOWANCE_S, True  # its runs are over: the fit
    return max(limit - elapsed, 0.0), False


def engine_words(device: str) -> str:
    """ "the CPU engine" or "the h100-sxm engine": a device's one vLLM engine, named for a
    learner."""
    return "the CPU engine" if device.startswith("cpu") else f"the {device} engine"


def calibrating_words(job: CalibrationJob, now: datetime | None = None) -> str:
    """ "The CPU engine is calibrating itself, about 6 minutes left" (or "at most 14 minutes
    left" before its first run has said how long a run takes)."""
    left, estimated = seconds_left(job, now)
    minutes = max(1, round(left / 60))
    amount = f"{'about' if estimated else 'at most'} {minutes} minute{'s' if minutes != 1 else ''}"
    who = "is calibrating itself" if job.self_started else "is being calibrated"
    name = engine_words(job.device)
    return f"{name[0].upper()}{name[1:]} {who}, {amount} left"


def calibrating_note(device: str) -> str:
    """What a learner reads while `device` is being calibrated: how long it has left,
    predictions keep their present figures, and a run sent now waits behind the sweep on the
    device's one engine."""
    job = CalibrationJob.objects.active().filter(device=device).first()
    if job is None:
        return ""
    figures = (
        "its probe figures"
        if job.self_started and not DeviceCalibration.objects.filter(device=device).exists()
        else "its current figures"
    )
    return (
        f"{calibrating_words(job)}: predictions use {figures} until it finishes, and a run sent "
        "now starts after it."
    )


def busy_words(device: str) -> str:
    """Why a learner cannot run on `device` now that another process of its installation holds
    its engine (the worker's heartbeat says so): its calibration, with the time it has left,
    or another process."""
    job = CalibrationJob.objects.active().filter(device=device).first()
    if job is not None:
        return f"{calibrating_words(job)}; runs on it can start once it has finished."
    name = engine_words(device)
    return (
        f"{name[0].upper()}{name[1:]} is busy: another process on its machine is running it, "
        "and one engine runs one thing at a time. Try again in a few minutes."
    )
