"""Every backend's module answers every question the registry asks, with its types.

Nothing imports this module: mypy (`make types`) checks the assignments below, so a backend that
lacks a question, or answers it with other types, fails the type check. A backend added to
BACKENDS is added here too (tests/labs/test_backend_registry.py checks the two lists agree).
"""

from __future__ import annotations

from labs.backends import BackendModule, sim, vllm

# One assignment each, so mypy names the backend and the questions it gets wrong.
SIM: BackendModule = sim
VLLM: BackendModule = vllm
CHECKED = {"sim": SIM, "vllm": VLLM}
