"""Writes for lab runs: submit, execute (inside a worker), cancel, reap.

Every state change is a conditional UPDATE on `LabRun.state`, so whoever gets there first wins
and the others see 0 rows changed: a duplicate delivery does not run twice, a cancelled run is
not overwritten by a late result, and the reaper never fails a run that just finished.

A submit sends one message per run, a turn on the run's queue; the worker taking it runs the
run whose turn it is then, so learners are served in turn (labs.turns), not first come first.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from celery import Task, group, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import InterfaceError, OperationalError, connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from config.celery import app as celery_app
from config.locks import transaction_lock
from labs import events, hooks, turns
from labs.backends import (
    StartOptions,
    backend_for_run,
    check_can_start,
    is_simulated,
    served_instead,
    simulated_backends,
)
from labs.backends.base import Phase, ProgressCallback
from labs.calibration_progress import busy_words
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState, Sweep, WorkerHeartbeat
from labs.parameters.params import (
    FIELDS_BY_NAME,
    LabParams,
    ParamError,
    follow_unshown,
    parse_lab_params,
)
from labs.parameters.presets import load_presets
from labs.prediction.sizing import RunTooLarge
from labs.selectors import device_key, device_prediction, priced_calibration, pricing
from labs.sim.lab import run_breakdown
from labs.workers import (
    busy_devices,
    devices_online,
    engines_busy,
    online_without_devices,
    placement_queue,
    served_queues,
    start_command,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

# on_progress writes at most this often; the backend may call it far more.
_PROGRESS_EVERY_S = 0.25


class RunRefused(Exception):
    """The run is valid but cannot be queued now. Nothing is saved.

    `kind` is "no-worker", "busy", "quota", "gpu-cap", "sim-cap" or "queue-down". `operator_hint` is
    for staff only (the command that starts a worker): a learner cannot act on it."""

    def __init__(self, reason: str, *, kind: str, operator_hint: str = "") -> None:
        self.reason = reason
        self.kind = kind
        self.operator_hint = operator_hint
        super().__init__(reason)


class RunStopped(Exception):
    """Raised inside on_progress when the run is no longer ours (cancelled or reaped)."""


# -- submit --------------------------------------------------------------------------------------


def backend_queue(backend: str) -> str:
    try:
        return settings.LABS_BACKEND_QUEUES[backend]
    except KeyError:
        known = ", ".join(settings.LABS_BACKEND_QUEUES)
        raise ParamError(
            {"backend": f"backend must be one of {known}, got {backend[:40]}"}
        ) from None


def _predicted(params: LabParams) -> dict[str, object]:
    """The prediction stored on a run, with what priced it (selectors.pricing), by which the
    run's parts are sized too."""
    return {**device_prediction(params), "priced_with": pricing(params)}


def _precheck(backend: str, params: LabParams) -> str:
    """Refuse at submit what the backend would refuse on its worker, in O(1) (nothing is built):
    the backend's own start-up check (labs.backends.check_can_start) against the devices the
    online workers announced. Returns the queue to send the run to.

    Raises:
        ParamError: what cannot start, by field.
    """
    devices, options = devices_online(backend), start_options(backend)
    try:
        placement = check_can_start(backend, params, devices, **options)
    except ParamError:
        kind = params.hardware.name
        busy = [d for d in busy_devices(backend) if d.kind == kind]
        if not busy or any(d.kind == kind for d in devices):
            raise
        # Its device is online but busy: what it could never run is still refused by field;
        # what it could run waits for it, said in a learner's words.
        check_can_start(backend, params, busy, **options)
        raise _engine_busy(backend, params) from None
    return placement_queue(backend_queue(backend), placement)


def _engine_busy(backend: str, params: LabParams) -> RunRefused:
    key = device_key(params)
    return RunRefused(
        f"{busy_words(key)} Nothing was queued.",
        kind="busy",
        operator_hint=engines_busy().get(key, ""),
    )


def start_options(backend: str) -> StartOptions:
    """What a backend's start-up check is given besides the online devices: the simulator's
    memory allowance, and whether a worker without a device (measuring a server elsewhere) is
    online; each backend reads what concerns it."""
    elsewhere = not is_simulated(backend) and online_without_devices(backend)
    return {"max_run_mb": settings.LABS_SIM_MAX_RUN_MB, "elsewhere": elsewhere}


def _check_can_queue(*, owner: object, backend: str, new_runs: int) -> None:
    """Refuse with a reason the learner can act on; called inside the submitting transaction."""
    queue = backend_queue(backend)
    if not WorkerHeartbeat.objects.online().filter(backend=backend).exists():
        raise RunRefused(
            f"No worker for the {backend} backend is online right now, so nothing was queued. "
            + (
                "Run it on the simulator, or try again once a GPU worker is back."
                if not is_simulated(backend)
                else "Try again in a minute; the site's staff have been told how to start one."
            ),
            kind="no-worker",
            operator_hint=f"Start one with `{start_command(queue)}`.",
        )
    _check_learner_quota(owner, new_runs)
    gpu_backends = [b for b, q in settings.LABS_BACKEND_QUEUES.items() if q == "labs.gpu"]
    if backend in gpu_backends:
        cap = settings.LABS_GPU_QUEUE_CAP
        busy = LabRun.objects.active().filter(backend__in=gpu_backends).count()
        if busy + new_runs > cap:
            raise RunRefused(
                f"The GPU queue is full ({busy} of {cap} runs queued or running"
                f"{f', this sweep needs {new_runs}' if new_runs > 1 else ''}). "
                "Try the simulator, or run again in a few minutes.",
                kind="gpu-cap",
            )
    elif is_simulated(backend):
        # Every learner's sim runs share the CPU workers: a global cap bounds the backlog ...
        cap = settings.LABS_SIM_QUEUE_CAP
        # Card requests simulate on the same workers: they count as runs here (labs/hooks.py).
        simulated = LabRun.objects.active().filter(backend__in=simulated_backends())
        busy = simulated.count() + hooks.work_in_flight(None)[0]
        if busy + new_runs > cap:
            raise RunRefused(
                f"The simulator queue is full ({busy} of {cap} runs queued or running"
                f"{f', this sweep needs {new_runs}' if new_runs > 1 else ''}). "
                "Run again in a few minutes.",
                kind="sim-cap",
            )
        # ... and no learner takes more than a share of it, so a handful cannot fill it.
        share = max(1, cap // settings.LABS_SIM_QUEUE_SHARES)
        cards = hooks.work_in_flight(owner.pk)[0]  # type: ignore[attr-defined]
        mine = (
            LabRun.objects.for_owner(owner)
            .active()
            .filter(backend__in=simulated_backends())
            .count()
            + cards
        )
        if mine + new_runs > share:
            raise RunRefused(
                f"Your share of the simulator queue is {share} runs and you have {mine} queued "
                f"or running{_counting(cards, 0)}"
                f"{f', this sweep needs {new_runs}' if new_runs > 1 else ''}. "
                "Wait for some to finish or cancel some, then run again.",
                kind="quota",
            )


def _is_established(owner: object) -> bool:
    """A learner who has answered LABS_ESTABLISHED_AFTER_REVIEWS quiz cards (or is staff): new
    accounts, which cost an attacker nothing, get a smaller allowance until then."""
    if getattr(owner, "is_staff", False):
        return True
    return hooks.reviews_at_least(owner.pk, settings.LABS_ESTABLISHED_AFTER_REVIEWS)  # type: ignore[attr-defined]


def _check_learner_quota(owner: object, new_runs: int) -> None:
    """Every run in flight counts, each point of a sweep included, and so does the learner's
    other work (cards being made, parameter fits; labs/hooks.py)."""
    cards, fits = hooks.work_in_flight(owner.pk)  # type: ignore[attr-defined]
    in_flight = LabRun.objects.for_owner(owner).active().count() + cards + fits
    limit = settings.LABS_MAX_ACTIVE_PER_LEARNER
    new_account = not _is_established(owner) and limit > settings.LABS_NEW_LEARNER_MAX_ACTIVE
    if new_account:
        limit = settings.LABS_NEW_LEARNER_MAX_ACTIVE
    if in_flight + new_runs <= limit:
        return
    needs = f"; this sweep needs {new_runs}" if new_runs > 1 else ""
    why = (
        f" until you have answered {settings.LABS_ESTABLISHED_AFTER_REVIEWS} quiz cards"
        if new_account
        else ""
    )
    raise RunRefused(
        f"You already have {in_flight} runs queued or running{_counting(cards, fits)} (the limit "
        f"is {limit}{why})"
        f"{needs}. Each point of a sweep counts as a run. Wait for one to finish or cancel "
        "one, then run again.",
        kind="quota",
    )


def _counting(cards: int, fits: int) -> str:
    """The learner's work other than lab runs that a count includes, in words ("" for none)."""
    parts = [f"{cards} card{'s' if cards != 1 else ''} being made"] if cards else []
    parts += [f"{fits} parameter fit{'s' if fits != 1 else ''}"] if fits else []
    return f" (counting {' and '.join(parts)})" if parts else ""


def sim_work_check(*, owner: object) -> None:
    """Refuse one more piece of simulating work (a card request) from `owner` as a run would be
    refused: no worker, the learner's quota, the simulator queue's cap or the learner's share.
    Call it inside the transaction that saves the work, so that the locks it takes (the
    learner's, then the queue's, as for runs) hold until the work is written.

    Raises:
        RunRefused: why, in plain words; nothing is saved.
    """
    _lock_owner(owner)
    _lock_queue_cap("sim")
    _check_can_queue(owner=owner, backend="sim", new_runs=1)


def _lock_owner(owner: object) -> None:
    # Serialises one learner's submissions so two quick clicks cannot both pass the quota.
    get_user_model().objects.select_for_update().filter(pk=owner.pk).first()  # type: ignore[attr-defined]


def _lock_queue_cap(backend: str) -> None:
    """Serialise submissions to one backend queue (labs.sim, labs.gpu) until this transaction
    ends, so two learners cannot both count the same free places under its global cap. A
    PostgreSQL advisory lock, as there is no row to lock: the cap counts rows not yet written.
    SQLite needs none: its IMMEDIATE transactions already take one write lock at BEGIN."""
    transaction_lock(f"labs.queue-cap:{backend_queue(backend)}")


class QueueUnavailable(Exception):
    """The broker refused or could not take the message."""


def _enqueue(run_ids: Sequence[int], backend: str, queues: Sequence[str] | None = None) -> None:
    """Send one turn per run to its queue (`queues`, one per run; else the backend's). A turn
    names no run: the worker that takes it runs whichever run's turn it is then (labs.turns).

    Raises:
        QueueUnavailable: the broker did not take them (down, refused, timed out).
    """
    send_turns(
        list(queues or [backend_queue(backend)] * len(run_ids)), for_what=f"runs {list(run_ids)}"
    )


def _turn_options(queue: str) -> dict[str, object]:
    # The hard limit kills the process; the soft one lets the service record why it stopped. A
    # turn may take any work on its queue, so it has the queue's lab run limits (work with a
    # shorter limit of its own, a card, holds itself to it).
    gpu = queue == "labs.gpu" or queue.startswith("labs.gpu.")
    soft = settings.LABS_GPU_TIME_LIMIT_S if gpu else settings.LABS_SIM_TIME_LIMIT_S
    return {"queue": queue, "soft_time_limit": soft, "time_limit": soft + 60}


def send_turns(queues: Sequence[str], *, for_what: str = "") -> None:
    """Send one turn to each of `queues` (a queue named twice gets two): one for each piece of
    work just queued there, sent after the transaction that saved the work commits.

    Raises:
        QueueUnavailable: the broker did not take them (down, refused, timed out).
    """
    try:
        if len(queues) == 1:
            run_next_task.apply_async(args=[queues[0]], **_turn_options(queues[0]))
        else:
            group(
                run_next_task.si(queue).set(**_turn_options(queue)) for queue in queues
            ).apply_async()
    except Exception as exc:
        # Any failure to hand over the message (connection refused, timeout, auth) would leave a
        # queued row no worker will ever take.
        logger.warning("could not send turns for %s to %s: %r", for_what, list(queues), exc)
        raise QueueUnavailable(str(exc)) from exc


def _save_and_enqueue(
    create: Callable[[], tuple[list[int], list[str]]], owner: object, backend: str, new_runs: int
) -> None:
    """Check and save in one transaction, send only after it commits; if the broker fails, take
    back the rows it did not take and refuse (nothing is left behind to fill the quota).
    `create` saves the runs and returns their ids and queues."""
    ids: list[int] = []
    try:
        with transaction.atomic():
            _lock_owner(owner)  # then the queue: one order everywhere, so no deadlock
            _lock_queue_cap(backend)
            _check_can_queue(owner=owner, backend=backend, new_runs=new_runs)
            ids, queues = create()
            transaction.on_commit(lambda: _enqueue(ids, backend, queues))
    except QueueUnavailable:
        sweeps = set(LabRun.objects.filter(pk__in=ids).values_list("sweep", flat=True))
        LabRun.objects.filter(pk__in=ids, state=RunState.QUEUED).delete()
        Sweep.objects.filter(pk__in=sweeps - {None}, runs=None).delete()
        raise RunRefused(
            "The lab queue is unavailable right now, so nothing was queued. Try again in a minute.",
            kind="queue-down",
        ) from None


def _check_preset(preset: str) -> None:
    """A run remembers the preset it came from only if that is a real preset's slug; anything
    else (a path, a NUL byte) is refused before it reaches the database."""
    if preset and preset not in load_presets():
        shown = preset[:30].encode("unicode_escape").decode("ascii")
        raise ParamError({"preset": f"preset must be the slug of a lab preset, got {shown}"})


def run_request(
    *, owner: object, lab: str, backend: str, data: Mapping[str, object], preset: str = ""
) -> LabRun:
    """Validate, check quotas and workers, save a queued run and enqueue it after commit.

    Raises:
        ParamError: bad parameters (or backend), one message per field.
        RunRefused: valid, but it cannot run now; nothing was saved or enqueued.
    """
    return runs_request(owner=owner, lab=lab, backend=backend, datas=[data], preset=preset)[0]


def runs_request(
    *,
    owner: object,
    lab: str,
    backend: str,
    datas: Sequence[Mapping[str, object]],
    preset: str = "",
    then: Callable[[list[LabRun]], object] | None = None,
) -> list[LabRun]:
    """`run_request` for runs that go together (a ratio's run and its baseline run): all are
    checked before any is saved, saved in one transaction with whatever `then(runs)` saves
    beside them, and each sent its turn after it commits.

    Raises:
        ParamError: bad parameters of any of them, one message per field.
        RunRefused: as for `run_request`; nothing was saved or enqueued.
    """
    backend_queue(backend)
    _check_preset(preset)
    points = [parse_lab_params(data, ignore_unknown=True) for data in datas]
    queues = [_precheck(backend, params) for params in points]
    created: list[LabRun] = []

    def create() -> tuple[list[int], list[str]]:
        created.extend(
            LabRun.objects.create(
                owner=owner,
                lab=lab,
                preset=preset,
                backend=backend,
                queue=queue,
                params=params.as_dict(),
                predicted=_predicted(params),
            )
            for params, queue in zip(points, queues, strict=True)
        )
        if then is not None:
            then(created)
        return [run.pk for run in created], [run.queue for run in created]

    _save_and_enqueue(create, owner, backend, len(points))
    return created


def sweep_values_parse(field: str, raw: str) -> list[str]:
    """Split '1, 2, 4' into ['1', '2', '4'] or raise ParamError naming sweep_values."""
    if field not in FIELDS_BY_NAME:
        raise ParamError({"sweep_field": f"sweep_field must be a lab parameter, got {field[:40]}"})
    items = [item.strip() for item in str(raw).replace(";", ",").split(",") if item.strip()]
    limit = settings.LABS_SWEEP_MAX_VALUES
    if not 2 <= len(items) <= limit:
        raise ParamError(
            {"sweep_values": f"sweep_values must list 2 to {limit} values, got {len(items)}"}
        )
    return items


def sweep_request(
    *,
    owner: object,
    lab: str,
    backend: str,
    data: Mapping[str, object],
    field: str,
    raw_values: str,
    shown: Collection[str] | None = None,
) -> Sweep:
    """Validate every point of the sweep, then queue one run per value (a turn each, sent as a
    Celery group).

    `shown`: the settings the lab shows; the others follow each point's values
    (`labs.parameters.params.follow_unshown`). None: every setting is as given (the `lab` command).

    Raises:
        ParamError: bad base parameters, field or values; a bad value names itself.
        RunRefused: as for `run_request`.
    """
    backend_queue(backend)
    # Refuse a learner over quota before any work on the points (checked again under the lock).
    _check_can_queue(owner=owner, backend=backend, new_runs=1)
    items = sweep_values_parse(field, raw_values)
    points: list[LabParams] = []
    queues: list[str] = []
    errors: dict[str, str] = {}
    for item in items:
        try:
            point_data = {**data, field: item}
            if shown is not None:
                point_data = follow_unshown(point_data, shown)
            point = parse_lab_params(point_data, ignore_unknown=True)
            queues.append(_precheck(backend, point))
            points.append(point)
        except ParamError as exc:
            # Report the first bad point; a bad swept value is named by its value.
            for name, message in exc.errors.items():
                key = "sweep_values" if name == field else name
                errors[key] = f"sweep value {item[:30]}: {message}" if name == field else message
            break
    if errors:
        raise ParamError(errors)
    values = [p.as_dict()[field] for p in points]
    if len(set(map(str, values))) != len(values):
        raise ParamError({"sweep_values": "sweep_values must not repeat a value"})
    made: list[Sweep] = []

    def create() -> tuple[list[int], list[str]]:
        sweep = Sweep.objects.create(
            owner=owner, lab=lab, backend=backend, field=field, values=values
        )
        made.append(sweep)
        runs = LabRun.objects.bulk_create(
            LabRun(
                owner=owner,
                lab=lab,
                backend=backend,
                queue=queues[i],
                params=p.as_dict(),
                predicted=_predicted(p),
                sweep=sweep,
                sweep_index=i,
            )
            for i, p in enumerate(points)
        )
        return [r.pk for r in runs], [r.queue for r in runs]

    _save_and_enqueue(create, owner, backend, len(points))
    return made[0]


# -- cancel --------------------------------------------------------------------------------------


def run_cancel(*, run: LabRun) -> bool:
    """Cancel a queued or running run. A running one stops at the backend's next progress call.

    Returns False when the run had already finished.
    """
    now = timezone.now()
    changed = LabRun.objects.filter(
        pk=run.pk, state__in=[RunState.QUEUED, RunState.RUNNING]
    ).update(state=RunState.CANCELLED, finished_at=now, error="Cancelled by the learner.")
    return bool(changed)


def sweep_cancel(*, sweep: Sweep) -> int:
    now = timezone.now()
    return sweep.runs.filter(state__in=[RunState.QUEUED, RunState.RUNNING]).update(
        state=RunState.CANCELLED, finished_at=now, error="Cancelled by the learner."
    )


# -- execute (in the worker) ----------------------------------------------------------------


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


# -- turns (in the worker) ---------------------------------------------------------------------


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
    """Take the work whose turn it is on `queue` (labs.turns: a lab run, or work another app
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


# -- reap --------------------------------------------------------------------------------------


def run_reap_stale(*, now: datetime | None = None, run_ids: Sequence[int] | None = None) -> int:
    """Fail runs a dead worker or a lost message left behind. Returns how many were failed.

    - running, and no heartbeat for LABS_RUN_STALE_S: the worker was killed or lost;
    - queued for LABS_QUEUED_STALE_S while no online worker consumes the queue it was sent to
      (a run for an H100 waits for an H100 worker, whatever other GPU workers are up);
    - queued while the broker lost its turn, and lost the one sent again (`_reap_lost_queued`,
      which sends that second turn).
    `run_ids` limits the check to those runs (a page watching one run).
    """
    now = now or timezone.now()
    stale_s = settings.LABS_RUN_STALE_S
    cutoff = now - timedelta(seconds=stale_s)
    runs = LabRun.objects.all() if run_ids is None else LabRun.objects.filter(pk__in=run_ids)
    reaped = 0
    for run_id, worker, beat_at in runs.filter(
        state=RunState.RUNNING, heartbeat_at__lt=cutoff
    ).values_list("pk", "worker", "heartbeat_at"):
        error = (
            f"The worker {worker or '(unknown)'} stopped sending heartbeats at "
            f"{beat_at:%H:%M:%S} UTC (killed or lost); marked failed after {stale_s} s of silence."
        )
        reaped += LabRun.objects.filter(
            pk=run_id, state=RunState.RUNNING, heartbeat_at__lt=cutoff
        ).update(state=RunState.FAILED, finished_at=now, error=error)
    queued_cutoff = now - timedelta(seconds=settings.LABS_QUEUED_STALE_S)
    old_queued = runs.filter(state=RunState.QUEUED, created_at__lt=queued_cutoff)
    served = _served_queues(now)
    for backend, queue in set(old_queued.values_list("backend", "queue")):
        sent_to = _sent_to(backend, queue)
        if sent_to in served:
            continue
        reaped += _fail_all(
            old_queued.filter(backend=backend, queue=queue),
            now,
            f"No {backend} worker took this run within {settings.LABS_QUEUED_STALE_S // 60} "
            f"minutes and none that consumes its queue ({sent_to}) is online.",
        )
    reaped += _reap_lost_queued(runs, now, served)
    if reaped:
        logger.warning("reaper marked %d lab run(s) failed", reaped)
    return reaped


def _sent_to(backend: str, queue: str) -> str:
    """The queue a run was sent to; a run saved before that was recorded went to its backend's."""
    return queue or settings.LABS_BACKEND_QUEUES.get(backend, "")


def _served_queues(now: datetime, *, up_since: datetime | None = None) -> set[str]:
    """The queues online workers consume: the one each announced (`labs.gpu.<kind>` for a GPU
    worker) and its backend's queue, which every worker of the backend consumes too. With
    `up_since`, only workers whose process has been up since then."""
    served: set[str] = set()
    online = WorkerHeartbeat.objects.online(now)
    if up_since is not None:
        online = online.filter(started_at__lte=up_since)
    for backend, queue, gpus in online.values_list("backend", "queue", "gpus"):
        served |= served_queues(backend, queue, gpus)
    return served


def _waiting_in_broker(queue: str) -> int | None:
    """How many messages wait in the broker's `queue`, not yet delivered to a worker; None when
    the broker cannot say (down, or it does not count)."""
    try:
        with celery_app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            try:
                return int(
                    conn.default_channel.queue_declare(queue=queue, passive=True).message_count
                )
            except conn.channel_errors:
                return 0  # Redis keeps no empty list: no such queue is an empty one
    except Exception as exc:
        logger.warning("reaper: cannot count the messages waiting in %s: %r", queue, exc)
        return None


def _reap_lost_queued(runs: QuerySet[LabRun], now: datetime, served: set[str]) -> int:
    """Queued runs whose turn the broker lost (a Redis restarted empty, say) get it again; a run
    whose re-sent turn was lost as well is failed. Returns how many were failed.

    A run's turn is lost when, LABS_QUEUED_LOST_S after it was queued, a worker consuming its
    queue has been up that long, their backend has been idle as long (nothing running, nothing
    started or finished) and the broker's queue is empty: a worker with prefetch 1 takes a
    waiting turn within seconds. Turns name no run (labs.turns), so after a loss a new run's
    turn may run an older one and leave the new run without one: every such run is sent a turn
    again, whenever it was queued. Only one whose re-sent turn vanished too is failed, so a run
    sent after the broker lost its messages is never failed for it. A worker that has just come
    back (after an outage, a restart) has not had the time to take what waits for it."""
    lost_s = settings.LABS_QUEUED_LOST_S
    cutoff = now - timedelta(seconds=lost_s)
    reaped = 0
    waiting = runs.filter(state=RunState.QUEUED, created_at__lt=cutoff)
    settled = _served_queues(now, up_since=cutoff)
    for backend, queue in set(waiting.values_list("backend", "queue")):
        sent_to = _sent_to(backend, queue)
        if sent_to not in served:
            continue  # nobody could have taken it: the stale check above deals with it
        if sent_to not in settled:
            continue  # its workers came up less than lost_s ago
        busy_with = _runs_its_workers_take(backend, queue)
        busy = (
            busy_with.filter(state=RunState.RUNNING).exists()
            or busy_with.filter(finished_at__gte=cutoff).exists()
            or busy_with.filter(started_at__gte=cutoff).exists()
        )
        if busy or _waiting_in_broker(sent_to) != 0:
            continue
        lost = waiting.filter(backend=backend, queue=queue)
        reaped += _fail_all(
            lost.filter(turn_resent_at__lt=cutoff),
            now,
            f"This run never reached a {backend} worker: the lab queue lost its turn, then the "
            f"one sent again, while a worker was online and idle for {lost_s} s. Run it again.",
        )
        _resend_turns(lost.filter(turn_resent_at__isnull=True), sent_to, now)
    return reaped


def _resend_turns(runs: QuerySet[LabRun], queue: str, now: datetime) -> None:
    """Send `queue` one turn for each of `runs`, whose own the broker lost, and record it on
    them. Marked first, so two reapers at once send them once; unmarked if the broker refuses,
    so the next reap tries again."""
    ids = list(runs.values_list("pk", flat=True))
    marked = LabRun.objects.filter(
        pk__in=ids, state=RunState.QUEUED, turn_resent_at__isnull=True
    ).update(turn_resent_at=now)
    if not marked:
        return
    logger.warning("reaper: the broker lost the turns of runs %s; sending them again", ids)
    try:
        send_turns([queue] * marked, for_what=f"runs {ids} whose turns were lost")
    except QueueUnavailable:
        LabRun.objects.filter(pk__in=ids, turn_resent_at=now).update(turn_resent_at=None)


def _runs_its_workers_take(backend: str, queue: str) -> QuerySet[LabRun]:
    """The runs that keep busy the workers able to take a run sent to `queue`: for the backend's
    shared queue, any of the backend's; for one GPU kind's queue, that queue's and the shared
    queue's (its workers take both), not another GPU's, whose runs never occupy them."""
    shared = settings.LABS_BACKEND_QUEUES.get(backend, "")
    of_backend = LabRun.objects.filter(backend=backend)
    if _sent_to(backend, queue) == shared:
        return of_backend
    # `labs.gpu.<kind>.x<n>`: the kind's workers also take its other counts' runs.
    kind_queue = queue.rsplit(".x", 1)[0]
    return of_backend.filter(
        Q(queue__in=[queue, kind_queue, shared, ""]) | Q(queue__startswith=kind_queue + ".x")
    )


def _fail_all(runs: QuerySet[LabRun], now: datetime, error: str) -> int:
    return runs.update(state=RunState.FAILED, finished_at=now, error=error)


# -- the Celery tasks (labs.tasks lists them for the workers) ----------------------------------
# Thin: they carry a queue's name, the functions above do the work and the database holds the
# state. The time limits are chosen when the turn is sent (`send_turns`).


@shared_task(
    name="labs.run_next",
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_next_task(self: Task, queue: str) -> str:
    return run_next(queue=str(queue), hostname=self.request.hostname or "")


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
    return run_next(queue=_sent_to(*row), hostname=self.request.hostname or "")


@shared_task(name="labs.reap_stale", ignore_result=True)
def reap_stale_task() -> int:
    """For a deployment that prefers celery beat; workers already reap from their heartbeat."""
    return run_reap_stale()
