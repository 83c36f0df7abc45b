"""A vLLM worker whose device has no calibration calibrates itself on its first start
(labs.worker_signals -> labs.calibration.jobs.calibration_self_request): one short job,
stored like a staff one, and the lab and run pages say the device is calibrating meanwhile.

No broker and no GPU: the task's `apply_async` is a mock, the engine the simulator
(tests/labs/calibration/test_calibrations.py's stand-in)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from labs import worker_signals
from labs.backends import device_lab_settings
from labs.calibration import jobs as calibration_jobs
from labs.models import CalibrationJob, DeviceCalibration, RunState, WorkerHeartbeat
from labs.parameters.catalog import CPU_KIND
from labs.parameters.params import parse_lab_params
from labs.runs import busy
from labs.runs.workers import announced_cpu_figures
from labs.tasks import calibrate_device_task
from tests.conftest import make_user
from tests.labs.calibration.test_calibrations import (
    CPU_KEY,
    L4_GPUS,
    StandInVllm,
    cpu_worker,
    l4_worker,
)
from tests.labs.factories import SMALL, make_run
from tests.labs.vllm.test_cpu import CPU_GPUS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _self_calibrate_on(settings):
    settings.LABS_SELF_CALIBRATE = True  # the test settings turn it off for started workers


@pytest.fixture
def sent():
    with mock.patch.object(calibrate_device_task, "apply_async") as apply_async:
        yield apply_async


def _start_worker(hostname: str, queues: tuple[str, ...] = ("labs.gpu", "labs.gpu.cpu.x1")):
    """The worker_ready signal as Celery sends it, with the first heartbeat already written
    (the fixtures' rows); the heartbeat thread is stopped again at once."""
    sender = SimpleNamespace(
        hostname=hostname, app=SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(
            consume_from={q: None for q in queues}))),
    )  # fmt: skip
    with mock.patch.object(worker_signals, "beat_once"):
        worker_signals._on_worker_ready(sender=sender)
    stop = worker_signals._process.pop("stop")
    stop.set()
    worker_signals._process.pop("thread").join(timeout=5)
    worker_signals._process.clear()


def _calibration(device: str) -> DeviceCalibration:
    return DeviceCalibration.objects.create(
        device=device, where="this worker", constants={}, fit_error=0.1, held_out_error=0.1
    )


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_device_has_no_calibration_queues_exactly_one_short_one(sent):
    cpu_worker()
    _start_worker("cpu@box")
    _start_worker("cpu@box")  # a restart while it is queued queues nothing more
    job = CalibrationJob.objects.get()
    assert job.device == CPU_KEY and job.state == RunState.QUEUED
    assert job.self_started and job.requested_by is None
    short = (calibration_jobs.SELF_REPEATS, calibration_jobs.SELF_ROUNDS)
    assert (job.repeats, job.rounds) == short
    assert job.repeats < calibration_jobs.REPEATS and job.rounds < calibration_jobs.ROUNDS
    assert job.base["model"] == "lab-llama-20m" and job.base["gpu"] == CPU_KIND
    sent.assert_called_once()
    kwargs = sent.call_args.kwargs
    assert kwargs["args"] == [job.pk] and kwargs["queue"] == "labs.gpu.cpu.x1"
    assert kwargs["soft_time_limit"] == 900  # LABS_SELF_CALIBRATE_TIME_LIMIT_S, not the hour


@pytest.mark.django_db(transaction=True)
def test_a_gpu_kind_with_no_calibration_calibrates_itself_too(sent):
    l4_worker()
    _start_worker("l4@box", ("labs.gpu", "labs.gpu.l4.x1"))
    job = CalibrationJob.objects.get()
    assert job.device == "l4" and job.self_started and job.queue == "labs.gpu.l4.x1"
    assert L4_GPUS["kind"] == job.base["gpu"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_device_is_calibrated_or_being_calibrated_queues_nothing(sent):
    cpu_worker()
    l4_worker()
    _calibration(CPU_KEY)
    CalibrationJob.objects.create(
        device="l4", queue="labs.gpu.l4.x1", base={"model": "qwen2.5-0.5b"}, repeats=5, rounds=6
    )  # a staff calibration, pending
    _start_worker("cpu@box")
    _start_worker("l4@box", ("labs.gpu", "labs.gpu.l4.x1"))
    assert CalibrationJob.objects.filter(self_started=True).count() == 0
    sent.assert_not_called()


@pytest.mark.django_db(transaction=True)
def test_switched_off_or_a_simulator_worker_queues_nothing(settings, sent):
    cpu_worker()
    _start_worker("sim@box", ("labs.sim",))
    settings.LABS_SELF_CALIBRATE = False
    _start_worker("cpu@box")
    assert not CalibrationJob.objects.exists()
    sent.assert_not_called()


def _l4_self_job() -> CalibrationJob:
    """A short calibration an L4 worker queued itself, pending."""
    return CalibrationJob.objects.create(
        device="l4",
        queue="labs.gpu.l4.x1",
        base={"model": "qwen2.5-0.5b", "gpu": "l4"},
        repeats=1,
        rounds=1,
        self_started=True,
    )


def _cpu_self_job(**fields: Any) -> CalibrationJob:
    """The short calibration this CPU worker queues itself on its first start."""
    return CalibrationJob.objects.create(
        device=CPU_KEY,
        queue="labs.gpu.cpu.x1",
        base={"model": "lab-llama-20m", "gpu": "cpu"},
        repeats=2,
        rounds=4,
        self_started=True,
        **fields,
    )


def test_a_self_calibration_past_its_time_limit_fails_saying_so(settings):
    settings.LABS_SELF_CALIBRATE_TIME_LIMIT_S = -1  # already past when the first run would start
    job = _l4_self_job()
    vllm = StandInVllm()
    with mock.patch("labs.calibration.jobs.get_backend", return_value=vllm):
        assert calibrate_device_task.run(job.pk) == RunState.FAILED
    job.refresh_from_db()
    assert vllm.runs == 0 and "time limit (-1 s)" in job.error
    assert not DeviceCalibration.objects.exists()


def test_a_self_calibration_is_stored_like_a_staff_one():
    job = _l4_self_job()
    with mock.patch("labs.calibration.jobs.get_backend", return_value=StandInVllm()):
        assert calibrate_device_task.run(job.pk) == RunState.DONE
    job.refresh_from_db()
    assert job.calibration == DeviceCalibration.objects.get(device="l4")


def test_the_lab_and_run_pages_say_the_device_is_calibrating_itself(client):
    user = make_user("learner")
    client.force_login(user)
    cpu_worker()
    _cpu_self_job(state=RunState.RUNNING, started_at=timezone.now())
    url = reverse("labs:lab-detail", args=["batching"])
    html = client.get(f"{url}?{urlencode(device_lab_settings('vllm', CPU_KIND))}").content.decode()
    # No run has finished yet: only its time limit says how long it may take.
    assert (
        "The CPU engine is calibrating itself, at most 15 minutes left: predictions use its "
        "probe figures"
    ) in html
    # Another device's lab page says nothing of it.
    assert "calibrating itself" not in client.get(url).content.decode()

    opened = {k: v for k, v in device_lab_settings("vllm", CPU_KIND).items() if k != "backend"}
    figures = announced_cpu_figures(CPU_GPUS)
    params: dict[str, Any] = parse_lab_params({**SMALL, **opened, **figures}).as_dict()
    run = make_run(user, backend="vllm", params=params)
    html = client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    assert "calibrating itself" in html and "a run sent now starts after it" in html


def test_the_devices_page_says_the_worker_started_its_own_calibration(client):
    client.force_login(make_user("root", is_staff=True))
    cpu_worker()
    _cpu_self_job()
    html = client.get(reverse("labs:devices")).content.decode()
    assert "by the worker itself, on its first start" in html


def test_a_busy_engine_is_said_and_not_offered(alice_client):
    """While another process of the installation holds the CPU worker's engine, the lab page
    says so and offers no run on it, and a submit finds no device to run on."""
    from labs.runs import workers

    busy = "vLLM on this device is busy: another process of this installation (pid 42, ...)"
    cpu_worker(gpus={**CPU_GPUS, "busy": busy})
    assert workers.gpu_offer() == {} and workers.devices_online("vllm") == []
    html = alice_client.get(reverse("labs:lab-detail", args=["batching"])).content.decode()
    assert "vLLM on this CPU</a>" not in html
    # In a learner's words: no pids, no environment variables.
    assert "The CPU engine is busy: another process on its machine is running it" in html
    assert busy not in html and "pid" not in html


def test_a_worker_announces_a_busy_engine_on_every_beat():
    from labs.runs import workers

    workers._state.clear()
    info = {"where": "vLLM", "gpu_name": "cpu", "versions": {}, "gpus": dict(CPU_GPUS)}
    with (
        mock.patch.object(workers, "describe_backend", return_value=info),
        mock.patch.object(workers, "engine_busy", return_value="vLLM on this device is busy"),
    ):
        workers.announce("cpu@box", ["vllm"])
    workers._state.clear()
    assert WorkerHeartbeat.objects.get(hostname="cpu@box").gpus["busy"].endswith("busy")


def test_a_submit_while_the_cpu_engine_calibrates_elsewhere_is_refused_in_a_learners_words(
    alice_client, settings
):
    """While another process holds the CPU engine for its calibration (`lab calibrate` in a
    shell, say), a submit is refused saying so and how long it has left, not as "a custom GPU
    (cpu) exists only in the simulator"; nothing is saved."""
    from labs.models import LabRun

    settings.LABS_SELF_CALIBRATE_TIME_LIMIT_S = 3600  # room for the estimate below
    busy = "vLLM on this device is busy: another process of this installation (pid 42, ...)"
    cpu_worker(gpus={**CPU_GPUS, "busy": busy})
    started = timezone.now() - timedelta(minutes=4)
    _cpu_self_job(
        state=RunState.RUNNING, started_at=started, note="run 11 of 41: D1 batch-1 decode"
    )
    data = {**device_lab_settings("vllm", CPU_KIND), "num_prompts": "4"}
    with mock.patch("labs.runs.tasks.run_next_task.apply_async") as queued:
        response = alice_client.post(reverse("labs:run-create", args=["batching"]), data)
    assert response.status_code == 503
    html = response.content.decode()
    # 10 runs in 4 minutes, 31 to go: about 12 minutes and a minute for the fit.
    assert (
        "The CPU engine is calibrating itself, about 13 minutes left; runs on it can start" in html
    )
    assert "custom GPU" not in html and "pid 42" not in html
    assert not LabRun.objects.exists() and not queued.called
    # What the CPU build could never run is still refused by field, not as busy.
    response = alice_client.post(
        reverse("labs:run-create", args=["batching"]), {**data, "block_size": "16"}
    )
    assert response.status_code == 400 and "multiple of 32" in response.content.decode()


def test_a_calibrations_note_says_how_far_it_is_and_the_minutes_left(settings):
    note = busy.progress_note(0, 41, "P1 a long prefill", 20.0)
    assert note == "run 1 of 41: P1 a long prefill; 1 min so far"
    note = busy.progress_note(10, 41, "D1 batch-1 decode", 240.0)
    assert note == "run 11 of 41: D1 batch-1 decode; 4 min so far, about 13 min left"
    # Its first run started the engine: from it alone the runs left look longer than the
    # 15 minutes its time limit allows, which is then what it says.
    note_first = busy.progress_note(1, 41, "S1 ngram speculation", 80.0, 900.0)
    assert note_first == "run 2 of 41: S1 ngram speculation; 1 min so far, at most 14 min left"
    settings.LABS_SELF_CALIBRATE_TIME_LIMIT_S = 3600  # room for the estimate below
    now = timezone.now()
    job = _cpu_self_job(state=RunState.RUNNING, started_at=now - timedelta(seconds=240), note=note)
    assert busy.runs_progress(job) == (10, 41)
    left, estimated = busy.seconds_left(job, now)
    assert estimated and left == pytest.approx(24 * 31 + busy.FIT_ALLOWANCE_S)
    # Its runs over, the fit is what is left.
    job.note = "S2 ngram, 3 drafts, 4 decoding: e2e_s.mean 0.91 (0.9 to 0.93 over 2 runs)"
    assert busy.seconds_left(job, now) == (
        busy.FIT_ALLOWANCE_S,
        True,
    )
    # More than its time limit leaves: the limit, as a bound.
    settings.LABS_SELF_CALIBRATE_TIME_LIMIT_S = 900
    job.note = note
    assert busy.seconds_left(job, now) == (660.0, False)
    # Queued: its whole time limit, as a bound.
    queued = CalibrationJob(device="l4", self_started=True, state=RunState.QUEUED)
    assert busy.calibrating_words(queued, now) == (
        "The l4 engine is calibrating itself, at most 15 minutes left"
    )


def test_a_sweep_says_each_run_before_it_starts_with_the_runs_planned():
    from labs.calibration.sweep import SWEEP, Runs, setting_label, sweep_settings

    base = {"model": "lab-llama-20m", "gpu": "h100-sxm"}
    said: list[tuple[int, int, str]] = []
    runs = Runs(
        lambda p: {"e2e_s": {"mean": 1.0}},
        repeats=2,
        warmups=1,
        on_run=lambda done, planned, p: said.append((done, planned, setting_label(base, p))),
    )
    settings = sweep_settings(base)
    runs.measure(settings)
    assert [done for done, _, _ in said] == list(range(len(said)))
    # Planned before the first run, and right: every repeat, and the warm-ups wherever the
    # server changes, which are more runs than the repeats alone.
    assert {planned for _, planned, _ in said} == {len(said)}
    assert len(said) > 2 * len(settings)
    labels = {label for _, _, label in said}
    assert {f"{p.id} {p.what}" for p in SWEEP} <= labels
    assert "max_num_seqs 1 -> 8, before" in labels


class _RecordedEngine:
    """The vllm backend on a CPU worker, as its run record comes out: the simulator's
    requests 1.5x slower, with vLLM's gauges (no tokens per step)."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def run(self, params: Any, on_progress: Any = None) -> Any:
        from tests.labs.factories import gpu_record_slower_than_the_model

        record = gpu_record_slower_than_the_model(params, 1.5)
        for sample in record.samples:
            sample.scheduled_tokens = None
        record.where = "vLLM 0.32.0 on CPU (Intel(R) Xeon(R) Test CPU, 2 cores)"
        return record


SLOW_CPU = {
    "bandwidth_efficiency": 0.3,
    "kv_bandwidth_efficiency": 0.25,
    "gemm_efficiency": 0.2,
    "decode_step_overhead_s": 0.004,
    "mixed_step_overhead_s": 0.006,
}


def test_a_run_sent_while_the_cpu_calibrates_itself_says_it_used_the_probe(alice, alice_client):
    """A run sent during the self-calibration was predicted from the probe and ran after the
    calibration: its parts were once sized by the calibration beside the probe's prediction,
    and the page said neither. Now they share the probe's basis and the page says so; a run
    sent after the calibration says which calibration priced it, when and how well."""
    from labs.explanation.results import PROBE_NOTE
    from labs.runs import execution, submission

    cpu_worker()
    _cpu_self_job(state=RunState.RUNNING, started_at=timezone.now())
    data = {**device_lab_settings("vllm", CPU_KIND), "num_prompts": "4"}
    data.pop("backend")
    data.update(announced_cpu_figures(CPU_GPUS))  # as the lab form fills them in
    with mock.patch("labs.runs.tasks.run_next_task.apply_async"):
        sent = submission.run_request(owner=alice, lab="batching", backend="vllm", data=data)
    assert sent.predicted["priced_with"] == {
        "device": CPU_KEY,
        "source": "probe",
        "calibrating": True,
    }
    # The calibration finishes while the run waits behind it.
    CalibrationJob.objects.update(state=RunState.DONE, finished_at=timezone.now())
    calibration = DeviceCalibration.objects.create(
        device=CPU_KEY, where="this worker", constants=SLOW_CPU, fit_error=0.05, held_out_error=0.12
    )
    with mock.patch("labs.runs.execution.backend_for_run", _RecordedEngine):
        assert execution.run_execute(run_id=sent.pk, hostname="cpu@box") == RunState.DONE
    sent.refresh_from_db()
    assert sent.result["breakdown"]["calibrated"] is False
    page = alice_client.get(sent.get_absolute_url()).content.decode()
    html = page.replace("&quot;", '"').replace("&#x27;", "'")
    label = calibration.to_constants().label()
    assert (
        "Predicted from this CPU's start-up probe (its bandwidth and matmul rate), not a "
        "calibration: it was calibrating itself when this run was sent, and a probe sizes none of "
        f"the parts. Its calibration has finished since ({label}): run again"
    ) in html
    assert PROBE_NOTE in html and "predicted from the device's start-up probe" in html
    assert "efficiency loss" not in html.split('id="run-definitions"')[0].split("Reading:")[1]

    with mock.patch("labs.runs.tasks.run_next_task.apply_async"):
        later = submission.run_request(owner=alice, lab="batching", backend="vllm", data=data)
    assert later.predicted["priced_with"]["calibration_id"] == calibration.pk
    with mock.patch("labs.runs.execution.backend_for_run", _RecordedEngine):
        assert execution.run_execute(run_id=later.pk, hostname="cpu@box") == RunState.DONE
    later.refresh_from_db()
    assert later.result["breakdown"]["calibrated"] is True
    html = alice_client.get(later.get_absolute_url()).content.decode()
    assert (
        f"Predicted, and its parts sized, with this device&#x27;s own calibration: {label}"
    ) in html
    assert label.endswith("held-out error 12%")
