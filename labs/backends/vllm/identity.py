"""Which catalog model a config.json describes: every field that tells two models apart.

Two models can share their attention (layers, hidden size, heads) and differ in what decides
their weights and their context: Llama 3.1 8B is Llama 3 8B's shape with a 16x longer context,
reached by llama3 RoPE scaling (factor 8 over 8,192 positions). So a served model, or a folder a
worker is pointed at, is taken for a catalog model only when all of these agree with that
model's bundled config (labs/backends/vllm/models/<slug>/config.json):

- the shape: layers, hidden size, heads, KV heads, head dim, vocabulary, experts;
- the MLP width (intermediate_size), which with the shape sets the weights;
- the context: max_position_embeddings and RoPE scaling (its type and factor), which
  transformers writes as `rope_scaling` or, since 5.x, inside `rope_parameters`;
- whether the LM head is the embedding matrix (tie_word_embeddings).

Pure functions of the JSON.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The catalog models' bundled configs (server.MODELS_DIR, which imports this module).
MODELS_DIR = Path(__file__).resolve().parent / "models"


def rope_scaling(config: Mapping[str, Any]) -> tuple[str, float | None] | None:
    """(type, factor) of the config's RoPE scaling; None for plain RoPE. Read from
    `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5, which folds the
    scaling and rope_theta into one dict, type "default" when there is no scaling)."""
    spec = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(spec, Mapping):
        return None
    kind = spec.get("rope_type") or spec.get("type") or "default"
    if kind == "default":
        return None
    factor = spec.get("factor")
    return str(kind), float(factor) if isinstance(factor, int | float) else None


def facts(config: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that tell models apart, as named on the pages, from a config.json."""
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_dim = hidden // heads
    return {
        "layers": config.get("num_hidden_layers"),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": config.get("num_key_value_heads", heads),
        "head_dim": head_dim,
        "vocab_size": config.get("vocab_size"),
        "experts": config.get("num_local_experts", 1),
        "mlp_size": config.get("intermediate_size"),
        "context": config.get("max_position_embeddings"),
        "rope_scaling": rope_scaling(config),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
    }


@functools.lru_cache(maxsize=64)
def _bundled(slug: str) -> str | None:
    try:
        return (MODELS_DIR / slug / "config.json").read_text()
    except OSError:
        return None


def catalog_facts(slug: str) -> dict[str, Any] | None:
    """The facts of catalog model `slug`, from its bundled config.json; None without one (a
    custom model)."""
    text = _bundled(slug)
    if text is None:
        return None
    try:
        config = json.loads(text)
    except ValueError:
        return None
    return facts(config) if isinstance(config, dict) else None


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        kind, factor = value
        return f"{kind} x{factor:g}" if factor is not None else str(kind)
    if value is None:
        return "none"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def differences(config: Mapping[str, Any], slug: str) -> list[str]:
    """How `config` differs from catalog model `slug`, one "name value (catalog value)" each;
    [] when it is that model. A model without a bundled config differs in everything."""
    want = catalog_facts(slug)
    if want is None:
        return [f"{slug} has no bundled config.json to compare with"]
    got = facts(config)
    return [
        f"{name} {_shown(got[name])} ({slug}: {_shown(value)})"
        for name, value in want.items()
        if got[name] != value
    ]


def identify(config: Mapping[str, Any], slugs: list[str]) -> str | None:
    """The one catalog model among `slugs` that `config` describes in every fact, or None."""
    return next((slug for slug in slugs if not differences(config, slug)), None)
