"""Fair lab queues: every run of a sweep counts toward a learner's allowance, no learner takes
more than a share of the simulator queue, and new accounts get less until they use the quiz."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from labs.models import LabRun, RunState
from labs.runs import submission
from labs.runs.submission import RunRefused
from quiz.models import ReviewLog
from tests.conftest import make_user
from tests.labs.factories import SMALL, make_heartbeat, make_run
from tests.labs.runs.test_runs import sent  # noqa: F401 - the fixture
from tests.quiz.factories import make_card

# Each test's runs are saved, and what would go to the broker recorded (`sent`).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sent")]


def answered(user, n: int) -> None:
    """`n` quiz answers in the learner's log, as grading leaves them."""
    card = make_card()
    now = timezone.now()
    ReviewLog.objects.bulk_create(
        ReviewLog(
            user=user,
            card=card,
            rating=3,
            kind=ReviewLog.Kind.REVIEW,
            reviewed_at=now - dt.timedelta(days=i),
            study_date=(now - dt.timedelta(days=i)).date(),
            duration_ms=4000,
            state_before={},
            token=uuid.uuid4().hex,
        )
        for i in range(n)
    )


def sweep(owner, values: int):
    return submission.sweep_request(
        owner=owner,
        lab="batching",
        backend="sim",
        data=SMALL,
        field="max_num_seqs",
        raw_values=", ".join(str(v) for v in range(1, values + 1)),
    )


def run(owner):
    return submission.run_request(owner=owner, lab="sandbox", backend="sim", data=SMALL)


def take_all_you_can(owner) -> int:
    """Submit full sweeps, then smaller ones, then single runs until refused; how many queued."""
    for size in (12, 6, 3, 2):
        while True:
            try:
                sweep(owner, size)
            except RunRefused:
                break
    while True:
        try:
            run(owner)
        except RunRefused:
            break
    return LabRun.objects.filter(owner=owner).active().count()


def test_every_run_of_a_sweep_counts_toward_the_learners_allowance(settings):
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 5
    make_heartbeat("sim")
    learner = make_user("dora")
    answered(learner, settings.LABS_ESTABLISHED_AFTER_REVIEWS)
    sweep(learner, 3)
    with pytest.raises(RunRefused, match=r"already have 3 runs .*the limit is 5.*needs 3") as info:
        sweep(learner, 3)
    assert info.value.kind == "quota"
    sweep(learner, 2)
    with pytest.raises(RunRefused, match=r"already have 5 runs"):
        run(learner)
    assert LabRun.objects.filter(owner=learner).count() == 5


def test_six_accounts_cannot_take_more_than_their_share_of_the_queue(settings):
    # The probe: six accounts filled the 200-run queue in 3 s. Give them every allowance a
    # learner can have (quiz used) and let each take all it can.
    settings.LABS_SIM_QUEUE_CAP = 200
    settings.LABS_SIM_QUEUE_SHARES = 16
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 36  # even a generous allowance stops at the share
    make_heartbeat("sim")
    share = 200 // 16
    takers = [make_user(f"taker{i}") for i in range(6)]
    taken = []
    for learner in takers:
        answered(learner, settings.LABS_ESTABLISHED_AFTER_REVIEWS)
        taken.append(take_all_you_can(learner))
    assert taken == [share] * 6
    busy = LabRun.objects.active().filter(backend="sim").count()
    assert busy == 6 * share <= 200 // 2
    # Everyone else still gets in.
    other = make_user("latecomer")
    assert run(other).state == RunState.QUEUED
    with pytest.raises(RunRefused, match=r"Your share of the simulator queue is 12 runs"):
        run(takers[0])


def test_new_accounts_get_a_smaller_allowance_until_they_use_the_quiz(settings):
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 12
    settings.LABS_NEW_LEARNER_MAX_ACTIVE = 4
    settings.LABS_ESTABLISHED_AFTER_REVIEWS = 10
    make_heartbeat("sim")
    fresh = make_user("fresh")
    assert take_all_you_can(fresh) == 4
    with pytest.raises(RunRefused, match="the limit is 4 until you have answered 10 quiz cards"):
        run(fresh)
    answered(fresh, 9)
    with pytest.raises(RunRefused):
        run(fresh)
    answered(fresh, 1)  # the tenth: now an established learner
    assert take_all_you_can(fresh) == 12
    # Staff are never new.
    staff = make_user("teacher", is_staff=True)
    assert take_all_you_can(staff) == 12


def test_finished_runs_do_not_count(settings):
    settings.LABS_NEW_LEARNER_MAX_ACTIVE = 2
    make_heartbeat("sim")
    learner = make_user("erin")
    for state in (RunState.DONE, RunState.FAILED, RunState.CANCELLED):
        make_run(learner, state=state)
    sweep(learner, 2)
    with pytest.raises(RunRefused):
        run(learner)
