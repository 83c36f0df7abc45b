"""The staff's devices page in Chromium: a CPU worker's stored calibration fits a 390 px phone
(its points table scrolls inside its box, the page does not), and "Calibrate this device" queues
a job the page then shows. The task is recorded, not sent: no broker, no worker."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from labs.calibration.sweep import SWEEP
from labs.models import CalibrationJob, DeviceCalibration, RunState
from labs.tasks import calibrate_device_task
from tests.e2e.conftest import PHONE, sign_up
from tests.e2e.test_phone_width_browser import _overflow
from tests.labs.factories import make_heartbeat
from tests.labs.vllm.test_cpu import CPU_GPUS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("SHOTS_DIR") or Path(settings.BASE_DIR) / "var/screenshots/phone")
CPU_KEY = "cpu:Intel(R) Xeon(R) Test CPU:2"


def test_a_staff_member_calibrates_a_cpu_worker_from_a_phone(page):
    make_heartbeat("vllm", hostname="cpu@box", queue="labs.gpu.cpu", gpus=CPU_GPUS)
    DeviceCalibration.objects.create(
        device=CPU_KEY,
        constants={
            "bandwidth_efficiency": 0.6,
            "kv_bandwidth_efficiency": 0.5,
            "gemm_efficiency": 1.0,
            "decode_step_overhead_s": 0.004,
            "mixed_step_overhead_s": 0.006,
        },  # fmt: skip
        fit_error=0.021,
        held_out_error=0.043,
        points=[
            {
                "id": p.id,
                "role": p.role,
                "what": p.what,
                "metric": p.metric,
                "measured": 0.1234567 * (i + 1),
                "predicted": 0.13 * (i + 1),
                "error": 0.053,
            }
            for i, p in enumerate(SWEEP)
        ],  # fmt: skip
    )
    page.set_viewport_size(PHONE)
    sign_up(page, "staffer")
    get_user_model().objects.filter(username="staffer").update(is_staff=True)
    page.goto("/labs/")
    page.click("text=Calibrate a vLLM worker's device")
    page.wait_for_selector("text=held-out error 4%")
    assert _overflow(page) is None, _overflow(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "labs-devices.png"), full_page=True)

    with mock.patch.object(calibrate_device_task, "apply_async") as sent:
        page.click("button:has-text('Calibrate this device')")
        page.wait_for_selector("text=queued for its worker")
    job = CalibrationJob.objects.get()
    assert job.state == RunState.QUEUED and job.device == CPU_KEY
    assert sent.call_args.kwargs["queue"] == "labs.gpu.cpu.x1"
    assert page.locator("button:has-text('Calibrate this device')").count() == 0
    assert _overflow(page) is None, _overflow(page)
    page.screenshot(path=str(SHOTS / "labs-devices-queued.png"), full_page=True)
