"""`lab serve-args`: the `vllm serve` command the vllm backend would start for the options.

    python manage.py lab serve-args --model llama-3-8b --block-size 32 --json

Runs nothing. With --json, the argument list as a JSON array; without it, one shell-quoted
line to paste. The port is the backend's choice at start (a free one); --port sets the one
shown. Settings vLLM cannot run are refused like any bad option, naming the field.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Mapping
from typing import Any, TextIO

from labs.backends import server_argv, server_port
from labs.cli import add_param_options, params_from_args

HELP = "print the vllm serve arguments the vllm backend would use for the options (runs nothing)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_param_options(parser)
    port = server_port("vllm")
    parser.add_argument("--port", type=int, default=port, help=f"port to show (default {port})")
    parser.add_argument(
        "--model-path",
        default=None,
        help="a model directory with real weights instead of the bundled config (as a worker's "
        "LABS_VLLM_MODEL_DIR_<SLUG>)",
    )
    parser.add_argument("--json", action="store_true", help="print the arguments as a JSON array")


def run(options: Mapping[str, Any], stdout: TextIO) -> None:
    """Print the argument list. Raises ParamError for bad options."""
    params = params_from_args(options)
    argv = server_argv(
        "vllm",
        params,
        model_path=options.get("model_path"),
        executable=os.environ.get("VLLM_EXECUTABLE") or "vllm",
        port=int(options.get("port") or 0) or None,
    )
    stdout.write((json.dumps(argv) if options.get("json") else shlex.join(argv)) + "\n")
