"""Closed-form serving predictions: the numbers every lab shows as "predicted".

"Predicted" means these formulas, the deck's own arithmetic at the hardware's peak figures:

- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element.
- Blocks per sequence = ceil(tokens / block_size); the last block wastes the rest. A contiguous
  reservation holds prompt + max_tokens slots and wastes what the sequence does not use.
- KV capacity = (HBM x gpu_memory_utilization - weights - activation reserve) / KV bytes per
  token, in whole blocks; concurrent sequences = capacity / blocks per sequence.
- A step takes max(compute, memory) + a fixed overhead, where compute = 2 x active parameters x
  tokens / FLOP/s and memory = (weights read + KV read) / bandwidth (`step_time_s`). Prefill
  is compute-bound, a decode step memory-bound; both come out of the same function.
- E2E = TTFT + TPOT x (output tokens - 1).
- Speculative decoding, k drafts accepted with probability alpha and costing c each relative to
  a target pass: (1 - alpha^(k+1)) / (1 - alpha) tokens per pass, a speedup of that / (k c + 1).

Under the learner's load (`predict_load`): concurrency above the batch runs in waves and waits
whole waves before its first step, a Poisson rate above the engine's capacity builds a queue that
grows for the whole run, and a KV pool smaller than the batch caps the batch. So does a step
token budget (max_num_batched_tokens) that the batch's decodes and prompts fill: that engine
admits as the simulator's scheduler does and starts requests one after another
(`budget_steady`). The idle numbers (`ttft_s`, `e2e_s`: one request on an idle engine) stay as
the deck's cards use them.

Left out on purpose: attention FLOPs (small next to 2 x parameters below ~10k tokens), tensor-
parallel communication, the kernels' real efficiencies, and that vLLM looks the input embedding
up and runs the LM head only where it samples (the deck teaches every weight read and multiplied
per token: 16 GB and 4.8 ms per Llama-3-8B decode step on an H100); the simulator's engine model
(labs/sim/engine_model.py) adds those on its realistic profile, and queueing step by step.

Standard library and numpy only; never Django (a test checks it), so the simulator and the lab
pages can call it on every step or slider change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from labs.catalog import KV_DTYPE_BYTES, WEIGHT_DTYPE_BYTES, Hardware, ModelSpec
from labs.params import EngineConfig, LabParams, Workload

if TYPE_CHECKING:
    from labs.device_calibration import DeviceConstants

Bound = Literal["compute", "memory-bandwidth", "kv-capacity"]

# -- memory ----------------------------------------------------------------------------------------


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str) -> int:
    """KV cache bytes one token holds across all layers: 2 x layers x kv_heads x head_dim x
    bytes per element."""
    return 2 * model.layers * model.kv_heads * model.head_dim * KV_DTYPE_BYTES[kv_dtype]


def kv_replication(model: ModelSpec, tp: int) -> int:
    """How many copies of each KV head a replica keeps: vLLM copies KV heads when tp > kv_heads."""
    return max(1, tp // model.kv_heads)


@overload
def blocks_for_tokens(tokens: int, block_size: int) -> int: ...


@overload
def blocks_for_tokens(tokens: np.ndarray, block_size: int) -> np.ndarray: ...


def blocks_for_tokens(tokens: int | np.ndarray, block_size: int) -> int | np.ndarray:
    """ceil(tokens / block_size): the blocks a sequence of `tokens` occupies (numpy ints, and
    arrays of sequences element-wise, too)."""
    return -(-tokens // block_size)


def slots_wasted(tokens: int, block_size: int) -> int:
    """Empty slots in a sequence's last block."""
    return blocks_for_tokens(tokens, block_size) * block_size - tokens


def weight_bytes(model: ModelSpec, weight_dtype: str) -> float:
    """Bytes of all weights: parameters x bytes per weight."""
    return model.params * WEIGHT_DTYPE_BYTES[weight_dtype]


def weight_bytes_read(model: ModelSpec, weight_dtype: str, num_tokens: int) -> float:
    """Weight bytes one step reads when it processes `num_tokens` tokens.

    A dense model reads every weight once per step. A mixture of experts reads its shared layers
    and only the experts its tokens were routed to: with top-k of E experts, a given expert is
    untouched by one token with chance 1 - k/E, so by n tokens with chance (1 - k/E)^n.
    """
    if not model.is_moe:
        return weight_bytes(model, weight_dtype)
    experts, top_k = model.num_experts, model.experts_per_token
    per_expert = (model.params - model.active_params) / (experts - top_k)
    shared = model.active_params - top_k * per_expert
    touched = experts * (1 - (1 - top_k / experts) ** max(num_tokens, 1))
    return (shared + touched * per_expert) * WEIGHT_DTYPE_BYTES[weight_dtype]


def kv_memory_bytes(model: ModelSpec, hardware: Hardware, engine: EngineConfig) -> float:
    """Memory left for the KV cache on one replica (may be negative: the weights do not fit)."""
    per_gpu = hardware.hbm_bytes * engine.gpu_memory_utilization - engine.activation_reserve_bytes
    return engine.tp * per_gpu - weight_bytes(model, engine.weight_dtype)


def kv_capacity_tokens(model: ModelSpec, hardware: Hardware, engine: EngineConfig) -> int:
    """Tokens the KV pool of one replica holds, in whole blocks; `engine.kv_capacity_tokens`
    overrides the prediction (as vLLM's --kv-cache-memory-bytes would)."""
    if engine.kv_capacity_tokens is not None:
        return engine.kv_capacity_tokens
    free = kv_memory_bytes(model, hardware, engine)
    per_token = kv_bytes_per_token(model, engine.kv_dtype) * kv_replication(model, engine.tp)
    if free <= 0:
        return 0
    return math.floor(free / (per_token * engine.block_size)) * engine.block_size


def concurrent_seqs(capacity_tokens: int, tokens_per_seq: int, block_size: int) -> int:
    """Sequences of `tokens_per_seq` that fit in the pool at once, each in whole blocks."""
    return (capacity_tokens // block_size) // blocks_for_tokens(tokens_per_seq, block_size)


# -- time --------------------------------------------------------------------------------------


def compute_rate(hardware: Hardware, engine: EngineConfig) -> float:
    """FLOP/s of one replica: FP8 tensor cores for FP8 weights where the GPU has them, else BF16
    (weight-only int8/int4 and FP8 on an A100 compute in 16 bits)."""
    peak = hardware.bf16_flops_per_s
    if engine.weight_dtype == "fp8" and hardware.fp8_flops_per_s is not None:
        peak = hardware.fp8_flops_per_s
    return peak * engine.tp * engine.compute_efficiency


def memory_rate(hardware: Hardware, engine: EngineConfig) -> float:
    """Bytes/s one replica reads from memory."""
    return hardware.bandwidth_bytes_per_s * engine.tp * engine.bandwidth_efficiency


def step_compute_s(
    hardware: Hardware, model: ModelSpec, engine: EngineConfig, num_tokens: int
) -> float:
    """Compute time of a step over `num_tokens` tokens: 2 x active parameters per token."""
    return 2 * model.active_params * num_tokens / compute_rate(hardware, engine)


def step_memory_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    num_tokens: int,
    kv_tokens_read: int,
) -> float:
    """Memory time of a step: the weights once, plus the KV cache of `kv_tokens_read` tokens."""
    kv = kv_tokens_read * kv_bytes_per_token(model, engine.kv_dtype)
    kv *= kv_replication(model, engine.tp)
    weights = weight_bytes_read(model, engine.weight_dtype, num_tokens)
    return (weights + kv) / memory_rate(hardware, engine)


def step_time_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    num_prefill_tokens: int,
    num_decode_tokens: int,
    kv_tokens_read: int,
    *,
    num_seqs: float | None = None,
) -> float:
    """Time of one engine step, from the batch's composition. Shared by predictor and simulator.

    step_time_s(hardware, model, engine, num_prefill_tokens, num_decode_tokens, kv_tokens_read)
        = max(compute, memory) + engine.step_overhead_s + engine.seq_overhead_s x sequences

    Args:
        hardware: one GPU; the replica has `engine.tp` of them, with FLOP/s and bandwidth added.
        model: the model served (its active parameters set the FLOPs).
        engine: dtypes, tp, efficiencies and the fixed per-step overhead.
        num_prefill_tokens: prompt tokens computed in this step (all chunks in the batch).
        num_decode_tokens: tokens decoded in this step: one per running sequence, or 1 + k per
            sequence when k drafts are verified.
        kv_tokens_read: tokens of KV cache the step's attention reads, summed over sequences
            (a decode of a sequence holding 2,000 tokens reads 2,000).
        num_seqs: sequences in the step; default: the decoding ones (decode tokens over 1 + k)
            and one more if it computes prompt tokens.

    Returns:
        Seconds. compute = 2 x active params x (prefill + decode tokens) / FLOP/s; memory =
        (weight bytes read + kv_tokens_read x KV bytes per token) / bandwidth.
    """
    num_tokens = num_prefill_tokens + num_decode_tokens
    compute = step_compute_s(hardware, model, engine, num_tokens)
    memory = step_memory_s(hardware, model, engine, num_tokens, kv_tokens_read)
    if num_seqs is None:
        num_seqs = num_decode_tokens / (1 + engine.spec_tokens) + (1 if num_prefill_tokens else 0)
    return max(compute, memory) + engine.step_overhead_s + engine.seq_overhead_s * num_seqs


def decode_step_time(
    hardware: Hardware, model: ModelSpec, engine: EngineConfig, batch: int, context_tokens: int
) -> float:
    """One decode step for `batch` sequences each holding `context_tokens` of KV: the weights are
    read once for all of them, each sequence's KV once."""
    return step_time_s(hardware, model, engine, 0, batch, batch * context_tokens)


def draft_time_s(
    hardware: Hardware, model: ModelSpec, engine: EngineConfig, batch: int, kv_tokens_read: int
) -> float:
    """Time to propose `engine.spec_tokens` drafts for `batch` sequences: each draft token costs
    `engine.draft_cost` of a plain decode step of the target at that batch. Add it to the
    verifying step's `step_time_s` (whose decode tokens are batch x (1 + k))."""
    plain = step_time_s(hardware, model, engine, 0, batch, kv_tokens_read, num_seqs=batch)
    return engine.spec_tokens * engine.draft_cost * plain


def token_time_s(
    hardware: Hardware, model: ModelSpec, engine: EngineConfig, batch: int, context_tokens: int
) -> float:
    """Time per output token of each of `batch` decoding sequences: one decode step, or with
    k drafts the verifying step plus the drafts, over the tokens a step yields on average."""
    k, alpha = engine.spec_tokens, engine.acceptance
    if not k:
        return decode_step_time(hardware, model, engine, batch, context_tokens)
    kv_read = batch * context_tokens
    verify = step_time_s(hardware, model, engine, 0, batch * (k + 1), kv_read)
    drafts = draft_time_s(hardware, model, engine, batch, kv_read)
    return (verify + drafts) / spec_tokens_per_step(k, alpha)


def prefill_time_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    prompt_tokens: int,
    cached_tokens: int = 0,
) -> float:
    """Time to prefill one prompt alone: the sum of its steps, chunked to the token budget when
    chunked prefill is on. Tokens found in the prefix cache are not computed, only read.

    Chunk i (of size b) reads the KV of every token before it, so its memory time grows by a
    fixed amount per chunk; the sum over full chunks is taken in closed form, so a million-token
    prompt costs no more than a short one.
    """
    todo = prompt_tokens - cached_tokens
    if todo <= 0:
        return 0.0
    chunk = engine.max_num_batched_tokens if engine.chunked_prefill else todo
    full, rest = divmod(todo, chunk)
    total = 0.0
    if full:
        compute = step_compute_s(hardware, model, engine, chunk)
        first_memory = step_memory_s(hardware, model, engine, chunk, cached_tokens)
        growth = step_memory_s(hardware, model, engine, chunk, cached_tokens + chunk)
        growth -= first_memory
        # Chunks 0 .. n_compute - 1 are compute-bound, the later ones memory-bound.
        if growth > 0:
            n_compute = math.floor((compute - first_memory) / growth) + 1
        else:
            n_compute = full if first_memory <= compute else 0
        n_compute = min(max(n_compute, 0), full)
        later = full * (full - 1) // 2 - n_compute * (n_compute - 1) // 2
        total += n_compute * compute + (full - n_compute) * first_memory + growth * later
        total += full * (engine.step_overhead_s + engine.seq_overhead_s)
    if rest:
        total += step_time_s(hardware, model, engine, rest, 0, cached_tokens + full * chunk)
    return total


def e2e_time_s(ttft_s: float, tpot_s: float, output_tokens: int) -> float:
    """End-to-end latency: the first token after TTFT, each later one TPOT apart."""
    return ttft_s + tpot_s * (output_tokens - 1)


def spec_tokens_per_step(k: int, alpha: float) -> float:
    """Expected tokens one target pass yields with k drafts, each accepted with chance alpha
    until the first rejection, plus the target's own token: (1 - alpha^(k+1)) / (1 - alpha)."""
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def spec_speedup(k: int, alpha: float, draft_cost: float) -> float:
    """Decode speedup at small batch, where verifying k + 1 tokens costs one target pass:
    tokens per pass / (k x c + 1)."""
    return spec_tokens_per_step(k, alpha) / (k * draft_cost + 1)


# -- under load ----------------------------------------------------------------------------------


def wave_prefill_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    batch: int,
    prompt_tokens: int,
    cached_tokens: int = 0,
) -> float:
    """Time to prefill `batch` prompts admitted together: their uncached tokens in steps of
    the token budget (max_num_batched_tokens), each step compute-bound on a full budget."""
    if batch <= 1:
        return prefill_time_s(hardware, model, engine, prompt_tokens, cached_tokens)
    total = batch * max(prompt_tokens - cached_tokens, 0)
    full, rest = divmod(total, engine.max_num_batched_tokens)
    seconds = full * step_time_s(hardware, model, engine, engine.max_num_batched_tokens, 0, 0)
    if rest:
        seconds += step_time_s(hardware, model, engine, rest, 0, 0)
    return seconds


def _wave_first_token_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    batch: int,
    workload: Workload,
    cached_tokens: int,
) -> float:
    """Mean time to first token of a wave's requests, with the wave's prompts computed in order,
    `max_num_batched_tokens` at a time: request j (1-based) is done in step ceil(j x u / budget),
    u its uncached tokens, and never before its lone prefill. O(batch) in numpy; batch is at
    most max_num_seqs."""
    alone = prefill_time_s(hardware, model, engine, workload.prompt_tokens, cached_tokens)
    if batch <= 1:
        return alone
    todo = max(workload.prompt_tokens - cached_tokens, 0)
    budget = engine.max_num_batched_tokens
    full, rest = divmod(batch * todo, budget)
    full_step = step_time_s(hardware, model, engine, budget, 0, 0)
    last_step = step_time_s(hardware, model, engine, rest, 0, 0) if rest else 0.0
    done_in_step = -(-np.arange(1, batch + 1, dtype=np.int64) * todo // budget)
    seconds = np.where(done_in_step <= full, done_in_step * full_step, full * full_step + last_step)
    return float(np.maximum(seconds, alone).mean())


def wave_service_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    batch: int,
    workload: Workload,
    cached_tokens: int = 0,
) -> tuple[float, float]:
    """(mean time to first token, time to finish) of a wave of `batch` equal requests admitted
    together: the wave's prefill, then (output - 1) tokens at the mean context
    prompt + output / 2 (with speculation, at its tokens per step). Its prompts fill the token
    budget in turn, so a request's first token comes at the end of the step that computes its
    last prompt token: prompts that share one step all wait for the whole step.

    No request of a wave gets its first token sooner than it would alone (`prefill_time_s`):
    the wave's steps carry at least the tokens a lone prefill's do. The wave's steps leave out
    the KV its chunks read, so that floor is taken explicitly."""
    prefill = wave_prefill_s(hardware, model, engine, batch, workload.prompt_tokens, cached_tokens)
    first = _wave_first_token_s(hardware, model, engine, batch, workload, cached_tokens)
    context = workload.prompt_tokens + workload.output_tokens // 2
    per_token = token_time_s(hardware, model, engine, batch, context)
    return first, prefill + per_token * (workload.output_tokens - 1)


def open_loop_batch(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    batch: int,
    workload: Workload,
    rate: float,
    cached_tokens: int = 0,
) -> tuple[int, float, float]:
    """(sequences decoding together, TTFT, E2E) of Poisson arrivals at `rate` below capacity.
    Requests come one at a time, so each is prefilled alone and decodes beside the others in
    flight: about rate x E2E of them (Little's law), at most `batch`; found by iterating that
    fixed point from one sequence."""
    first = prefill_time_s(hardware, model, engine, workload.prompt_tokens, cached_tokens)
    context = workload.prompt_tokens + workload.output_tokens // 2
    running = 1
    for _ in range(16):
        e2e = first + token_time_s(hardware, model, engine, running, context) * (
            workload.output_tokens - 1
        )
        settled = max(1, min(batch, math.ceil(rate * e2e)))
        if settled == running:
            break
        running = settled
    e2e = first + token_time_s(hardware, model, engine, running, context) * (
        workload.output_tokens - 1
    )
    return running, first, e2e


def closed_loop_wait_s(
    num_prompts: int, concurrency: int, batch: int, service_s: float
) -> tuple[float, float]:
    """(mean, median) wait before a request's first step when a client keeps `concurrency`
    requests in flight and the engine runs `batch` at a time, each wave taking `service_s`.

    Request i runs in wave i // batch, which starts at (i // batch) x service_s. The first
    `concurrency` requests are issued at 0; request i after them when request i - concurrency
    finishes, at (1 + (i - concurrency) // batch) x service_s. Concurrency above the batch
    therefore waits whole waves: that is the queueing a TTFT then shows.

    Counted in closed form, in O(1) whatever `num_prompts` (this runs in the web process). With
    concurrency = q x batch + r, the first `concurrency` requests wait 0, 1, ..., q - 1 waves
    (batch of each) and r wait q; every later one waits q - 1 waves, or q if its offset past
    `concurrency` is r or fewer short of a whole batch.
    """
    c = max(1, min(concurrency, num_prompts))
    if batch >= c:
        return 0.0, 0.0
    q, r = divmod(c, batch)
    full, rest = divmod(num_prompts - c, batch)
    at_q = full * r + max(0, rest - (batch - r)) + r
    at_q_minus_1 = num_prompts - batch * (q - 1) - at_q

    def waves_at(rank: int) -> int:
        """The rank-th smallest wait, in waves: batch requests each at 0 .. q - 2, then q - 1."""
        if rank < batch * (q - 1):
            return rank // batch
        return q - 1 if rank < batch * (q - 1) + at_q_minus_1 else q

    waves = batch * q * (q - 1) // 2 + (q - 1) * (at_q_minus_1 - batch) + q * at_q
    middle = (waves_at((num_prompts - 1) // 2) + waves_at(num_prompts // 2)) / 2
    return waves * service_s / num_prompts, middle * service_s


def open_loop_wait_s(num_prompts: int, rate: float, capacity: float) -> float:
    """Mean wait of `num_prompts` Poisson arrivals at `rate` on an engine that finishes
    `capacity` requests/s: above capacity the k-th waits about k (1/capacity - 1/rate), a queue
    that grows for the whole run; below it the queue stays short and is taken as 0."""
    if rate <= capacity:
        return 0.0
    return (num_prompts - 1) / 2 * (1 / capacity - 1 / rate)


# -- the token budget ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetSteady:
    """What the step's token budget (max_num_batched_tokens) lets an engine with a queue run.

    `running`: sequences in the engine at once, decoding or prefilling (Little's law: requests
    admitted per step x steps each spends there); `per_step`: requests admitted per step;
    `admit_share`: the share of steps that carry prompt tokens."""

    running: float
    per_step: float
    admit_share: float

    def caps(self, allowed: int) -> bool:
        """Whether the budget runs fewer sequences than the `allowed` other limits let run."""
        return math.ceil(self.running) < allowed


def budget_steady(engine: EngineConfig, workload: Workload, cached_tokens: int = 0) -> BudgetSteady:
    """The steady state of a queued engine's token budget, admitting as the scheduler does
    (labs/sim/scheduler.py): running sequences take their tokens first, oldest first, and
    waiting prompts get what is left.

    With u uncached prompt tokens, d = (output - 1) / tokens per step decode steps of 1 + k
    tokens each (k drafts) and budget B:

    - chunked prefill fills every step: r = B / (u + d (1 + k)) requests start per step, about
      r x d sequences decode and max(r, 1) prompts are part-way through;
    - without it a prompt joins a step only whole. When m = floor(B / (u + d (1 + k))) >= 1,
      r = m prompts join each step beside the r x d decodes they lead to (up to
      (B - (m + 1) u) / (d (1 + k)) when m + 1 still fit beside fewer decodes). When not even
      one does, a prompt waits until at most (B - u) / (1 + k) sequences decode:
      floor((B - u) / (1 + k)) + 1 run, one at a time when the prompt needs the whole budget.
    """
    k = engine.spec_tokens
    per_decode = 1 + k
    budget = engine.max_num_batched_tokens
    prompt = max(workload.prompt_tokens - cached_tokens, 1)
    steps = (workload.output_tokens - 1) / spec_tokens_per_step(k, engine.acceptance)
    per_request = prompt + steps * per_decode
    if engine.chunked_prefill:
        per_step = budget / per_request
        return BudgetSteady(per_step * steps + max(per_step, 1.0), per_step, 1.0)
    whole = budget // per_request
    if whole >= 1:
        per_step = float(whole)
        if steps:
            per_step = max(per_step, (budget - (whole + 1) * prompt) / (steps * per_decode))
        return BudgetSteady(per_step * (steps + 1), per_step, min(per_step, 1.0))
    running = max((budget - prompt) // per_decode + 1, 1)
    per_step = running / (steps + 1)
    return BudgetSteady(float(running), per_step, per_step)


@dataclass(frozen=True)
class BudgetTimes:
    """Seconds of a budget-bound engine in its steady state (`budget_steady`)."""

    first_token_s: float  # from a request's admission to its first token
    tpot_s: float  # between a decoding sequence's tokens
    plain_tpot_s: float  # the same, were its steps to carry no prompt tokens for others
    requests_per_s: float
    in_engine_s: float  # admission to last token: first_token_s + (output - 1) x tpot_s


def budget_times(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    workload: Workload,
    steady: BudgetSteady,
    context_tokens: int,
    cached_tokens: int = 0,
) -> BudgetTimes:
    """Price `steady`'s steps: a step that admits carries per_step / admit_share prompts beside
    the r x d decodes of `context_tokens` each, the others the decodes alone.

    With chunked prefill every step admits, so each token of a decoding sequence waits for
    a full step and a prompt spans 1 / r of them. Without it the prompt is one step, and a
    sequence decoding while fewer than one request is admitted per step sees the admissions
    of the others that turn over during its decode (running - 1), not one per step."""
    k, alpha = engine.spec_tokens, engine.acceptance
    prompt = max(workload.prompt_tokens - cached_tokens, 1)
    tokens_per_step = spec_tokens_per_step(k, alpha)
    steps = (workload.output_tokens - 1) / tokens_per_step
    share = steady.admit_share
    decoding = steady.per_step * steps
    decode_tokens = round(decoding * (1 + k))
    kv_read = round(decoding * context_tokens)
    prompts = round(steady.per_step / share * prompt)
    admit = step_time_s(hardware, model, engine, prompts, decode_tokens, kv_read)
    plain = step_time_s(hardware, model, engine, 0, decode_tokens, kv_read)
    drafts = draft_time_s(hardware, model, engine, round(decoding), kv_read) if k else 0.0
    if not steps:
        seen = plain  # nothing decodes: no token waits on a prompt
    elif engine.chunked_prefill or share >= 1:
        seen = admit
    else:
        others = min(steps, max(steady.running - 1, 0.0))
        seen = plain + others / steps * (admit - plain)
    # A chunked prompt spans the 1 / r steps that fill with its tokens, a whole one its own.
    spans = max(1.0, 1 / steady.per_step) if engine.chunked_prefill else 1.0
    alone = prefill_time_s(hardware, model, engine, workload.prompt_tokens, cached_tokens)
    first = max(spans * admit, alone)
    tpot = (seen + drafts) / tokens_per_step
    mean_step = share * admit + (1 - share) * plain + drafts
    return BudgetTimes(
        first_token_s=first,
        tpot_s=tpot,
        plain_tpot_s=(plain + drafts) / tokens_per_step,
        requests_per_s=steady.per_step / mean_step,
        in_engine_s=first + (workload.output_tokens - 1) * tpot,
    )


def pipeline_wait_s(
    num_prompts: int, concurrency: int, running: float, requests_per_s: float
) -> tuple[float, float]:
    """(mean, median) wait before a request's first step when `concurrency` clients keep
    requests in flight on an engine that starts `requests_per_s` of them one after another
    and holds `running` (fewer than `concurrency`): the budget-bound engine, never in waves.

    Request i starts at i / rate. The first `concurrency` are issued at 0; each later one when
    the request `concurrency` ahead of it finishes, running / rate after it started (Little's
    law), so it waits (concurrency - running) / rate. O(1), as closed_loop_wait_s."""
    c = max(1, min(concurrency, num_prompts))
    later = num_prompts - c
    waits = max(c - running, 0.0)  # of a later request, in units of 1 / rate
    mean = (c * (c - 1) / 2 + later * waits) / num_prompts
    below = min(c, math.ceil(waits))  # first requests that wait less than a later one

    def at(rank: int) -> float:
        """The rank-th smallest wait: 0 .. below - 1, the later ones, then the rest."""
        if rank < below:
            return float(rank)
        return waits if rank < below + later else float(rank - later)

    middle = (at((num_prompts - 1) // 2) + at(num_prompts // 2)) / 2
    return mean / requests_per_s, middle / requests_per_s


@dataclass(frozen=True)
class LoadPrediction:
    """What the learner's load does: the batch that runs, how long requests queue, TTFT and E2E
    including that queueing. With one request in flight these are the idle numbers."""

    batch: int
    capacity_requests_per_s: float
    queue_wait_s: float
    queue_wait_p50_s: float
    ttft_s: float
    ttft_p50_s: float
    e2e_s: float
    # From a request's first step to its first token (the rest of ttft_s is queueing): its
    # lone prefill, or on a budget-bound engine (`budget_steady`) the full steps it spans.
    own_prefill_s: float = 0.0
    # Of e2e_s after the first token: the time its decode steps spend on others' prompt tokens,
    # which only a budget-bound engine mixes into them.
    prefill_interference_s: float = 0.0


def predict_load(params: LabParams, batch: int, cached_tokens: int = 0) -> LoadPrediction:
    """Queueing under the lab's load: closed-loop `max_concurrency` (or `concurrency`) clients,
    or Poisson arrivals at `request_rate`, on an engine running at most `batch` sequences (the
    smaller of max_num_seqs, the KV pool and the load), or fewer when the token budget allows
    fewer (`budget_steady`): that engine starts requests one after another, never in waves."""
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    in_flight = work.max_concurrency if work.max_concurrency is not None else work.concurrency
    in_flight = max(1, min(in_flight, work.num_prompts))
    batch = max(1, min(batch, in_flight))
    steady = budget_steady(engine, work, cached_tokens)
    interference = 0.0
    if steady.caps(batch):
        context = work.prompt_tokens + work.output_tokens // 2
        times = budget_times(hw, model, engine, work, steady, context, cached_tokens)
        batch, capacity = math.ceil(steady.running), times.requests_per_s
        first = own = times.first_token_s
        after_first = times.in_engine_s - first
        interference = (work.output_tokens - 1) * (times.tpot_s - times.plain_tpot_s)
        closed = pipeline_wait_s(work.num_prompts, in_flight, steady.running, capacity)
    else:
        first, service = wave_service_s(hw, model, engine, batch, work, cached_tokens)
        capacity = batch / service if service > 0 else math.inf
        own = prefill_time_s(hw, model, engine, work.prompt_tokens, cached_tokens)
        after_first = service - wave_prefill_s(
            hw, model, engine, batch, work.prompt_tokens, cached_tokens
        )
        closed = closed_loop_wait_s(work.num_prompts, in_flight, batch, service)
    if work.request_rate is not None and work.request_rate <= capacity:
        running, first, e2e = open_loop_batch(
            hw, model, engine, batch, work, work.request_rate, cached_tokens
        )
        return LoadPrediction(
            batch=running,
            capacity_requests_per_s=capacity,
            queue_wait_s=0.0,
            queue_wait_p50_s=0.0,
            ttft_s=first,
            ttft_p50_s=first,
            e2e_s=e2e,
            own_prefill_s=first,
        )
    if work.request_rate is None:
        mean_wait, p50_wait = closed
    else:
        mean_wait = open_loop_wait_s(work.num_prompts, work.request_rate, capacity)
        p50_wait = mean_wait
    return LoadPrediction(
        batch=batch,
        capacity_requests_per_s=capacity,
        queue_wait_s=mean_wait,
        queue_wait_p50_s=p50_wait,
        ttft_s=first + mean_wait,
        ttft_p50_s=first + p50_wait,
        e2e_s=mean_wait + first + after_first,
        own_prefill_s=own,
        prefill_interference_s=interference,
    )


# -- the whole prediction ----------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Every predicted number of a lab. Bytes, tokens, seconds; None where nothing fits."""

    kv_bytes_per_token: int
    kv_bytes_per_seq: int
    blocks_per_seq: int
    prompt_blocks: int
    slots_wasted_per_seq: int
    contiguous_reserved_slots: int
    contiguous_wasted_slots: int
    contiguous_waste_fraction: float
    weight_bytes: int
    kv_memory_bytes: int
    kv_capacity_tokens: int
    max_concurrent_seqs: int
    contiguous_max_concurrent_seqs: int
    running_seqs: int
    replicas_needed: int | None
    gpus_needed: int | None
    prefix_cached_tokens: int
    prefill_s: float
    ttft_s: float | None
    weight_read_s: float
    kv_read_s: float
    decode_step_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    output_tokens_per_s: float | None
    batch_speedup_vs_batch1: float | None
    spec_tokens_per_step: float
    spec_speedup: float
    spec_speedup_at_batch: float | None
    bound: Bound
    fits: bool
    # Under the learner's load (predict_load): None where nothing fits.
    capacity_requests_per_s: float | None = None
    queue_wait_s: float | None = None
    loaded_ttft_s: float | None = None
    loaded_ttft_p50_s: float | None = None
    loaded_e2e_s: float | None = None
    # What max_num_seqs, the KV pool and the load would let run when the token budget lets
    # fewer (`budget_steady`); None when the budget is not what caps running_seqs.
    running_seqs_without_budget: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def prefix_cached_tokens(engine: EngineConfig, workload: Workload) -> int:
    """Prompt tokens a warm prefix cache serves: whole blocks of the shared prefix, never the
    prompt's last token (vLLM always computes it to get the first output token)."""
    if not engine.prefix_caching:
        return 0
    whole = workload.shared_prefix_tokens // engine.block_size * engine.block_size
    return min(whole, workload.prompt_tokens - 1)


def predict(params: LabParams, device: DeviceConstants | None = None) -> Prediction:
    """All predictions for one lab: one request alone for TTFT, `concurrency` sequences of
    `context_tokens` for the batch, capacity and fleet figures.

    `device`: the calibration measured on the lab's device, if it has one; its fitted
    efficiencies and step overhead replace the knobs the lab left at their ideal defaults."""
    if device is not None:
        params = replace(params, engine=device.predictor_engine(params.engine))
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    bs = engine.block_size
    used = work.prompt_tokens + work.output_tokens
    reserved = work.prompt_tokens + work.max_tokens
    per_token = kv_bytes_per_token(model, engine.kv_dtype)
    capacity = kv_capacity_tokens(model, hw, engine)
    contiguous_seqs = capacity // reserved
    paged_seqs = concurrent_seqs(capacity, work.context_tokens, bs)
    max_seqs = contiguous_seqs if engine.kv_allocation == "contiguous" else paged_seqs
    per_replica = min(max_seqs, engine.max_num_seqs)
    allowed = min(work.concurrency, per_replica)
    fits = allowed >= 1
    cached = prefix_cached_tokens(engine, work)
    steady = budget_steady(engine, work, cached)
    running = math.ceil(steady.running) if steady.caps(allowed) else allowed
    batch = max(running, 1)

    decode_s = decode_step_time(hw, model, engine, batch, work.context_tokens)
    tpot, _, tokens_per_s = steady_decode(hw, model, engine, work, allowed, cached)
    k, alpha = engine.spec_tokens, engine.acceptance
    ttft = prefill_time_s(hw, model, engine, work.prompt_tokens, cached)
    single = decode_step_time(hw, model, engine, 1, work.context_tokens)
    replicas = math.ceil(work.concurrency / per_replica) if fits else None

    if not fits or work.concurrency > max_seqs:
        bound: Bound = "kv-capacity"
    elif step_compute_s(hw, model, engine, batch) > step_memory_s(
        hw, model, engine, batch, batch * work.context_tokens
    ):
        bound = "compute"
    else:
        bound = "memory-bandwidth"

    rate = memory_rate(hw, engine)
    load = predict_load(params, per_replica, cached) if fits else None
    return Prediction(
        kv_bytes_per_token=per_token,
        kv_bytes_per_seq=blocks_for_tokens(work.context_tokens, bs) * bs * per_token,
        blocks_per_seq=blocks_for_tokens(used, bs),
        prompt_blocks=blocks_for_tokens(work.prompt_tokens, bs),
        slots_wasted_per_seq=slots_wasted(used, bs),
        contiguous_reserved_slots=reserved,
        contiguous_wasted_slots=reserved - used,
        contiguous_waste_fraction=(reserved - used) / reserved,
        weight_bytes=round(weight_bytes(model, engine.weight_dtype)),
        kv_memory_bytes=max(0, round(kv_memory_bytes(model, hw, engine))),
        kv_capacity_tokens=capacity,
        max_concurrent_seqs=max_seqs,
        contiguous_max_concurrent_seqs=contiguous_seqs,
        running_seqs=running,
        replicas_needed=replicas,
        gpus_needed=None if replicas is None else replicas * engine.tp,
        prefix_cached_tokens=cached,
        prefill_s=step_compute_s(hw, model, engine, work.prompt_tokens - cached),
        ttft_s=ttft if fits else None,
        weight_read_s=weight_bytes_read(model, engine.weight_dtype, batch) / rate,
        kv_read_s=batch * work.context_tokens * per_token * kv_replication(model, engine.tp) / rate,
        decode_step_s=decode_s if fits else None,
        tpot_s=tpot if fits else None,
        e2e_s=e2e_time_s(ttft, tpot, work.output_tokens) if fits else None,
        output_tokens_per_s=tokens_per_s if fits else None,
        batch_speedup_vs_batch1=batch * single / decode_s if fits else None,
        spec_tokens_per_step=spec_tokens_per_step(k, alpha),
        spec_speedup=spec_speedup(k, alpha, engine.draft_cost),
        spec_speedup_at_batch=(
            decode_s / token_time_s(hw, model, engine, batch, work.context_tokens) if fits else None
        ),
        bound=bound,
        fits=fits,
        capacity_requests_per_s=load.capacity_requests_per_s if load else None,
        queue_wait_s=load.queue_wait_s if load else None,
        loaded_ttft_s=load.ttft_s if load else None,
        loaded_ttft_p50_s=load.ttft_p50_s if load else None,
        loaded_e2e_s=load.e2e_s if load else None,
        running_seqs_without_budget=allowed if fits and running < allowed else None,
    )


def steady_decode(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    workload: Workload,
    allowed: int,
    cached_tokens: int = 0,
) -> tuple[float, float, float]:
    """(TPOT, the same without others' prompt tokens in its steps, output tokens/s) of the
    sequences running together at workload.context_tokens.

    `allowed` of them decode together on pure decode steps (`token_time_s`), each making a
    token per TPOT. When the token budget runs fewer (`budget_times`), their steps carry
    prompts too, and some of the running sequences are still prefilling: the output is what
    the requests finished per second take away, not running / TPOT."""
    steady = budget_steady(engine, workload, cached_tokens)
    if not steady.caps(allowed):
        batch = max(allowed, 1)
        tpot = token_time_s(hardware, model, engine, batch, workload.context_tokens)
        return tpot, tpot, batch / tpot
    context = workload.context_tokens
    times = budget_times(hardware, model, engine, workload, steady, context, cached_tokens)
    tokens_per_s = times.requests_per_s * workload.output_tokens
    return times.tpot_s, times.plain_tpot_s, tokens_per_s


# -- the prediction's parts ------------------------------------------------------------------------

# The parts of a run's breakdown (labs/sim/breakdown.py) and of the prediction's. The formulas
# have no tensor-parallel communication and no preemption, and share decode steps with prompts
# only where the token budget caps the batch (`budget_steady`): the rest is 0 on the predicted
# side by assumption.
BREAKDOWN_PARTS = (
    "ideal",
    "efficiency",
    "overhead",
    "frontend",
    "communication",
    "queueing",
    "prefill_interference",
    "preemption",
    "speculation",
)


def _section(parts: dict[str, float]) -> dict[str, object]:
    full = {name: float(parts.get(name, 0.0)) for name in BREAKDOWN_PARTS}
    return {"total": sum(full.values()), "parts": full}


def predicted_breakdown(params: LabParams) -> dict[str, object] | None:
    """The predicted mean TTFT and E2E under this load (`predict_load`) and TPOT (`tpot_s`),
    split into the parts the run's breakdown has, under the formulas' assumptions; None when
    nothing fits.

    The parts come from pricing the same figures with fewer of the lab's knobs: with the fixed
    per-step overhead set to 0 (the difference is `overhead`), then with the efficiencies at
    1 as well (`efficiency`); what is left is the roofline (`ideal`), except that speculation's
    drafts and its extra verified tokens count as `speculation`, as the simulator counts them.
    `queueing` is the load's mean wait for a slot and, in a wave admitted together, for the
    prefill of the prompts ahead of it. Where the token budget caps the batch, the time a
    decode step spends on others' prompt tokens is `prefill_interference`, as the simulator
    counts it. Each section's parts add up to its total.
    Also `batch`: the sequences the formula decodes together, output tokens/s x TPOT (fewer
    than running_seqs where the token budget leaves some of them prefilling).
    """
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    prediction = predict(params)
    if not prediction.fits:
        return None
    per_replica = min(prediction.max_concurrent_seqs, engine.max_num_seqs)
    allowed = min(work.concurrency, per_replica)
    cached = prediction.prefix_cached_tokens
    batch = max(prediction.running_seqs, 1)
    no_overhead = replace(engine, step_overhead_s=0.0, seq_overhead_s=0.0)
    at_peak = replace(no_overhead, compute_efficiency=1.0, bandwidth_efficiency=1.0)

    def figures(e: EngineConfig) -> tuple[float, float, float, LoadPrediction]:
        """(own prefill, decode after the first token, TPOT, the load) priced with `e`, the
        last two without the time their steps spend on others' prompts."""
        load = predict_load(replace(params, engine=e), per_replica, cached)
        tpot = steady_decode(hw, model, e, work, allowed, cached)[1]
        # What the load's first token adds to the request's own prefill is waiting: behind the
        # wave's other prompts (wave_service_s), or for the budget (budget_times).
        own = load.own_prefill_s
        decode = load.e2e_s - load.ttft_s - load.prefill_interference_s
        return own, decode, tpot, load

    full, bare, peak = figures(engine), figures(no_overhead), figures(at_peak)
    tpot_total, _, tokens_per_s = steady_decode(hw, model, engine, work, allowed, cached)
    decoding = tokens_per_s * tpot_total
    # Waiting behind the other prompts of its wave is queueing, as the simulator counts the
    # time before the first step that schedules a request.
    load = full[3]
    waited = load.ttft_s - full[0]

    def plain_share(batch_size: int, context: int) -> float:
        """The share of a token's roofline time that is a plain decode step (no drafts)."""
        if not engine.spec_tokens:
            return 1.0
        spread = spec_tokens_per_step(engine.spec_tokens, engine.acceptance)
        plain = decode_step_time(hw, model, at_peak, batch_size, context) / spread
        return min(1.0, plain / token_time_s(hw, model, at_peak, batch_size, context))

    tpot_plain = plain_share(batch, work.context_tokens)
    # predict_load's decode runs at the load's batch and the mean context.
    decode_plain = plain_share(peak[3].batch, work.prompt_tokens + work.output_tokens // 2)
    ttft = {
        "queueing": waited,
        "overhead": full[0] - bare[0],
        "efficiency": bare[0] - peak[0],
        "ideal": peak[0],
    }
    decode = {
        "prefill_interference": load.prefill_interference_s,
        "overhead": full[1] - bare[1],
        "efficiency": bare[1] - peak[1],
        "ideal": peak[1] * decode_plain,
        "speculation": peak[1] * (1 - decode_plain),
    }
    tpot = {
        "prefill_interference": tpot_total - full[2],
        "overhead": full[2] - bare[2],
        "efficiency": bare[2] - peak[2],
        "ideal": peak[2] * tpot_plain,
        "speculation": peak[2] * (1 - tpot_plain),
    }
    e2e = {name: ttft.get(name, 0.0) + decode.get(name, 0.0) for name in BREAKDOWN_PARTS}
    return {
        "source": "formulas",
        "ttft_s": _section(ttft),
        "tpot_s": _section(tpot),
        "e2e_s": _section(e2e),
        "batch": batch if prediction.running_seqs_without_budget is None else decoding,
    }


def lab_prediction(params: LabParams, device: DeviceConstants | None = None) -> dict[str, object]:
    """The one prediction every page, the CLI and the personal cards show for a lab's settings:
    `predict(params)` as a dict, the rates the run's table compares (prefix-cache hit rate,
    draft acceptance) and the predicted breakdown (`predicted_breakdown`).

    `device`: the lab device's own calibration, if it has one; the figures and the breakdown
    are then both priced by it (see `predict`)."""
    if device is not None:
        params = replace(params, engine=device.predictor_engine(params.engine))
    values = predict(params).as_dict()
    engine, work = params.engine, params.workload
    if engine.prefix_caching and work.prompt_tokens:
        values["prefix_hit_rate"] = int(values["prefix_cached_tokens"]) / work.prompt_tokens  # type: ignore[call-overload]
    if engine.spec_tokens:
        # Accepted drafts per step are (tokens per step - 1); vLLM's rate divides by k drafted.
        values["draft_acceptance_rate"] = (
            float(values["spec_tokens_per_step"]) - 1  # type: ignore[arg-type]
        ) / engine.spec_tokens
    values["breakdown"] = predicted_breakdown(params)
    return values


def _seconds_words(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds >= 1 else f"{seconds * 1000:,.0f} ms"


def budget_notice(params: LabParams, predicted: Mapping[str, object]) -> str:
    """In plain words, when the token budget runs fewer sequences than max_num_seqs, the KV pool
    and the load allow (`predicted`: a `lab_prediction`): what it does and the figures that
    follow; "" when it is not what caps the batch. The lab page shows it before a run."""
    allowed = predicted.get("running_seqs_without_budget")
    if not isinstance(allowed, int):
        return ""
    engine, work = params.engine, params.workload
    budget = f"max_num_batched_tokens ({engine.max_num_batched_tokens:,})"
    prompt = f"{work.prompt_tokens:,}-token prompt"
    running = int(predicted["running_seqs"])  # type: ignore[call-overload]
    if not engine.chunked_prefill and running == 1:
        what = (
            f"{budget} serialises the engine: with chunked prefill off, a {prompt} needs the "
            "whole step's budget, so it never joins a step that carries a decode and requests "
            f"run one at a time, not {allowed:,} together."
        )
    else:
        why = (
            f"with chunked prefill off, a {prompt} joins a step only whole, in the room its "
            "decodes leave"
            if not engine.chunked_prefill
            else f"every step is full, each decode taking a token of it and {prompt}s the rest"
        )
        what = (
            f"{budget} lets only about {running:,} sequences run at once, not the {allowed:,} "
            f"that max_num_seqs, the KV pool and the load allow: {why}."
        )
    tokens_per_s = float(predicted["output_tokens_per_s"])  # type: ignore[arg-type]
    ttft = float(predicted["loaded_ttft_s"])  # type: ignore[arg-type]
    return (
        f"{what} Predicted under this load: {tokens_per_s:,.0f} output tokens/s, "
        f"time to first token {_seconds_words(ttft)}."
    )
