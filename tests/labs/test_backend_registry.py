"""The backend registry (labs/backends/__init__.py): every backend answers every question the
registry asks (mypy checks the types, BackendModule; this checks the modules listed at run time),
and nothing outside labs/backends/ compares a backend's name."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from unittest import mock

import pytest

from labs import backends
from labs.backends import BACKENDS, BackendModule
from labs.parameters.params import parse_lab_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_backend_answers_every_question(name):
    assert isinstance(importlib.import_module(BACKENDS[name]), BackendModule)


def test_the_simulator_answers_as_a_backend_without_devices_or_server():
    params = parse_lab_params({"gpu": "h200"})
    assert backends.is_simulated("sim") and not backends.is_simulated("vllm")
    assert backends.simulated_backends() == ["sim"]
    assert backends.requirement("sim", params) == ""
    assert backends.device_lab_settings("sim", "cpu") == {}
    assert backends.worker_inventory("sim") is None
    assert backends.device_label("sim", {"count": 1, "name": "x"}) == ""
    assert backends.this_device("sim", params) == "h200"
    assert backends.served_instead("sim", params, {"served_model": {"id": "x"}}) is None
    assert backends.engine_busy("sim") == ""
    assert backends.server_port("sim") is None
    assert backends.describe_worker("sim") == {"where": "simulated on CPU"}
    with pytest.raises(ValueError, match="starts no server"):
        backends.server_argv("sim", params)
    with pytest.raises(ValueError, match="builds no models"):
        backends.make_model("sim", "lab-llama-20m")
    built = backends.backend_for_run("sim", max_run_mb=64, device=None)
    assert (built.name, built.max_run_mb) == ("sim", 64)  # type: ignore[attr-defined]


def test_engine_busy_asks_the_backend_the_question_of_that_name():
    # It once asked vLLM's module for `busy`, which only a wrapper answered.
    with mock.patch("labs.backends.vllm.engine_busy", return_value="vLLM is busy here"):
        assert backends.engine_busy("vllm") == "vLLM is busy here"


def test_an_unknown_backend_is_named_with_those_there_are():
    with pytest.raises(ValueError, match="backend must be one of sim, vllm, got gpu"):
        backends.is_simulated("gpu")


# A backend's name compared with == or != (or its reverse), in code or a template.
_NAME = "|".join(re.escape(name) for name in BACKENDS)
_COMPARED = re.compile(rf"""(==|!=)\s*["']({_NAME})["']|["']({_NAME})["']\s*(==|!=)""")


def test_no_backend_name_is_compared_outside_the_registry():
    sources = [
        *(p for p in (ROOT / "labs").rglob("*.py") if "backends" not in p.parts),
        *(ROOT / "config").rglob("*.py"),
        *(ROOT / "quiz").rglob("*.py"),
        *(ROOT / "templates").rglob("*.html"),
    ]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}"
        for path in sources
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _COMPARED.search(line)
    ]
    assert not found, "ask labs.backends (is_simulated, ...) instead:\n" + "\n".join(found)


def test_mypy_checks_every_backend():
    from labs.backends.conformance import CHECKED

    assert set(CHECKED) == set(BACKENDS)
    assert all(module.__name__ == BACKENDS[name] for name, module in CHECKED.items())  # type: ignore[attr-defined]
