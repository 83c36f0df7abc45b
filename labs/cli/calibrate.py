"""`lab calibrate`: calibrate a device from its own vLLM runs and store the result.

    python manage.py lab calibrate --base-url http://127.0.0.1:8000 --model qwen2.5-0.5b \
        --gpu l4 [--device l4] [--repeats 3] [--where "gpu-worker-1"]

Runs labs.calibration.sweep.SWEEP on the vLLM server at --base-url (or the one the vllm
backend starts), fits the device's constants to the sweep's `fit` points with the published
calibration's search, checks them on the held-out points, and stores a
labs.models.DeviceCalibration for --device (default: the --gpu kind; a CPU worker passes
"cpu:<model>:<cores>"). From then on that device's predictions and simulations use it and say so.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any, TextIO

from labs.cli import add_param_options, params_from_args
from labs.parameters.params import PARAM_FIELDS, LabParams, ParamError

HELP = "calibrate a device from a short sweep on its vLLM engine and store the constants"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_param_options(parser)
    parser.add_argument("--base-url", default=None, help="the device's running vLLM server")
    parser.add_argument(
        "--device",
        default=None,
        help="what the calibration is stored for (default: the --gpu kind; for --gpu cpu, "
        '"cpu:<this CPU\'s model>:<cores>")',
    )
    parser.add_argument("--repeats", default="3", help="runs per sweep point, median kept")
    parser.add_argument("--rounds", default="6", help="rounds of the coordinate search")
    parser.add_argument("--where", default="this worker", help="who measured, for the label")


def _positive_int(options: Mapping[str, Any], name: str, most: int) -> int:
    raw = options.get(name)
    try:
        value = int(str(raw))
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise ParamError({name: f"--{name} must be a whole number from 1 to {most}, got {raw}"})
    return value


def run(options: Mapping[str, Any], stdout: TextIO) -> None:
    """Measure, fit, store and print. Raises ParamError for bad options."""
    from labs.calibration.jobs import calibrate_and_store

    params = params_from_args(options)  # validates the base settings
    repeats = _positive_int(options, "repeats", 10)
    rounds = _positive_int(options, "rounds", 10)
    device = (options.get("device") or default_device(params)).strip()
    if not device or len(device) > 200:
        raise ParamError({"device": "--device must be 1 to 200 characters"})
    base = {f.name: options[f.name] for f in PARAM_FIELDS if options.get(f.name) is not None}

    def log(line: str) -> None:
        stdout.write(line + "\n")

    stored = calibrate_and_store(
        base,
        device,
        repeats=repeats,
        rounds=rounds,
        where=str(options.get("where") or "this worker")[:200],
        log=log,
        base_url=options.get("base_url") or None,
    )
    c = stored.constants
    stdout.write(format_points(stored.points))
    stdout.write(format_changes(stored.changes))
    stdout.write(f"stored for {device}: {c.label()} (fit error {c.fit_error:.0%})\n")


def default_device(params: LabParams) -> str:
    """The --gpu kind; for gpu cpu this machine's CPU as its CPU worker announces itself."""
    from labs.calibration.jobs import this_device

    return this_device(params)


# Each column: (header, the row's key, its format: alignment, sign, width, then precision/type).
POINT_COLUMNS = (
    ("id", "id", "<4"),
    ("role", "role", "<10"),
    ("what", "what", "<30"),
    ("metric", "metric", "<22"),
    ("measured", "measured", ">12.5g"),
    ("simulated", "predicted", ">12.5g"),
    ("error", "error", ">+9.1%"),
)
CHANGE_COLUMNS = (
    ("change", "what", "<42"),
    ("metric", "metric", "<22"),
    ("measured", "measured_change", ">+10.1%"),
    ("simulated", "simulated_change", ">+11.1%"),
    ("ratio err", "error", ">+10.1%"),
    ("change err", "change_error", ">+11.1%"),
)
_ALIGN_AND_WIDTH = re.compile(r"([<>^])[+ -]?(\d+)")


def format_table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str, str], ...]) -> str:
    """A header line, then a line per row: each column's value in its format, the header in
    that format's alignment and width."""

    def header(title: str, spec: str) -> str:
        found = _ALIGN_AND_WIDTH.match(spec)
        assert found is not None, spec
        return f"{title:{found[1]}{found[2]}}"

    lines = ["".join(header(title, spec) for title, _, spec in columns)]
    lines += ["".join(f"{row[key]:{spec}}" for _, key, spec in columns) for row in rows]
    return "\n".join(lines) + "\n"


def format_points(points: list[dict[str, Any]]) -> str:
    """Each sweep point: measured, simulated with the fitted constants, and the error."""
    return format_table(points, POINT_COLUMNS)


def format_changes(rows: list[dict[str, Any]]) -> str:
    """The lessons' changes: measured, simulated with the fitted constants, and how far off."""
    return format_table(rows, CHANGE_COLUMNS)
