"""Calibrating a device from the staff's devices page (labs/calibration/jobs.py): what each
online vLLM worker's device is calibrated with and where its task goes, one job per device at a
time, a broker outage at submit, and the task's body on a stand-in vLLM backend (the simulator,
priced with known constants), never a real worker or engine."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.utils import timezone

from labs.calibration import jobs as calibration_jobs
from labs.calibration.sweep import SWEEP
from labs.models import CalibrationJob, DeviceCalibration, RunState
from labs.sim.lab import build_simulator
from labs.tasks import calibrate_device_task
from tests.conftest import make_user
from tests.labs.calibration.test_calibrate_device import TRUTH
from tests.labs.factories import make_heartbeat
from tests.labs.vllm.test_cpu import CPU_GPUS

pytestmark = pytest.mark.django_db

CPU_KEY = "cpu:Intel(R) Xeon(R) Test CPU:2"
L4_GPUS = {"count": 1, "name": "NVIDIA L4", "kind": "l4", "memory_bytes": 23034 * 1024**2}


def cpu_worker(**overrides: Any) -> Any:
    fields = {"hostname": "cpu@box", "queue": "labs.gpu.cpu", "gpus": CPU_GPUS, **overrides}
    return make_heartbeat("vllm", **fields)


def l4_worker(**overrides: Any) -> Any:
    fields = {"hostname": "l4@box", "queue": "labs.gpu.l4", "gpus": L4_GPUS, **overrides}
    return make_heartbeat("vllm", **fields)


@pytest.fixture
def staff(db):
    return make_user("root", is_staff=True)


@pytest.fixture
def sent():
    """What was handed to the broker, instead of a broker (no worker, no eager mode)."""
    with mock.patch.object(calibrate_device_task, "apply_async") as apply_async:
        yield apply_async


class StandInVllm:
    """The vLLM backend's `run`, answered by the simulator priced with TRUTH's constants."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.runs = fail, 0

    def run(self, params: Any, on_progress: Any = None) -> Any:
        self.runs += 1
        if self.fail is not None:
            raise self.fail
        return build_simulator(params, device=TRUTH).run()


def test_a_cpu_worker_is_calibrated_with_the_documented_settings_and_its_own_figures():
    cpu_worker()
    (target,) = calibration_jobs.calibration_targets()
    assert target.device == CPU_KEY and target.workers == ("cpu@box",)
    assert target.queue == "labs.gpu.cpu.x1"  # the queue its worker consumes for tp 1
    assert target.base == {
        "model": "lab-llama-20m",
        "gpu": "cpu",
        "block_size": 128,
        "kv_capacity_tokens": 8192,
        "max_num_seqs": 8,
        # What the worker measured, as the lab form prices gpu cpu (labs.runs.workers.cpu_figures).
        "hbm_gb": pytest.approx(16 * 1024**3 / 10**9),
        "bandwidth_tbs": pytest.approx(0.008),
        "tflops": pytest.approx(0.2),
    }


def test_a_gpu_worker_is_calibrated_with_the_smallest_catalog_model_that_fits():
    l4_worker()
    l4_worker(hostname="l4@other")
    (target,) = calibration_jobs.calibration_targets()  # two workers, one device
    assert target.device == "l4" and set(target.workers) == {"l4@box", "l4@other"}
    assert target.queue == "labs.gpu.l4.x1"
    assert target.base == {"model": "qwen2.5-0.5b", "gpu": "l4"}


def test_a_device_that_cannot_be_calibrated_says_why():
    cpu_worker(gpus={k: v for k, v in CPU_GPUS.items() if k != "matmul_flops_per_s"})
    make_heartbeat(
        "vllm", hostname="odd@box", gpus={"count": 1, "name": "NVIDIA RTX 4090", "kind": None}
    )
    make_heartbeat("vllm", hostname="old@box", age_s=3600, gpus=L4_GPUS)  # offline
    targets = {t.label: t for t in calibration_jobs.calibration_targets()}
    assert set(targets) == {
        "Intel(R) Xeon(R) Test CPU, 2 cores (CPU)",
        "1× NVIDIA RTX 4090 (not in the catalog)",
    }
    assert all(t.base is None for t in targets.values())
    assert "no measured bandwidth" in targets["Intel(R) Xeon(R) Test CPU, 2 cores (CPU)"].why_not
    assert "not in the catalog" in targets["1× NVIDIA RTX 4090 (not in the catalog)"].why_not


def test_a_request_saves_a_queued_job_and_sends_it_to_the_devices_queue(
    staff, sent, django_capture_on_commit_callbacks
):
    cpu_worker()
    with django_capture_on_commit_callbacks(execute=True):
        job = calibration_jobs.calibration_request(device=CPU_KEY, user=staff)
    assert job.state == RunState.QUEUED and job.requested_by == staff
    assert (job.repeats, job.rounds) == (5, 6) and job.base["model"] == "lab-llama-20m"
    sent.assert_called_once()
    assert sent.call_args.kwargs["args"] == [job.pk]
    assert sent.call_args.kwargs["queue"] == "labs.gpu.cpu.x1"


def test_a_second_request_while_one_is_queued_is_refused_and_sends_nothing(
    staff, sent, django_capture_on_commit_callbacks
):
    l4_worker()
    with django_capture_on_commit_callbacks(execute=True):
        calibration_jobs.calibration_request(device="l4", user=staff)
    sent.reset_mock()
    with (
        pytest.raises(
            calibration_jobs.CalibrationRefused, match="already queued or running"
        ) as exc,
        django_capture_on_commit_callbacks(execute=True),
    ):
        calibration_jobs.calibration_request(device="l4", user=staff)
    assert exc.value.kind == "busy"
    assert CalibrationJob.objects.count() == 1
    sent.assert_not_called()


def test_a_request_for_a_device_no_online_worker_has_is_refused(staff, sent):
    with pytest.raises(calibration_jobs.CalibrationRefused, match="No online vLLM worker") as exc:
        calibration_jobs.calibration_request(device="h100-sxm", user=staff)
    assert exc.value.kind == "no-device"
    assert not CalibrationJob.objects.exists()
    sent.assert_not_called()


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_the_job_is_failed_not_left_queued(sent):
    sent.side_effect = ConnectionRefusedError("[Errno 111] Connection refused")
    staff = make_user("root", is_staff=True)
    l4_worker()
    with pytest.raises(calibration_jobs.CalibrationRefused, match="queue is unavailable") as exc:
        calibration_jobs.calibration_request(device="l4", user=staff)
    assert exc.value.kind == "queue-down"
    job = CalibrationJob.objects.get()
    assert job.state == RunState.FAILED and job.finished_at is not None
    assert "never sent" in job.error and "Connection refused" in job.error


def _queued_job(device: str = "l4", base: dict[str, Any] | None = None) -> CalibrationJob:
    return CalibrationJob.objects.create(
        device=device,
        queue="labs.gpu.l4.x1",
        base=base or {"model": "qwen2.5-0.5b", "gpu": "l4"},
        repeats=1,
        rounds=1,
    )


def test_the_task_calibrates_on_its_worker_stores_the_result_and_marks_the_job_done():
    job = _queued_job()
    vllm = StandInVllm()
    with mock.patch("labs.calibration.jobs.get_backend", return_value=vllm) as get_backend:
        state = calibrate_device_task.run(job.pk)  # the task's body, in this process
    assert state == RunState.DONE
    get_backend.assert_called_once_with("vllm")  # the worker's own engine, no base_url
    job.refresh_from_db()
    row = DeviceCalibration.objects.get(device="l4")
    assert job.state == RunState.DONE and job.calibration == row and job.finished_at is not None
    assert [p["id"] for p in row.points] == [p.id for p in SWEEP]
    assert row.where == "this worker" and job.note.startswith("stored: calibrated on this worker")
    # A second delivery of the same message calibrates nothing again.
    assert calibrate_device_task.run(job.pk) == RunState.DONE
    assert DeviceCalibration.objects.count() == 1


def test_a_failing_calibration_marks_the_job_failed_with_a_one_line_reason():
    job = _queued_job()
    broken = StandInVllm(fail=RuntimeError("vLLM exited with code 1\nTraceback (most recent ...)"))
    with mock.patch("labs.calibration.jobs.get_backend", return_value=broken):
        assert calibrate_device_task.run(job.pk) == RunState.FAILED
    job.refresh_from_db()
    assert job.state == RunState.FAILED
    assert job.error == "RuntimeError: vLLM exited with code 1"
    assert not DeviceCalibration.objects.exists()


def test_a_cpu_job_taken_by_a_worker_with_another_cpu_fails_before_measuring():
    base = {**calibration_jobs.CPU_BASE, "hbm_gb": 16, "bandwidth_tbs": 0.008, "tflops": 0.2}
    job = _queued_job(device="cpu:Some Other CPU:64", base=base)
    vllm = StandInVllm()
    with mock.patch("labs.calibration.jobs.get_backend", return_value=vllm):
        assert calibrate_device_task.run(job.pk) == RunState.FAILED
    job.refresh_from_db()
    assert "not cpu:Some Other CPU:64" in job.error and vllm.runs == 0


def test_a_job_whose_worker_died_or_restarted_is_failed_by_the_reaper():
    gone = _queued_job()
    CalibrationJob.objects.filter(pk=gone.pk).update(
        state=RunState.RUNNING, worker="l4@box", started_at=timezone.now()
    )
    assert calibration_jobs.calibration_reap_stale() == 1
    gone.refresh_from_db()
    assert gone.state == RunState.FAILED and "l4@box is no longer online" in gone.error

    beat = l4_worker()  # up for an hour: it has been running the job all along
    alive = _queued_job()
    CalibrationJob.objects.filter(pk=alive.pk).update(
        state=RunState.RUNNING, worker="l4@box", started_at=timezone.now()
    )
    assert calibration_jobs.calibration_reap_stale() == 0
    beat.started_at = timezone.now() + timedelta(seconds=1)  # came back after it began
    beat.save()
    assert calibration_jobs.calibration_reap_stale() == 1
    alive.refresh_from_db()
    assert "l4@box restarted" in alive.error
