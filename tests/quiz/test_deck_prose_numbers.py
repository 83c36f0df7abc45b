"""Numbers in the deck's prose are the predictor's numbers too.

`test_deck_numbers.py` checks each numeric card's stored value. This file checks the figures written
into the prose of every kind of card (answers, steps, options, explanations, follow-ups) wherever
the predictor can compute them from the inputs the card states: KV bytes, blocks and wasted slots,
contiguous waste, weight bytes, KV capacity and concurrent sequences, replicas and GPUs, decode step
time, E2E, batch speedup, speculative tokens per pass and speedup.

Each row names a card, a snippet exactly as the card's file spells it (so editing the prose breaks
the row, and someone has to look again), the predictor quantity behind it, and the value the
snippet states in a unit, with a tolerance that accepts the snippet's rounding. A quantity is a
predictor key for lab parameters (`Key`), a public formula of `labs.prediction.predict`
(`Formula`), or simple arithmetic of those with the counts the card states (`Key(...) * 32`,
`Key(a) / Key(b)`).

Left out on purpose, because the predictor does not compute them: published measurements and paper
figures (PagedAttention's 20.4-38.2 % and < 4 %, vLLM's ~1.5x spec gain), measured load-test inputs
(47 x 0.8 capacity, 20,000 tokens/s, goodput), statistics (1 - 0.95^10), hardware ratios (the
~300 FLOP/byte ridge), chunk counts and realistic-efficiency ranges (150-200 tokens/s).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.quiz.test_deck_numbers import CONTENT, UNIT_SIZE, predicted_base

# The card units, plus the few the prose uses besides them.
PROSE_UNIT_SIZE: dict[str, float] = {**UNIT_SIZE, "TB": 1e12, "GB/s": 1e9}


class Quantity:
    """Something the predictor computes, in its base unit; combines with numbers and others."""

    def base(self) -> float:
        raise NotImplementedError

    def _op(self, fn: Callable[[float, float], float], other: Any, swap: bool = False) -> Quantity:
        other = other if isinstance(other, Quantity) else Const(other)
        return Combined(fn, other, self) if swap else Combined(fn, self, other)

    def __add__(self, other: Any) -> Quantity:
        return self._op(operator.add, other)

    def __sub__(self, other: Any) -> Quantity:
        return self._op(operator.sub, other)

    def __rsub__(self, other: Any) -> Quantity:
        return self._op(operator.sub, other, swap=True)

    def __mul__(self, other: Any) -> Quantity:
        return self._op(operator.mul, other)

    def __truediv__(self, other: Any) -> Quantity:
        return self._op(operator.truediv, other)


@dataclass(frozen=True, eq=False)
class Key(Quantity):
    """`predict(parse_lab_params(params)).as_dict()[key]`, as a card's `check: {key, params}`."""

    key: str
    params: Mapping[str, Any]

    def base(self) -> float:
        return predicted_base({"key": self.key, "params": dict(self.params)}, self.key)


@dataclass(frozen=True, eq=False)
class Formula(Quantity):
    """A public formula of `labs.prediction.predict`, as a card's `check: {formula, args}`."""

    name: str
    args: Mapping[str, Any]

    def base(self) -> float:
        return predicted_base({"formula": self.name, "args": dict(self.args)}, self.name)


@dataclass(frozen=True, eq=False)
class Const(Quantity):
    value: float

    def base(self) -> float:
        return self.value


@dataclass(frozen=True, eq=False)
class Combined(Quantity):
    fn: Callable[[float, float], float]
    left: Quantity
    right: Quantity

    def base(self) -> float:
        return self.fn(self.left.base(), self.right.base())


@dataclass(frozen=True)
class Figure:
    slug: str
    snippet: str  # exactly as in content/cards/<slug>.yaml
    quantity: Quantity = field(repr=False)
    stated: float  # the value the snippet states, in `unit`
    unit: str
    tolerance: float  # absolute, in `unit`: accepts the snippet's rounding

    @property
    def id(self) -> str:
        return f"{self.slug}: {self.snippet}"


# -- lab parameters the cards state --------------------------------------------------------------

L8 = {"model": "llama-3-8b", "gpu": "h100-sxm"}
L8_BATCH1 = {**L8, "concurrency": 1, "context_tokens": 1}  # the weights alone, as the cards do
L8_BATCH32 = {**L8, "concurrency": 32, "context_tokens": 2048}
L8_BATCH32_8K = {**L8, "concurrency": 32, "context_tokens": 8192}
L8_BATCH1_8K = {**L8, "concurrency": 1, "context_tokens": 8192}
SEQ_1000 = {"model": "llama-3-8b", "block_size": 16, "prompt_tokens": 700, "output_tokens": 300}
SEQ_1000 |= {"max_tokens": 2048}
SEQ_1000_B128 = {**SEQ_1000, "block_size": 128}
# 700-token prompt sampled n times: its whole blocks shared through the prefix cache.
SHARED_700 = {**SEQ_1000, "shared_prefix_tokens": 700}
# A 1,000-token system prompt in front of each request's own text.
SYSTEM_1000 = {"model": "llama-3-8b", "prompt_tokens": 1100, "shared_prefix_tokens": 1000}
# A 600-token sequence in a contiguous 8,192-slot reservation (prompt + max_tokens = 8,192).
SEQ_600_IN_8K = {"model": "llama-3.1-8b", "prompt_tokens": 100, "output_tokens": 500}
SEQ_600_IN_8K |= {"max_tokens": 8092}
# The same 8,192 x 20 = 163,840-slot pool, paged.
PAGED_163840 = {"model": "llama-3.1-8b", "kv_capacity_tokens": 163840}
# A server whose KV pool holds 40 chats of 4,096 tokens.
CAP_4K = {"model": "llama-3.1-70b", "kv_capacity_tokens": 163840}
R70 = {"model": "llama-3-70b", "gpu": "h100-sxm", "tp": 4, "gpu_memory_utilization": 0.9}
R70 |= {"context_tokens": 8192, "concurrency": 2000}
R70_FP8_KV = {**R70, "kv_dtype": "fp8"}
R70_FP8_WEIGHTS = {**R70, "weight_dtype": "fp8"}
# The seed's 70B-class model (80 layers, 8 KV heads, dim 128, 70 B parameters in fp16) on one
# 8 x 80 GB node: 640 GB - 140 GB of weights = 500 GB of KV, 256 sessions of 32K tokens.
M70 = {"layers": 80, "kv_heads": 8, "head_dim": 128, "params_b": 70}
NODE70 = {**M70, "gpu": "h100-sxm", "tp": 8, "gpu_memory_utilization": 1.0}
NODE70 |= {"context_tokens": 32768, "concurrency": 256}
NODE70_8K = {**NODE70, "context_tokens": 8192}
# The seed's 7B model in fp16 (~14 GB) decoding one sequence.
M7 = {"layers": 32, "kv_heads": 8, "heads": 32, "head_dim": 128, "params_b": 7}
M7 |= {"weight_dtype": "fp16", "concurrency": 1, "context_tokens": 1}
# 32 layers, head dim 128 in BF16, with 32 (MHA), 8 (GQA) or 1 (MQA) KV heads.
MHA = {"layers": 32, "kv_heads": 32, "head_dim": 128, "params_b": 6.74}
GQA8 = {"layers": 32, "kv_heads": 8, "heads": 32, "head_dim": 128, "params_b": 8.03}
MQA = {"layers": 32, "kv_heads": 1, "heads": 32, "head_dim": 128, "params_b": 8.03}


def pool_40gb(model: dict[str, Any], context_tokens: int) -> dict[str, Any]:
    """`model` on a GPU whose memory is its weights plus exactly 40 GB of KV pool."""
    weights_gb = model["params_b"] * 2
    gpu = {"hbm_gb": weights_gb + 40, "bandwidth_tbs": 3.35, "tflops": 989}
    return {**model, **gpu, "gpu_memory_utilization": 1.0, "context_tokens": context_tokens}


def ceil_div(a: float, b: float) -> float:
    return math.ceil(a / b)


def spec_per_pass(k: int, alpha: float = 0.7) -> Formula:
    return Formula("spec_tokens_per_step", {"k": k, "alpha": alpha})


def on(slug: str, *rows: tuple[str, Quantity, float, str, float]) -> list[Figure]:
    """Rows of one card: (snippet, quantity, stated value, unit, tolerance)."""
    return [Figure(slug, *row) for row in rows]


# -- named quantities ----------------------------------------------------------------------------

W8 = Key("weight_bytes", L8)
W8_INT4 = Key("weight_bytes", {**L8, "weight_dtype": "int4"})
STEP1 = Key("decode_step_s", L8_BATCH1)
STEP1_INT4 = Key("decode_step_s", {**L8_BATCH1, "weight_dtype": "int4"})
STEP32 = Key("decode_step_s", L8_BATCH32)
TOKS1 = Key("decode_tokens_per_s", L8_BATCH1)
TOKS1_70PCT = Key("decode_tokens_per_s", {**L8_BATCH1, "bandwidth_efficiency": 0.7})
SPEEDUP32 = Key("batch_speedup_vs_batch1", L8_BATCH32)
SPEEDUP32_8K = Key("batch_speedup_vs_batch1", L8_BATCH32_8K)
KV8_2K = Key("kv_bytes_per_seq", L8_BATCH32)
KV8_2K_FP8 = Key("kv_bytes_per_seq", {**L8_BATCH32, "kv_dtype": "fp8"})
KV8_8K = Key("kv_bytes_per_seq", L8_BATCH32_8K)
KV8_TOKEN_FP8 = Key("kv_bytes_per_token", {"model": "llama-3-8b", "kv_dtype": "fp8"})
POOL8_UTIL050 = Key("kv_memory_bytes", {**L8, "gpu_memory_utilization": 0.5})
POOL8_UTIL092 = Key("kv_memory_bytes", {**L8, "gpu_memory_utilization": 0.92})
PREFILL_6000 = Key("prefill_s", {**L8, "prompt_tokens": 6000, "compute_efficiency": 0.5})

W7 = Key("weight_bytes", M7)
STEP7_H100 = Key("decode_step_s", {**M7, "gpu": "h100-sxm"})
STEP7_A100 = Key("decode_step_s", {**M7, "gpu": "a100-80gb"})
STEP7_L4 = Key("decode_step_s", {**M7, "gpu": "l4"})

KVTOK_MHA = Key("kv_bytes_per_token", MHA)
KVTOK_GQA = Key("kv_bytes_per_token", GQA8)
KVTOK_MQA = Key("kv_bytes_per_token", MQA)
KVTOK_L8 = Key("kv_bytes_per_token", {"model": "llama-3-8b"})
KV_MHA_4K = Key("kv_bytes_per_seq", {**MHA, "context_tokens": 4096})
KV_GQA_4K = Key("kv_bytes_per_seq", {**GQA8, "context_tokens": 4096})
SEQS_MHA_40GB = Key("max_concurrent_seqs", pool_40gb(MHA, 4096))
SEQS_GQA_40GB = Key("max_concurrent_seqs", pool_40gb(GQA8, 4096))

BLOCKS_1000 = Key("blocks_per_seq", SEQ_1000)
BLOCKS_1000_B128 = Key("blocks_per_seq", SEQ_1000_B128)
EMPTY_1000 = Key("slots_wasted_per_seq", SEQ_1000)
EMPTY_1000_B128 = Key("slots_wasted_per_seq", SEQ_1000_B128)
RESERVED_1000 = Key("contiguous_reserved_slots", SEQ_1000)
UNUSED_1000 = Key("contiguous_wasted_slots", SEQ_1000)
UNUSED_SHARE_1000 = Key("contiguous_waste_fraction", SEQ_1000)
PROMPT_BLOCKS_700 = Key("prompt_blocks", SEQ_1000)
SHARED_BLOCKS_700 = Key("prefix_cached_tokens", SHARED_700) / 16
UNUSED_SHARE_8K = Key("contiguous_waste_fraction", SEQ_600_IN_8K)
BLOCKS_600 = Key("blocks_per_seq", SEQ_600_IN_8K)
RESERVED_8K = Key("contiguous_reserved_slots", SEQ_600_IN_8K)
PAGED_600 = Key("max_concurrent_seqs", {**PAGED_163840, "context_tokens": 600})
CACHED_1000 = Key("prefix_cached_tokens", SYSTEM_1000)
CACHED_1000_B64 = Key("prefix_cached_tokens", {**SYSTEM_1000, "block_size": 64})

W70 = Key("weight_bytes", R70)
W70_FP8 = Key("weight_bytes", R70_FP8_WEIGHTS)
POOL70 = Key("kv_memory_bytes", R70)
KV70_8K = Key("kv_bytes_per_seq", R70)
KV70_8K_FP8 = Key("kv_bytes_per_seq", R70_FP8_KV)
KV70_2K = Key("kv_bytes_per_seq", {**R70, "context_tokens": 2048})
SEQS70 = Key("max_concurrent_seqs", R70)
# The pool in fractional 8,192-token conversations (before rounding down to whole ones).
KV70_POOL_SEQS = Key("kv_capacity_tokens", R70) / 8192
SEQS70_2K = Key("max_concurrent_seqs", {**R70, "context_tokens": 2048})
SEQS70_FP8 = Key("max_concurrent_seqs", R70_FP8_KV)
SEQS70_FP8_WEIGHTS = Key("max_concurrent_seqs", R70_FP8_WEIGHTS)
REPLICAS70 = Key("replicas_needed", R70)
REPLICAS70_FP8 = Key("replicas_needed", R70_FP8_KV)
GPUS70 = Key("gpus_needed", R70)
GPUS70_FP8 = Key("gpus_needed", R70_FP8_KV)

KVTOK_M70 = Key("kv_bytes_per_token", M70)
KV70_32K = Key("kv_bytes_per_seq", NODE70)
KV70_32K_FP8 = Key("kv_bytes_per_seq", {**NODE70, "kv_dtype": "fp8"})
KV70_8K_NODE = Key("kv_bytes_per_seq", NODE70_8K)
W70_NODE = Key("weight_bytes", NODE70)
POOL70_NODE = Key("kv_memory_bytes", NODE70)
SESSIONS70_NODE = Key("max_concurrent_seqs", NODE70)
NODES70 = Key("replicas_needed", NODE70)
NODES70_FP8 = Key("replicas_needed", {**NODE70, "kv_dtype": "fp8"})
NODES70_8K = Key("replicas_needed", NODE70_8K)
NODES70_8K_FP8 = Key("replicas_needed", {**NODE70_8K, "kv_dtype": "fp8"})
CHATS_4K = Key("max_concurrent_seqs", {**CAP_4K, "context_tokens": 4096})
CHATS_32K = Key("max_concurrent_seqs", {**CAP_4K, "context_tokens": 32768})
CHATS_32K_DOUBLED = Key(
    "max_concurrent_seqs", {**CAP_4K, "kv_capacity_tokens": 327680, "context_tokens": 32768}
)
KVTOK70 = Key("kv_bytes_per_token", {"model": "llama-3.1-70b"})
KVTOK70_FP8 = Key("kv_bytes_per_token", {"model": "llama-3.1-70b", "kv_dtype": "fp8"})

E2E_CHAT = Formula("e2e_time_s", {"ttft_s": 0.3, "tpot_s": 0.025, "output_tokens": 400})
# The mistake the card warns about: TPOT times all n tokens, i.e. the formula for n + 1 tokens.
E2E_CHAT_N_TIMES_TPOT = Formula(
    "e2e_time_s", {"ttft_s": 0.3, "tpot_s": 0.025, "output_tokens": 401}
)
E2E_AGENT_CALL = Formula("e2e_time_s", {"ttft_s": 0.4, "tpot_s": 0.02, "output_tokens": 150})
SPEC_SPEEDUP = Formula("spec_speedup", {"k": 3, "alpha": 0.7, "draft_cost": 0.1})

FIGURES: list[Figure] = [
    # -- batching and decode step time (Llama 3 8B, one H100 SXM) -----------------------------
    *on(
        "batch-size-throughput-vs-latency",
        ("~21×", SPEEDUP32, 21, "x", 0.5),
        ("About 1.5×", STEP32 / STEP1, 1.5, "x", 0.05),
        ("≈ 4.8 ms", STEP1, 4.8, "ms", 0.05),
        ("≈ 7.4 ms", STEP32, 7.4, "ms", 0.05),
        ("≈ 8.6 GB of KV", KV8_2K * 32, 8.6, "GB", 0.05),
    ),
    *on(
        "batch32-speedup-llama3-8b-h100",
        ("(~8.6 GB)", KV8_2K * 32, 8.6, "GB", 0.05),
        ("≈ 0.27 GB", KV8_2K, 0.27, "GB", 0.005),
        ("≈ 16.1 GB", W8, 16.1, "GB", 0.05),
        # 16.1 + 8.6, a sum of two rounded terms: 24.65 GB.
        ("= 24.7 GB", W8 + KV8_2K * 32, 24.7, "GB", 0.1),
        ("≈ 1.5× longer", STEP32 / STEP1, 1.5, "x", 0.05),
        ("32 / 1.5 ≈ 21×", SPEEDUP32, 21, "x", 0.5),
        ("32 × 1.07 GB", KV8_8K, 1.07, "GB", 0.005),
        ("≈ 34 GB", KV8_8K * 32, 34, "GB", 0.5),
        ("step ≈ 50 GB", W8 + KV8_8K * 32, 50, "GB", 0.5),
        ("≈ 17.1 GB", W8 + KV8_8K, 17.1, "GB", 0.05),
        ("≈ 11×", SPEEDUP32_8K, 11, "x", 0.5),
    ),
    *on("decode-memory-bound", ("(≈ 16 GB for an 8B model in BF16)", W8, 16, "GB", 0.5)),
    *on(
        "decode-step-llama3-8b-h100-batch1",
        ("≈ 210 tokens/s ideal", TOKS1, 210, "tokens/s", 5),
        ("~150 at 70 % of peak bandwidth", TOKS1_70PCT, 150, "tokens/s", 5),
        ("≈ 16.1 GB.", W8, 16.1, "GB", 0.05),
        ("≈ 4.8 ms per step", STEP1, 4.8, "ms", 0.05),
        ("≈ 0.27 GB each", KV8_2K, 0.27, "GB", 0.005),
        ("≈ 8.6 GB for 32", KV8_2K * 32, 8.6, "GB", 0.05),
        ("≈ 7.4 ms for 32 tokens", STEP32, 7.4, "ms", 0.05),
        ("throughput ≈ 21×", SPEEDUP32, 21, "x", 0.5),
    ),
    *on("naive-generate-loop-does-not-scale", ("~5 ms step", STEP1, 5, "ms", 0.5)),
    *on(
        "reduce-kv-read-per-step",
        ("≈ 4.3 GB", KV8_2K_FP8 * 32, 4.3, "GB", 0.05),
        ("≈ 8.6 GB", KV8_2K * 32, 8.6, "GB", 0.05),
    ),
    # -- a 7B model in fp16 decoding one sequence ---------------------------------------------
    *on(
        "hardware-spec-for-decode-speed",
        ("streams the ~14 GB of weights", W7, 14, "GB", 0.5),
        ("≈ 4.2 ms on an H100 SXM", STEP7_H100, 4.2, "ms", 0.05),
        ("≈ 6.9 ms on an A100 80 GB", STEP7_A100, 6.9, "ms", 0.05),
        ("≈ 47 ms on an L4", STEP7_L4, 47, "ms", 0.5),
    ),
    # -- weight quantization -------------------------------------------------------------------
    *on(
        "int4-weight-only-speeds-decode",
        ("roughly 4× fewer bytes", W8 / W8_INT4, 4, "x", 0),
        ("reads ~16 GB per step", W8, 16, "GB", 0.5),
        # Ranges: the predictor's INT4 bytes leave out group scales, so they sit at the low end.
        ("About 4–4.5 GB", W8_INT4, 4.25, "GB", 0.25),
        ("from ≈ 4.8 ms", STEP1, 4.8, "ms", 0.05),
        ("to ≈ 1.2–1.3 ms", STEP1_INT4, 1.25, "ms", 0.06),
    ),
    # -- KV bytes per token and per sequence ---------------------------------------------------
    *on(
        "kv-bytes-per-token-llama3-8b",
        ("131,072 bytes", KVTOK_L8, 131072, "bytes", 0),
        ("256 MiB of KV", KV8_2K, 256, "MiB", 0),
        ("64 KiB per token", KV8_TOKEN_FP8, 64, "KiB", 0),
    ),
    *on("kv-bytes-per-token-llama3-8b-fp8", ("(65,536 bytes)", KV8_TOKEN_FP8, 65536, "bytes", 0)),
    *on(
        "kv-bytes-per-token-mha-32-heads",
        ("= 524,288 bytes", KVTOK_MHA, 524288, "bytes", 0),
        ("With 8 KV heads: 131,072 bytes", KVTOK_GQA, 131072, "bytes", 0),
        ("4× the 128 KiB", KVTOK_MHA / KVTOK_GQA, 4, "x", 0),
        ("2 GiB of KV with MHA", KV_MHA_4K, 2, "GiB", 0),
        ("512 MiB with GQA-8", KV_GQA_4K, 512, "MiB", 0),
        ("40e9 / 2.15e9", KV_MHA_4K, 2.15e9, "bytes", 0.005e9),
        ("≈ 18 with MHA", SEQS_MHA_40GB, 18, "sequences", 0),
        ("about 74 with GQA-8", SEQS_GQA_40GB, 74, "sequences", 0),
    ),
    *on(
        "gqa-32-to-8-kv-heads",
        ("It shrinks 4× per token", KVTOK_MHA / KVTOK_GQA, 4, "x", 0),
        ("512 KiB →", KVTOK_MHA, 512, "KiB", 0),
        ("→ 128 KiB", KVTOK_GQA, 128, "KiB", 0),
        ("A 32× smaller cache than MHA", KVTOK_MHA / KVTOK_MQA, 32, "x", 0),
    ),
    *on("gqa-vs-mha", ("caches 4× less", KVTOK_MHA / KVTOK_L8, 4, "x", 0)),
    # -- blocks, empty slots and contiguous reservations ---------------------------------------
    *on(
        "paged-blocks-1000-tokens",
        ("63 blocks (1,008 slots)", BLOCKS_1000 * 16, 1008, "slots", 0),
        ("8 slots in the last block are empty", EMPTY_1000, 8, "slots", 0),
        ("= 8 blocks", BLOCKS_1000_B128, 8, "blocks", 0),
        ("= 1,024 slots", BLOCKS_1000_B128 * 128, 1024, "slots", 0),
        ("24 slots are empty", EMPTY_1000_B128, 24, "slots", 0),
    ),
    *on(
        "contiguous-waste-1000-tokens",
        ("(of 2,748 reserved", RESERVED_1000, 2748, "slots", 0),
        ("reserved, ≈ 64 %)", UNUSED_SHARE_1000, 64, "%", 0.5),
        ("needs 63 blocks", BLOCKS_1000, 63, "blocks", 0),
        ("wastes only 8 slots", EMPTY_1000, 8, "slots", 0),
        ("≈ 63.6 % of the reservation", UNUSED_SHARE_1000, 63.6, "%", 0.05),
        ("holds 1,008 slots instead of 2,748", BLOCKS_1000 * 16, 1008, "slots", 0),
        ("about 2.7× as many", RESERVED_1000 / (BLOCKS_1000 * 16), 2.7, "x", 0.05),
    ),
    *on(
        "contiguous-waste-fraction-1000-tokens",
        ("(1,748 of 2,748 slots)", UNUSED_1000, 1748, "slots", 0),
        ("≈ 0.636", UNUSED_SHARE_1000, 0.636, "x", 0.0005),
    ),
    *on(
        "contiguous-8k-reservation-vs-paged",
        ("≈ 93 % of KV memory", UNUSED_SHARE_8K, 93, "%", 0.5),
        ("= 38 blocks", BLOCKS_600, 38, "blocks", 0),
        ("= 608 slots", BLOCKS_600 * 16, 608, "slots", 0),
        ("20 × 8,192 = 163,840 slots", RESERVED_8K * 20, 163840, "slots", 0),
        ("≈ 269 such sequences", PAGED_600, 269, "sequences", 0),
    ),
    *on(
        "parallel-sampling-shared-prompt-blocks",
        ("43 full blocks and one", SHARED_BLOCKS_700, 43, "blocks", 0),
        ("the last 12 prompt tokens", 700 - SHARED_BLOCKS_700 * 16, 12, "tokens", 0),
        ("88 prompt blocks", PROMPT_BLOCKS_700 * 2, 88, "blocks", 0),
        ("43 + 8 = 51", SHARED_BLOCKS_700 + 8, 51, "blocks", 0),
        ("8 × 44 = 352", PROMPT_BLOCKS_700 * 8, 352, "blocks", 0),
    ),
    # -- prefix caching of a 1,000-token system prompt -----------------------------------------
    *on(
        "shared-system-prompt-cache",
        ("62 full blocks = 992 tokens", CACHED_1000, 992, "tokens", 0),
        ("the last 8 system-prompt tokens", 1000 - CACHED_1000, 8, "tokens", 0),
    ),
    *on(
        "what-block-size-controls",
        ("15 × 64 = 960 tokens", CACHED_1000_B64, 960, "tokens", 0),
        ("62 × 16 = 992", CACHED_1000, 992, "tokens", 0),
    ),
    # -- Llama 3 70B, TP-4 replicas of 4 x H100, 8,192-token conversations ---------------------
    *on(
        "chats-per-replica-70b-8k-tp4",
        ("4 × 80 GB × 0.9 = 288 GB", POOL70 + W70, 288, "GB", 0.5),
        ("288 − 141.2 = 146.8 GB", POOL70, 146.8, "GB", 0.05),
        ("141.2 GB in BF16", W70, 141.2, "GB", 0.05),
        ("8,192 × 327,680 bytes ≈ 2.68 GB", KV70_8K, 2.68, "GB", 0.005),
        ("146.8 / 2.68 ≈ 54.7", Key("kv_capacity_tokens", R70) / 8192, 54.7, "sequences", 0.05),
        ("About 218 conversations", SEQS70_2K, 218, "sequences", 0),
        ("(146.8 GB / 0.671 GB", KV70_2K, 0.671, "GB", 0.0005),
        ("0.671 GB ≈ 218.7)", Key("kv_capacity_tokens", R70) / 2048, 218.7, "sequences", 0.05),
    ),
    *on(
        "gpus-for-2000-chats-70b-8k",
        ("About 38 replicas × 4 = 152 GPUs", REPLICAS70, 38, "replicas", 0),
        ("about 19 × 4 = 76 GPUs", GPUS70_FP8, 76, "GPUs", 0),
        ("× 0.9 = 288 GB", POOL70 + W70, 288, "GB", 0.5),
        ("≈ 141 GB of weights", W70, 141, "GB", 0.5),
        ("≈ 147 GB for KV", POOL70, 147, "GB", 0.5),
        ("8,192 tokens ≈ 2.68 GB", KV70_8K, 2.68, "GB", 0.005),
        ("floor(147 / 2.68) = 54", SEQS70, 54, "sequences", 0),
        ("ceil(2,000 / 54) = 38", REPLICAS70, 38, "replicas", 0),
        ("38 × 4 = 152", GPUS70, 152, "GPUs", 0),
        ("the leftover 0.7 of a conversation", KV70_POOL_SEQS - SEQS70, 0.7, "sequences", 0.05),
        ("by 54.7 instead", KV70_POOL_SEQS, 54.7, "sequences", 0.05),
        (
            "would give 37 replicas",
            Combined(ceil_div, Const(2000), KV70_POOL_SEQS),
            37,
            "replicas",
            0,
        ),
        ("strand 2 conversations", 2000 - SEQS70 * 37, 2, "sequences", 0),
        ("(≈ 1.34 GB per conversation)", KV70_8K_FP8, 1.34, "GB", 0.005),
        ("≈ 109 conversations per replica", SEQS70_FP8, 109, "sequences", 0),
        ("ceil(2,000 / 109) = 19 replicas = 76 GPUs", REPLICAS70_FP8, 19, "replicas", 0),
    ),
    *on(
        "gpus-for-2000-chats-70b-8k-fp8-kv",
        ("About 19 replicas", REPLICAS70_FP8, 19, "replicas", 0),
        ("half of the 152", GPUS70, 152, "GPUs", 0),
        ("160 KiB per token", Key("kv_bytes_per_token", R70_FP8_KV), 160, "KiB", 0),
        ("≈ 1.34 GB per 8k conversation", KV70_8K_FP8, 1.34, "GB", 0.005),
        ("still ≈ 147 GB", Key("kv_memory_bytes", R70_FP8_KV), 147, "GB", 0.5),
        ("≈ 109 conversations fit", SEQS70_FP8, 109, "sequences", 0),
        ("= 19 replicas → 76 GPUs", GPUS70_FP8, 76, "GPUs", 0),
        ("free ≈ 70 GB per replica", W70 - W70_FP8, 70, "GB", 1),
        ("about 26 more conversations", SEQS70_FP8_WEIGHTS - SEQS70, 26, "sequences", 0),
        ("only add ≈ 70 GB to the pool", W70 - W70_FP8, 70, "GB", 1),
    ),
    *on(
        "disaggregated-prefill-kv-transfer",
        ("(≈ 2.7 GB for 8K tokens", KV70_8K, 2.7, "GB", 0.05),
        ("327,680 bytes ≈ 2.7 GB per request", KV70_8K, 2.7, "GB", 0.05),
        ("≈ 27 GB/s sustained", KV70_8K * 10, 27, "GB/s", 0.5),
        ("(≈ 1.34 GB)", KV70_8K_FP8, 1.34, "GB", 0.005),
    ),
    # -- a 70B-class model on one 8 x 80 GB node, 32K-token sessions ---------------------------
    *on(
        "kv-per-32k-session-70b",
        ("= 10,737,418,240 bytes", KV70_32K, 10737418240, "bytes", 0),
        ("About 10.7 GB (10 GiB)", KV70_32K, 10.7, "GB", 0.05),
        ("≈ 10.74 GB = 10 GiB", KV70_32K, 10, "GiB", 0),
        ("about 0.33 MB of KV per token", KVTOK_M70, 0.33, "MB", 0.005),
        ("~1 GB per 3,000 tokens", KVTOK_M70 * 3000, 1, "GB", 0.05),
        ("About 2.75 TB", KV70_32K * 256, 2.75, "TB", 0.005),
    ),
    *on(
        "kv-for-256-sessions-32k-70b",
        ("≈ 2.75 TB of KV", KV70_32K * 256, 2.75, "TB", 0.005),
        ("≈ 500 GB left after weights", POOL70_NODE, 500, "GB", 5),
        ("~46 such sessions", SESSIONS70_NODE, 46, "sequences", 0),
        ("you need ~6 nodes", NODES70, 6, "replicas", 0),
        ("= 327,680 bytes (320 KiB)", KVTOK_M70, 327680, "bytes", 0),
        ("≈ 10.7 GB (exactly 10 GiB)", KV70_32K, 10.7, "GB", 0.05),
        ("≈ 2,749 GB", KV70_32K * 256, 2749, "GB", 0.5),
        ("≈ 140 GB of weights", W70_NODE, 140, "GB", 0.5),
        ("≈ 500 GB for KV", POOL70_NODE, 500, "GB", 5),
        ("≈ 46 sessions", SESSIONS70_NODE, 46, "sequences", 0),
        ("≈ 6 nodes of memory", NODES70, 6, "replicas", 0),
        ("(halves it to ≈ 1.4 TB)", KV70_32K_FP8 * 256, 1.4, "TB", 0.05),
        ("FP8 halves the KV to ≈ 1.4 TB", KV70_32K_FP8 * 256, 1.4, "TB", 0.05),
        ("still 2.75 times the ≈ 500 GB", KV70_32K_FP8 * 256 / POOL70_NODE, 2.75, "x", 0.005),
        ("even with FP8 it takes 3 nodes", NODES70_FP8, 3, "replicas", 0),
        ("≈ 690 GB", KV70_8K_NODE * 256, 690, "GB", 5),
        ("so two nodes", NODES70_8K, 2, "replicas", 0),
        ("FP8 KV on one", NODES70_8K_FP8, 1, "replicas", 0),
    ),
    *on(
        "context-4k-to-32k-capacity",
        ("(8× fewer)", CHATS_4K / CHATS_32K, 8, "x", 0),
        ("doubles to ~327,680", KVTOK70 / KVTOK70_FP8 * 163840, 327680, "tokens", 0),
        ("About 10;", CHATS_32K_DOUBLED, 10, "sequences", 0),
    ),
    # -- memory left for KV at a gpu_memory_utilization ----------------------------------------
    *on(
        "gpu-memory-utilization-too-low",
        ("0.5 leaves ≈ 24 GB of KV", POOL8_UTIL050, 24, "GB", 0.5),
        ("0.92 leaves ≈ 58 GB", POOL8_UTIL092, 58, "GB", 0.5),
    ),
    # -- latency: E2E and prefill --------------------------------------------------------------
    *on(
        "e2e-latency-from-ttft-tpot",
        ("10.275 s ≈ 10.28 s end to end", E2E_CHAT, 10.275, "s", 0.0005),
        ("≈ 10.28 s end to end", E2E_CHAT, 10.28, "s", 0.005),
        ("0.3 + 9.975 = 10.275 s", E2E_CHAT - 0.3, 9.975, "s", 0.0005),
        ("about 10.28 s.", E2E_CHAT, 10.28, "s", 0.005),
        ("gives 10.3 s, 25 ms too long", E2E_CHAT_N_TIMES_TPOT, 10.3, "s", 0.0005),
        ("10.3 s, 25 ms too long", E2E_CHAT_N_TIMES_TPOT - E2E_CHAT, 0.025, "s", 0.0005),
    ),
    *on(
        "when-e2e-beats-ttft",
        ("0.02 × 149 ≈ 3.4 s", E2E_AGENT_CALL, 3.4, "s", 0.05),
        ("about 20 s for six calls", E2E_AGENT_CALL * 6, 20, "s", 0.5),
    ),
    *on(
        "rag-6000-token-ttft-component",
        ("≈ 0.2 s", PREFILL_6000, 0.2, "s", 0.01),
        ("≈ 5 ms for an 8B model on an H100", Key("weight_read_s", L8_BATCH1), 5, "ms", 0.5),
        ("take ≈ 0.2 s there", PREFILL_6000, 0.2, "s", 0.01),
        ("375 blocks of 16", Key("prompt_blocks", {**L8, "prompt_tokens": 6000}), 375, "blocks", 0),
    ),
    # -- speculative decoding: k drafts, acceptance alpha, draft cost c ------------------------
    *on(
        "spec-speedup-k3-alpha07",
        ("/ 0.3 ≈ 2.53", spec_per_pass(3), 2.53, "tokens", 0.005),
        ("3 × 0.1 + 1 = 1.3", spec_per_pass(3) / SPEC_SPEEDUP, 1.3, "x", 0.0005),
        ("2.53 / 1.3 ≈ 1.95×", SPEC_SPEEDUP, 1.95, "x", 0.005),
    ),
    *on(
        "spec-tokens-per-pass-k3-alpha07",
        ("0.7599 / 0.3", spec_per_pass(3) * 0.3, 0.7599, "x", 0.00005),
        ("/ 0.3 ≈ 3.14", spec_per_pass(7), 3.14, "tokens", 0.005),
        ("only 0.61 more", spec_per_pass(7) - spec_per_pass(3), 0.61, "tokens", 0.005),
    ),
]


def card_text(slug: str) -> str:
    return (Path(CONTENT) / "cards" / f"{slug}.yaml").read_text(encoding="utf-8")


def predicted(figure: Figure) -> float:
    assert figure.unit in PROSE_UNIT_SIZE, f"{figure.id}: unit {figure.unit!r} unknown"
    return figure.quantity.base() / PROSE_UNIT_SIZE[figure.unit]


def agrees(figure: Figure, stated: float) -> bool:
    return abs(stated - predicted(figure)) <= figure.tolerance + 1e-9


def test_it_has_figures_to_check():
    assert len(FIGURES) >= 100
    assert len({f.slug for f in FIGURES}) >= 25


def test_each_figure_is_listed_once():
    ids = [f.id for f in FIGURES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("figure", FIGURES, ids=[f.id for f in FIGURES])
def test_the_card_says_it(figure: Figure):
    path = Path(CONTENT) / "cards" / f"{figure.slug}.yaml"
    assert path.is_file(), f"no card {figure.slug}"
    assert figure.snippet in card_text(figure.slug), (
        f"{figure.slug}: {figure.snippet!r} is no longer in the card; re-check the figure "
        f"against the predictor and update this row"
    )


@pytest.mark.parametrize("figure", FIGURES, ids=[f.id for f in FIGURES])
def test_the_predictor_agrees(figure: Figure):
    value = predicted(figure)
    assert agrees(figure, figure.stated), (
        f"{figure.slug}: {figure.snippet!r} states {figure.stated} {figure.unit}, the predictor "
        f"gives {value:.6g} {figure.unit}, tolerance {figure.tolerance}"
    )


@pytest.mark.parametrize("figure", FIGURES, ids=[f.id for f in FIGURES])
def test_it_rejects_a_wrong_figure(figure: Figure):
    # The same comparison fails once the stated number is off by more than the tolerance.
    off = 2 * figure.tolerance + 0.1 * max(abs(figure.stated), 1e-3)
    assert not agrees(figure, figure.stated + off)
    assert not agrees(figure, figure.stated - off)
