"""Will a lab start on vLLM, and on which GPUs? Checked at submit, before anything is queued.

- Memory: with `--load-format dummy` vLLM still allocates every weight at full size, so the
  weights, the KV pool and the activation reserve must fit the tp GPUs. The arithmetic is the
  predictor's (labs.predict): weight bytes, KV bytes per token (with KV heads copied when tp
  exceeds them), and what `gpu_memory_utilization` leaves; a draft model adds its layers' share
  of the weights.
- Workers: tp cannot exceed the GPUs of the largest online worker of the lab's GPU kind ("World
  size (4) is larger than the number of available GPUs" otherwise), and the kind must be one an
  online worker has.

Pure functions of the parameters and of `offer` (GPU kind -> the most GPUs one online worker of
that kind has); labs.workers.gpu_offer() reads the offer from the heartbeat rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from labs.backends.vllm.server import _max_model_len
from labs.catalog import GB, GPUS
from labs.params import LabParams, ParamError
from labs.predict import (
    blocks_for_tokens,
    kv_bytes_per_token,
    kv_replication,
    weight_bytes,
)

MAX_TP = 8  # the largest single-node worker the checks suggest


def _gb(n: float) -> str:
    return f"{n / GB:,.1f} GB"


@dataclass(frozen=True)
class MemoryNeed:
    """What one replica needs on `tp` GPUs, and what they hold."""

    weights: float
    kv: float  # the fixed pool, or the longest request's KV when vLLM sizes the pool itself
    reserve: float
    have: float  # tp x memory (x utilization when vLLM sizes the pool from it)
    fixed_pool: bool

    @property
    def fits(self) -> bool:
        return self.weights + self.kv + self.reserve <= self.have


def memory_need(params: LabParams, tp: int | None = None) -> MemoryNeed:
    engine, model, gpu = params.engine, params.model, params.hardware
    tp = tp or engine.tp
    weights = weight_bytes(model, engine.weight_dtype)
    if engine.spec_method in ("draft_model", "eagle"):
        # The draft is the target cut to round(draft_cost x layers) layers (server._draft).
        draft_layers = max(1, round(engine.draft_cost * model.layers))
        weights += weights * draft_layers / model.layers
    per_token = kv_bytes_per_token(model, engine.kv_dtype) * kv_replication(model, tp)
    if engine.kv_capacity_tokens is not None:
        # --kv-cache-memory-bytes: whole blocks plus vLLM's null block, whatever the utilization.
        blocks = blocks_for_tokens(engine.kv_capacity_tokens, engine.block_size) + 1
        kv = blocks * engine.block_size * per_token
        have = tp * gpu.hbm_bytes
        fixed = True
    else:
        # vLLM sizes the pool from what utilization leaves; it must hold the longest request.
        kv = _max_model_len(params) * per_token
        have = tp * gpu.hbm_bytes * engine.gpu_memory_utilization
        fixed = False
    return MemoryNeed(weights, kv, tp * engine.activation_reserve_bytes, have, fixed)


def _smallest_tp(params: LabParams) -> int | None:
    heads, kv_heads = params.model.heads, params.model.kv_heads
    for tp in (1, 2, 4, 8):
        # vLLM's rule (labs.params checks it too): tp divides the heads and the KV heads, or
        # the KV heads divide tp.
        if heads % tp or (kv_heads % tp and tp % kv_heads):
            continue
        if memory_need(params, tp).fits:
            return tp
    return None


def memory_problem(params: LabParams) -> str | None:
    """Why the lab cannot start on its GPUs for lack of memory, with the numbers; or None."""
    need = memory_need(params)
    if need.fits:
        return None
    engine, gpu = params.engine, params.hardware
    kv_what = (
        f"{engine.kv_capacity_tokens:,}-token KV pool {_gb(need.kv)}"
        if need.fixed_pool
        else f"KV for the longest request ({_max_model_len(params):,} tokens) {_gb(need.kv)}"
    )
    holds = f"{engine.tp}\u00d7 {gpu.name} hold{'s' if engine.tp == 1 else ''} {_gb(need.have)}" + (
        "" if need.fixed_pool else f" at gpu_memory_utilization {engine.gpu_memory_utilization:g}"
    )
    total = need.weights + need.kv + need.reserve
    smallest = _smallest_tp(params)
    advice = f"tp {smallest} would fit" if smallest else f"no tp up to {MAX_TP} fits on {gpu.name}"
    return (
        f"tp {engine.tp} is too few {gpu.name} GPUs for this lab on vLLM: weights "
        f"{_gb(need.weights)} ({engine.weight_dtype}) + {kv_what} + activation reserve "
        f"{_gb(need.reserve)} = {_gb(total)}, but {holds}; {advice}"
    )


def check_fits(params: LabParams, offer: Mapping[str, int]) -> None:
    """Refuse, by field and with numbers, a lab no online worker can start.

    Args:
        params: validated lab parameters (their GPU and tp).
        offer: GPU kind -> the most GPUs one online vLLM worker of that kind has.

    Raises:
        ParamError: `gpu` when no online worker has that kind, `tp` when it exceeds the largest
        worker's GPUs or the weights and KV do not fit.
    """
    gpu, tp = params.hardware.name, params.engine.tp
    if gpu not in offer:
        online = ", ".join(f"{k} (up to {n})" for k, n in sorted(offer.items())) or "none"
        raise ParamError(
            {
                "gpu": f"gpu must be a GPU kind an online vLLM worker has: {online}; got {gpu}. "
                "Run it on the simulator, or pick one of those"
            }
        )
    if tp > offer[gpu]:
        raise ParamError(
            {
                "tp": f"tp must be at most {offer[gpu]} on {gpu}: the largest online {gpu} "
                f"worker has {offer[gpu]} GPU{'s' if offer[gpu] != 1 else ''}, got {tp}"
            }
        )
    problem = memory_problem(params)
    if problem:
        raise ParamError({"tp": problem})


def requirement(params: LabParams) -> str:
    """What a lab needs to run on vLLM, in a sentence: `4× h100-sxm` and why more would not
    help, or why it cannot run on vLLM at all."""
    from labs.backends.vllm.server import check_supported

    try:
        check_supported(params)
    except ParamError as exc:
        return "cannot run on vLLM: " + "; ".join(exc.errors.values())
    gpu = params.hardware.name
    if gpu not in GPUS:
        return "cannot run on vLLM: a custom GPU exists only in the simulator"
    problem = memory_problem(params)
    if problem:
        return "cannot start as set: " + problem
    tp = params.engine.tp
    need = memory_need(params)
    used = need.weights + need.kv + need.reserve
    gpus = f"{tp}\u00d7 {gpu}" if tp > 1 else f"a {gpu}"
    return f"needs a vLLM worker with {gpus} (at least {_gb(used)} of its {_gb(need.have)})"
