"""The reaper and a worker that comes back: runs still waiting in the broker are run, not
called lost. The clock is faked by passing `now` (and backdating rows), not by waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from labs.models import LabRun, RunState, WorkerHeartbeat
from labs.parameters.params import parse_lab_params
from labs.runs import queueing, reaping, workers
from tests.labs.factories import make_heartbeat, make_run
from tests.labs.runs.test_tasks import state_of, wait_for
from tests.worker import purge, start_worker

pytestmark = pytest.mark.django_db


def _queue_for_real(run: LabRun) -> None:
    queueing._enqueue([run.pk], "sim")


def test_a_run_queued_during_a_two_minute_outage_is_left_for_the_worker_that_comes_back(
    alice, settings
):
    settings.LABS_QUEUED_LOST_S = 60
    purge(["labs.sim"])
    back_at = timezone.now()
    # Queued two minutes before the worker came back; its message waits in the broker.
    run = make_run(alice, backend="sim", created_at=back_at - timedelta(minutes=2))
    _queue_for_real(run)
    make_heartbeat("sim", started_at=back_at, last_seen=back_at)
    assert reaping.run_reap_stale(now=back_at) == 0
    # A minute and more later the worker has been up long enough, but the message still waits
    # in the broker (it is busy elsewhere, say): still not lost.
    later = back_at + timedelta(seconds=90)
    WorkerHeartbeat.objects.update(last_seen=later)
    assert reaping.run_reap_stale(now=later) == 0
    assert state_of(run.pk) == RunState.QUEUED
    # Once the broker holds nothing for it, its turn was lost: it is sent one again.
    purge(["labs.sim"])
    assert reaping.run_reap_stale(now=later) == 0
    assert reaping._waiting_in_broker("labs.sim") == 1
    run.refresh_from_db()
    assert run.state == RunState.QUEUED and run.turn_resent_at == later
    # Lost as well, and the worker idle a minute more: now it is failed.
    purge(["labs.sim"])
    last = later + timedelta(seconds=61)
    WorkerHeartbeat.objects.update(last_seen=last)
    assert reaping.run_reap_stale(now=last) == 1
    run.refresh_from_db()
    assert run.state == RunState.FAILED and "never reached a sim worker" in run.error


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_runs_queued_before_and_after_the_broker_restarted_empty_are_all_run(celery_worker, alice):
    """Redis restarted empty with A and B queued; C, queued after, sends a turn, which runs A
    (the oldest: turns name no run). B and C, left without a turn, get one again from the
    reaper (here the test's call, or the worker's own reaping) and run."""
    now = timezone.now()
    # The worker has been up for long; the clock is faked by the rows' ages.
    WorkerHeartbeat.objects.filter(hostname__startswith=celery_worker.name).update(
        started_at=now - timedelta(hours=1)
    )
    params = parse_lab_params({"num_prompts": 4}).as_dict()
    a, b = (make_run(alice, params=params, created_at=now - timedelta(minutes=m)) for m in (5, 4))
    c = make_run(alice, params=params)
    _queue_for_real(c)
    wait_for(lambda: state_of(a.pk) == RunState.DONE, 120, 0.2)
    assert state_of(b.pk) == state_of(c.pk) == RunState.QUEUED
    # A minute and more later, the worker idle all along.
    LabRun.objects.filter(pk=a.pk).update(
        started_at=now - timedelta(seconds=100), finished_at=now - timedelta(seconds=90)
    )
    LabRun.objects.filter(pk=c.pk).update(created_at=now - timedelta(seconds=101))
    assert reaping.run_reap_stale() == 0
    for run in (b, c):
        wait_for(lambda run=run: state_of(run.pk) in {RunState.DONE, RunState.FAILED}, 120, 0.2)
        run.refresh_from_db()
        assert run.state == RunState.DONE, run.error
        assert run.turn_resent_at is not None


def test_a_worker_process_restarted_under_the_same_name_says_when_it_started(settings):
    old = timezone.now() - timedelta(hours=3)
    make_heartbeat("sim", hostname="w@box", started_at=old, last_seen=old)
    workers._state.clear()  # a new process
    workers.announce("w@box", ["sim"])
    first = WorkerHeartbeat.objects.get(hostname="w@box").started_at
    assert first > old + timedelta(hours=2)
    workers.announce("w@box", ["sim"])  # a later beat of the same process keeps it
    assert WorkerHeartbeat.objects.get(hostname="w@box").started_at == first
    workers._state.clear()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_comes_back_runs_what_was_queued_while_it_was_down(alice, settings):
    purge(["labs.sim"])
    params = parse_lab_params({"num_prompts": 4}).as_dict()
    # Queued 2.5 minutes ago, while no worker was up (the clock faked by the row's age).
    run = make_run(alice, params=params, created_at=timezone.now() - timedelta(seconds=150))
    _queue_for_real(run)
    worker = start_worker(["labs.sim"], purge_first=False)
    try:
        wait_for(lambda: state_of(run.pk) in {RunState.DONE, RunState.FAILED}, 180, 0.2)
        run.refresh_from_db()
        assert run.state == RunState.DONE, run.error
        assert run.worker.startswith(worker.name)
    finally:
        worker.stop()
