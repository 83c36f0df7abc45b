"""Submitting lab runs and sweeps: refuse what cannot run (with why), queue the rest.

Every state change is a conditional UPDATE on `LabRun.state`, so whoever gets there first wins
and the others see 0 rows changed: a duplicate delivery does not run twice, a cancelled run is
not overwritten by a late result, and the reaper never fails a run that just finished.

A submit sends one message per run, a turn on the run's queue (labs.runs.queueing); the worker
taking it runs the run whose turn it is then (labs.runs.turns), not first come first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from config.locks import transaction_lock
from labs import hooks
from labs.backends import StartOptions, check_can_start, is_simulated, simulated_backends
from labs.models import LabRun, RunState, Sweep, WorkerHeartbeat
from labs.parameters.params import (
    FIELDS_BY_NAME,
    LabParams,
    ParamError,
    follow_unshown,
    parse_lab_params,
)
from labs.parameters.presets import load_presets
from labs.runs import execution, queueing
from labs.runs.busy import busy_words
from labs.runs.selectors import device_key
from labs.runs.workers import (
    busy_devices,
    devices_online,
    engines_busy,
    online_without_devices,
    placement_queue,
    start_command,
)

logger = logging.getLogger(__name__)


class RunRefused(Exception):
    """The run is valid but cannot be queued now. Nothing is saved.

    `kind` is "no-worker", "busy", "quota", "gpu-cap", "sim-cap" or "queue-down". `operator_hint` is
    for staff only (the command that starts a worker): a learner cannot act on it."""

    def __init__(self, reason: str, *, kind: str, operator_hint: str = "") -> None:
        self.reason = reason
        self.kind = kind
        self.operator_hint = operator_hint
        super().__init__(reason)


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
    return placement_queue(queueing.backend_queue(backend), placement)


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
    queue = queueing.backend_queue(backend)
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
    transaction_lock(f"labs.queue-cap:{queueing.backend_queue(backend)}")


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
            transaction.on_commit(lambda: queueing._enqueue(ids, backend, queues))
    except queueing.QueueUnavailable:
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
    queueing.backend_queue(backend)
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
                predicted=execution._predicted(params),
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
    queueing.backend_queue(backend)
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
                predicted=execution._predicted(p),
                sweep=sweep,
                sweep_index=i,
            )
            for i, p in enumerate(points)
        )
        return [r.pk for r in runs], [r.queue for r in runs]

    _save_and_enqueue(create, owner, backend, len(points))
    return made[0]


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
