"""The simulator set up for a lab: a Simulator built from validated lab parameters (the sim
backend's runs, the published and a device's calibrations), and where a finished run's time went
for any backend.

The KV pool is the predictor's KV capacity (or `kv_capacity_tokens`) in whole blocks; steps are
priced by the engine model of the lab's `sim_profile`. One seed drives two independent streams,
the workload's lengths and arrivals (`lab_workload`, shared with the vllm backend) and the run's
draft acceptance, so changing speculation settings does not change the requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from labs.backends.base import ProgressCallback, RunRecord
from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import LabParams, ParamError
from labs.prediction.predict import kv_capacity_tokens
from labs.sim.cost_model import build_cost_model
from labs.sim.engine_model import Calibration, load_calibration
from labs.sim.scheduler import SchedulerConfig
from labs.sim.simulator import SimConfigError, Simulator, StepInfo
from labs.sim.workload import lab_workload


def build_simulator(
    params: LabParams,
    *,
    on_progress: ProgressCallback | None = None,
    on_step: Callable[[StepInfo], None] | None = None,
    device: DeviceConstants | None = None,
    calibration: Calibration | None = None,
    host: str | None = None,
) -> Simulator:
    """A Simulator for validated lab parameters; `device` = the lab's GPU's own calibration,
    `calibration` = the published one to price with (default: labs/sim/calibration.yaml),
    `host` = the published host whose front end the requests pass (default: the API server's
    default; a published run names its own source's).

    Raises:
        ParamError: the KV pool cannot hold even one request (naming kv_capacity_tokens).
    """
    engine, work = params.engine, params.workload
    capacity = kv_capacity_tokens(params.model, params.hardware, engine)
    num_blocks = capacity // engine.block_size
    if num_blocks < 1:
        raise ParamError(
            {
                "kv_capacity_tokens": "kv_capacity_tokens must be at least one block "
                f"({engine.block_size} tokens): the weights leave {capacity:,} tokens of KV "
                "cache; raise tp or gpu_memory_utilization, or lower weight_dtype"
            }
        )
    config = SchedulerConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        num_gpu_blocks=num_blocks,
        block_size=engine.block_size,
        chunked_prefill=engine.chunked_prefill,
        prefix_caching=engine.prefix_caching,
        kv_allocation=engine.kv_allocation,
        num_spec_tokens=engine.spec_tokens,
        spec_acceptance=engine.acceptance,
        spec_draft_share=engine.draft_share,
    )
    # The seed's first stream draws the requests (lab_workload), the second draft acceptance.
    _, run_seed = np.random.SeedSequence(work.seed).spawn(2)
    workload = lab_workload(work)
    frontend_latency_s, frontend_per_stream_s = frontend_s(params, device, calibration, host)
    try:
        return Simulator(
            config,
            workload,
            build_cost_model(params.hardware, params.model, engine, device),
            np.random.default_rng(run_seed),
            on_progress=on_progress,
            on_step=on_step,
            frontend_latency_s=frontend_latency_s,
            frontend_per_stream_s=frontend_per_stream_s,
            frontend_cpu_s=(device.frontend_cpu_s or 0.0) if device else 0.0,
        )
    except SimConfigError as error:
        raise ParamError({error.field: str(error)}) from None


def frontend_s(
    params: LabParams,
    device: DeviceConstants | None,
    calibration: Calibration | None = None,
    host: str | None = None,
) -> tuple[float, float]:
    """(latency, per other stream in flight) of the front end in front of the engine: a host's
    own, never the GPU's. A device's own calibration measured its worker's host; otherwise the
    published `host` (a published run's source), else the default API server. The ideal
    profile, the engine the predicted column describes, has no front end."""
    if params.engine.sim_profile == "ideal":
        return 0.0, 0.0
    if device is not None:
        return device.frontend_latency_s or 0.0, device.frontend_per_stream_s or 0.0
    return (calibration or load_calibration()).frontend(host)


def run_breakdown(
    params: LabParams,
    record: RunRecord,
    measured: dict[str, Any],
    device: DeviceConstants | None = None,
) -> dict[str, Any] | None:
    """Where a finished run's time went (labs/sim/breakdown.py), for any backend.

    A simulated run knows its parts step by step (record.meta["breakdown"]). For a real run the
    same workload is simulated on the realistic profile to get the expected parts (priced with
    `device`, the GPU's own calibration, when it has one), and what the measurement has beyond
    them is shown as "unexplained" (negative when the GPU beat the model). `calibrated` says
    whether those parts were priced by constants fitted to this kind of device at all (its own
    calibration, or published vLLM runs of its kind): "why they differ" sizes no part when not.
    """
    if record.simulated:
        return record.meta.get("breakdown")
    realistic = replace(params, engine=replace(params.engine, sim_profile="realistic"))
    try:
        expected = build_simulator(realistic, device=device).run().meta["breakdown"]
    except (ParamError, ValueError, RuntimeError, MemoryError):
        return None  # the expected parts are extra: never fail a measured run over them
    result: dict[str, Any] = {**expected, "source": "expected"}
    for key in ("e2e_s", "tpot_s", "ttft_s"):
        section = expected.get(key)
        value = (measured.get(key) or {}).get("mean")
        if not section or value is None:
            result[key] = None
            continue
        parts = dict(section["parts"])
        parts["unexplained"] = value - section["total"]
        result[key] = {"total": value, "parts": parts}
    result["parts"] = [*expected["parts"], "unexplained"]
    result["calibrated"] = device is not None or load_calibration().gpu(params.hardware).calibrated
    return result
