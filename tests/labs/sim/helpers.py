"""Tiny simulator set-ups for the sim tests: hand-sized workloads and a cost model whose step
times are easy to add up by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from labs.sim.scheduler import SchedulerConfig, SchedulerOutput
from labs.sim.simulator import Simulator, StepInfo
from labs.sim.workload import GeneratedWorkload


class LinearCost:
    """step = fixed_s + per_token_s x tokens scheduled (1 s per step by default)."""

    def __init__(self, fixed_s: float = 1.0, per_token_s: float = 0.0) -> None:
        self.fixed_s = fixed_s
        self.per_token_s = per_token_s

    def step_time_s(self, out: SchedulerOutput) -> float:
        return self.fixed_s + self.per_token_s * out.total_num_scheduled_tokens


def make_workload(
    prompts: Sequence[int],
    outputs: Sequence[int],
    arrivals: Sequence[float] | None = None,
    *,
    max_tokens: Sequence[int] | None = None,
    shared_prefix_tokens: int = 0,
    max_concurrency: int | None = None,
) -> GeneratedWorkload:
    n = len(prompts)
    return GeneratedWorkload(
        prompt_tokens=np.array(prompts, dtype=np.int64),
        output_tokens=np.array(outputs, dtype=np.int64),
        max_tokens=np.array(max_tokens if max_tokens is not None else outputs, dtype=np.int64),
        intended_arrival_s=np.array(arrivals if arrivals is not None else [0.0] * n),
        shared_prefix_tokens=shared_prefix_tokens,
        max_concurrency=max_concurrency,
    )


def make_sim(
    workload: GeneratedWorkload,
    *,
    cost: LinearCost | None = None,
    seed: int = 0,
    on_step: Callable[[StepInfo], None] | None = None,
    **config: object,
) -> Simulator:
    defaults: dict[str, object] = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 16,
        "num_gpu_blocks": 64,
        "block_size": 4,
        "prefix_caching": False,
    }
    return Simulator(
        SchedulerConfig(**{**defaults, **config}),  # type: ignore[arg-type]
        workload,
        cost or LinearCost(),
        np.random.default_rng(seed),
        on_step=on_step,
    )


def record_steps(steps: list[dict[int, int]]) -> Callable[[StepInfo], None]:
    """An observer appending each step's {request index: tokens scheduled} to `steps`."""
    return lambda info: steps.append(info.output.as_dict())
