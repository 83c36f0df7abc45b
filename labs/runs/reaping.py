"""The stale-run reaper: fail runs whose worker died, and queued runs nobody will take.

A run is failed only by a conditional UPDATE on its state, so the reaper never fails a run that
just finished.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from config.celery import app as celery_app
from labs.models import LabRun, RunState, WorkerHeartbeat
from labs.runs import queueing
from labs.runs.workers import served_queues

logger = logging.getLogger(__name__)


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
    waiting turn within seconds. Turns name no run (labs.runs.turns), so after a loss a new run's
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
        queueing.send_turns([queue] * marked, for_what=f"runs {ids} whose turns were lost")
    except queueing.QueueUnavailable:
        LabRun.objects.filter(pk__in=ids, turn_resent_at=now).update(turn_resent_at=None)
