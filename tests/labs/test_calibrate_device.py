"""Calibrating a device from its own sweep (labs/calibrate_device.py, `manage.py lab calibrate`):
the fit sees only the `fit` points, recovers constants the runs were made with, and the command
stores the result for the device against the fake vLLM server."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import date
from typing import Any

import pytest
from django.core.management import call_command

from labs.calibrate_device import SWEEP, Measured, fit_device, point_params, simulate_point
from labs.device_calibration import CONSTANT_BOUNDS, DeviceConstants
from labs.models import DeviceCalibration
from labs.selectors import device_calibration
from tests.labs.vllm.conftest import fake_server  # noqa: F401 (the fixture)

BASE = {"model": "qwen2.5-0.5b", "gpu": "l4"}
TRUTH = DeviceConstants(
    device="l4",
    bandwidth_efficiency=0.5,
    kv_bandwidth_efficiency=0.5,
    gemm_efficiency=0.4,
    decode_step_overhead_s=0.002,
    mixed_step_overhead_s=0.004,
    fitted_on=date(2026, 12, 2),
    fit_error=0.0,
    held_out_error=0.0,
)


def _measured_with(device: DeviceConstants) -> list[Measured]:
    """The sweep as a device with `device`'s constants would measure it (by simulating it)."""
    out = []
    for point in SWEEP:
        m = Measured(point, point_params(BASE, point), 0.0)
        out.append(replace(m, value=simulate_point(m, device)))
    return out


def test_the_sweep_fixes_its_roles_and_covers_decode_batching_prefill_and_speculation():
    roles = {p.role for p in SWEEP}
    assert roles == {"fit", "held_out"}
    changes = [p.changes for p in SWEEP]
    assert any(c.get("max_concurrency") == 1 and c.get("output_tokens", 0) > 8 for c in changes)
    assert len({c.get("max_concurrency") for c in changes}) >= 3  # a batch sweep
    assert any(c.get("prompt_tokens", 0) >= 1024 for c in changes)
    assert any(c.get("spec_method", "none") != "none" for c in changes)


def test_the_fit_recovers_a_devices_runs_and_never_sees_the_held_out_ones():
    measured = _measured_with(TRUTH)
    result = fit_device("l4", measured, on=date(2026, 12, 2), rounds=3, log=lambda _: None)
    assert result.constants.held_out_error < 0.15
    assert result.constants.fit_error < 0.10
    assert [p["id"] for p in result.points] == [p.id for p in SWEEP]

    # Doubling every held-out measurement changes their errors, never the constants.
    skewed = [replace(m, value=m.value * 2) if m.point.role == "held_out" else m for m in measured]
    again = fit_device("l4", skewed, on=date(2026, 12, 2), rounds=3, log=lambda _: None)
    names = tuple(CONSTANT_BOUNDS)
    assert [getattr(again.constants, n) for n in names] == [
        getattr(result.constants, n) for n in names
    ]
    assert again.constants.held_out_error > result.constants.held_out_error + 0.3


@pytest.mark.django_db
def test_the_command_calibrates_a_device_from_its_vllm_server_and_stores_it(
    fake_server: Any,  # noqa: F811
):
    server = fake_server({"ttft_ms": 20, "itl_ms": [8], "chunk_tokens": [1]})
    out = io.StringIO()
    call_command(
        "lab",
        "calibrate",
        "--base-url",
        server.base_url,
        "--model",
        "qwen2.5-0.5b",
        "--gpu",
        "l4",
        "--repeats",
        "1",
        "--rounds",
        "1",
        "--where",
        "the test worker",
        stdout=out,
    )
    row = DeviceCalibration.objects.get(device="l4")
    assert [p["id"] for p in row.points] == [p.id for p in SWEEP]
    held_out = sorted(abs(p["error"]) for p in row.points if p["role"] == "held_out")
    assert row.held_out_error == pytest.approx(held_out[len(held_out) // 2])
    # The fake answers each token 8 ms apart whatever the batch: batch-1 decode shows it.
    decode = next(p for p in row.points if p["id"] == "D1")
    assert decode["measured"] == pytest.approx(0.008, rel=0.5)
    stored = device_calibration("l4")
    assert stored is not None and stored.where == "the test worker"
    assert "stored for l4: calibrated on the test worker" in out.getvalue()


@pytest.mark.django_db
def test_the_command_refuses_bad_repeats_naming_the_option():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--repeats must be a whole number from 1 to 10"):
        call_command("lab", "calibrate", "--repeats", "0", "--base-url", "http://127.0.0.1:9")
    assert not DeviceCalibration.objects.exists()
