"""Random lab forms: settings drawn across the whole lab form, each a form a learner could submit,
sized so the simulator takes it step by step in a fraction of a second.

Every engine setting the simulator reads is drawn (model, GPU or a custom one, tp, dtypes, memory
share, block size, max_num_seqs, token budget, chunked prefill, prefix caching with a shared
prefix, paged or contiguous KV, a KV pool small enough to preempt, speculation, the sim profile,
efficiencies and step overhead), and every kind of load (all at once, a request rate, a
concurrency cap, both), with lengths fixed or drawn from a range. Beyond the form, sometimes a
calibrated draft share below 1 and a device calibration with a front end (its latency, its cost
per stream in flight, its CPU time taken from a busy engine), which only a worker's own sweep sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import TypeVar

import numpy as np

from labs.catalog import GPUS, MODELS
from labs.device_calibration import DeviceConstants
from labs.params import LabParams, ParamError, parse_lab_params
from labs.sim.lab import build_simulator

T = TypeVar("T")


@dataclass(frozen=True)
class LabDraw:
    form: dict[str, object]  # as submitted
    params: LabParams
    device: DeviceConstants | None  # the GPU's own calibration, if drawn


def _pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    return options[int(rng.integers(len(options)))]


def _log_int(rng: np.random.Generator, low: int, high: int) -> int:
    return round(float(np.exp(rng.uniform(np.log(low), np.log(high)))))


def draw_form(rng: np.random.Generator) -> dict[str, object]:
    """One lab form (raw values, as a learner could submit them; some the parser refuses)."""
    prompt, output = _log_int(rng, 1, 1536), _log_int(rng, 1, 160)
    ratio_in, ratio_out = _pick(rng, [0.0, 0.0, 0.5, 0.9]), _pick(rng, [0.0, 0.0, 0.5, 0.9])
    longest_prompt, longest_output = int(prompt * (1 + ratio_in)), int(output * (1 + ratio_out))
    block = _pick(rng, [1, 2, 4, 8, 16, 16, 32, 64, 128])
    chunked = bool(rng.random() < 0.7)
    contiguous = bool(rng.random() < 0.15)
    max_tokens = output * 2 + int(rng.integers(0, 64))
    form: dict[str, object] = {
        "model": _pick(rng, list(MODELS)),
        "gpu": _pick(rng, list(GPUS)),
        "tp": _pick(rng, [1, 1, 2, 4, 8]),
        "weight_dtype": _pick(rng, ["bf16", "bf16", "fp8", "int4"]),
        "kv_dtype": _pick(rng, ["auto", "fp8"]),
        "gpu_memory_utilization": _pick(rng, [0.9, 0.9, 0.5]),
        "sim_profile": _pick(rng, ["realistic", "ideal"]),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "input_range_ratio": ratio_in,
        "output_range_ratio": ratio_out,
        "max_tokens": max_tokens,
        "num_prompts": int(rng.integers(1, 41)),
        "max_num_seqs": _pick(rng, [1, 2, 4, 8, 16, 64, 256]),
        "block_size": block,
        "chunked_prefill": chunked,
        "prefix_caching": bool(rng.random() < 0.6),
        "kv_allocation": "contiguous" if contiguous else "paged",
        "seed": int(rng.integers(0, 2**32)),
    }
    if rng.random() < 0.1:
        form.update(gpu="custom", hbm_gb=48, bandwidth_tbs=1.2, tflops=300)
    if rng.random() < 0.2:
        form.update(
            step_overhead_ms=_pick(rng, [0.0, 0.5, 3.0]),
            compute_efficiency=_pick(rng, [1.0, 0.6]),
            bandwidth_efficiency=_pick(rng, [1.0, 0.8]),
        )
    budget = _pick(rng, [8, 32, 128, 512, 2048, 8192])
    # Without chunked prefill the parser asks for a budget that holds the longest prompt.
    form["max_num_batched_tokens"] = budget if chunked else max(budget, longest_prompt + 1)
    arrivals = _pick(rng, ["at-once", "rate", "concurrency", "rate-capped"])
    if arrivals in ("rate", "rate-capped"):
        form["request_rate"] = round(float(np.exp(rng.uniform(np.log(0.5), np.log(400)))), 3)
    if arrivals in ("concurrency", "rate-capped"):
        form["max_concurrency"] = _pick(rng, [1, 2, 4, 8, 32])
    if rng.random() < 0.4:
        shortest = max(1, int(prompt * (1 - ratio_in)))
        form["shared_prefix_tokens"] = int(rng.integers(0, shortest + 1))
    if rng.random() < 0.35:
        form["spec_tokens"] = _pick(rng, [1, 2, 3, 5, 8])
        form["spec_method"] = _pick(rng, ["draft_model", "eagle", "ngram"])
        form["acceptance"] = _pick(rng, [0.0, 0.3, 0.7, 0.95])
    if rng.random() < 0.5:
        # A pool of one to a few of the longest requests: admission waits on blocks, and
        # running requests preempt one another.
        longest = longest_prompt + (max_tokens if contiguous else longest_output)
        form["kv_capacity_tokens"] = int(longest * rng.uniform(1.0, 4.0)) + 2 * block
    return form


def _device(rng: np.random.Generator, params: LabParams) -> DeviceConstants:
    """A device calibration of the lab's GPU with a front end (a CPU worker's, where it takes
    CPU time from a busy engine); the rest of its constants are ordinary ones."""
    return DeviceConstants(
        device=params.hardware.name,
        bandwidth_efficiency=0.8,
        kv_bandwidth_efficiency=0.7,
        gemm_efficiency=0.6,
        decode_step_overhead_s=0.004,
        mixed_step_overhead_s=0.006,
        fitted_on=date(2025, 1, 1),
        fit_error=0.05,
        held_out_error=0.08,
        frontend_latency_s=_pick(rng, [0.0, 0.003, 0.02]),
        frontend_per_stream_s=_pick(rng, [0.0, 0.001]),
        frontend_cpu_s=_pick(rng, [0.0, 0.002, 0.01]),
    )


def draw_lab(rng: np.random.Generator) -> LabDraw:
    """A lab the simulator runs: forms are drawn until the parser accepts one and its KV pool
    holds a request."""
    while True:
        form = draw_form(rng)
        try:
            params = parse_lab_params(form)
        except ParamError:
            continue
        if params.engine.spec_tokens and rng.random() < 0.3:
            share = _pick(rng, [0.3, 0.8])
            params = replace(params, engine=replace(params.engine, draft_share=share))
        device = None
        if params.engine.sim_profile == "realistic" and rng.random() < 0.3:
            device = _device(rng, params)
        try:
            build_simulator(params, device=device)
        except ParamError:
            continue
        return LabDraw(form, params, device)
