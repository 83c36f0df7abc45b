"""How long a step takes, from the batch it actually ran.

The simulator prices every step with the predictor's own `labs.predict.step_time_s` (so the two
can only differ through queueing, batching and chunking, never through a second formula):

    step = max(2 x active params x (prefill + verified tokens) / FLOP/s,
               (weights read once + each sequence's KV read) / bandwidth)
           + fixed per-step overhead
           + k x c x (a decode step over the speculating sequences)   when drafting

The draft term is how `labs.predict` prices speculation too: the drafter runs once per draft
position, and each pass costs c times the target's decode step over the same sequences.
"""

from __future__ import annotations

from typing import Protocol

from labs.catalog import Hardware, ModelSpec
from labs.params import EngineConfig
from labs.predict import step_time_s
from labs.sim.scheduler import SchedulerOutput


class CostModel(Protocol):
    def step_time_s(self, out: SchedulerOutput) -> float:
        """Seconds the step `out` takes."""
        ...


class RooflineCostModel:
    """Step time from the step's composition via the predictor's shared cost function.

    Args:
        hardware: one GPU of the replica.
        model: the model served.
        engine: dtypes, tp, efficiencies, overhead and the draft cost c.
    """

    def __init__(self, hardware: Hardware, model: ModelSpec, engine: EngineConfig) -> None:
        self.hardware = hardware
        self.model = model
        self.engine = engine

    def step_time_s(self, out: SchedulerOutput) -> float:
        hw, model, engine = self.hardware, self.model, self.engine
        seconds = step_time_s(
            hw, model, engine, out.num_prefill_tokens, out.num_decode_tokens, out.kv_tokens_read
        )
        if out.max_num_draft_tokens and engine.draft_cost:
            draft_pass = step_time_s(
                hw, model, engine, 0, out.num_spec_seqs, out.spec_kv_tokens_read
            )
            seconds += out.max_num_draft_tokens * engine.draft_cost * draft_pass
        return seconds
