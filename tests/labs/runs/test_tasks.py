"""Lab runs through the real broker and real `celery worker` processes (never eager mode).

SQLite + the filesystem broker by default; CI runs the same tests on PostgreSQL + Redis.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest
from django.urls import reverse

from labs.models import LabRun, RunState, Sweep, WorkerHeartbeat
from labs.parameters.params import parse_lab_params
from labs.runs import queueing
from labs.tasks import run_execute_task, run_next_task
from tests.labs.factories import make_run
from tests.worker import WorkerProcess, start_worker

pytestmark = [pytest.mark.worker]
HTMX = {"HTTP_HX_REQUEST": "true"}

# A run the simulator takes about a second over: long enough to watch progress move, short
# enough for a test. NOTE: the simulator skips the steps in which nothing happens, so that takes
# something happening at nearly every step: Poisson arrivals, and speculation's drafts.
WATCHABLE = {
    "num_prompts": "2000",
    "prompt_tokens": "256",
    "output_tokens": "64",
    "max_tokens": "512",
    "request_rate": "50",
    "spec_method": "draft_model",
    "spec_tokens": "2",
    "backend": "sim",
}
# About a minute of simulation: still running when the test kills its worker.
ENDLESS = {
    **WATCHABLE,
    "num_prompts": "300000",
    "prompt_tokens": "64",
    "output_tokens": "16",
    "request_rate": "100",
}
# Seconds, for worker processes a test starts itself: a killed worker's run is stale after 3 s.
FAST_REAPER = {
    "LABS_RUN_STALE_S": "3",
    "LABS_RUN_HEARTBEAT_S": "1",
    "LABS_WORKER_HEARTBEAT_S": "1",
}


# How long a test waits for a worker to get somewhere: a limit for a busy machine (the default
# suite must pass with every core taken by other work), never a speed check.
WAIT_S = 180


def wait_for(
    check: Callable[[], object], timeout_s: float = WAIT_S, every_s: float = 0.1
) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {check}")


def state_of(run_id: int) -> str:
    return LabRun.objects.values_list("state", flat=True).get(pk=run_id)


@pytest.fixture
def workers(transactional_db) -> Iterator[list[WorkerProcess]]:
    """Worker processes a test starts itself; all are stopped (or already dead) afterwards."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


def test_a_lab_run_from_the_page_to_the_result_through_a_real_worker(
    celery_worker, alice_client, alice
):
    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), WATCHABLE)
    assert response.status_code == 302, response.content.decode()[:2000]
    run = LabRun.objects.get(owner=alice)
    assert response["Location"] == run.get_absolute_url()

    # Poll the page's partial, as the browser's htmx does, and keep every percentage seen.
    seen: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        poll = alice_client.get(run.get_absolute_url(), **HTMX)
        match = re.search(
            r'<progress id="run-progress" max="100" value="(\d+)"', poll.content.decode()
        )
        if match:
            seen.append(int(match.group(1)))
        if poll.status_code == 286:
            break
        assert poll.status_code == 200
        time.sleep(0.1)
    else:
        raise AssertionError(f"run never finished; worker log:\n{celery_worker.log()}")

    run.refresh_from_db()
    assert run.state == RunState.DONE, run.error
    moving = [p for p in seen if 0 < p < 100]
    assert len(set(moving)) >= 2 and moving == sorted(moving), seen  # progress rose while it ran
    assert run.worker.startswith(celery_worker.name)
    assert run.where.startswith("simulated on CPU as H100 SXM (calibrated to ")
    assert run.started_at <= run.finished_at and run.progress == 1
    assert run.result["completed"] == 2000
    assert run.result["ttft_s"]["p50"] > 0 and run.predicted["ttft_s"] > 0

    page = alice_client.get(run.get_absolute_url())
    rows = {r.label: r for r in page.context["rows"]}
    tokens = rows["Output tokens/s"]
    assert tokens.measured and tokens.predicted and tokens.diff  # side by side, with the %
    html = page.content.decode()
    assert 'class="num measured"' in html and 'class="num predicted"' in html
    assert "simulated on CPU" in html


def test_a_killed_worker_leaves_a_run_that_is_marked_failed_by_the_reaper(
    workers, alice_client, alice
):
    # The victim serves the sim queue; the other worker only "default", so it never takes the
    # run, but its heartbeat thread runs the reaper like every worker's does.
    victim = start_worker(["labs.sim"], extra_env=FAST_REAPER)
    workers.append(victim)
    workers.append(start_worker(["default"], extra_env=FAST_REAPER))

    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), ENDLESS)
    assert response.status_code == 302, response.content.decode()[:2000]
    run = LabRun.objects.get(owner=alice)
    wait_for(lambda: LabRun.objects.filter(pk=run.pk, progress__gt=0).exists())
    assert state_of(run.pk) == RunState.RUNNING

    victim.kill()
    killed_at = time.monotonic()
    # How soon depends on how busy the machine is (stale 3 s + heartbeat 1 s + reaper period 1 s
    # when idle); the wait is generous so a loaded machine does not fail it. What cannot vary is
    # that the reaper waited for the heartbeat to go stale (the database's own timestamps).
    wait_for(lambda: state_of(run.pk) == RunState.FAILED, WAIT_S, 0.2)
    took_s = time.monotonic() - killed_at

    run.refresh_from_db()
    assert "stopped sending heartbeats" in run.error and victim.name in run.error
    assert (run.finished_at - run.heartbeat_at).total_seconds() >= 3
    print(f"killed worker's run marked failed {took_s:.1f}s after SIGKILL")
    page = alice_client.get(run.get_absolute_url())
    assert "The run failed." in page.content.decode()


def test_a_run_submitted_while_no_worker_is_up_is_refused(workers, alice_client, alice):
    worker = start_worker(["labs.sim"])
    workers.append(worker)
    assert WorkerHeartbeat.objects.online().filter(backend="sim").exists()
    worker.stop()  # a clean stop takes the worker offline at once
    assert not WorkerHeartbeat.objects.filter(hostname__startswith=worker.name).exists()

    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), WATCHABLE)
    assert response.status_code == 503
    assert "No worker for the sim backend is online right now" in response.content.decode()
    assert not LabRun.objects.exists()


def test_a_task_that_raises_marks_the_run_failed_with_the_error(celery_worker, alice):
    # A row no service would write: the worker's own validation refuses it.
    run = make_run(alice, params={"block_size": "17"})
    run_execute_task.apply_async(args=[run.pk], queue="labs.sim")
    wait_for(lambda: state_of(run.pk) == RunState.FAILED)
    run.refresh_from_db()
    assert run.error.startswith("These settings cannot run: block_size must be a power of two")
    assert run.finished_at is not None


def test_a_second_delivery_of_the_same_run_does_not_run_it_again(celery_worker, alice):
    # A message sent before turns (it names its run) is a turn on the run's queue; a second
    # one, or a turn more than the work waiting, finds nothing and runs nothing twice.
    run = make_run(alice, params=parse_lab_params({"num_prompts": 4}).as_dict())
    run_execute_task.apply_async(args=[run.pk], queue="labs.sim")
    wait_for(lambda: state_of(run.pk) == RunState.DONE)
    finished_at = LabRun.objects.get(pk=run.pk).finished_at
    run_execute_task.apply_async(args=[run.pk], queue="labs.sim")
    run_next_task.apply_async(args=["labs.sim"], queue="labs.sim")
    wait_for(lambda: celery_worker.log().count("a turn on labs.sim found nothing waiting") == 2)
    assert LabRun.objects.get(pk=run.pk).finished_at == finished_at


def test_the_worker_serves_learners_in_turn_not_in_the_order_runs_came(celery_worker, alice, bob):
    # Alice's runs were queued before Bob's one: as the worker frees, it takes Bob's second,
    # not after all of Alice's (the probe's FIFO served it last). The rows are saved before any
    # turn is sent, so the order does not depend on how fast the worker is.
    small = parse_lab_params({"num_prompts": 4}).as_dict()
    alices = [make_run(alice, params=small, queue="labs.sim") for _ in range(3)]
    bobs = make_run(bob, params=small, queue="labs.sim")
    queueing._enqueue([r.pk for r in [*alices, bobs]], "sim")
    runs = LabRun.objects.filter(owner__in=[alice, bob])
    wait_for(lambda: runs.filter(state=RunState.DONE).count() == 4, WAIT_S, 0.2)
    order = list(runs.order_by("started_at").values_list("pk", flat=True))
    assert order == [alices[0].pk, bobs.pk, alices[1].pk, alices[2].pk]
    assert f"(learner {bob.pk}'s turn on labs.sim)" in celery_worker.log()


def test_cancelling_a_running_run_stops_the_backend(celery_worker, alice_client, alice):
    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), ENDLESS)
    run = LabRun.objects.get(owner=alice)
    assert response.status_code == 302
    wait_for(lambda: LabRun.objects.filter(pk=run.pk, progress__gt=0).exists())
    alice_client.post(reverse("labs:run-cancel", args=[run.pk]))
    assert state_of(run.pk) == RunState.CANCELLED
    wait_for(lambda: f"run {run.pk} stopped: cancelled" in celery_worker.log())
    # The worker is free again: a small run goes through.
    small = {**WATCHABLE, "num_prompts": "3"}
    alice_client.post(reverse("labs:run-create", args=["sandbox"]), small)
    second = LabRun.objects.exclude(pk=run.pk).get(owner=alice)
    wait_for(lambda: state_of(second.pk) == RunState.DONE)
    assert state_of(run.pk) == RunState.CANCELLED


def test_a_sweep_runs_as_a_group_and_charts_measured_and_predicted(
    celery_worker, alice_client, alice
):
    response = alice_client.post(
        reverse("labs:sweep-create", args=["batching"]),
        {
            "backend": "sim",
            "num_prompts": "32",
            "concurrency": "32",
            "sweep_field": "max_num_seqs",
            "sweep_values": "1, 8, 32",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    sweep = Sweep.objects.get(owner=alice)
    wait_for(lambda: sweep.runs.filter(state=RunState.DONE).count() == 3, WAIT_S, 0.2)
    page = alice_client.get(sweep.get_absolute_url(), **HTMX)
    assert page.status_code == 286
    chart = page.context["chart"] if page.context else None
    if chart is None:  # partial responses carry no context; read the page's own JSON
        chart = alice_client.get(sweep.get_absolute_url()).context["chart"]
    throughput = next(m for m in chart["metrics"] if m["key"] == "output_tokens_per_s")
    measured = [p["measured"] for p in throughput["points"]]
    predicted = [p["predicted"] for p in throughput["points"]]
    assert all(measured) and all(predicted)
    assert measured[0] < measured[1] < measured[2]  # bigger batches, more tokens per second
    assert predicted[0] < predicted[1] < predicted[2]


# A prefork pool and a SIGKILLed child, twenty seconds: `make test-deep`.
@pytest.mark.deep
def test_the_prefork_pool_runs_labs_and_a_killed_child_is_reaped(workers, alice_client, alice):
    # make run's worker uses the prefork pool: the heartbeat thread lives in the parent, the run
    # (and its own heartbeat) in a child. Killing only the child leaves the parent beating.
    worker = start_worker(["labs.sim", "default"], pool="prefork", extra_env=FAST_REAPER)
    workers.append(worker)
    assert WorkerHeartbeat.objects.online().filter(hostname__startswith=worker.name).exists()
    small = {**WATCHABLE, "num_prompts": "3"}
    alice_client.post(reverse("labs:run-create", args=["sandbox"]), small)
    first = LabRun.objects.get(owner=alice)
    wait_for(lambda: state_of(first.pk) == RunState.DONE)

    alice_client.post(reverse("labs:run-create", args=["sandbox"]), ENDLESS)
    run = LabRun.objects.exclude(pk=first.pk).get(owner=alice)
    wait_for(lambda: LabRun.objects.filter(pk=run.pk, progress__gt=0).exists())
    children = _children(worker.process.pid)
    assert children, "no pool process"
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: state_of(run.pk) == RunState.FAILED, WAIT_S, 0.2)
    assert "stopped sending heartbeats" in LabRun.objects.get(pk=run.pk).error
    assert worker.alive()  # the parent lived on, and still says so
    assert WorkerHeartbeat.objects.online().filter(hostname__startswith=worker.name).exists()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def test_a_million_prompt_run_fails_cleanly_and_the_worker_lives_on(celery_worker, alice):
    # A row that skipped the submit check (written by hand): the worker checks the size itself.
    huge = make_run(alice, params=parse_lab_params({"num_prompts": 1_000_000}).as_dict())
    run_execute_task.apply_async(args=[huge.pk], queue="labs.sim")
    wait_for(lambda: state_of(huge.pk) == RunState.FAILED, 60)
    huge.refresh_from_db()
    assert huge.error.startswith("Too large for one simulated run: num_prompts")
    assert celery_worker.alive()
    small = make_run(alice, params=parse_lab_params({"num_prompts": 4}).as_dict())
    run_execute_task.apply_async(args=[small.pk], queue="labs.sim")
    wait_for(lambda: state_of(small.pk) == RunState.DONE, 60)
    assert celery_worker.alive()
