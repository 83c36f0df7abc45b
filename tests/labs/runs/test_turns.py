"""A lab queue serves learners in turn (labs.runs.turns): each message is a turn on its queue, and
the worker taking it takes the oldest run of the learner served least recently, not the oldest run.

Against the database, no broker or worker: runs are queued by the services (their turns recorded
by `sent`, never sent) and turns are taken by calling `take` or `run_next`, as a worker would.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from labs.models import LabRun, QueueTurn, RunState
from labs.runs import execution, submission, turns
from tests.conftest import make_user
from tests.labs.factories import SMALL, make_heartbeat, make_run
from tests.labs.runs.test_runs import sent  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sent")]


def queue_runs(owner, n: int, backend: str = "sim", **data) -> list[LabRun]:
    return [
        submission.run_request(owner=owner, lab="sandbox", backend=backend, data={**SMALL, **data})
        for _ in range(n)
    ]


def take(queue: str = "labs.sim") -> LabRun | None:
    """Be a worker whose slot just freed: take the next turn's run (claimed, not run)."""
    taken = turns.take(queue, "w@host", [execution.LAB_RUNS])
    return None if taken is None else LabRun.objects.get(pk=taken.pk)


def owners_in_turn(queue: str = "labs.sim") -> list[str]:
    """Whose run each turn takes, until nothing waits."""
    order = []
    while (run := take(queue)) is not None:
        order.append(run.owner.username)
    return order


def test_a_learner_after_anothers_many_runs_is_served_second_not_last(settings):
    # The probe's case: many long runs queued by others, then one learner's short run.
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 12
    make_heartbeat("sim")
    ann, ben = make_user("ann", is_staff=True), make_user("ben")
    queue_runs(ann, 6)
    queue_runs(ben, 1)
    assert owners_in_turn() == ["ann", "ben", "ann", "ann", "ann", "ann", "ann"]


def test_learners_take_turns_round_robin_and_each_gets_their_oldest_run_first(settings):
    make_heartbeat("sim")
    ann, ben, cat = (make_user(name, is_staff=True) for name in ("ann", "ben", "cat"))
    first_of_ann = queue_runs(ann, 3)
    queue_runs(ben, 2)
    queue_runs(cat, 1)
    taken = []
    while (run := take()) is not None:
        taken.append(run)
    assert [r.owner.username for r in taken] == ["ann", "ben", "cat", "ann", "ben", "ann"]
    assert [r.pk for r in taken if r.owner == ann] == [r.pk for r in first_of_ann]
    assert all(r.state == RunState.RUNNING and r.worker == "w@host" for r in taken)


def test_the_learner_served_least_recently_goes_first_one_never_served_before_all():
    make_heartbeat("sim")
    ann, ben, cat = (make_user(name) for name in ("ann", "ben", "cat"))
    now = timezone.now()
    QueueTurn.objects.create(queue="labs.sim", owner=ann, taken_at=now - timedelta(minutes=1))
    QueueTurn.objects.create(queue="labs.sim", owner=ben, taken_at=now - timedelta(hours=1))
    # A turn on another queue does not count on this one.
    QueueTurn.objects.create(queue="labs.gpu", owner=cat, taken_at=now)
    make_run(ann, queue="labs.sim", created_at=now - timedelta(hours=3))
    make_run(ben, queue="labs.sim", created_at=now - timedelta(hours=2))
    make_run(cat, queue="labs.sim", created_at=now - timedelta(minutes=5))
    assert owners_in_turn() == ["cat", "ben", "ann"]
    assert QueueTurn.objects.get(queue="labs.sim", owner=ann).taken_at > now


def test_a_run_pinned_to_a_gpu_kinds_queue_is_taken_only_by_a_turn_on_that_queue(alice):
    for kind, count in (("l4", 1), ("h100-sxm", 2)):
        make_heartbeat(
            "vllm",
            hostname=f"{kind}@box",
            queue=f"labs.gpu.{kind}",
            gpus={"kind": kind, "count": count, "name": kind, "memory_bytes": 80 * 2**30},
        )
    [on_h100] = queue_runs(alice, 1, backend="vllm", gpu="h100-sxm", tp=2)
    assert on_h100.queue == "labs.gpu.h100-sxm.x2"
    assert take("labs.gpu.l4.x1") is None
    assert take("labs.gpu") is None
    assert take("labs.sim") is None
    assert take("labs.gpu.h100-sxm.x2").pk == on_h100.pk


def test_a_run_saved_before_runs_recorded_their_queue_waits_on_its_backends(alice):
    old = make_run(alice, backend="sim", queue="")
    assert take("labs.gpu") is None
    assert take("labs.sim").pk == old.pk


def test_a_cancelled_runs_turn_takes_the_next_learners_run_or_finds_nothing(alice, bob):
    make_heartbeat("sim")
    [cancelled] = queue_runs(alice, 1)
    [bobs] = queue_runs(bob, 1)
    submission.run_cancel(run=cancelled)
    assert take().pk == bobs.pk
    assert take() is None
    assert execution.run_next(queue="labs.sim", hostname="w@host") == "nothing waits on labs.sim"
    assert LabRun.objects.get(pk=cancelled.pk).state == RunState.CANCELLED


def test_a_run_cancelled_after_it_was_read_is_passed_over(alice, bob):
    # The cancel commits between the taker's read and its claim (PostgreSQL's READ COMMITTED).
    make_heartbeat("sim")
    [first] = queue_runs(alice, 1)
    [second] = queue_runs(bob, 1)
    real_claim = execution.LAB_RUNS.claim

    def cancelled_meanwhile(run_id, hostname):
        if run_id == first.pk:
            submission.run_cancel(run=first)
        return real_claim(run_id, hostname)

    kind = dataclasses.replace(execution.LAB_RUNS, claim=cancelled_meanwhile)
    taken = turns.take("labs.sim", "w@host", [kind])
    assert taken is not None and taken.pk == second.pk
    assert not QueueTurn.objects.filter(owner=alice).exists()


def test_a_turn_runs_the_run_it_takes_and_records_what_escapes(alice, bob):
    make_heartbeat("sim")
    [alices] = queue_runs(alice, 1)
    [bobs] = queue_runs(bob, 1)
    assert execution.run_next(queue="labs.sim", hostname="w@host") == f"run {alices.pk} done"
    alices.refresh_from_db()
    assert alices.state == RunState.DONE and alices.result["completed"] == 8
    # What escapes the run's own handling fails the run it took, not some other.
    with (
        mock.patch.object(execution, "_run_claimed", side_effect=RuntimeError("lost")),
        pytest.raises(RuntimeError),
    ):
        execution.run_next(queue="labs.sim", hostname="w@host")
    bobs.refresh_from_db()
    assert bobs.state == RunState.FAILED and bobs.error == "RuntimeError: lost"


def test_choose_is_by_last_turn_then_by_how_long_the_oldest_work_waited():
    kind = execution.LAB_RUNS
    t0 = timezone.now()

    def at(owner: int, pk: int, minutes: int) -> tuple[turns.WorkKind, turns.Waiting]:
        return kind, turns.Waiting(
            owner_id=owner, pk=pk, created_at=t0 + timedelta(minutes=minutes)
        )

    waiting = [at(1, 10, 5), at(1, 11, 1), at(2, 20, 3), at(3, 30, 4)]
    # Nobody served yet: whoever has waited longest, with their oldest work.
    assert turns.choose(waiting, {})[1].pk == 11
    # Learner 1 served just now: 2 and 3 never were, and 2 has waited longer.
    assert turns.choose(waiting, {1: t0 + timedelta(hours=1)})[1].pk == 20
    # All served: the least recently.
    served = {1: t0 + timedelta(hours=3), 2: t0 + timedelta(hours=2), 3: t0 + timedelta(hours=1)}
    assert turns.choose(waiting, served)[1].pk == 30
    assert turns.choose([], served) is None
