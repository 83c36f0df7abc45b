"""Synthetic workloads in the manner of `vllm bench serve --dataset-name random`.

- Lengths: fixed, or drawn uniformly from len x [1 - r, 1 + r] (`--random-range-ratio`).
- A shared prefix: the first `shared_prefix_tokens` of every prompt are identical.
- Arrivals: all at t = 0 (no rate, bench's default), Poisson at `request_rate` (exponential gaps,
  the first request at 0), and/or closed loop: at most `max_concurrency` requests in flight, the
  next one issued when one finishes (the simulator applies that limit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labs.parameters.params import Workload


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate. Lengths in tokens; `request_rate` None = all at once."""

    num_prompts: int
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None  # the cap a contiguous allocator reserves (None: output_tokens)
    input_range_ratio: float = 0.0
    output_range_ratio: float = 0.0
    shared_prefix_tokens: int = 0
    request_rate: float | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True)
class GeneratedWorkload:
    """One concrete draw of a WorkloadSpec: per-request arrays in issue order."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    max_tokens: np.ndarray
    intended_arrival_s: np.ndarray  # when the client wants to send each request (sorted)
    shared_prefix_tokens: int = 0
    max_concurrency: int | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)


def _lengths(mean: int, ratio: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if ratio == 0:
        return np.full(n, mean, dtype=np.int64)
    low = max(1, math.ceil(mean * (1 - ratio)))
    high = math.floor(mean * (1 + ratio))
    return rng.integers(low, high + 1, size=n, dtype=np.int64)


def generate_workload(spec: WorkloadSpec, rng: np.random.Generator) -> GeneratedWorkload:
    """Draw prompt and output lengths, then arrival times, from `rng` (in that order).

    Args:
        spec: the workload's shape.
        rng: the only source of randomness; the same seed gives the same workload.

    Returns:
        Per-request arrays. max_tokens is at least each request's output length.
    """
    n = spec.num_prompts
    if n < 1:
        raise ValueError(f"num_prompts must be at least 1, got {n}")
    prompts = _lengths(spec.prompt_tokens, spec.input_range_ratio, n, rng)
    outputs = _lengths(spec.output_tokens, spec.output_range_ratio, n, rng)
    if spec.shared_prefix_tokens > prompts.min():
        raise ValueError("shared_prefix_tokens must be at most the shortest prompt")
    cap = spec.max_tokens if spec.max_tokens is not None else 0
    max_tokens = np.maximum(outputs, cap)
    if spec.request_rate is None:
        arrivals = np.zeros(n)
    else:
        gaps = rng.exponential(1.0 / spec.request_rate, size=n - 1)
        arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    return GeneratedWorkload(
        prompt_tokens=prompts,
        output_tokens=outputs,
        max_tokens=max_tokens,
        intended_arrival_s=arrivals,
        shared_prefix_tokens=spec.shared_prefix_tokens,
        max_concurrency=spec.max_concurrency,
    )


def lab_workload(work: Workload) -> GeneratedWorkload:
    """The requests of a lab's workload.

    NOTE: drawn from the first child stream of the seed (SeedSequence(seed).spawn(...)[0]), so
    every backend that draws its requests here sends the same ones for the same seed; later
    streams are free for each backend's own randomness.
    """
    spec = WorkloadSpec(
        num_prompts=work.num_prompts,
        prompt_tokens=work.prompt_tokens,
        output_tokens=work.output_tokens,
        max_tokens=work.max_tokens,
        input_range_ratio=work.input_range_ratio,
        output_range_ratio=work.output_range_ratio,
        shared_prefix_tokens=work.shared_prefix_tokens,
        request_rate=work.request_rate,
        max_concurrency=work.max_concurrency,
    )
    (stream,) = np.random.SeedSequence(work.seed).spawn(1)
    return generate_workload(spec, np.random.default_rng(stream))
