"""Time: one engine step from its composition, a prompt's prefill, a decoding token, and
speculative decoding's tokens per pass.

A step takes max(compute, memory) + a fixed overhead, where compute = 2 x active parameters x
tokens / FLOP/s and memory = (weights read + KV read) / bandwidth (`step_time_s`). Prefill is
compute-bound, a decode step memory-bound; both come out of the same function, which the
simulator's ideal profile prices every step with.

Standard library and numpy only.
"""

from __future__ import annotations

import math

from labs.parameters.catalog import Hardware, ModelSpec
from labs.parameters.params import EngineConfig
from labs.prediction.memory import kv_bytes_per_token, kv_replication, weight_bytes_read


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
    hardware: Hardware, model: ModelSpec, engine: EngineConfig, num_tokens: float
) -> float:
    """Compute time of a step over `num_tokens` tokens: 2 x active parameters per token."""
    return 2 * model.active_params * num_tokens / compute_rate(hardware, engine)


def step_memory_s(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    num_tokens: float,
    kv_tokens_read: float,
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
    num_prefill_tokens: float,
    num_decode_tokens: float,
    kv_tokens_read: float,
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
    hardware: Hardware, model: ModelSpec, engine: EngineConfig, batch: float, kv_tokens_read: float
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


def spec_decode(tokens: int, k: int, alpha: float) -> tuple[float, float]:
    """(decode steps, tokens each step verifies per sequence) to make `tokens` more tokens
    with k drafts accepted at rate alpha, as the engine drafts: never past the request's last
    token, so with r tokens left a step drafts d = min(k, r - 1) and yields T tokens, T = j
    with chance alpha^(j-1) (1 - alpha) for j <= d and d + 1 with chance alpha^d. Whole-k
    steps are followed in the mean while more than k + 1 tokens are left; the last k + 1 by
    expectation, E(r) = 1 + sum_j P(T = j) E(r - j), since a few tokens left are where the
    mean path and the expected steps part (the chance of one step for all of them)."""
    if tokens <= 0:
        return 0.0, 1.0 + k
    if not k:
        return float(tokens), 1.0
    full = spec_tokens_per_step(k, alpha)
    bulk = max(0.0, (tokens - (k + 1)) / full)
    tail = min(tokens, k + 1)
    # steps[r], verified[r]: expected steps and verified tokens to make the last r tokens.
    steps = [0.0] * (tail + 1)
    verified = [0.0] * (tail + 1)
    for r in range(1, tail + 1):
        d = min(k, r - 1)
        chances = [alpha ** (j - 1) * (1 - alpha) for j in range(1, d + 1)] + [alpha**d]
        steps[r] = 1 + sum(c * steps[r - j] for j, c in enumerate(chances, start=1))
        verified[r] = 1 + d + sum(c * verified[r - j] for j, c in enumerate(chances, start=1))
    total = bulk + steps[tail]
    return total, (bulk * (1 + k) + verified[tail]) / total
