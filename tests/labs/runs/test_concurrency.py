"""Two learners submit at the same moment, on two real database connections: the global queue
caps hold. Two workers take turns at the same moment: each serves another learner."""

from __future__ import annotations

import dataclasses
import threading
from functools import partial
from unittest import mock

import pytest
from django.db import connection

from labs.models import LabRun
from labs.runs import execution, queueing, submission, turns
from tests.conftest import make_user
from tests.labs.factories import SMALL, make_heartbeat
from tests.threads import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("the queue-cap lock is exercised on PostgreSQL (SQLite serialises writers)")


@pytest.fixture
def checks_meet():
    """Each submit, once it passed the checks, waits (a while) for the other to pass them too:
    without a lock both would, and both would insert."""
    meet = threading.Barrier(2)
    check = submission._check_can_queue

    def check_then_meet(**kwargs):
        check(**kwargs)
        try:
            meet.wait(timeout=3)
        except threading.BrokenBarrierError:
            pass  # the other submit is waiting for the lock (or was refused): go on alone

    with (
        mock.patch.object(submission, "_check_can_queue", side_effect=check_then_meet),
        mock.patch.object(queueing, "_enqueue"),
    ):
        yield


@pytest.mark.parametrize(
    ("backend", "cap_setting", "data", "kind"),
    [
        ("sim", "LABS_SIM_QUEUE_CAP", SMALL, "sim-cap"),
        ("vllm", "LABS_GPU_QUEUE_CAP", {**SMALL, "gpu": "l4"}, "gpu-cap"),
    ],
)
def test_two_learners_submitting_at_once_do_not_pass_the_global_cap(
    settings, checks_meet, backend, cap_setting, data, kind
):
    setattr(settings, cap_setting, 1)
    make_heartbeat("sim")
    make_heartbeat("vllm", gpus={"kind": "l4", "count": 1, "name": "NVIDIA L4"})
    submits = [
        partial(
            submission.run_request, owner=make_user(name), lab="sandbox", backend=backend, data=data
        )
        for name in ("alice", "bob")
    ]
    results = race(*submits)
    assert LabRun.objects.filter(backend=backend).count() == 1, results
    [refused] = [r for r in results if isinstance(r, submission.RunRefused)]
    assert refused.kind == kind


def test_two_workers_taking_turns_at_once_serve_two_learners_not_one_twice():
    make_heartbeat("sim")
    alice, bob = make_user("alice"), make_user("bob")
    with mock.patch.object(queueing, "_enqueue"):
        for owner in (alice, alice, bob):
            submission.run_request(owner=owner, lab="sandbox", backend="sim", data=SMALL)
    # Each taker, once it has read what waits, waits (a while) for the other to read too:
    # without the queue's lock both would see Alice unserved, and both would serve her.
    meet = threading.Barrier(2)

    def read_then_meet(queue):
        waiting = execution.LAB_RUNS.waiting(queue)
        try:
            meet.wait(timeout=3)
        except threading.BrokenBarrierError:
            pass  # the other taker is waiting for the lock: go on alone
        return waiting

    kind = dataclasses.replace(execution.LAB_RUNS, waiting=read_then_meet)
    taken = race(*(partial(turns.take, "labs.sim", f"w{i}@host", [kind]) for i in range(2)))
    owners = sorted(LabRun.objects.get(pk=t.pk).owner.username for t in taken)
    assert owners == ["alice", "bob"], taken
