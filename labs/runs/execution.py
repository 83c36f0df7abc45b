"""Running one lab run inside a worker: claim it, run its backend, write its record.

Every state change is a conditional UPDATE on `LabRun.state`, so a duplicate delivery does not
run twice and a cancelled run is not overwritten by a late result. While a run goes on, its
heartbeat and progress are written with retries, so a database blip does not lose a finished run.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.models import Q
from django.utils import timezone

from labs import hooks
from labs.backends import backend_for_run, served_instead
from labs.backends.base import Phase, ProgressCallback
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState
from labs.parameters.params import LabParams, ParamError, parse_lab_params
from labs.prediction.sizing import RunTooLarge
from labs.runs import events, turns
from labs.runs.selectors import device_prediction, priced_calibration, pricing
from labs.sim.lab import run_breakdown

logger = logging.getLogger(__name__)


T = TypeVar("T")


# on_progress writes at most this often; the backend may call it far more.
_PROGRESS_EVERY_S = 0.25


class RunStopped(Exception):
    """Raised inside on_progress when the run is no longer ours (cancelled or reaped)."""


def _predicted(params: LabParams) -> dict[str, object]:
    """The prediction stored on a run, with what priced it (selectors.pricing), by which the
    run's parts are sized too."""
    return {**device_prediction(params), "priced_with": pricing(params)}


class _RunHeartbeat:
    """Bumps heartbeat_at from a side thread while the backend works, so a long step (or a slow
    vLLM start) is not mistaken for a dead worker. Notices cancellation too."""

    def __init__(self, run_id: int, interval_s: float) -> None:
        self.run_id = run_id
        self.interval_s = interval_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"run-{run_id}-heartbeat", daemon=True
        )

    def __enter__(self) -> _RunHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    alive = _beat(self.run_id)
                except DB_ERRORS:
                    # The database restarted or blinked: keep beating, the next one reconnects.
                    # Stopping here would let the reaper call a healthy run's worker dead.
                    logger.warning(
                        "heartbeat of run %s: database unavailable, retrying", self.run_id
                    )
                    _drop_connection()
                    continue
                if not alive:
                    self.lost.set()
                    return
        except Exception:
            logger.exception("heartbeat of run %s failed", self.run_id)
        finally:
            # Django connections are per thread; this one would otherwise leak.
            connections.close_all()


DB_ERRORS = (OperationalError, InterfaceError)


def _drop_connection() -> None:
    """Forget this thread's broken connection so the next query opens a new one."""
    with contextlib.suppress(Exception):
        connections["default"].close()


def _beat(run_id: int) -> int:
    return LabRun.objects.filter(pk=run_id, state=RunState.RUNNING).update(
        heartbeat_at=timezone.now()
    )


def _write_progress(run_id: int, value: float, phase: Phase | None = None) -> int:
    fields: dict[str, object] = {"progress": value, "heartbeat_at": timezone.now()}
    if phase is not None:
        fields["phase"] = phase.as_dict()
    return LabRun.objects.filter(pk=run_id, state=RunState.RUNNING).update(**fields)


def _with_retries(write: Callable[[], T], *, within_s: float, what: str) -> T:
    """Run a database write, retrying through a short outage (a PostgreSQL restart) for up to
    `within_s` seconds with growing pauses; then let the error through."""
    deadline = time.monotonic() + within_s
    pause = 0.2
    while True:
        try:
            return write()
        except DB_ERRORS:
            _drop_connection()
            if time.monotonic() + pause > deadline:
                raise
            logger.warning("%s: database unavailable, retrying in %.1f s", what, pause)
            time.sleep(pause)
            pause = min(2 * pause, 5.0)


def _progress_reporter(run_id: int, beat: _RunHeartbeat) -> ProgressCallback:
    last = 0.0
    last_step: str | None = None

    def on_progress(fraction: float, phase: Phase | None = None) -> None:
        nonlocal last, last_step
        if beat.lost.is_set():
            raise RunStopped
        now = time.monotonic()
        # A new phase is written at once (the page must not miss "ready"); repeats are throttled.
        new_step = phase is not None and phase.step != last_step
        if now - last < _PROGRESS_EVERY_S and fraction < 1 and not new_step:
            return
        last = now
        value = min(1.0, max(0.0, float(fraction)))
        try:
            alive = _write_progress(run_id, value, phase)
        except DB_ERRORS:
            # Progress is only shown; skip this one and let the run go on (the next call, or
            # the final write with its retries, reaches the database once it is back).
            logger.warning("progress of run %s: database unavailable, skipped", run_id)
            _drop_connection()
            return
        if not alive:
            raise RunStopped
        if phase is not None:
            last_step = phase.step

    return on_progress


@dataclass
class _Outcome:
    result: dict[str, object]
    where: str
    # The prediction to store instead of the one made at submit: a server already running
    # (LABS_VLLM_BASE_URL) served another model than the one submitted. None: keep it.
    predicted: dict[str, object] | None = None


def _execute_backend(run: LabRun, beat: _RunHeartbeat) -> _Outcome:
    params = parse_lab_params(run.params)
    # What priced the run's prediction at submit (the device's own calibration, if it had one
    # then) prices the simulation, or a real run's expected parts: a calibration finished
    # while the run waited does not size parts beside a prediction made without it.
    priced = (run.predicted or {}).get("priced_with")
    device = priced_calibration(params, priced)
    backend = backend_for_run(run.backend, max_run_mb=settings.LABS_SIM_MAX_RUN_MB, device=device)
    record = backend.run(params, _progress_reporter(run.pk, beat))
    summary = summarize(record)
    # What the numbers are expected to be for is the model the server served.
    instead = served_instead(run.backend, params, getattr(record, "meta", {}) or {})
    expected_for = params if instead is None else instead.params
    breakdown = run_breakdown(expected_for, record, summary, device) if expected_for else None
    if breakdown is not None and isinstance(priced, Mapping) and priced.get("source") == "probe":
        breakdown["calibrated"] = False  # a probe sizes no part, whatever the kind's
        if priced.get("calibrating"):
            # Sent while the device calibrated itself: the page says the run used the probe
            # (a device that had no calibration at all says just that).
            breakdown["priced_from"] = "probe"
    summary["breakdown"] = _json_safe({"b": breakdown})["b"]
    # Stored once, at the top, where a vLLM run's expected parts go too; not again in meta.
    meta = {k: v for k, v in (getattr(record, "meta", {}) or {}).items() if k != "breakdown"}
    summary["meta"] = _json_safe(meta)
    predicted: dict[str, object] | None = None
    if instead is not None:
        predicted = (
            _predicted(instead.params)
            if instead.params is not None
            else {"no_prediction": instead.no_prediction}
        )
    return _Outcome(result=summary, where=str(record.where), predicted=predicted)


def _json_safe(meta: Mapping[str, object]) -> dict[str, object]:
    import json

    return json.loads(json.dumps(dict(meta), default=str))


def run_execute(*, run_id: int, hostname: str) -> str:
    """Claim a queued run, run it on its backend, store the summary. Returns the final state.

    Idempotent: a second call with the same id finds the run no longer queued and returns.
    """
    if not _run_claim(run_id, hostname):
        state = LabRun.objects.filter(pk=run_id).values_list("state", flat=True).first()
        logger.info("run %s not claimed (state %s): duplicate or cancelled", run_id, state)
        return str(state)
    return _run_and_announce(run_id)


def _run_and_announce(run_id: int) -> str:
    """Run a claimed run, then tell labs' listeners (a prediction waiting for this run) that it
    ended; what fails there is logged, and is not the run's failure. Returns the final state."""
    state = _run_claimed(run_id)
    for _receiver, outcome in events.run_finished.send_robust(sender=LabRun, run_id=run_id):
        if isinstance(outcome, Exception):
            logger.error("after run %s: %r", run_id, outcome, exc_info=outcome)
    return state


def _run_claim(run_id: int, hostname: str) -> bool:
    """queued -> running on the worker `hostname`; False when the run is no longer queued."""
    now = timezone.now()
    return bool(
        LabRun.objects.filter(pk=run_id, state=RunState.QUEUED).update(
            state=RunState.RUNNING,
            started_at=now,
            heartbeat_at=now,
            worker=hostname[:200],
            progress=0,
            phase={},
        )
    )


def _run_claimed(run_id: int) -> str:
    """Run a run this worker claimed on its backend, store the summary. Returns the final state."""
    run = LabRun.objects.get(pk=run_id)
    try:
        with _RunHeartbeat(run_id, settings.LABS_RUN_HEARTBEAT_S) as beat:
            outcome = _execute_backend(run, beat)
    except RunStopped:
        logger.info("run %s stopped: cancelled or reaped while running", run_id)
        return str(LabRun.objects.values_list("state", flat=True).get(pk=run_id))
    except SoftTimeLimitExceeded:
        run_fail(run_id=run_id, error="The run took longer than the worker's time limit.")
        return RunState.FAILED
    except RunTooLarge as exc:
        run_fail(run_id=run_id, error=f"Too large for one simulated run: {exc}")
        return RunState.FAILED
    except ParamError as exc:
        # Settings refused on the worker, where the backend can see them (a running vLLM
        # server's max_model_len, say): the learner's to change, not a fault of the worker's.
        logger.info("run %s refused on the worker: %s", run_id, exc)
        run_fail(run_id=run_id, error=f"These settings cannot run: {exc}")
        return RunState.FAILED
    except MemoryError:
        # The address-space cap of the sim backend stopped it; the worker lives on.
        logger.warning("run %s ran out of its memory allowance", run_id)
        run_fail(
            run_id=run_id,
            error="Too large: the run needed more memory than a simulated run may use "
            f"({settings.LABS_SIM_MAX_RUN_MB} MB). Lower num_prompts or output_tokens.",
        )
        return RunState.FAILED
    except Exception as exc:
        logger.exception("run %s failed", run_id)
        run_fail(run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return RunState.FAILED
    done = timezone.now()
    changed = {} if outcome.predicted is None else {"predicted": outcome.predicted}
    finished = _with_retries(
        lambda: LabRun.objects.filter(pk=run_id, state=RunState.RUNNING).update(
            state=RunState.DONE,
            progress=1.0,
            finished_at=done,
            heartbeat_at=done,
            result=outcome.result,
            where=outcome.where[:200],
            error="",
            **changed,
        ),
        within_s=settings.LABS_DB_RETRY_S,
        what=f"result of run {run_id}",
    )
    if not finished:
        logger.warning("run %s finished but was no longer running; result dropped", run_id)
    return (
        RunState.DONE
        if finished
        else str(LabRun.objects.values_list("state", flat=True).get(pk=run_id))
    )


def run_fail(*, run_id: int, error: str) -> bool:
    """Mark a queued or running run failed with `error`; False if it had already ended."""
    now = timezone.now()
    return bool(
        LabRun.objects.filter(pk=run_id, state__in=[RunState.QUEUED, RunState.RUNNING]).update(
            state=RunState.FAILED, finished_at=now, error=error[:4000]
        )
    )


def _runs_waiting(queue: str) -> list[turns.Waiting]:
    """The lab runs queued on `queue`; one saved before runs recorded their queue waits on its
    backend's."""
    unrecorded = [b for b, q in settings.LABS_BACKEND_QUEUES.items() if q == queue]
    rows = LabRun.objects.filter(state=RunState.QUEUED).filter(
        Q(queue=queue) | Q(queue="", backend__in=unrecorded)
    )
    return [
        turns.Waiting(owner_id=owner_id, pk=pk, created_at=created_at)
        for owner_id, pk, created_at in rows.values_list("owner_id", "pk", "created_at")
    ]


LAB_RUNS = turns.WorkKind(
    name="lab run",
    waiting=_runs_waiting,
    claim=_run_claim,
    execute=lambda run_id, _hostname: f"run {run_id} {_run_and_announce(run_id)}",
    fail=lambda run_id, exc: run_fail(run_id=run_id, error=f"{type(exc).__name__}: {exc}"),
)


def run_next(*, queue: str, hostname: str) -> str:
    """Take the work whose turn it is on `queue` (labs.runs.turns: a lab run, or work another app
    queued there, labs.hooks) and do it. Returns a line for the worker's log."""
    taken = _with_retries(
        lambda: turns.take(queue, hostname, [LAB_RUNS, *turns.registered(), *hooks.queued_work()]),
        within_s=settings.LABS_DB_RETRY_S,
        what=f"a turn on {queue}",
    )
    if taken is None:
        # More turns than work: its work was cancelled, or taken by an earlier turn.
        logger.info("a turn on %s found nothing waiting", queue)
        return f"nothing waits on {queue}"
    try:
        done = taken.kind.execute(taken.pk, hostname)
    except Exception as exc:
        # What escaped the work's own handling (a lost database connection, say) is recorded, so
        # the work does not sit in "running" until it is reaped.
        taken.kind.fail(taken.pk, exc)
        raise
    logger.info(
        "%s %s (learner %s's turn on %s): %s",
        taken.kind.name,
        taken.pk,
        taken.owner_id,
        queue,
        done,
    )
    return done
