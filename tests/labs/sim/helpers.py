"""Tiny simulator set-ups for the sim tests: hand-sized workloads and a cost model whose step
times are easy to add up by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from labs.backends.base import RunRecord
from labs.sim.engine_model import PARTS
from labs.sim.scheduler import SchedulerConfig, SchedulerOutput
from labs.sim.simulator import Simulator, StepInfo
from labs.sim.workload import GeneratedWorkload


class LinearCost:
    """step = fixed_s + per_token_s x tokens scheduled + per_kv_s x KV tokens read (+ the same
    per speculating sequence's KV); 1 s per step by default."""

    def __init__(
        self, fixed_s: float = 1.0, per_token_s: float = 0.0, per_kv_s: float = 0.0
    ) -> None:
        self.fixed_s = fixed_s
        self.per_token_s = per_token_s
        self.per_kv_s = per_kv_s

    def step_time_s(self, out: SchedulerOutput) -> float:
        return float(self.steps_time_s(out, [out.kv_tokens_read], [out.spec_kv_tokens_read])[0])

    def steps_time_s(
        self, out: SchedulerOutput, kv_tokens_read: np.ndarray, spec_kv_tokens_read: np.ndarray
    ) -> np.ndarray:
        kv = np.asarray(kv_tokens_read, dtype=np.int64) + np.asarray(spec_kv_tokens_read)
        return self.fixed_s + self.per_token_s * out.total_num_scheduled_tokens + self.per_kv_s * kv

    def composition_parts_s(
        self, num_tokens: int, num_prefill_tokens: int, num_seqs: int, kv: int, pairs: int
    ) -> tuple[float, ...]:
        """A step without drafts from its totals (what lets the simulator take steady steps):
        all of it in the first part, as step_parts_s puts a time-only model's step."""
        step_s = self.fixed_s + self.per_token_s * num_tokens + self.per_kv_s * kv
        return (step_s,) + (0.0,) * (len(PARTS) - 1)

    def composition_share_s(
        self, step_s: float, num_decode_tokens: int, num_alone: int, kv_alone: int
    ) -> float:
        """No prefill share, as step_parts_s gives a time-only model."""
        return 0.0


def composition(num_seqs: int, num_prefill: int, num_decode: int, kv_read: int) -> SchedulerOutput:
    """A SchedulerOutput with a step's totals (what the cost models price); the per-sequence
    arrays only have the right length."""
    filler = np.zeros(num_seqs, dtype=np.int64)
    return SchedulerOutput(
        req_indices=filler,
        num_scheduled_tokens=filler,
        num_draft_tokens=filler,
        num_computed_before=filler,
        num_prefill_tokens=num_prefill,
        num_decode_tokens=num_decode,
        kv_tokens_read=kv_read,
    )


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
    step_by_step: bool | None = None,
    **config: object,
) -> Simulator:
    """A simulator over `workload`; with an `on_step` observer it schedules every step on its own
    (unless `step_by_step` says otherwise), so the observer sees them all."""
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
        step_by_step=on_step is not None if step_by_step is None else step_by_step,
    )


def record_steps(steps: list[dict[int, int]]) -> Callable[[StepInfo], None]:
    """An observer appending each step's {request index: tokens scheduled} to `steps`."""
    return lambda info: steps.append(info.output.as_dict())


def assert_same_record(fast: RunRecord, slow: RunRecord) -> None:
    """The fast path's record is the step-by-step one: every request's token counts, cached
    tokens and preemptions exactly, its token times (first token included), arrival and finish
    within 1e-9 s; the engine counters exactly; the engine samples, duration and step count."""
    assert len(fast.requests) == len(slow.requests)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.req_id == b.req_id
        assert np.array_equal(a.chunks.tokens, b.chunks.tokens), a.req_id
        np.testing.assert_allclose(
            a.chunks.times_s, b.chunks.times_s, rtol=0, atol=1e-9, err_msg=f"{a.req_id}'s times"
        )
        assert a.arrival_s == pytest.approx(b.arrival_s, abs=1e-9), a.req_id
        assert a.finish_s == pytest.approx(b.finish_s, abs=1e-9), a.req_id
        assert (a.cached_prompt_tokens, a.preemptions) == (b.cached_prompt_tokens, b.preemptions)
    assert fast.counters == slow.counters
    assert len(fast.samples) == len(slow.samples)
    for x, y in zip(fast.samples, slow.samples, strict=True):
        assert (x.running, x.waiting, x.kv_blocks_used) == (y.running, y.waiting, y.kv_blocks_used)
        assert x.scheduled_tokens == y.scheduled_tokens
        assert x.kv_usage == y.kv_usage
        assert x.t_s == pytest.approx(y.t_s, abs=1e-9)
    assert fast.duration_s == pytest.approx(slow.duration_s, abs=1e-9)
    assert fast.meta["steps"] == slow.meta["steps"]


def assert_same_breakdown(
    fast_sim: Simulator, fast: RunRecord, slow_sim: Simulator, slow: RunRecord
) -> None:
    """Every request's time breakdown (E2E and TPOT parts) agrees within 1e-9 relative, and its
    E2E parts add up to its measured E2E."""
    for a, b in zip(
        fast_sim.breakdown.per_request(fast.requests),
        slow_sim.breakdown.per_request(slow.requests),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)
    e2e, _ = fast_sim.breakdown.per_request(fast.requests)
    measured = np.array([r.finish_s - r.arrival_s for r in fast.requests])
    np.testing.assert_allclose(e2e.sum(axis=1), measured, rtol=1e-9, atol=1e-12)
    assert fast.meta["breakdown"] is not None
