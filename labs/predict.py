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
grows for the whole run, and a KV pool smaller than the batch caps the batch. The idle numbers
(`ttft_s`, `e2e_s`: one request on an idle engine) stay as the deck's cards use them.

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
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal

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


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """ceil(tokens / block_size): the blocks a sequence of `tokens` occupies (numpy ints too)."""
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
) -> float:
    """Time of one engine step, from the batch's composition. Shared by predictor and simulator.

    step_time_s(hardware, model, engine, num_prefill_tokens, num_decode_tokens, kv_tokens_read)
        = max(compute, memory) + engine.step_overhead_s

    Args:
        hardware: one GPU; the replica has `engine.tp` of them, with FLOP/s and bandwidth added.
        model: the model served (its active parameters set the FLOPs).
        engine: dtypes, tp, efficiencies and the fixed per-step overhead.
        num_prefill_tokens: prompt tokens computed in this step (all chunks in the batch).
        num_decode_tokens: tokens decoded in this step: one per running sequence, or 1 + k per
            sequence when k drafts are verified.
        kv_tokens_read: tokens of KV cache the step's attention reads, summed over sequences
            (a decode of a sequence holding 2,000 tokens reads 2,000).

    Returns:
        Seconds. compute = 2 x active params x (prefill + decode tokens) / FLOP/s; memory =
        (weight bytes read + kv_tokens_read x KV bytes per token) / bandwidth.
    """
    num_tokens = num_prefill_tokens + num_decode_tokens
    compute = step_compute_s(hardware, model, engine, num_tokens)
    memory = step_memory_s(hardware, model, engine, num_tokens, kv_tokens_read)
    return max(compute, memory) + engine.step_overhead_s


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
    plain = step_time_s(hardware, model, engine, 0, batch, kv_tokens_read)
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
        total += full * engine.step_overhead_s
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


def predict_load(params: LabParams, batch: int, cached_tokens: int = 0) -> LoadPrediction:
    """Queueing under the lab's load: closed-loop `max_concurrency` (or `concurrency`) clients,
    or Poisson arrivals at `request_rate`, on an engine running at most `batch` sequences (the
    smaller of max_num_seqs, the KV pool and the load)."""
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    in_flight = work.max_concurrency if work.max_concurrency is not None else work.concurrency
    in_flight = max(1, min(in_flight, work.num_prompts))
    batch = max(1, min(batch, in_flight))
    first, service = wave_service_s(hw, model, engine, batch, work, cached_tokens)
    capacity = batch / service if service > 0 else math.inf
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
        )
    if work.request_rate is None:
        mean_wait, p50_wait = closed_loop_wait_s(work.num_prompts, in_flight, batch, service)
    else:
        mean_wait = open_loop_wait_s(work.num_prompts, work.request_rate, capacity)
        p50_wait = mean_wait
    decode_part = service - wave_prefill_s(
        hw, model, engine, batch, work.prompt_tokens, cached_tokens
    )
    return LoadPrediction(
        batch=batch,
        capacity_requests_per_s=capacity,
        queue_wait_s=mean_wait,
        queue_wait_p50_s=p50_wait,
        ttft_s=first + mean_wait,
        ttft_p50_s=first + p50_wait,
        e2e_s=mean_wait + first + decode_part,
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
    running = min(work.concurrency, per_replica)
    fits = running >= 1
    batch = max(running, 1)

    cached = prefix_cached_tokens(engine, work)
    decode_s = decode_step_time(hw, model, engine, batch, work.context_tokens)
    tpot = token_time_s(hw, model, engine, batch, work.context_tokens)
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
        output_tokens_per_s=batch / tpot if fits else None,
        batch_speedup_vs_batch1=batch * single / decode_s if fits else None,
        spec_tokens_per_step=spec_tokens_per_step(k, alpha),
        spec_speedup=spec_speedup(k, alpha, engine.draft_cost),
        spec_speedup_at_batch=decode_s / tpot if fits else None,
        bound=bound,
        fits=fits,
        capacity_requests_per_s=load.capacity_requests_per_s if load else None,
        queue_wait_s=load.queue_wait_s if load else None,
        loaded_ttft_s=load.ttft_s if load else None,
        loaded_ttft_p50_s=load.ttft_p50_s if load else None,
        loaded_e2e_s=load.e2e_s if load else None,
    )


# -- the prediction's parts ------------------------------------------------------------------------

# The parts of a run's breakdown (labs/sim/breakdown.py) and of the prediction's. The formulas
# have no tensor-parallel communication, no prefill sharing a decode step, no preemption: those
# are 0 on the predicted side by assumption.
BREAKDOWN_PARTS = (
    "ideal",
    "efficiency",
    "overhead",
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
    prefill of the prompts ahead of it. Each section's parts add up to its total.
    Also `batch`: the sequences the formula decodes together.
    """
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    prediction = predict(params)
    if not prediction.fits:
        return None
    per_replica = min(prediction.max_concurrent_seqs, engine.max_num_seqs)
    cached = prediction.prefix_cached_tokens
    batch = max(prediction.running_seqs, 1)
    no_overhead = replace(engine, step_overhead_s=0.0)
    at_peak = replace(no_overhead, compute_efficiency=1.0, bandwidth_efficiency=1.0)

    def figures(e: EngineConfig) -> tuple[float, float, float, LoadPrediction]:
        """(own prefill, decode after the first token, TPOT, the load) priced with `e`."""
        load = predict_load(replace(params, engine=e), per_replica, cached)
        tpot = token_time_s(hw, model, e, batch, work.context_tokens)
        # A request's own prefill is the lone one: the load's first token never comes sooner
        # (wave_service_s), and what it adds is waiting behind the wave's other prompts.
        own = prefill_time_s(hw, model, e, work.prompt_tokens, cached)
        return own, load.e2e_s - load.ttft_s, tpot, load

    full, bare, peak = figures(engine), figures(no_overhead), figures(at_peak)
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
        "overhead": full[1] - bare[1],
        "efficiency": bare[1] - peak[1],
        "ideal": peak[1] * decode_plain,
        "speculation": peak[1] * (1 - decode_plain),
    }
    tpot = {
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
        "batch": batch,
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
