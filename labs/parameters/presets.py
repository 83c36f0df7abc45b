"""The labs (which settings each shows, what it explains) and the deck's presets.

A lab is a page over the same parameters (labs/parameters/params.py): it shows the settings that
matter for its lesson and starts from numbers that make the lesson visible on the simulator in a
second or two. Presets (content/labs/presets.yaml, written by the deck's author) open a lab with a
card's numbers. No Django models: a lab's definition is code, a preset is content.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from labs.parameters.params import (
    CUSTOM,
    CUSTOM_GPU_FIELDS,
    CUSTOM_MODEL_FIELDS,
    DEFAULT_DRAFT_COST,
    FIELDS_BY_NAME,
    PARAM_FIELDS,
    ParamError,
    parse_lab_params,
)

logger = logging.getLogger(__name__)

PRESETS_PATH = Path(__file__).resolve().parent.parent.parent / "content" / "labs" / "presets.yaml"


@dataclass(frozen=True)
class Lab:
    slug: str
    title: str
    question: str  # the one question the lab answers, shown under the title
    explanation: tuple[str, ...]  # short paragraphs
    fields: tuple[str, ...]  # the settings shown; every other one keeps its value, hidden
    defaults: Mapping[str, object]  # starting numbers (over PARAM_FIELDS' defaults)
    predicted: tuple[str, ...]  # predictor keys shown live as settings change
    sweep_field: str
    sweep_values: str
    # (measured summary key, predicted key or None), charted against the swept setting
    sweep_metrics: tuple[tuple[str, str | None], ...] = (
        ("output_tokens_per_s", "output_tokens_per_s"),
        ("tpot_s.p50", "tpot_s"),
    )
    tags: tuple[str, ...] = field(default_factory=tuple)


# A small workload on a capped KV pool: the simulator finishes in a second or two, and paging,
# batching and preemption show up without a real GPU's 400k-token pool hiding them.
_SMALL = {"num_prompts": 64, "prompt_tokens": 512, "output_tokens": 128, "max_tokens": 512}

LABS: dict[str, Lab] = {
    lab.slug: lab
    for lab in (
        Lab(
            slug="paged-kv",
            title="Paged KV and block size",
            question="How much KV memory does a request waste, and how many fit at once?",
            explanation=(
                "vLLM stores each sequence's keys and values in fixed-size blocks of block_size "
                "tokens. Only the last block of a sequence is partly empty, so at most "
                "block_size - 1 slots are wasted per sequence.",
                "A contiguous allocator must reserve prompt + max_tokens slots up front, for "
                "output that usually never comes. Switch kv_allocation to contiguous and watch "
                "the number of running sequences fall while the waiting queue grows.",
            ),
            fields=(
                "block_size",
                "kv_allocation",
                "kv_capacity_tokens",
                "prompt_tokens",
                "output_tokens",
                "max_tokens",
                "num_prompts",
                "model",
            ),
            defaults={
                **_SMALL,
                "prompt_tokens": 700,
                "output_tokens": 300,
                "max_tokens": 2048,
                "kv_capacity_tokens": 16384,
                "concurrency": 64,
            },
            predicted=(
                "kv_bytes_per_token",
                "blocks_per_seq",
                "slots_wasted_per_seq",
                "contiguous_reserved_slots",
                "contiguous_waste_fraction",
                "kv_capacity_tokens",
                "max_concurrent_seqs",
                "contiguous_max_concurrent_seqs",
                "running_seqs",
            ),
            sweep_field="block_size",
            sweep_values="8, 16, 32, 64, 128, 256",
            sweep_metrics=(
                ("max_running_seqs", "running_seqs"),
                ("output_tokens_per_s", "output_tokens_per_s"),
            ),
            tags=("paged-attention", "kv-memory"),
        ),
        Lab(
            slug="batching",
            title="Batch size and latency",
            question="What does a bigger batch buy in throughput, and cost in latency?",
            explanation=(
                "Decoding is memory-bound: each step reads all the weights once, whatever the "
                "batch. More sequences per step share that read, so tokens per second rise "
                "almost linearly until the KV reads or compute catch up.",
                "max_num_seqs caps the batch; concurrency is how many requests are in flight. "
                "Time per output token grows slowly with the batch, and a request that waits "
                "for a slot shows it in its TTFT.",
                "Each step also has a token budget, max_num_batched_tokens: running sequences "
                "take their tokens first and waiting prompts get what is left, so long prompts "
                "can keep the batch well below max_num_seqs.",
            ),
            fields=(
                "max_num_seqs",
                "max_num_batched_tokens",
                "concurrency",
                "num_prompts",
                "prompt_tokens",
                "output_tokens",
                "model",
                "gpu",
            ),
            defaults={**_SMALL, "num_prompts": 128, "concurrency": 32},
            predicted=(
                "running_seqs",
                "decode_step_s",
                "tpot_s",
                "output_tokens_per_s",
                "batch_speedup_vs_batch1",
                "ttft_s",
                "queue_wait_s",
                "loaded_ttft_s",
                "loaded_e2e_s",
                "bound",
            ),
            sweep_field="max_num_seqs",
            sweep_values="1, 2, 4, 8, 16, 32, 64, 128",
            tags=("batching", "scheduling"),
        ),
        Lab(
            slug="speculative",
            title="Speculative decoding",
            question="When does drafting k tokens make decoding faster, and by how much?",
            explanation=(
                "A cheap draft proposes k tokens; the target model checks them all in one pass "
                "and keeps the accepted prefix plus one token of its own. With acceptance "
                "alpha, one pass yields (1 - alpha^(k+1)) / (1 - alpha) tokens on average.",
                "Each draft token costs draft_cost of a target pass, so a long draft with low "
                "acceptance loses. The gain also shrinks at large batch, where the target pass "
                "stops being free.",
            ),
            fields=(
                "spec_method",
                "spec_tokens",
                "acceptance",
                "draft_cost",
                "temperature",
                "concurrency",
                "output_tokens",
                "model",
            ),
            defaults={
                **_SMALL,
                "num_prompts": 16,
                "spec_method": "draft_model",
                "spec_tokens": 3,
                "concurrency": 1,
            },
            predicted=(
                "spec_tokens_per_step",
                "spec_speedup",
                "spec_speedup_at_batch",
                "tpot_s",
                "output_tokens_per_s",
            ),
            sweep_field="spec_tokens",
            sweep_values="1, 2, 3, 4, 6, 8",
            sweep_metrics=(
                ("tpot_s.p50", "tpot_s"),
                ("output_tokens_per_s", "output_tokens_per_s"),
            ),
            tags=("speculative-decoding",),
        ),
        Lab(
            slug="chunked-prefill",
            title="Chunked prefill and inter-token latency",
            question="Why do long prompts make everyone else's tokens stutter?",
            explanation=(
                "A prefill of thousands of tokens is one long compute-bound step; every "
                "decoding sequence waits for it. Chunked prefill splits the prompt into pieces "
                "that fit the step's token budget (max_num_batched_tokens) and runs them beside "
                "the decodes.",
                "A smaller budget keeps inter-token latency (ITL) smooth but takes more steps "
                "to finish a prompt, so time to first token rises.",
            ),
            fields=(
                "chunked_prefill",
                "max_num_batched_tokens",
                "prompt_tokens",
                "output_tokens",
                "concurrency",
                "num_prompts",
                "model",
            ),
            defaults={
                **_SMALL,
                "prompt_tokens": 4096,
                "max_tokens": 512,
                "max_num_batched_tokens": 512,
                "concurrency": 16,
                "num_prompts": 48,
            },
            predicted=("prefill_s", "ttft_s", "decode_step_s", "tpot_s", "bound"),
            sweep_field="max_num_batched_tokens",
            sweep_values="256, 512, 1024, 2048, 4096, 8192",
            sweep_metrics=(("itl_s.p99", "tpot_s"), ("ttft_s.p50", "ttft_s")),
            tags=("chunked-prefill", "latency-metrics"),
        ),
        Lab(
            slug="prefix-caching",
            title="Prefix caching and TTFT",
            question="How much of a shared system prompt can the engine skip?",
            explanation=(
                "With prefix caching, the KV blocks of a prompt prefix already seen are reused, "
                "so only the rest of the prompt is prefilled. Reuse is by whole block: a "
                "shared prefix of 1,000 tokens at block_size 16 reuses 62 blocks (992 tokens).",
                "The first request pays in full; the hit rate climbs as later ones arrive.",
            ),
            fields=(
                "prefix_caching",
                "shared_prefix_tokens",
                "prompt_tokens",
                "block_size",
                "concurrency",
                "num_prompts",
                "model",
            ),
            defaults={
                **_SMALL,
                "prompt_tokens": 2048,
                "shared_prefix_tokens": 1536,
                "concurrency": 8,
                "num_prompts": 48,
            },
            predicted=("prefix_cached_tokens", "prefill_s", "ttft_s", "e2e_s"),
            sweep_field="shared_prefix_tokens",
            sweep_values="0, 256, 512, 1024, 1536, 2000",
            sweep_metrics=(
                ("ttft_s.p50", "ttft_s"),
                ("prefix_cache_hit_rate", None),
            ),
            tags=("prefix-caching",),
        ),
        Lab(
            slug="kv-capacity",
            title="KV dtype and capacity planning",
            question="How many concurrent chats fit on a GPU, and how many GPUs for a fleet?",
            explanation=(
                "KV bytes per token = 2 x layers x KV heads x head dim x bytes per element. "
                "The pool is what is left of gpu_memory_utilization x HBM after the weights.",
                "An FP8 KV cache halves the bytes per token and doubles the sequences that fit; "
                "tensor parallelism splits both the weights and the KV across GPUs.",
            ),
            fields=(
                "model",
                "gpu",
                "tp",
                "kv_dtype",
                "weight_dtype",
                "gpu_memory_utilization",
                "context_tokens",
                "concurrency",
                "num_prompts",
            ),
            defaults={**_SMALL, "concurrency": 64},
            predicted=(
                "kv_bytes_per_token",
                "weight_bytes",
                "kv_memory_bytes",
                "kv_capacity_tokens",
                "max_concurrent_seqs",
                "replicas_needed",
                "gpus_needed",
            ),
            sweep_field="gpu_memory_utilization",
            sweep_values="0.5, 0.6, 0.7, 0.8, 0.9",
            sweep_metrics=(
                ("max_running_seqs", "running_seqs"),
                ("output_tokens_per_s", "output_tokens_per_s"),
            ),
            tags=("kv-memory", "capacity-planning", "quantization"),
        ),
        Lab(
            slug="tensor-parallel",
            title="Tensor parallelism",
            question="What do more GPUs per replica buy a large model, and what do they cost?",
            explanation=(
                "With tp GPUs each holds 1/tp of every weight matrix, so a decode step reads "
                "1/tp of the weights per GPU and the memory-bound part of the step shrinks "
                "almost as 1/tp. The GPUs also pool their memory, so the KV cache grows.",
                "Each layer then sums its partial results across the GPUs twice (after "
                "attention and after the MLP). For a decode step that is a few kilobytes per "
                "sequence, which vLLM's own all-reduce sends over NVLink in a few microseconds, "
                "so communication stays a modest share of the step; over PCIe, or for a long "
                "prompt's megabytes, NCCL takes over and the bytes count.",
                "The per-step CPU work does not shrink with tp, so past some point more GPUs "
                "flatten the latency instead of cutting it. Sweep tp and read where the time "
                "went.",
            ),
            fields=(
                "tp",
                "model",
                "gpu",
                "concurrency",
                "num_prompts",
                "prompt_tokens",
                "output_tokens",
                "max_num_seqs",
            ),
            defaults={
                **_SMALL,
                "model": "llama-3-70b",
                "gpu": "h100-sxm",
                "tp": 4,
                "concurrency": 16,
                "num_prompts": 64,
            },
            predicted=(
                "weight_bytes",
                "decode_step_s",
                "tpot_s",
                "ttft_s",
                "loaded_e2e_s",
                "output_tokens_per_s",
                "kv_capacity_tokens",
                "bound",
            ),
            sweep_field="tp",
            sweep_values="2, 4, 8",
            sweep_metrics=(
                ("e2e_s.mean", "loaded_e2e_s"),
                ("tpot_s.p50", "tpot_s"),
                ("output_tokens_per_s", "output_tokens_per_s"),
            ),
            tags=("tensor-parallelism", "multi-gpu"),
        ),
        Lab(
            slug="sandbox",
            title="Sandbox",
            question="Every setting, for your own experiments.",
            explanation=(
                "All the engine, model, hardware and workload settings the other labs use. "
                "Leave a field empty for its default.",
            ),
            fields=tuple(f.name for f in PARAM_FIELDS),
            defaults=dict(_SMALL),
            predicted=(
                "ttft_s",
                "tpot_s",
                "e2e_s",
                "output_tokens_per_s",
                "running_seqs",
                "kv_capacity_tokens",
                "max_concurrent_seqs",
                "bound",
            ),
            sweep_field="max_num_seqs",
            sweep_values="1, 4, 16, 64, 256",
            tags=(),
        ),
    )
}


@dataclass(frozen=True)
class Preset:
    slug: str
    lab: str
    title: str
    params: Mapping[str, object]


class PresetError(ValueError):
    pass


def _parse_presets(raw: Any) -> dict[str, Preset]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise PresetError("presets.yaml must be a list of presets")
    presets: dict[str, Preset] = {}
    for i, item in enumerate(raw):
        where = f"presets.yaml item {i + 1}"
        if not isinstance(item, dict) or not item.get("slug"):
            raise PresetError(f"{where}: needs a slug")
        slug = str(item["slug"])
        lab = str(item.get("lab", ""))
        if lab not in LABS:
            raise PresetError(f"preset {slug}: lab must be one of {', '.join(LABS)}, got {lab}")
        params = item.get("params") or {}
        try:
            parse_lab_params({**LABS[lab].defaults, **params})
        except ParamError as exc:
            raise PresetError(f"preset {slug}: {exc}") from None
        if slug in presets:
            raise PresetError(f"preset {slug} appears twice")
        presets[slug] = Preset(
            slug=slug, lab=lab, title=str(item.get("title", slug)), params=params
        )
    return presets


@cache
def _load(path: Path, mtime_ns: int) -> dict[str, Preset]:
    with path.open(encoding="utf-8") as fh:
        return _parse_presets(yaml.safe_load(fh))


def load_presets(path: Path = PRESETS_PATH) -> dict[str, Preset]:
    """The deck's presets by slug, re-read when the file changes.

    Raises:
        PresetError: a preset names an unknown lab or has parameters the lab cannot run.
    """
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return {}
    return _load(path, mtime)


def lab_initial(
    lab: Lab, preset: Preset | None = None, overrides: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The values a lab page starts from: every parameter's default, the lab's numbers, the
    preset's, then `overrides` (a link's query string). Defaults are spelled out so a select
    shows the value that will be used."""
    given: dict[str, object] = dict(lab.defaults)
    if preset is not None:
        given.update(preset.params)
    given.update(overrides or {})
    values: dict[str, object] = {f.name: f.default for f in PARAM_FIELDS if f.default is not None}
    # A custom model or GPU is implied by its numbers; the catalog default would contradict them.
    if any(name in given for name in CUSTOM_MODEL_FIELDS):
        values["model"] = CUSTOM
    if any(name in given for name in CUSTOM_GPU_FIELDS):
        values["gpu"] = CUSTOM
    values.update(given)
    return {k: v for k, v in values.items() if k in FIELDS_BY_NAME}


def rerun_values(lab: Lab, params: Mapping[str, object]) -> dict[str, object]:
    """A run's settings as a lab link carries them: only what differs from the lab's start, and
    not the values the parser derived (context_tokens, max_concurrency, spec_method,
    draft_cost), so changing prompt_tokens or spec_tokens on the page still moves them."""
    start = lab_initial(lab)
    derived = {
        "context_tokens": _sum(params.get("prompt_tokens"), params.get("output_tokens")),
        "max_concurrency": params.get("concurrency"),
        "spec_method": "draft_model" if params.get("spec_tokens") else "none",
        "draft_cost": DEFAULT_DRAFT_COST.get(str(params.get("spec_method")), None),
    }
    return {
        name: value
        for name, value in params.items()
        if name in FIELDS_BY_NAME
        and value is not None
        and value != start.get(name)
        and not (name in derived and value == derived[name])
    }


def _sum(a: object, b: object) -> object:
    return a + b if isinstance(a, int) and isinstance(b, int) else None
