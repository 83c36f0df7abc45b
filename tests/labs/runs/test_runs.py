"""Run services against the real database: submit, quotas, refusal, cancel, reap."""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from labs.backends.base import Phase
from labs.models import LabRun, RunState, Sweep
from labs.parameters.params import ParamError, parse_lab_params
from labs.parameters.presets import LABS, load_presets
from labs.runs import execution, queueing, reaping, submission, tasks
from labs.runs.execution import RunStopped
from labs.runs.submission import RunRefused
from tests.labs.factories import SMALL, make_heartbeat, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent():
    """What would have gone to the broker: (the queue of each turn, options) per send."""
    calls: list[tuple[list[int], dict]] = []

    def apply_async(args=None, **options):
        calls.append((list(args), options))

    with (
        mock.patch.object(tasks.run_next_task, "apply_async", side_effect=apply_async),
        mock.patch.object(queueing, "group") as group,
    ):
        group.side_effect = _group_recorder(calls)
        yield calls


@pytest.fixture
def empty_queues():
    """The broker's lab queues emptied: the reaper asks the broker what still waits there."""
    from tests.worker import purge

    purge(["labs.sim", "labs.gpu", "labs.gpu.h100-sxm"])


def _group_recorder(calls):
    def make(signatures):
        sigs = list(signatures)
        return mock.Mock(
            apply_async=lambda: calls.append(([s.args[0] for s in sigs], dict(sigs[0].options)))
        )

    return make


def test_it_queues_a_run_and_sends_a_turn_on_its_queue_after_commit(
    alice, sent, django_capture_on_commit_callbacks
):
    make_heartbeat("sim")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run = submission.run_request(owner=alice, lab="paged-kv", backend="sim", data=SMALL)
        assert sent == []  # nothing leaves before the transaction commits
    assert len(callbacks) == 1
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert run.params["num_prompts"] == 8
    assert run.predicted["kv_bytes_per_token"] == 131072  # llama-3-8b, 16-bit KV
    # The message names no run: it is a turn on the run's queue (labs.runs.turns).
    [(queues, options)] = sent
    assert queues == [run.queue] == ["labs.sim"]
    assert options["queue"] == "labs.sim"
    assert options["soft_time_limit"] < options["time_limit"]


def test_it_refuses_when_no_worker_for_the_backend_is_online(
    alice, sent, django_capture_on_commit_callbacks
):
    make_heartbeat("sim", age_s=300)  # long gone
    make_heartbeat("vllm")  # another backend does not help
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RunRefused, match="No worker for the sim backend is online"),
    ):
        submission.run_request(owner=alice, lab="sandbox", backend="sim", data=SMALL)
    assert callbacks == [] and sent == []
    assert not LabRun.objects.exists()


def test_a_refusal_keeps_the_worker_command_for_staff(alice, sent):
    with pytest.raises(RunRefused) as info:
        submission.run_request(owner=alice, lab="sandbox", backend="vllm", data=SMALL)
    # The learner's reason has no command in it; the operator's hint has it.
    assert "celery" not in info.value.reason
    assert "simulator" in info.value.reason
    assert "celery -A config worker -Q labs.gpu --pool=solo" in info.value.operator_hint
    make_heartbeat("vllm", age_s=300)
    with pytest.raises(RunRefused) as info:
        submission.run_request(owner=alice, lab="sandbox", backend="sim", data=SMALL)
    assert "celery" not in info.value.reason
    assert info.value.operator_hint.count("celery -A config worker -Q labs.sim`") == 1


def test_it_refuses_a_learner_over_their_quota(alice, bob, sent, settings):
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 2
    make_heartbeat("sim")
    make_run(alice, state=RunState.QUEUED)
    make_run(alice, state=RunState.RUNNING)
    make_run(alice, state=RunState.DONE)
    with pytest.raises(RunRefused, match=r"already have 2 runs .* \(the limit is 2\)"):
        submission.run_request(owner=alice, lab="sandbox", backend="sim", data=SMALL)
    assert LabRun.objects.count() == 3
    # Someone else's runs do not count against bob.
    submission.run_request(owner=bob, lab="sandbox", backend="sim", data=SMALL)


def test_it_refuses_gpu_runs_over_the_queue_cap(alice, bob, sent, settings):
    settings.LABS_GPU_QUEUE_CAP = 1
    make_heartbeat("vllm")
    make_run(bob, backend="vllm", state=RunState.RUNNING)
    with pytest.raises(RunRefused, match=r"GPU queue is full \(1 of 1"):
        submission.run_request(owner=alice, lab="sandbox", backend="vllm", data=SMALL)
    assert LabRun.objects.filter(owner=alice).count() == 0


def test_bad_params_raise_one_message_per_field_and_save_nothing(alice, sent):
    make_heartbeat("sim")
    with pytest.raises(ParamError) as info:
        submission.run_request(
            owner=alice,
            lab="sandbox",
            backend="sim",
            data={"block_size": "17", "num_prompts": "-3", "model": "gpt-9"},
        )
    assert set(info.value.errors) == {"block_size", "num_prompts", "model"}
    assert "power of two" in info.value.errors["block_size"]
    with pytest.raises(ParamError) as info:
        submission.run_request(owner=alice, lab="sandbox", backend="tpu", data={})
    assert set(info.value.errors) == {"backend"}
    assert not LabRun.objects.exists() and sent == []


def test_settings_vllm_cannot_run_are_refused_at_submit_by_field(alice, sent):
    make_heartbeat("vllm")
    with pytest.raises(ParamError) as info:
        submission.run_request(
            owner=alice,
            lab="paged-kv",
            backend="vllm",
            data={**SMALL, "kv_allocation": "contiguous", "block_size": "8"},
        )
    assert set(info.value.errors) == {"kv_allocation", "block_size"}
    assert not LabRun.objects.exists() and sent == []
    # The same settings are fine for the simulator, which is where contiguous KV can be shown.
    make_heartbeat("sim")
    submission.run_request(
        owner=alice,
        lab="paged-kv",
        backend="sim",
        data={**SMALL, "kv_allocation": "contiguous", "block_size": "8"},
    )


def test_a_sweep_is_one_group_on_the_backend_queue(alice, sent, django_capture_on_commit_callbacks):
    make_heartbeat("sim")
    with django_capture_on_commit_callbacks(execute=True):
        sweep = submission.sweep_request(
            owner=alice,
            lab="batching",
            backend="sim",
            data=SMALL,
            field="max_num_seqs",
            raw_values="1; 8, 64",
        )
    assert sweep.values == [1, 8, 64]
    runs = list(sweep.runs.order_by("sweep_index"))
    assert [r.params["max_num_seqs"] for r in runs] == [1, 8, 64]
    assert [r.predicted["running_seqs"] for r in runs] == [1, 1, 1]  # concurrency 1
    [(queues, options)] = sent  # a turn for each point
    assert queues == ["labs.sim"] * 3 and options["queue"] == "labs.sim"


def test_the_tensor_parallel_lab_sweeps_tp_over_its_preset(
    alice, sent, django_capture_on_commit_callbacks
):
    # The lab and the deck's preset: Llama 3 70B on H100 SXM, 16 clients, swept over tp 2, 4, 8.
    lab, preset = LABS["tensor-parallel"], load_presets()["tp-llama3-70b-h100-16-clients"]
    assert (lab.sweep_field, lab.sweep_values) == ("tp", "2, 4, 8") and preset.lab == lab.slug
    make_heartbeat("sim")
    with django_capture_on_commit_callbacks(execute=True):
        sweep = submission.sweep_request(
            owner=alice,
            lab=lab.slug,
            backend="sim",
            data={**lab.defaults, **preset.params},
            field=lab.sweep_field,
            raw_values=lab.sweep_values,
        )
    runs = list(sweep.runs.order_by("sweep_index"))
    assert [r.params["tp"] for r in runs] == [2, 4, 8]
    assert all(r.params["model"] == "llama-3-70b" for r in runs)
    # The formulas' decode step shrinks with tp (each GPU reads 1/tp of the weights).
    steps = [r.predicted["decode_step_s"] for r in runs]
    assert steps[0] > steps[1] > steps[2]


@pytest.mark.parametrize(
    ("field", "values", "bad"),
    [
        ("max_num_seqs", "1", "sweep_values"),
        ("max_num_seqs", "1, 2, 99999999", "sweep_values"),
        ("block_size", "16, 16", "sweep_values"),
        ("no_such_field", "1, 2", "sweep_field"),
        ("max_num_seqs", ",".join(str(n) for n in range(1, 40)), "sweep_values"),
    ],
)
def test_a_bad_sweep_names_the_problem_and_saves_nothing(alice, sent, field, values, bad):
    make_heartbeat("sim")
    with pytest.raises(ParamError) as info:
        submission.sweep_request(
            owner=alice, lab="batching", backend="sim", data=SMALL, field=field, raw_values=values
        )
    assert bad in info.value.errors
    assert not Sweep.objects.exists() and not LabRun.objects.exists()


def test_cancel_stops_queued_and_running_runs_but_not_finished_ones(alice):
    queued = make_run(alice)
    running = make_run(alice, state=RunState.RUNNING)
    done = make_run(alice, state=RunState.DONE)
    assert submission.run_cancel(run=queued) and submission.run_cancel(run=running)
    assert not submission.run_cancel(run=done)
    for run in (queued, running):
        run.refresh_from_db()
        assert run.state == RunState.CANCELLED and run.finished_at
    # A late claim of the cancelled run does nothing.
    assert execution.run_execute(run_id=queued.pk, hostname="w@h") == RunState.CANCELLED


def test_progress_of_a_cancelled_run_stops_the_backend(alice):
    run = make_run(alice, state=RunState.RUNNING)
    beat = execution._RunHeartbeat(run.pk, interval_s=60)
    on_progress = execution._progress_reporter(run.pk, beat)
    on_progress(0.5)
    run.refresh_from_db()
    assert run.progress == 0.5
    submission.run_cancel(run=run)
    with pytest.raises(RunStopped):
        on_progress(1.0)


def test_a_new_phase_is_written_at_once_and_kept_while_requests_finish(alice, monkeypatch):
    run = make_run(alice, backend="vllm", state=RunState.RUNNING, phase={"step": "stale"})
    beat = execution._RunHeartbeat(run.pk, interval_s=60)
    on_progress = execution._progress_reporter(run.pk, beat)
    starting = Phase("starting", "vLLM", "engine arguments changed", 3.5, 41.0)
    on_progress(0.0, starting)
    run.refresh_from_db()
    assert run.phase == {
        "step": "starting",
        "engine": "vLLM",
        "why": "engine arguments changed",
        "elapsed_s": 3.5,
        "last_start_s": 41.0,
    }
    # The next step is not held back by the throttle, however soon it comes.
    monkeypatch.setattr(execution, "_PROGRESS_EVERY_S", 3600.0)
    on_progress(0.0, Phase("ready", "vLLM", "same engine arguments", reused=True))
    run.refresh_from_db()
    assert Phase.from_dict(run.phase) == Phase(
        "ready", "vLLM", "same engine arguments", reused=True
    )
    # Requests report fractions only: the phase stays as the backend last said.
    monkeypatch.setattr(execution, "_PROGRESS_EVERY_S", 0.0)
    on_progress(0.5)
    run.refresh_from_db()
    assert run.progress == 0.5 and run.phase["step"] == "ready"


def test_a_claimed_run_starts_with_no_phase(alice, settings):
    settings.LABS_RUN_HEARTBEAT_S = 60
    run = make_run(alice, phase={"step": "starting", "engine": "vLLM"})
    seen = {}

    def fake_execute(claimed, beat):
        seen["phase"] = LabRun.objects.get(pk=claimed.pk).phase
        raise RunStopped

    with mock.patch.object(execution, "_execute_backend", fake_execute):
        execution.run_execute(run_id=run.pk, hostname="w@h")
    assert seen["phase"] == {}


def test_the_reaper_fails_running_runs_with_a_stale_heartbeat(alice, settings):
    settings.LABS_RUN_STALE_S = 30
    now = timezone.now()
    stale = make_run(
        alice, state=RunState.RUNNING, worker="sim@box", heartbeat_at=now - timedelta(seconds=31)
    )
    fresh = make_run(alice, state=RunState.RUNNING, heartbeat_at=now - timedelta(seconds=5))
    done = make_run(alice, state=RunState.DONE, heartbeat_at=now - timedelta(hours=1))
    assert reaping.run_reap_stale(now=now) == 1
    stale.refresh_from_db()
    assert stale.state == RunState.FAILED
    assert "sim@box stopped sending heartbeats" in stale.error
    assert stale.finished_at == now
    for run, state in ((fresh, RunState.RUNNING), (done, RunState.DONE)):
        run.refresh_from_db()
        assert run.state == state
    assert reaping.run_reap_stale(now=now) == 0  # idempotent


def test_the_reaper_fails_old_queued_runs_only_when_no_worker_can_take_them(alice, settings):
    settings.LABS_QUEUED_STALE_S = 600
    old = timezone.now() - timedelta(seconds=601)
    sim_run = make_run(alice, backend="sim", created_at=old)
    gpu_run = make_run(alice, backend="vllm", created_at=old)
    make_heartbeat("sim")
    now = timezone.now()
    make_run(alice, backend="sim", state=RunState.RUNNING, started_at=old, heartbeat_at=now)
    assert reaping.run_reap_stale() == 1
    sim_run.refresh_from_db()
    gpu_run.refresh_from_db()
    assert sim_run.state == RunState.QUEUED  # a sim worker is up; it is just busy
    assert gpu_run.state == RunState.FAILED and "No vllm worker" in gpu_run.error


def test_run_fail_does_not_touch_a_finished_run(alice):
    run = make_run(alice, state=RunState.DONE)
    assert not execution.run_fail(run_id=run.pk, error="late")
    run.refresh_from_db()
    assert run.state == RunState.DONE and run.error == ""


def gpu_worker(kind: str, count: int, host: str) -> None:
    make_heartbeat(
        "vllm",
        hostname=host,
        queue=f"labs.gpu.{kind}",
        gpus={"kind": kind, "count": count, "name": kind, "memory_bytes": 80 * 2**30},
    )


def test_a_vllm_run_goes_to_the_queue_of_the_gpu_it_was_priced_for(alice, sent):
    gpu_worker("l4", 1, "l4@box")
    gpu_worker("h100-sxm", 2, "h100@box")
    with mock.patch("django.db.transaction.on_commit", side_effect=lambda f: f()):
        submission.run_request(
            owner=alice, lab="sandbox", backend="vllm", data={**SMALL, "gpu": "l4"}
        )
        submission.run_request(
            owner=alice, lab="sandbox", backend="vllm", data={**SMALL, "gpu": "h100-sxm", "tp": 2}
        )
    # The queue of the GPU kind and of the GPU count the run needs (its tp).
    assert [options["queue"] for _, options in sent] == ["labs.gpu.l4.x1", "labs.gpu.h100-sxm.x2"]
    # The run remembers where it went, for the reaper.
    assert list(LabRun.objects.order_by("pk").values_list("queue", flat=True)) == [
        "labs.gpu.l4.x1",
        "labs.gpu.h100-sxm.x2",
    ]


def test_a_sweep_over_gpus_sends_each_point_to_its_own_kind(alice):
    gpu_worker("l4", 1, "l4@box")
    gpu_worker("h100-sxm", 1, "h100@box")
    with (
        mock.patch("django.db.transaction.on_commit", side_effect=lambda f: f()),
        mock.patch.object(tasks.run_next_task, "si") as si,
        mock.patch.object(queueing, "group") as group,
    ):
        submission.sweep_request(
            owner=alice, lab="sandbox", backend="vllm", data=SMALL, field="gpu",
            raw_values="l4, h100-sxm",
        )  # fmt: skip
        list(group.call_args.args[0])  # the group's signatures, each .set() with its queue
    queues = [c.kwargs["queue"] for c in si.return_value.set.call_args_list]
    assert queues == ["labs.gpu.l4.x1", "labs.gpu.h100-sxm.x1"]
    sent_to = LabRun.objects.order_by("sweep_index").values_list("queue", flat=True)
    assert list(sent_to) == queues


def test_a_queued_run_is_reaped_when_no_worker_consumes_its_gpu_kind_queue(alice, settings):
    settings.LABS_QUEUED_STALE_S = 600
    old = timezone.now() - timedelta(seconds=601)
    gpu_worker("l4", 1, "l4@box")
    # The L4 worker is busy, so none of these looks lost; only the stale check applies.
    make_run(alice, backend="vllm", queue="labs.gpu.l4", state=RunState.RUNNING)
    h100 = make_run(alice, backend="vllm", queue="labs.gpu.h100-sxm", created_at=old)
    l4 = make_run(alice, backend="vllm", queue="labs.gpu.l4", created_at=old)
    any_gpu = make_run(alice, backend="vllm", queue="labs.gpu", created_at=old)
    assert reaping.run_reap_stale() == 2
    for run in (h100, l4, any_gpu):
        run.refresh_from_db()
    assert h100.state == RunState.FAILED
    assert "none that consumes its queue (labs.gpu.h100-sxm) is online" in h100.error
    # The L4 worker consumes its kind's queue; the shared GPU queue is for workers without a
    # device (measuring a server elsewhere), and none is online.
    assert l4.state == RunState.QUEUED
    assert any_gpu.state == RunState.FAILED and "(labs.gpu)" in any_gpu.error
    gpu_worker("h100-sxm", 1, "h100@box")
    h100.state, h100.error = RunState.QUEUED, ""
    h100.save()
    assert reaping.run_reap_stale() == 0


def test_a_run_for_a_gpu_no_worker_has_is_not_called_lost_by_an_idle_other_gpu(alice, settings):
    settings.LABS_QUEUED_LOST_S = 60
    settings.LABS_QUEUED_STALE_S = 600
    now = timezone.now()
    gpu_worker("l4", 1, "l4@box")  # online and idle, but it does not consume the H100 queue
    waiting = make_run(
        alice, backend="vllm", queue="labs.gpu.h100-sxm", created_at=now - timedelta(seconds=120)
    )
    assert reaping.run_reap_stale(now=now) == 0
    waiting.refresh_from_db()
    assert waiting.state == RunState.QUEUED


def test_a_lost_gpu_kind_run_is_not_hidden_by_another_gpus_busy_worker(
    alice, bob, settings, empty_queues, sent
):
    settings.LABS_QUEUED_LOST_S = 60
    settings.LABS_QUEUED_STALE_S = 600
    now = timezone.now()
    gpu_worker("h100-sxm", 1, "h100@box")  # online, idle: it would have taken the run by now
    gpu_worker("a100-80gb", 1, "a100@box")
    make_run(bob, backend="vllm", queue="labs.gpu.a100-80gb", state=RunState.RUNNING)
    lost = make_run(
        alice, backend="vllm", queue="labs.gpu.h100-sxm", created_at=now - timedelta(seconds=120)
    )
    assert reaping.run_reap_stale(now=now) == 0
    assert [queues for queues, _ in sent] == [["labs.gpu.h100-sxm"]]  # its turn, sent again
    lost.refresh_from_db()
    assert lost.state == RunState.QUEUED and lost.turn_resent_at == now
    # A run on the shared GPU queue keeps the H100 worker busy: then no turn is called lost.
    lost.turn_resent_at = None
    lost.save()
    make_run(bob, backend="vllm", queue="labs.gpu", state=RunState.RUNNING)
    assert reaping.run_reap_stale(now=now) == 0
    assert len(sent) == 1


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"gpu": "a100-80gb"}, "gpu", ["l4 (up to 1)", "a100-80gb"]),
        ({"gpu": "l4", "tp": 2}, "tp", ["at most 1 on l4", "got 2"]),
        (
            {"gpu": "l4", "model": "llama-3.1-70b"},
            "tp",
            # The memory the worker announced (gpu_worker: 80 GiB), at utilization 0.9.
            ["weights 141.2 GB (bf16)", "one l4 holds 77.3 GB"],
        ),
    ],
)
def test_what_no_online_worker_can_start_is_refused_at_submit_by_field(
    alice, sent, data, field, words
):
    gpu_worker("l4", 1, "l4@box")
    with pytest.raises(ParamError) as info:
        submission.run_request(owner=alice, lab="sandbox", backend="vllm", data={**SMALL, **data})
    assert list(info.value.errors) == [field]
    for word in words:
        assert word in info.value.errors[field]
    assert not LabRun.objects.exists() and sent == []


def test_the_reaper_sends_again_the_turn_of_a_queued_run_an_idle_online_worker_never_took(
    alice, settings, empty_queues, sent
):
    settings.LABS_QUEUED_LOST_S = 60
    now = timezone.now()
    lost = make_run(alice, backend="sim", created_at=now - timedelta(seconds=61))
    recent = make_run(alice, backend="sim", created_at=now - timedelta(seconds=30))
    make_heartbeat("sim")
    assert reaping.run_reap_stale(now=now) == 0
    assert [queues for queues, _ in sent] == [["labs.sim"]]
    lost.refresh_from_db()
    recent.refresh_from_db()
    assert lost.state == RunState.QUEUED and lost.turn_resent_at == now
    # Its own turn may still be on its way to the worker.
    assert recent.state == RunState.QUEUED and recent.turn_resent_at is None
    # A second reaper at the same moment (every worker reaps) sends it no other.
    assert reaping.run_reap_stale(now=now) == 0
    assert len(sent) == 1


def test_after_the_broker_lost_every_turn_the_runs_left_without_one_get_one_again(
    alice, settings, empty_queues, sent
):
    """Redis restarted empty with runs A and B queued; C, queued after, sent a turn that ran
    the oldest, A (turns name no run). B and C are left without a turn: both get one again,
    and none is failed (the reaper used to fail both, C queued after the loss included)."""
    settings.LABS_QUEUED_LOST_S = 60
    now = timezone.now()
    make_heartbeat("sim")
    make_run(
        alice,
        state=RunState.DONE,
        created_at=now - timedelta(seconds=600),
        started_at=now - timedelta(seconds=100),
        finished_at=now - timedelta(seconds=90),
    )  # A
    b = make_run(alice, created_at=now - timedelta(seconds=590))
    c = make_run(alice, created_at=now - timedelta(seconds=101))
    assert reaping.run_reap_stale(now=now) == 0
    assert [queues for queues, _ in sent] == [["labs.sim", "labs.sim"]]
    for run in (b, c):
        run.refresh_from_db()
        assert run.state == RunState.QUEUED and run.turn_resent_at == now


def test_a_run_whose_turn_sent_again_was_lost_too_is_failed_and_says_so(
    alice, settings, empty_queues, sent
):
    settings.LABS_QUEUED_LOST_S = 60
    now = timezone.now()
    make_heartbeat("sim")
    lost_twice = make_run(
        alice, created_at=now - timedelta(seconds=600), turn_resent_at=now - timedelta(seconds=61)
    )
    # Queued after the second loss: its turn is sent again, it is not failed with the other.
    after = make_run(alice, created_at=now - timedelta(seconds=61))
    assert reaping.run_reap_stale(now=now) == 1
    lost_twice.refresh_from_db()
    after.refresh_from_db()
    assert lost_twice.state == RunState.FAILED
    assert lost_twice.error == (
        "This run never reached a sim worker: the lab queue lost its turn, then the one sent "
        "again, while a worker was online and idle for 60 s. Run it again."
    )
    assert after.state == RunState.QUEUED and after.turn_resent_at == now
    assert [queues for queues, _ in sent] == [["labs.sim"]]


def test_a_turn_sent_again_but_refused_by_the_broker_is_tried_again_at_the_next_reap(
    alice, settings, empty_queues
):
    settings.LABS_QUEUED_LOST_S = 60
    now = timezone.now()
    make_heartbeat("sim")
    run = make_run(alice, created_at=now - timedelta(seconds=61))
    refused = queueing.QueueUnavailable("connection refused")
    with mock.patch.object(queueing, "send_turns", side_effect=refused) as send:
        assert reaping.run_reap_stale(now=now) == 0
    send.assert_called_once()
    run.refresh_from_db()
    assert run.state == RunState.QUEUED and run.turn_resent_at is None


def test_a_queued_run_behind_a_busy_or_just_finished_worker_is_not_lost(alice, bob, settings):
    settings.LABS_QUEUED_LOST_S = 60
    now = timezone.now()
    waiting = make_run(alice, backend="sim", created_at=now - timedelta(seconds=600))
    make_heartbeat("sim")
    # The worker finished bob's run a moment ago and is about to take alice's.
    make_run(bob, backend="sim", state=RunState.DONE, finished_at=now - timedelta(seconds=5))
    assert reaping.run_reap_stale(now=now) == 0
    waiting.refresh_from_db()
    assert waiting.state == RunState.QUEUED


def test_over_quota_sweep_is_refused_before_its_points_are_checked(alice, sent, settings):
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 1
    make_heartbeat("sim")
    make_run(alice, state=RunState.QUEUED)
    with (
        mock.patch.object(submission, "parse_lab_params") as parse,
        mock.patch.object(submission, "_precheck") as precheck,
        pytest.raises(RunRefused, match="already have 1 runs"),
    ):
        submission.sweep_request(
            owner=alice,
            lab="batching",
            backend="sim",
            data=SMALL,
            field="max_num_seqs",
            raw_values=",".join(str(2**i) for i in range(12)),
        )
    parse.assert_not_called()
    precheck.assert_not_called()
    assert Sweep.objects.count() == 0


def test_the_sim_queue_has_a_global_cap(alice, bob, sent, settings):
    settings.LABS_SIM_QUEUE_CAP = 3
    make_heartbeat("sim")
    make_run(bob, state=RunState.QUEUED)
    make_run(bob, state=RunState.RUNNING)
    with pytest.raises(RunRefused, match=r"simulator queue is full \(2 of 3.*needs 3") as info:
        submission.sweep_request(
            owner=alice,
            lab="batching",
            backend="sim",
            data=SMALL,
            field="max_num_seqs",
            raw_values="1, 2, 4",
        )
    assert info.value.kind == "sim-cap"
    submission.run_request(owner=alice, lab="sandbox", backend="sim", data=SMALL)
    with pytest.raises(RunRefused, match="simulator queue is full"):
        submission.run_request(owner=alice, lab="sandbox", backend="sim", data=SMALL)


# -- a database restart while a run is running ---------------------------------------------


def _failing_first(real, times: int):
    """`real`, except that its first `times` calls raise OperationalError (a restart)."""
    from django.db import OperationalError

    calls = {"n": 0}

    def call(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= times:
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    return call, calls


@pytest.mark.django_db(transaction=True)
def test_the_run_heartbeat_beats_on_through_a_database_outage(alice):
    old = timezone.now() - timedelta(hours=1)
    run = make_run(alice, state=RunState.RUNNING, heartbeat_at=old)
    beat, calls = _failing_first(execution._beat, 3)
    with (
        mock.patch.object(execution, "_beat", side_effect=beat),
        execution._RunHeartbeat(run.pk, 0.01) as heartbeat,
    ):
        deadline = timezone.now() + timedelta(seconds=30)
        while calls["n"] < 5 and timezone.now() < deadline:
            time.sleep(0.02)
        assert heartbeat._thread.is_alive()
    run.refresh_from_db()
    assert run.heartbeat_at > old and not heartbeat.lost.is_set()


@pytest.mark.django_db(transaction=True)
def test_a_run_finishes_when_its_progress_writes_fail_for_a_while(alice):
    from django.db import OperationalError

    run = make_run(alice, params=parse_lab_params({**SMALL, "num_prompts": 200}).as_dict())
    with mock.patch.object(execution, "_write_progress", side_effect=OperationalError("down")):
        assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    run.refresh_from_db()
    assert run.state == RunState.DONE and run.result


def test_the_final_write_retries_through_a_short_outage_then_gives_up(settings):
    from django.db import OperationalError

    write, calls = _failing_first(lambda: 1, 2)
    with mock.patch.object(execution.time, "sleep"):
        assert execution._with_retries(write, within_s=10, what="test") == 1
        assert calls["n"] == 3
        always, _ = _failing_first(lambda: 1, 10**6)
        with pytest.raises(OperationalError):
            execution._with_retries(always, within_s=0, what="test")


def test_an_unexpected_error_fails_the_run_with_its_type_and_a_logged_traceback(alice, caplog):
    run = make_run(alice)
    boom = RuntimeError("the engine fell over")
    with mock.patch.object(execution, "_execute_backend", side_effect=boom):
        assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.FAILED
    run.refresh_from_db()
    assert run.error == "RuntimeError: the engine fell over"
    assert any(r.exc_info and r.levelname == "ERROR" for r in caplog.records)


def test_a_finished_run_stores_its_breakdown_once(alice):
    run = make_run(alice)
    assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    run.refresh_from_db()
    assert run.result["breakdown"]["source"] == "simulated"
    assert "breakdown" not in run.result["meta"]
    assert run.result["meta"]["steps"] > 0  # the rest of the record's meta is kept


def test_the_draft_model_reproduction_is_refused_at_submit_with_each_part(alice, sent):
    # The KV pool spans the target's and the draft's layers: counted over the target's alone,
    # this setting would seem to fit, where it needs 100.3 GiB on one H100.
    gpu_worker("h100-sxm", 8, "h100@box")
    data = {
        "model": "llama-3-8b",
        "gpu": "h100-sxm",
        "spec_tokens": 3,
        "draft_cost": 0.5,
        "kv_capacity_tokens": 420000,
    }
    with pytest.raises(ParamError) as info:
        submission.run_request(owner=alice, lab="sandbox", backend="vllm", data=data)
    message = info.value.errors["tp"]
    for part in (
        "weights 16.1 GB (bf16)",
        "draft model 9.1 GB",
        "420,000-token KV pool 82.6 GB",
        "activation reserve 0.0 GB",
        "CUDA context 0.5 GB = 108.3 GB",
        "tp 2 would fit",
    ):
        assert part in message
    assert not LabRun.objects.exists() and sent == []
