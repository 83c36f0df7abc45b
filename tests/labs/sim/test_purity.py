"""The simulator, the metrics and the sim backend run anywhere: they never import Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PURE_MODULES = [
    "labs.sim",
    "labs.sim.entities",
    "labs.sim.block_pool",
    "labs.sim.kv_cache",
    "labs.sim.rules",
    "labs.sim.scheduler",
    "labs.sim.decode_run",
    "labs.sim.steady",
    "labs.sim.cost_model",
    "labs.sim.engine_model",
    "labs.sim.breakdown",
    "labs.sim.published_calibration",
    "labs.sim.lab",
    "labs.sim.recording",
    "labs.sim.workload",
    "labs.sim.simulator",
    "labs.measurement.metrics",
    "labs.parameters.device_calibration",
    "labs.calibration.sweep",
    "labs.backends.base",
    "labs.backends.sim",
]


def test_it_imports_no_django():
    # A fresh interpreter: pytest-django has already imported Django into this one.
    code = (
        "import importlib, sys\n"
        f"for name in {PURE_MODULES!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
