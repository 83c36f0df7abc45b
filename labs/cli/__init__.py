"""Command-line options for the `lab` command, generated from labs.parameters.params.PARAM_FIELDS.

`add_param_options(parser)` gives every lab parameter an option (`block_size` -> `--block-size`;
booleans also get `--no-...`), all parsed as plain strings so that `parse_lab_params` stays the
one place that validates them. `lab predict` and `lab run` share these options.

Each subcommand module (`labs.cli.predict`, ...) has `add_arguments(parser)` and
`run(options, stdout)`; the management command `lab` only dispatches to them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import (
    FIELDS_BY_NAME,
    PARAM_FIELDS,
    LabParams,
    ParamError,
    ParamField,
    parse_lab_params,
)

_GROUP_TITLES = {
    "model": "model (a catalog name, or a custom model from its numbers)",
    "hardware": "hardware (one GPU of a replica)",
    "engine": "engine",
    "workload": "workload",
}
_METAVAR = {"int": "N", "float": "F", "choice": "NAME"}


def _help(f: ParamField) -> str:
    parts = [f.help]
    if f.unit:
        parts.append(f"in {f.unit}")
    parts.append(f.allowed())
    if f.default is not None:
        default = str(f.default).lower() if isinstance(f.default, bool) else f.default
        parts.append(f"default {default}")
    # argparse treats % as a format character in help text.
    return "; ".join(parts).replace("%", "%%")


def add_param_options(parser: argparse.ArgumentParser) -> None:
    """Add one option per lab parameter, grouped as model, hardware, engine, workload."""
    groups = {key: parser.add_argument_group(title) for key, title in _GROUP_TITLES.items()}
    for f in PARAM_FIELDS:
        group = groups[f.group]
        if f.kind == "bool":
            group.add_argument(
                f.option,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=_help(f),
            )
        else:
            group.add_argument(
                f.option, dest=f.name, default=None, metavar=_METAVAR[f.kind], help=_help(f)
            )


def params_from_args(options: argparse.Namespace | Mapping[str, object]) -> LabParams:
    """LabParams from parsed options (a Namespace or a dict such as Django's **options).

    Raises:
        ParamError: as parse_lab_params does.
    """
    values = vars(options) if isinstance(options, argparse.Namespace) else options
    given = {f.name: values[f.name] for f in PARAM_FIELDS if values.get(f.name) is not None}
    return parse_lab_params(given)


def stored_calibration(params: LabParams) -> DeviceConstants | None:
    """The calibration stored for the device these settings run on, as the pages use it; None
    without a database to read: `lab predict` and `lab run` also serve scripts run before any
    migration, and then no device has a calibration of its own."""
    from django.db import DatabaseError

    from labs.runs.selectors import lab_calibration

    try:
        return lab_calibration(params)
    except DatabaseError:
        return None


def error_line(error: ParamError) -> str:
    """One line naming each bad option and what it allows."""
    parts = []
    for name, message in error.errors.items():
        f = FIELDS_BY_NAME.get(name)
        parts.append(f"{f.option}: {message}" if f else message)
    return "; ".join(parts)
