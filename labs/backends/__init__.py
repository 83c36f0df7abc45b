"""Lab backends: `sim` (the CPU default) and `vllm` (a real engine on a GPU worker).

Each returns a `RunRecord` (labs/backends/base.py, docs/run-record.md). Backends are imported
only when asked for, so importing this package stays cheap and Django-free.
"""

from __future__ import annotations

import importlib
from typing import Any

from labs.backends.base import Backend, Device, Placement

__all__ = ["BACKENDS", "Backend", "Device", "Placement", "check_can_start", "get_backend"]

# name -> "module:class"; the class is built with the options given to get_backend.
BACKENDS: dict[str, str] = {
    "sim": "labs.backends.sim:SimBackend",
    "vllm": "labs.backends.vllm:VLLMBackend",
}


# name -> "module:function": the backend's one start-up check, check_can_start(params, devices)
# -> Placement | None, called at submit (the online workers' devices) and on the worker.
START_CHECKS: dict[str, str] = {
    "sim": "labs.backends.sim:check_can_start",
    "vllm": "labs.backends.vllm.start:check_can_start",
}


def check_can_start(name: str, params: Any, devices: Any = (), **options: Any) -> Placement | None:
    """Ask backend `name` whether the lab can start on one of `devices` and where.

    Raises:
        ParamError: what cannot start, by field.
    """
    module_name, function = START_CHECKS[name].split(":")
    check = getattr(importlib.import_module(module_name), function)
    return check(params, list(devices), **options)


def get_backend(name: str, **options: Any) -> Backend:
    """The backend called `name`, built with `options` (e.g. base_url for vllm).

    Raises:
        ValueError: no backend has that name.
    """
    try:
        target = BACKENDS[name]
    except KeyError:
        allowed = ", ".join(BACKENDS)
        raise ValueError(f"backend must be one of {allowed}, got {name}") from None
    module_name, class_name = target.split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(**options)
