"""The `vllm` lab backend: real vLLM on a GPU worker (see backend.py), measured over HTTP.

What the registry (labs/backends/__init__.py) asks of it is answered here, from its modules:
start.py decides what can start where, gpus.py and cpu.py say what a worker has, server.py
builds the `vllm serve` command and served.py reads what a running server serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labs.backends.base import Device, Placement
from labs.backends.vllm import cpu
from labs.backends.vllm.backend import VLLMBackend, device_state, gpu_inventory
from labs.backends.vllm.gpus import GpuInventory
from labs.backends.vllm.served import served_instead
from labs.backends.vllm.server import DEFAULT_PORT, build_plan, engine_busy
from labs.backends.vllm.start import check_can_start as _check_can_start
from labs.backends.vllm.start import requirement
from labs.parameters.catalog import CPU_KIND
from labs.parameters.device_calibration import DeviceConstants, cpu_device_key
from labs.parameters.params import LabParams

__all__ = [
    "BACKEND",
    "SIMULATED",
    "VLLMBackend",
    "backend_for_run",
    "check_can_start",
    "describe",
    "device_lab_settings",
    "device_label",
    "device_state",
    "engine_busy",
    "make_model",
    "requirement",
    "served_instead",
    "server_argv",
    "server_port",
    "this_device",
    "worker_inventory",
]

BACKEND = VLLMBackend
SIMULATED = False
make_model = cpu.make_model


def backend_for_run(*, max_run_mb: int | None, device: DeviceConstants | None) -> VLLMBackend:
    # A real engine: no simulated run's memory cap, and it measures instead of pricing.
    return VLLMBackend()


def check_can_start(
    params: LabParams,
    devices: Sequence[Device],
    /,
    *,
    max_run_mb: int | None = None,
    elsewhere: bool = False,
) -> Placement | None:
    return _check_can_start(params, devices, elsewhere=elsewhere)


def describe() -> dict[str, Any]:
    return VLLMBackend().describe()


def device_lab_settings(kind: str, start: Mapping[str, Any] | None = None) -> dict[str, str]:
    return cpu.cpu_lab_settings(start or {}) if kind == CPU_KIND else {}


def worker_inventory() -> dict[str, Any] | None:
    """This worker's devices; none for a worker measuring a server on another machine
    (LABS_VLLM_BASE_URL), which announces none either (VLLMBackend.describe)."""
    if not VLLMBackend().runs_here():
        return None
    inventory = gpu_inventory()
    return None if inventory is None else inventory.as_dict()


def device_label(announced: Mapping[str, Any]) -> str:
    return GpuInventory(
        count=int(announced.get("count") or 0),
        name=str(announced.get("name") or ""),
        kind=announced.get("kind"),
        memory_bytes=announced.get("memory_bytes"),
    ).label()


def this_device(params: LabParams) -> str:
    """The GPU kind; for gpu cpu this machine's CPU as its CPU worker announces itself (model
    and cores), the key its runs look their calibration up by (labs.runs.selectors.device_key)."""
    if params.hardware.name != CPU_KIND:
        return params.hardware.name
    return cpu_device_key(cpu.cpu_inventory().name or "", cpu.cores())


def server_argv(
    params: LabParams,
    *,
    model_path: str | None = None,
    executable: str | None = None,
    port: int | None = None,
) -> list[str]:
    plan = build_plan(params, model_path=model_path)
    return plan.argv(executable or "vllm", port=port or DEFAULT_PORT)


def server_port() -> int:
    return DEFAULT_PORT
