"""Hardware and model catalogs for the labs: plain data, no Django.

GPU figures are per GPU and *dense* (without 2:4 sparsity): NVIDIA data sheets print the sparse
FLOP/s, which is twice the dense figure. Memory is in bytes with GB = 10^9, as the data sheets
print it. Every entry names its source (a data sheet or a model card) in its `source` field.

Model figures are the facts of each model's Hugging Face config.json (layers, hidden size, heads,
KV heads, head dim, vocabulary, max_position_embeddings) plus the parameter count on its model
card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

GB = 10**9
TB = 10**12
TFLOPS = 10**12

# Bytes per weight by weight precision. int4 ignores the few percent that group scales add.
WEIGHT_DTYPE_BYTES: dict[str, float] = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
# Bytes per KV element: "auto" keeps the activations' 16-bit type, whatever the weights are.
KV_DTYPE_BYTES: dict[str, int] = {"auto": 2, "fp8": 1}


@dataclass(frozen=True)
class Hardware:
    """One GPU (or the CPU of a CPU vLLM worker). A replica uses `tp` of them (see
    EngineConfig)."""

    name: str
    hbm_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    # None where the GPU has no FP8 tensor cores (A100): FP8 weights then run at BF16 rate.
    fp8_flops_per_s: float | None = None
    source: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the formulas need.

    `params` counts every weight; for a mixture-of-experts model `active_params` counts those one
    token passes through (shared layers plus `experts_per_token` experts), which sets its FLOPs.
    Both include the vocabulary tables (input embedding and LM head, vocab x hidden each, one
    shared table when `tied_embeddings`), which the formulas price apart
    (labs/prediction/predict.py).
    """

    name: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float
    active_params: float
    vocab_size: int | None = None
    max_context: int | None = None
    num_experts: int = 1
    experts_per_token: int = 1
    # config.json's tie_word_embeddings: the LM head is the input embedding's table.
    tied_embeddings: bool = False
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1


def _gpu(
    name: str,
    hbm_gb: float,
    bandwidth_tbs: float,
    bf16_tflops: float,
    fp8_tflops: float | None,
    source: str,
) -> Hardware:
    return Hardware(
        name=name,
        hbm_bytes=round(hbm_gb * GB),
        bandwidth_bytes_per_s=bandwidth_tbs * TB,
        bf16_flops_per_s=bf16_tflops * TFLOPS,
        fp8_flops_per_s=None if fp8_tflops is None else fp8_tflops * TFLOPS,
        source=source,
    )


_SPARSE_NOTE = "data sheet prints sparse FLOP/s; dense = half"

GPUS: dict[str, Hardware] = {
    gpu.name: gpu
    for gpu in (
        _gpu(
            "a100-40gb",
            40,
            1.555,
            312,
            None,
            "NVIDIA A100 data sheet (SXM4 40GB HBM2: 1,555 GB/s, 312 TFLOPS BF16 dense, no FP8),"
            " via glennklockwood.com/garden/processors/A100",
        ),
        _gpu(
            "a100-80gb",
            80,
            2.039,
            312,
            None,
            "NVIDIA A100 data sheet (SXM4 80GB HBM2e: 2,039 GB/s, 312 TFLOPS BF16 dense, no FP8),"
            " via glennklockwood.com/garden/processors/A100",
        ),
        _gpu(
            "h100-sxm",
            80,
            3.35,
            989,
            1979,
            "NVIDIA H100 data sheet (SXM5 80GB HBM3: 3.35 TB/s; BF16 1,979* / FP8 3,958* TFLOPS,"
            f" {_SPARSE_NOTE}), via archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html",
        ),
        _gpu(
            "h100-pcie",
            80,
            2.0,
            756,
            1513,
            "NVIDIA H100 data sheet (PCIe 80GB HBM2e: 2.0 TB/s; BF16 1,513* / FP8 3,026* TFLOPS,"
            f" {_SPARSE_NOTE}), via archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html",
        ),
        _gpu(
            "h200",
            141,
            4.8,
            989,
            1979,
            "NVIDIA H200 data sheet (SXM 141GB HBM3e: 4.8 TB/s; BF16 1,979* / FP8 3,958* TFLOPS,"
            f" {_SPARSE_NOTE}), via lzwjava.github.io/nvidia-h200-gpu-specs-en",
        ),
        _gpu(
            "l4",
            24,
            0.3,
            121,
            242,
            "NVIDIA L4 data sheet (24GB GDDR6: 300 GB/s; BF16 242* / FP8 485* TFLOPS,"
            f" {_SPARSE_NOTE}), via grokipedia.com/page/NVIDIA_L4_vs_L40S",
        ),
        _gpu(
            "l40s",
            48,
            0.864,
            362,
            733,
            "NVIDIA L40S data sheet (48GB GDDR6: 864 GB/s; BF16 362 dense (733*),"
            " FP8 733 dense (1,466*)), via mullet.se/product.html?product_id=355414",
        ),
        _gpu(
            "b200",
            180,
            7.7,
            2250,
            4500,
            "NVIDIA HGX B200 table (180GB HBM3e, 7.7 TB/s; FP8 9 PF*), via"
            " zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html; dense BF16/FP8"
            " from glennklockwood.com/garden/processors/B200. Early pages say 192 GB / 8 TB/s",
        ),
    )
}


def _dense(
    name: str,
    *,
    layers: int,
    hidden_size: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    params_b: float,
    vocab_size: int,
    max_context: int,
    source: str,
    tied_embeddings: bool = False,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        layers=layers,
        hidden_size=hidden_size,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        params=params_b * 1e9,
        active_params=params_b * 1e9,
        vocab_size=vocab_size,
        max_context=max_context,
        tied_embeddings=tied_embeddings,
        source=source,
    )


class _Shape(TypedDict):
    """The layer shape two catalog models share (a model and its longer-context release)."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int


_LLAMA3_8B: _Shape = {
    "layers": 32,
    "hidden_size": 4096,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
}
_LLAMA3_70B: _Shape = {
    "layers": 80,
    "hidden_size": 8192,
    "heads": 64,
    "kv_heads": 8,
    "head_dim": 128,
}

MODELS: dict[str, ModelSpec] = {
    model.name: model
    for model in (
        _dense(
            "llama-3-8b",
            **_LLAMA3_8B,
            params_b=8.03,
            vocab_size=128256,
            max_context=8192,
            source="meta-llama/Meta-Llama-3-8B config.json; 8.03B parameters",
        ),
        _dense(
            "llama-3.1-8b",
            **_LLAMA3_8B,
            params_b=8.03,
            vocab_size=128256,
            max_context=131072,
            source="meta-llama/Llama-3.1-8B config.json; 8.03B parameters",
        ),
        _dense(
            "llama-3-70b",
            **_LLAMA3_70B,
            params_b=70.6,
            vocab_size=128256,
            max_context=8192,
            source="meta-llama/Meta-Llama-3-70B config.json; 70.6B parameters",
        ),
        _dense(
            "llama-3.1-70b",
            **_LLAMA3_70B,
            params_b=70.6,
            vocab_size=128256,
            max_context=131072,
            source="meta-llama/Llama-3.1-70B config.json; 70.6B parameters",
        ),
        _dense(
            "mistral-7b",
            layers=32,
            hidden_size=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            params_b=7.25,
            vocab_size=32768,
            max_context=32768,
            source="mistralai/Mistral-7B-v0.3 config.json (no sliding window); 7.25B parameters",
        ),
        _dense(
            "qwen2.5-7b",
            layers=28,
            hidden_size=3584,
            heads=28,
            kv_heads=4,
            head_dim=128,
            params_b=7.61,
            vocab_size=152064,
            max_context=131072,
            source="Qwen/Qwen2.5-7B config.json and model card; 7.61B parameters",
        ),
        _dense(
            "qwen2.5-72b",
            layers=80,
            hidden_size=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            params_b=72.7,
            vocab_size=152064,
            max_context=131072,
            source="Qwen/Qwen2.5-72B config.json and model card; 72.7B parameters",
        ),
        ModelSpec(
            name="mixtral-8x7b",
            layers=32,
            hidden_size=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            params=46.7e9,
            active_params=12.9e9,
            vocab_size=32000,
            max_context=32768,
            num_experts=8,
            experts_per_token=2,
            source="mistralai/Mixtral-8x7B-v0.1 config.json (8 experts, 2 per token);"
            " 46.7B parameters in total, 12.9B active per token (Mistral's announcement)",
        ),
        _dense(
            "qwen2.5-0.5b",
            layers=24,
            hidden_size=896,
            heads=14,
            kv_heads=2,
            head_dim=64,
            params_b=0.49,
            vocab_size=151936,
            max_context=32768,
            tied_embeddings=True,
            source="Qwen/Qwen2.5-0.5B config.json (tie_word_embeddings true) and model card; 0.49B"
            " parameters",
        ),
    )
}


# -- small models for a real engine on a CPU ---------------------------------------------------
# Llama-architecture models that `manage.py lab make-model NAME` builds with random weights and a
# byte-level BPE tokenizer (the vllm backend's cpu_tools.py), from the seed below. The vocabulary
# covers every token id the load generator draws (up to 32,000).


@dataclass(frozen=True)
class LabModelShape:
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    intermediate_size: int
    vocab_size: int = 32000
    max_context: int = 4096
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def params(self) -> int:
        """Every weight of an untied Llama: embeddings and LM head, per layer the attention
        projections, the gated MLP and two norms, and the final norm."""
        h, kv = self.hidden_size, self.kv_heads * self.head_dim
        layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size + 2 * h
        return 2 * self.vocab_size * h + self.layers * layer + h

    def spec(self) -> dict[str, int]:
        """What cpu_tools.py make-model takes."""
        return {
            "layers": self.layers,
            "hidden_size": self.hidden_size,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "seed": self.seed,
        }


LAB_MODEL_SHAPES: dict[str, LabModelShape] = {
    "lab-llama-20m": LabModelShape(
        layers=4, hidden_size=256, heads=4, kv_heads=4, intermediate_size=1024
    ),
    "lab-llama-58m": LabModelShape(
        layers=8, hidden_size=512, heads=8, kv_heads=4, intermediate_size=1536
    ),
    "lab-llama-99m": LabModelShape(
        layers=8, hidden_size=768, heads=12, kv_heads=4, intermediate_size=2048
    ),
}

for _slug, _shape in LAB_MODEL_SHAPES.items():
    MODELS[_slug] = ModelSpec(
        name=_slug,
        layers=_shape.layers,
        hidden_size=_shape.hidden_size,
        heads=_shape.heads,
        kv_heads=_shape.kv_heads,
        head_dim=_shape.head_dim,
        params=_shape.params,
        active_params=_shape.params,
        vocab_size=_shape.vocab_size,
        max_context=_shape.max_context,
        source="built by `manage.py lab make-model` (random weights, Llama architecture); "
        f"{_shape.params:,} parameters",
    )

# -- the CPU of a CPU vLLM worker ----------------------------------------------------------------

CPU_KIND = "cpu"


def _positive(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and value > 0 else None


def cpu_hardware(gpus: dict[str, object] | None) -> Hardware | None:
    """The CPU a CPU vLLM worker announced (its heartbeat's `gpus`), as a Hardware the roofline
    formulas price: RAM for memory, the measured triad bandwidth and bf16 matmul FLOP/s. None
    when the worker announced no measurements."""
    gpus = gpus or {}
    memory = _positive(gpus.get("memory_bytes"))
    bandwidth = _positive(gpus.get("bandwidth_bytes_per_s"))
    flops = _positive(gpus.get("matmul_flops_per_s"))
    if memory is None or bandwidth is None or flops is None:
        return None
    return Hardware(
        name=CPU_KIND,
        hbm_bytes=int(memory),
        bandwidth_bytes_per_s=float(bandwidth),
        bf16_flops_per_s=float(flops),
        source=f"{gpus.get('name', 'CPU')}: RAM, and bandwidth (numpy triad) and bf16 matmul "
        f"FLOP/s on {gpus.get('engine_threads', '?')} engine thread(s), measured by its worker",
    )
