"""Lab backends: `sim` (the CPU default) and `vllm` (a real engine on a GPU worker).

Each returns a `RunRecord` (labs/backends/base.py, docs/run-record.md). Backends are imported
only when asked for, so importing this package stays cheap and Django-free.
"""

from __future__ import annotations

import importlib
from typing import Any

from labs.backends.base import Backend

__all__ = ["BACKENDS", "Backend", "get_backend"]

# name -> "module:class"; the class is built with the options given to get_backend.
BACKENDS: dict[str, str] = {
    "sim": "labs.backends.sim:SimBackend",
    "vllm": "labs.backends.vllm:VLLMBackend",
}


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
