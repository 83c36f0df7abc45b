"""Lab backends: `sim` (the CPU default) and `vllm` (a real engine on a GPU worker).

Each returns a `RunRecord` (labs/backends/base.py, docs/run-record.md). Outside labs/backends/,
code reaches a backend only through this registry (and the shared types of base.py): which
backends there are, one built to run a lab, and what each says about a lab, a worker's devices
and its server. Backends are imported only when asked for, so importing this package stays cheap
and Django-free.

Each backend's module (BACKENDS) defines `BACKEND`, its class, and answers the questions below
with functions of the same names; a question it does not answer gets the default its function
here gives.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from labs.backends.base import Backend, Device, Placement

__all__ = [
    "BACKENDS",
    "Backend",
    "Device",
    "Placement",
    "check_can_start",
    "device_label",
    "device_lab_settings",
    "device_state",
    "get_backend",
    "make_model",
    "requirement",
    "served_instead",
    "server_argv",
    "server_port",
    "this_device",
    "worker_inventory",
]

# name -> the module that answers for the backend.
BACKENDS: dict[str, str] = {
    "sim": "labs.backends.sim",
    "vllm": "labs.backends.vllm",
}


def _module(name: str) -> ModuleType:
    """Raises ValueError: no backend has that name."""
    try:
        module_name = BACKENDS[name]
    except KeyError:
        allowed = ", ".join(BACKENDS)
        raise ValueError(f"backend must be one of {allowed}, got {name}") from None
    return importlib.import_module(module_name)


def _answer(name: str, question: str) -> Callable[..., Any] | None:
    return getattr(_module(name), question, None)


def get_backend(name: str, **options: Any) -> Backend:
    """The backend called `name`, built with `options` (e.g. base_url for vllm).

    Raises:
        ValueError: no backend has that name.
    """
    return _module(name).BACKEND(**options)


# -- what can start where ------------------------------------------------------------------------


def check_can_start(name: str, params: Any, devices: Any = (), **options: Any) -> Placement | None:
    """Ask backend `name` whether the lab can start on one of `devices` and where: its one
    start-up check, called at submit (the online workers' devices) and on the worker.

    Raises:
        ParamError: what cannot start, by field.
    """
    return _module(name).check_can_start(params, list(devices), **options)


def requirement(name: str, params: Any) -> str:
    """What the lab needs to start on backend `name`, in a sentence ("needs a vLLM worker with
    4× h100-sxm ..."), or why it cannot; "" for a backend any of its workers runs."""
    answer = _answer(name, "requirement")
    return "" if answer is None else str(answer(params))


def device_lab_settings(
    name: str, kind: str, start: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The form values that open a lab to run on backend `name` on a device of `kind` (vLLM's
    CPU build: its block size, a fixed KV pool, a workload a few cores finish); {} for none.
    `start`: the lab's own starting values, which the device may have to change (a draft
    model where the device speculates by ngram only)."""
    answer = _answer(name, "device_lab_settings")
    return {} if answer is None else dict(answer(kind, start or {}))


# -- a worker's devices --------------------------------------------------------------------------


def worker_inventory(name: str) -> dict[str, Any] | None:
    """The devices this worker runs backend `name` on (count, name, kind, memory_bytes each),
    read once; None for a backend without devices, or when none is found."""
    answer = _answer(name, "worker_inventory")
    return None if answer is None else answer()


def device_label(name: str, announced: Mapping[str, Any]) -> str:
    """A worker's devices as it announced them (its heartbeat's `gpus`), for the pages:
    `2× NVIDIA H100 80GB HBM3 (h100-sxm, 80 GiB each)`; "" for a backend without devices."""
    answer = _answer(name, "device_label")
    return "" if answer is None else str(answer(announced))


def this_device(name: str, params: Any) -> str:
    """The device the lab's settings run on with backend `name` on this machine, as its
    calibration is stored: the GPU kind, or for vLLM on a CPU this CPU's key."""
    answer = _answer(name, "this_device")
    return params.hardware.name if answer is None else str(answer(params))


# -- a run's server ------------------------------------------------------------------------------


def served_instead(name: str, params: Any, meta: Mapping[str, Any]) -> Any:
    """For a finished run's record (its meta): what its numbers are expected to be for when the
    server it measured served another model than the one submitted (`.params`, or None with
    `.no_prediction` saying why); None when it served the lab's own, or the backend starts none."""
    answer = _answer(name, "served_instead")
    return None if answer is None else answer(params, meta)


def server_argv(
    name: str,
    params: Any,
    *,
    model_path: str | None = None,
    executable: str | None = None,
    port: int | None = None,
) -> Sequence[str]:
    """The command backend `name` would start its server with for the lab (runs nothing).

    Raises:
        ValueError: the backend starts no server.
        ParamError: settings the server cannot run.
    """
    answer = _answer(name, "server_argv")
    if answer is None:
        raise ValueError(f"backend {name} starts no server")
    return answer(params, model_path=model_path, executable=executable, port=port)


def device_state(name: str) -> dict[str, Any]:
    """What this worker's devices hold now, for its every heartbeat (a CPU worker: the memory a
    new engine could have, labs.backends.base.Device.available_bytes, and what the engine's
    processes take); {} for a backend without devices or nothing to say."""
    answer = _answer(name, "device_state")
    return {} if answer is None else dict(answer())


def engine_busy(name: str) -> str:
    """Why backend `name` cannot start its engine on this worker's devices now (another process
    of this installation runs one there), in a learner's words; "" when it can."""
    answer = _answer(name, "busy")
    return "" if answer is None else str(answer())


def server_port(name: str) -> int | None:
    """The port backend `name` shows its server on by default; None if it starts none."""
    answer = _answer(name, "server_port")
    return None if answer is None else int(answer())


def make_model(name: str, slug: str, *, force: bool = False) -> dict[str, Any]:
    """Build catalog model `slug` for backend `name` to load (vLLM's small real-engine models).

    Raises:
        ValueError: the backend builds no models.
        ParamError: `slug` is not a model it builds.
        RuntimeError: the build failed.
    """
    answer = _answer(name, "make_model")
    if answer is None:
        raise ValueError(f"backend {name} builds no models")
    return answer(slug, force=force)
