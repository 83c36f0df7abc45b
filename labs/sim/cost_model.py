"""How long a step takes, from the batch it actually ran.

A cost model prices a step from its SchedulerOutput. Two exist:

- `labs.sim.engine_model.EngineModel` on the `realistic` profile: kernel efficiencies, per-step
  and per-sequence costs, attention, tensor-parallel all-reduces, calibrated to published vLLM
  runs (labs/sim/calibration.yaml). The simulator's default.
- `RooflineCostModel` (= EngineModel on the `ideal` profile): the predictor's own
  `labs.prediction.predict.step_time_s`, so the simulator then differs from the formulas only
  through queueing, batching and chunking:

      step = max(2 x active params x (prefill + verified tokens) / FLOP/s,
                 (weights read once + each sequence's KV read) / bandwidth)
             + fixed per-step overhead (the lab's step_overhead_ms, 0 by default)
             + k x c x (a decode step over the speculating sequences)   when drafting

Both also price many steps at once (`steps_time_s`) and split steps into parts
(`steps_parts_s`, columns labs.sim.engine_model.PARTS) for the run's breakdown.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from labs.parameters.catalog import Hardware, ModelSpec
from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import EngineConfig
from labs.sim.engine_model import PARTS, EngineModel, load_calibration, with_device
from labs.sim.scheduler import SchedulerOutput


class CostModel(Protocol):
    def step_time_s(self, out: SchedulerOutput) -> float:
        """Seconds the step `out` takes."""
        ...

    def steps_time_s(
        self, out: SchedulerOutput, kv_tokens_read: ArrayLike, spec_kv_tokens_read: ArrayLike
    ) -> np.ndarray:
        """Seconds of len(kv_tokens_read) steps composed like `out` except for their KV totals
        (the simulator's runs of plain decode steps, unless it goes step by step)."""
        ...


@runtime_checkable
class PartsCostModel(CostModel, Protocol):
    """A cost model that can say what each step's time is made of."""

    def steps_parts_s(
        self, out: SchedulerOutput, kv_tokens_read: ArrayLike, spec_kv_tokens_read: ArrayLike
    ) -> np.ndarray: ...

    def prefill_share_s(self, out: SchedulerOutput) -> float: ...


class CompositionCostModel(CostModel, Protocol):
    """A cost model that prices a step without drafts from its totals alone (what steady steps
    need: labs/sim/steady.py)."""

    def composition_parts_s(
        self, num_tokens: int, num_prefill_tokens: int, num_seqs: int, kv: int, pairs: int
    ) -> tuple[float, ...]: ...

    def composition_share_s(
        self, step_s: float, num_decode_tokens: int, num_alone: int, kv_alone: int
    ) -> float: ...


class RooflineCostModel(EngineModel):
    """Step time from the step's composition via the predictor's shared cost function.

    Args:
        hardware: one GPU of the replica.
        model: the model served.
        engine: dtypes, tp, efficiencies, overhead and the draft cost c.
    """

    def __init__(self, hardware: Hardware, model: ModelSpec, engine: EngineConfig) -> None:
        super().__init__(hardware, model, engine, profile="ideal")


def build_cost_model(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    device: DeviceConstants | None = None,
) -> EngineModel:
    """The cost model of `engine.sim_profile`; on the realistic profile, priced with `device`'s
    own fitted constants when the lab's GPU has them (labs/parameters/device_calibration.py)."""
    if engine.sim_profile == "ideal":
        # The engine the predicted column describes: with the device's own knobs where it has a
        # calibration, as labs.prediction.predict.predict applies them.
        if device is not None:
            engine = device.predictor_engine(engine)
        return RooflineCostModel(hardware, model, engine)
    calibration = None
    if device is not None:
        calibration = with_device(load_calibration(), hardware, device)
    return EngineModel(hardware, model, engine, profile=engine.sim_profile, calibration=calibration)


def step_parts_s(cost_model: CostModel, out: SchedulerOutput) -> tuple[np.ndarray, float]:
    """(parts of the step, its prefill share) from any cost model: one that only knows step
    times puts the whole step in the first part ("ideal") and shares nothing."""
    if isinstance(cost_model, PartsCostModel):
        parts = cost_model.steps_parts_s(out, [out.kv_tokens_read], [out.spec_kv_tokens_read])[0]
        return parts, cost_model.prefill_share_s(out)
    parts = np.zeros(len(PARTS))
    parts[0] = cost_model.step_time_s(out)
    return parts, 0.0
