"""Random lab forms for the simulator's equivalence test: the settings
labs/explanation/form_draws.py draws across the whole lab form (every field, validated as the form
validates them), on either sim profile, sized so the simulator takes a run step by step in a
fraction of a second.

Beyond those, more often a KV pool of one to a few of the longest requests (so admission waits
on blocks and running requests preempt one another) and, beyond the form, sometimes a calibrated
draft share below 1 and a device calibration with a front end (its latency, its cost per stream
in flight, its CPU time taken from a busy engine), which only a worker's own sweep sets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import TypeVar

import numpy as np

from labs.explanation.form_draws import DRAW_RUN_MB, draw_values
from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import LabParams, ParamError, align_run_batch, parse_lab_params
from labs.prediction.sizing import sim_precheck, sim_steps
from labs.sim.lab import build_simulator

T = TypeVar("T")
# The most simulated work (labs.prediction.sizing.sim_steps) a draw may take: step by step, a
# fraction of a second.
MAX_STEPS = 4000


@dataclass(frozen=True)
class LabDraw:
    form: dict[str, object]  # as the form posts it
    params: LabParams
    device: DeviceConstants | None  # the GPU's own calibration, if drawn


def _pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    return options[int(rng.integers(len(options)))]


def draw_form(rng: np.random.Generator) -> dict[str, object]:
    """One lab form: labs/explanation/form_draws.py's, on a sim profile drawn, half the time with a
    KV pool of one to two and a half of its longest requests."""
    form = draw_values(rng)
    form["sim_profile"] = _pick(rng, ["realistic", "ideal"])
    if rng.random() < 0.5:
        prompt, output = int(form["prompt_tokens"]), int(form["output_tokens"])  # type: ignore[call-overload]
        longest = math.floor(prompt * (1 + float(form.get("input_range_ratio", 0.0))))  # type: ignore[arg-type]
        if form.get("kv_allocation") == "contiguous":
            longest += int(form["max_tokens"])  # type: ignore[call-overload]
        else:
            longest += math.floor(output * (1 + float(form.get("output_range_ratio", 0.0))))  # type: ignore[arg-type]
        block = int(form["block_size"])  # type: ignore[call-overload]
        form["kv_capacity_tokens"] = int(longest * rng.uniform(1.0, 2.5)) + block
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
    """A lab the simulator runs cheaply: forms are drawn until the form's validation accepts
    one, its run passes the form's size check and its work is at most MAX_STEPS."""
    while True:
        form = draw_form(rng)
        try:
            params = parse_lab_params(align_run_batch(form))
            sim_precheck(params, max_run_mb=DRAW_RUN_MB)
        except ParamError:
            continue
        if sim_steps(params) > MAX_STEPS:
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
