"""`lab predict`: the closed-form predictions for one set of lab parameters.

With --json, one JSON object with every key of `Prediction.as_dict()` (bytes, seconds, tokens);
without it, a table in readable units (GiB, ms, tokens/s).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import TextIO

from labs.cli import add_param_options, params_from_args, stored_calibration
from labs.explanation.results import load_label
from labs.parameters.params import LabParams, align_run_batch
from labs.prediction.device_speculation import lab_prediction_on, priced_params
from labs.prediction.predict import Prediction, predict

HELP = "print the closed-form predictions (KV memory, capacity, TTFT, TPOT, ...) for the options"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_param_options(parser)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (bytes, seconds, tokens)"
    )


def run(options: Mapping[str, object], stdout: TextIO) -> None:
    """Print the prediction. Raises ParamError for bad options."""
    # One batch for prediction and run, as the lab pages and `lab run` take them.
    params = params_from_args(align_run_batch(options))
    device = stored_calibration(params)
    if options.get("json"):
        # The one prediction the lab pages, runs and cards show (predict() plus its parts).
        stdout.write(json.dumps(lab_prediction_on(params, device)) + "\n")
    else:
        stdout.write(format_table(params, predict(priced_params(params, device), device)))


def _bytes(value: float) -> str:
    if abs(value) >= 2**30:
        # GB too: data sheets and the deck's worked answers count in 10^9 bytes.
        return f"{value / 2**30:,.2f} GiB ({value / 1e9:,.2f} GB)"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} bytes"


def _seconds(value: float) -> str:
    return f"{value:,.2f} s" if value >= 1 else f"{value * 1000:,.2f} ms"


def _count(unit: str) -> Callable[[float], str]:
    return lambda value: f"{value:,} {unit.removesuffix('s') if value == 1 else unit}"


def _ratio(value: float) -> str:
    return f"{value:,.2f}x"


_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("kv_bytes_per_token", "KV cache per token", _bytes),
    ("kv_bytes_per_seq", "KV cache per sequence (context_tokens)", _bytes),
    ("blocks_per_seq", "blocks per sequence (prompt + output)", _count("blocks")),
    ("slots_wasted_per_seq", "slots wasted in the last block", _count("slots")),
    ("contiguous_reserved_slots", "contiguous reservation (prompt + max_tokens)", _count("slots")),
    ("contiguous_wasted_slots", "contiguous slots wasted", _count("slots")),
    ("contiguous_waste_fraction", "contiguous waste", lambda v: f"{v:.1%}"),
    ("weight_bytes", "weights", _bytes),
    ("kv_memory_bytes", "memory left for KV cache (per replica)", _bytes),
    ("kv_capacity_tokens", "KV capacity", _count("tokens")),
    ("max_concurrent_seqs", "most concurrent sequences", _count("sequences")),
    ("contiguous_max_concurrent_seqs", "same with contiguous reservations", _count("sequences")),
    ("running_seqs", "most sequences running at once", _count("sequences")),
    ("replicas_needed", "replicas for the concurrency", _count("replicas")),
    ("gpus_needed", "GPUs for the concurrency", _count("GPUs")),
    ("prefix_cached_tokens", "prompt tokens from the prefix cache", _count("tokens")),
    ("prefill_s", "prefill compute", _seconds),
    ("ttft_s", "TTFT (one request, idle engine)", _seconds),
    ("weight_read_s", "weight read per decode step", _seconds),
    ("kv_read_s", "KV read per decode step", _seconds),
    ("decode_step_s", "decode step", _seconds),
    ("tpot_s", "TPOT", _seconds),
    ("e2e_s", "end to end", _seconds),
    ("capacity_requests_per_s", "requests/s the engine serves", lambda v: f"{v:,.3g} req/s"),
    ("queue_wait_s", "wait before the first step (mean)", _seconds),
    ("loaded_ttft_s", "TTFT under this load (mean)", _seconds),
    ("loaded_ttft_p50_s", "TTFT under this load (median)", _seconds),
    ("loaded_e2e_s", "end to end under this load (mean)", _seconds),
    ("output_tokens_per_s", "output throughput over the run", lambda v: f"{v:,.1f} tokens/s"),
    ("decode_tokens_per_s", "decode throughput of the batch", lambda v: f"{v:,.1f} tokens/s"),
    ("batch_speedup_vs_batch1", "throughput vs batch 1", _ratio),
    ("spec_tokens_per_step", "tokens per target pass (speculation)", lambda v: f"{v:.2f}"),
    ("spec_speedup", "speculation speedup at small batch", _ratio),
    ("spec_speedup_at_batch", "speculation speedup at this batch", _ratio),
)


def _why_not(params: LabParams, prediction: Prediction) -> str:
    if prediction.kv_memory_bytes == 0 and params.engine.kv_capacity_tokens is None:
        return (
            f"the weights ({_bytes(prediction.weight_bytes)}) leave no room for a KV cache; "
            "raise tp or gpu_memory_utilization, or lower weight_dtype"
        )
    return "one sequence of context_tokens (contiguous: prompt + max_tokens) exceeds the KV pool"


def format_table(params: LabParams, prediction: Prediction) -> str:
    e = params.engine
    lines = [
        f"{params.model.name} on {e.tp} x {params.hardware.name}: {e.weight_dtype} weights, "
        f"{e.kv_dtype} KV cache, block_size {e.block_size}, {e.kv_allocation} allocation",
        f"  {load_label(params.as_dict())}",
    ]
    if not prediction.fits:
        lines.append(f"  does not fit: {_why_not(params, prediction)}")
    values = prediction.as_dict()
    width = max(len(label) for _, label, _ in _ROWS)
    for key, label, fmt in _ROWS:
        value = values[key]
        if key in prediction.uncovered:
            shown = f"not covered here: {prediction.uncovered[key]}"
        elif value is None:
            shown = "- (does not fit)" if not prediction.fits else "-"
        else:
            shown = fmt(value)  # type: ignore[arg-type]
        lines.append(f"  {label:<{width}}  {shown}")
    lines.append(f"  {'binding resource':<{width}}  {prediction.bound}")
    if prediction.regime:
        lines.append(f"  {'what sets the pace':<{width}}  {prediction.regime}")
    return "\n".join(lines) + "\n"
