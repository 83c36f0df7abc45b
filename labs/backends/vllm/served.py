"""What an already-running vLLM server serves, and which catalog model that is (if any).

vLLM's `GET /v1/models` gives each served model's card: `id` (the served name), `root` (the
model path it was started with) and `max_model_len` (vllm/entrypoints/openai/models/serving.py).
When `root` is a folder readable from here (a server on this machine, or a shared disk), its
config.json gives the architecture and the vocabulary. The served model is a catalog model only
when that config has the catalog model's shape: a served name proves nothing ("lab" is any
model), so without a readable config nothing is predicted for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from labs.backends.vllm.identity import facts, identify
from labs.parameters.catalog import MODELS
from labs.parameters.params import LabParams, ParamError, parse_lab_params

NOT_IN_CATALOG = "no prediction: the served model is not in the catalog"


@dataclass(frozen=True)
class ServedModel:
    """One served model as the server describes it, and what the lab makes of it."""

    id: str
    root: str | None
    max_model_len: int | None
    config: dict[str, Any] | None  # root/config.json, when readable from here
    catalog_slug: str | None  # the catalog model with the config's shape, if any

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary: its config's, else (never reached today) the catalog's."""
        value = (self.config or {}).get("vocab_size")
        if isinstance(value, int) and value > 0:
            return value
        return MODELS[self.catalog_slug].vocab_size if self.catalog_slug else None

    def why_no_prediction(self) -> str | None:
        """None when the lab can predict for this model, else the sentence the CLI shows."""
        if self.catalog_slug is not None:
            return None
        if self.config is None:
            return (
                f"{NOT_IN_CATALOG} (it serves {self.id!r} from {self.root!r}, whose config.json "
                "is not readable from here, so its architecture is unknown)"
            )
        return f"{NOT_IN_CATALOG} (it serves {self.id!r}, a {_shape_text(self.config)})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "root": self.root,
            "max_model_len": self.max_model_len,
            "vocab_size": self.vocab_size,
            "catalog_model": self.catalog_slug,
        }


def _shape_text(config: dict[str, Any]) -> str:
    s = facts(config)
    return (
        f"{s['layers']}-layer model, hidden size {s['hidden_size']}, {s['heads']} heads, "
        f"vocabulary {s['vocab_size']}"
    )


def catalog_match(config: dict[str, Any]) -> str | None:
    """The catalog model the config describes in every field that tells models apart
    (identity.py: shape, MLP width, context and RoPE scaling), or None: Llama 3.1 8B shares
    Llama 3 8B's shape and differs in its context."""
    return identify(config, list(MODELS))


def _read_config(root: str | None) -> dict[str, Any] | None:
    if not root:
        return None
    try:
        config = json.loads((Path(root).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def read_served_model(base_url: str, timeout_s: float = 10.0) -> ServedModel:
    """The first model the server at `base_url` serves.

    Raises:
        httpx.HTTPError, ValueError, KeyError, IndexError, TypeError: the server did not answer
            `/v1/models` as vLLM does (the backend turns these into a ServerError).
    """
    response = httpx.get(f"{base_url}/v1/models", timeout=timeout_s, trust_env=False)
    response.raise_for_status()
    card = response.json()["data"][0]
    length = card.get("max_model_len")
    root = card.get("root")
    root = str(root) if isinstance(root, str) and root else None
    config = _read_config(root)
    return ServedModel(
        id=str(card["id"]),
        root=root,
        max_model_len=length if isinstance(length, int) else None,
        config=config,
        catalog_slug=catalog_match(config) if config is not None else None,
    )


@dataclass(frozen=True)
class ServedInstead:
    """A run on an already-running server that served another model than the one submitted:
    what to predict for instead (the served catalog model), or why nothing is predicted."""

    submitted: str  # the catalog model the learner submitted
    served: Mapping[str, Any]  # the record's meta["served_model"] (ServedModel.as_dict())
    params: LabParams | None  # the run's settings with the served model, when predictable
    no_prediction: str | None  # why nothing is predicted, when params is None


def served_instead(params: LabParams, meta: Mapping[str, Any]) -> ServedInstead | None:
    """For a run's record (its meta): None when the server served the submitted model (or the
    run started its own server), else what the prediction must be for. The settings are the
    learner's with only the model changed, as `lab run --base-url` predicts."""
    served = meta.get("served_model")
    if not isinstance(served, Mapping):
        return None
    slug = served.get("catalog_model")
    submitted = params.model.name
    if slug == submitted:
        return None
    if slug is None:
        reason = meta.get("no_prediction") or f"{NOT_IN_CATALOG} (it serves {served.get('id')!r})"
        return ServedInstead(submitted, served, None, str(reason))
    try:
        swapped = parse_lab_params({**params.as_dict(), "model": slug})
    except ParamError as exc:
        reason = f"no prediction: these settings do not fit the served model {slug} ({exc})"
        return ServedInstead(submitted, served, None, reason)
    return ServedInstead(submitted, served, swapped, None)
