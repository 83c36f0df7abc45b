"""Does a lab fit in the memory of its GPUs on vLLM 0.33? Per GPU, as vLLM counts it.

- Weights: with `--load-format dummy` vLLM still allocates every weight at full size, split
  over the tp GPUs. Online fp8 (`--quantization fp8`) quantizes the linear layers only: the
  embeddings and the LM head stay bf16.
- A draft model (draft_model, and eagle, which runs as one: server._draft) is the target cut to
  round(draft_cost x layers) layers: its own embeddings and LM head plus those layers' share.
- The KV pool: `--kv-cache-memory-bytes` for kv_capacity_tokens (plus vLLM's null block) over
  the target's AND the draft's layers, as server.build_plan sizes it; or, with
  gpu_memory_utilization, what that share leaves, which must hold one request of
  max_model_len plus the null block (vLLM's start check, v1/core/kv_cache_planning.py).
- The activation reserve (the learner's setting) and the CUDA context, which exists before
  vLLM measures free memory (and why gpu_memory_utilization 1.0 cannot start).

Pure functions of the parameters and of the memory of one GPU.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from labs.backends.base import Device
from labs.backends.vllm.server import MODELS_DIR, _max_model_len
from labs.parameters.catalog import GB, KV_DTYPE_BYTES, WEIGHT_DTYPE_BYTES, ModelSpec
from labs.parameters.params import LabParams
from labs.prediction.predict import blocks_for_tokens

MAX_TP = 8  # the largest single-node worker the checks suggest
# What a GPU holds before vLLM measures its free memory: the CUDA context, cuBLAS/NCCL
# workspaces ("hundreds of MiB"). vLLM refuses to start when free memory is below
# gpu_memory_utilization x total (v1/worker/utils.py request_memory).
CUDA_CONTEXT_BYTES = 512 * 1024**2


# vLLM's own processes on a CPU, before any weight or KV block: its API server and its engine
# core, each a Python with torch and vLLM loaded, where a GPU's figure is its CUDA context. A
# CPU worker measures its own at each engine start (cpu.record_engine_memory: the group's
# proportional set size less weights, KV pool and the copies below); this is the figure until
# it has: 1.48 GB measured on a 2-core worker of the 0.32 build, 1.52 with the pool counted.
CPU_ENGINE_BYTES = 1_500_000_000


def in_gb(n: float) -> str:
    return f"{n / GB:,.1f} GB"


@functools.lru_cache(maxsize=32)
def _ties_embeddings(slug: str) -> bool:
    try:
        config = json.loads((MODELS_DIR / slug / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("tie_word_embeddings", False))


def embedding_params(model: ModelSpec) -> float:
    """Parameters of the input embeddings and the LM head (one matrix when they are tied)."""
    if not model.vocab_size:
        return 0.0
    return model.vocab_size * model.hidden_size * (1 if _ties_embeddings(model.name) else 2)


def vllm_weight_bytes(model: ModelSpec, weight_dtype: str, layers: int | None = None) -> float:
    """Bytes of the weights vLLM allocates for `model` cut to `layers` layers (all by default):
    the embeddings and LM head in 16 bits (online fp8 leaves them so), the rest at the dtype."""
    embed = embedding_params(model)
    body = (model.params - embed) * (layers if layers is not None else model.layers) / model.layers
    return body * WEIGHT_DTYPE_BYTES[weight_dtype] + embed * 2


def draft_layers(params: LabParams) -> int:
    """Layers of the draft model server._draft builds (0 without one)."""
    if params.engine.spec_method not in ("draft_model", "eagle"):
        return 0
    return max(1, round(params.engine.draft_cost * params.model.layers))


def kv_bytes_per_token_per_gpu(params: LabParams, tp: int) -> int:
    """KV bytes one token takes on each GPU, over the target's and the draft's layers: the KV
    heads are split over the GPUs, or copied when there are fewer heads than GPUs."""
    model = params.model
    heads = max(1, model.kv_heads // tp)
    layers = model.layers + draft_layers(params)
    return 2 * layers * heads * model.head_dim * KV_DTYPE_BYTES[params.engine.kv_dtype]


def usable_pool_tokens(params: LabParams) -> int | None:
    """Tokens the fixed pool holds for requests (whole blocks; the null block is extra), or
    None when vLLM sizes the pool from gpu_memory_utilization."""
    engine = params.engine
    if engine.kv_capacity_tokens is None:
        return None
    return blocks_for_tokens(engine.kv_capacity_tokens, engine.block_size) * engine.block_size


@dataclass(frozen=True)
class MemoryNeed:
    """What one GPU of a replica on `tp` GPUs needs, part by part, and what it has."""

    weights: float
    draft: float
    kv: float  # the fixed pool, or one max_model_len request plus the null block
    reserve: float
    context: float
    have: float  # the GPU's memory (x utilization when vLLM sizes the pool from it)
    fixed_pool: bool
    tp: int

    @property
    def total(self) -> float:
        return self.weights + self.draft + self.kv + self.reserve + self.context

    @property
    def fits(self) -> bool:
        return self.total <= self.have


def gpu_memory(params: LabParams, memory_bytes: int | None = None) -> float:
    """Memory of one GPU: what the worker announced, else the catalog's."""
    return float(memory_bytes or params.hardware.hbm_bytes)


def memory_need(
    params: LabParams, tp: int | None = None, memory_bytes: int | None = None
) -> MemoryNeed:
    engine, model = params.engine, params.model
    tp = tp or engine.tp
    per_token = kv_bytes_per_token_per_gpu(params, tp)
    memory = gpu_memory(params, memory_bytes)
    if engine.kv_capacity_tokens is not None:
        blocks = blocks_for_tokens(engine.kv_capacity_tokens, engine.block_size) + 1
        have = memory
    else:
        blocks = blocks_for_tokens(_max_model_len(params), engine.block_size) + 1
        have = memory * engine.gpu_memory_utilization
    draft = draft_layers(params)
    return MemoryNeed(
        weights=vllm_weight_bytes(model, engine.weight_dtype) / tp,
        draft=vllm_weight_bytes(model, engine.weight_dtype, draft) / tp if draft else 0.0,
        kv=blocks * engine.block_size * per_token,
        reserve=float(engine.activation_reserve_bytes),
        context=float(CUDA_CONTEXT_BYTES),
        have=have,
        fixed_pool=engine.kv_capacity_tokens is not None,
        tp=tp,
    )


def _tp_allowed(model: ModelSpec, tp: int) -> bool:
    # vLLM's rule (labs.parameters.params checks it too): tp divides the heads, and the KV heads
    # are split (divisible by tp) or copied (tp divisible by them).
    return not model.heads % tp and (not model.kv_heads % tp or not tp % model.kv_heads)


def smallest_tp(
    params: LabParams, memory_bytes: int | None = None, most: int = MAX_TP
) -> int | None:
    for tp in (1, 2, 4, 8, 16, 32, 64):
        if tp > most:
            break
        if _tp_allowed(params.model, tp) and memory_need(params, tp, memory_bytes).fits:
            return tp
    return None


def _largest_pool(need: MemoryNeed, params: LabParams) -> int:
    """The most kv_capacity_tokens that fit beside everything else (whole blocks, null block
    kept back), or 0."""
    bs = params.engine.block_size
    room = need.have - need.weights - need.draft - need.reserve - need.context
    blocks = int(room // (bs * kv_bytes_per_token_per_gpu(params, need.tp))) - 1
    return max(0, blocks * bs)


def memory_problem(
    params: LabParams, memory_bytes: int | None = None, most_gpus: int = MAX_TP
) -> str | None:
    """Why the lab cannot start on tp GPUs of `memory_bytes` each (the catalog's by default),
    with what each part takes and what would fit; or None."""
    need = memory_need(params, memory_bytes=memory_bytes)
    if need.fits:
        return None
    engine, gpu = params.engine, params.hardware.name
    if need.fixed_pool:
        kv_what = f"{engine.kv_capacity_tokens:,}-token KV pool {in_gb(need.kv)}"
    else:
        kv_what = f"KV for one {_max_model_len(params):,}-token request {in_gb(need.kv)}"
    draft = f" + draft model {in_gb(need.draft)}" if need.draft else ""
    holds = f"one {gpu} holds {in_gb(need.have)}" + (
        "" if need.fixed_pool else f" at gpu_memory_utilization {engine.gpu_memory_utilization:g}"
    )
    advice = []
    smallest = smallest_tp(params, memory_bytes, most_gpus)
    if smallest and smallest != engine.tp:
        advice.append(f"tp {smallest} would fit")
    if need.fixed_pool:
        room = _largest_pool(need, params)
        longest = params.workload.prompt_range[1] + params.workload.output_range[1]
        if room >= longest:
            advice.append(f"kv_capacity_tokens up to {room:,} fits at tp {engine.tp}")
    if not advice:
        advice.append(f"no tp up to {most_gpus} fits on {gpu}")
    return (
        f"tp {engine.tp} is too few {gpu} GPUs for this lab on vLLM: per GPU, weights "
        f"{in_gb(need.weights)} ({engine.weight_dtype}){draft} + {kv_what} + activation reserve "
        f"{in_gb(need.reserve)} + CUDA context {in_gb(need.context)} = {in_gb(need.total)}, but "
        f"{holds}; {' or '.join(advice)}"
    )


def cpu_vocab_copies_bytes(model: ModelSpec) -> float:
    """What vLLM's CPU build adds to the weights: a second copy of each vocabulary matrix, the
    embedding and the LM head (the same matrix twice when they are tied). Its matrix kernels
    get a packed copy of every linear layer, and of these two the original stays too, for the
    embedding lookup (model_executor/layers/vocab_parallel_embedding.py packs them with
    remove_weight=False). Measured on the 0.32 build: Llama 3 8B's shape cut to 2 and to 4
    layers held 3.54 GB beyond weights and pool at both, 2.1 GB of it these copies; Qwen2.5
    0.5B (tied) 0.27 GB twice. In 16 bits, as the weights."""
    if not model.vocab_size:
        return 0.0
    return 2.0 * model.vocab_size * model.hidden_size * 2


@dataclass(frozen=True)
class CpuMemory:
    """What a vLLM engine on a CPU worker needs, part by part, and what the worker can give."""

    weights: float
    draft: float
    kv: float
    copies: float  # cpu_vocab_copies_bytes
    processes: float  # the engine's processes, measured (or CPU_ENGINE_BYTES)
    measured: bool  # whether `processes` is this worker's measurement
    reserve: float
    have: float  # what a new engine can have now
    memory: float  # the worker's memory
    live: bool  # whether `have` is the worker's live figure (else its whole memory)

    @property
    def fixed(self) -> float:
        return self.weights + self.draft + self.copies + self.processes + self.reserve

    @property
    def total(self) -> float:
        return self.fixed + self.kv


def cpu_memory(params: LabParams, device: Device) -> CpuMemory | None:
    """The CPU engine's memory for a lab with a fixed KV pool on `device`; None when the pool or
    the worker's memory is not known."""
    engine = params.engine
    memory = device.memory_bytes
    if not memory or engine.kv_capacity_tokens is None:
        return None
    need = memory_need(params, 1, memory)
    processes = device.engine_bytes
    return CpuMemory(
        weights=need.weights,
        draft=need.draft,
        kv=need.kv,
        copies=cpu_vocab_copies_bytes(params.model) * (2 if need.draft else 1),
        processes=float(processes or CPU_ENGINE_BYTES),
        measured=processes is not None,
        reserve=need.reserve,
        have=float(device.available_bytes if device.available_bytes is not None else memory),
        memory=float(memory),
        live=device.available_bytes is not None,
    )


def _cpu_parts(m: CpuMemory, params: LabParams) -> str:
    engine = params.engine
    draft = f" + draft model {in_gb(m.draft)}" if m.draft else ""
    reserve = f" + activation reserve {in_gb(m.reserve)}" if m.reserve else ""
    where = (
        "measured when this worker's engine last started"
        if m.measured
        else "not measured on this worker yet"
    )
    own = in_gb(m.copies + m.processes)
    copies = (
        f", and the second copy of the embedding and LM head that its CPU matrix kernels keep, "
        f"{in_gb(m.copies)}"
        if m.copies
        else ""
    )
    if m.live:
        held = max(m.memory - m.have, 0.0)
        can = (
            f"the worker can give it {in_gb(m.have)} now (its {in_gb(m.memory)} less "
            f"{in_gb(held)} that the machine's other processes hold)"
        )
    else:
        can = f"the CPU worker has {in_gb(m.memory)}"
    return (
        f"weights {in_gb(m.weights)} ({engine.weight_dtype}){draft} + "
        f"{engine.kv_capacity_tokens:,}-token KV pool {in_gb(m.kv)} + vLLM's own working memory "
        f"{own} (its processes {in_gb(m.processes)}, {where}{copies}){reserve} = "
        f"{in_gb(m.total)}, but {can}"
    )


def cpu_memory_refusals(params: LabParams, device: Device) -> dict[str, str]:
    """What would not start in the memory a CPU worker can give its engine now (its RAM less
    what the machine's other processes hold, announced on every heartbeat): the weights, the
    fixed KV pool (vLLM's CPU build allocates all of it at start), the engine's own working
    memory, by field ("model" when not even the smallest pool fits beside the rest, else
    "kv_capacity_tokens", with the largest pool that would); {} when it fits, or the memory
    or the pool is not known."""
    m = cpu_memory(params, device)
    if m is None or m.total <= m.have:
        return {}
    engine = params.engine
    per_block = engine.block_size * kv_bytes_per_token_per_gpu(params, 1)
    parts = _cpu_parts(m, params)
    if m.fixed + 2 * per_block > m.have:
        return {"model": f"model {params.model.name} cannot start on this CPU worker now: {parts}"}
    blocks = int((m.have - m.fixed) // per_block) - 1  # the null block kept back
    room = max(0, blocks * engine.block_size)
    return {
        "kv_capacity_tokens": f"kv_capacity_tokens must fit what this CPU worker can give: "
        f"{parts}; up to {room:,} tokens would fit"
    }
