"""KV cache memory: bytes per token, blocks, the pool's capacity and what fits in it.

- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element.
- Blocks per sequence = ceil(tokens / block_size); the last block wastes the rest. A contiguous
  reservation holds prompt + max_tokens slots and wastes what the sequence does not use.
- KV capacity = (HBM x gpu_memory_utilization - weights - activation reserve) / KV bytes per
  token, in whole blocks; concurrent sequences = capacity / blocks per sequence, where the
  blocks of a prefix every request shares are held once, not once per sequence.

Standard library and numpy only.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np

from labs.parameters.catalog import KV_DTYPE_BYTES, WEIGHT_DTYPE_BYTES, Hardware, ModelSpec
from labs.parameters.params import EngineConfig


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


def weight_bytes_read(model: ModelSpec, weight_dtype: str, num_tokens: float) -> float:
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
