"""Lab parameters: the one place where every lab setting is described and validated.

`PARAM_FIELDS` describes each parameter (name, kind, default, allowed values, unit, help); the
`lab` command's options and the lab form are both generated from it. `parse_lab_params` turns a
mapping of raw values (strings from a form or a command line, or native Python values) into
frozen dataclasses, or raises `ParamError` with one message per bad field. Nothing else is ever
raised for bad input.

Units follow the data sheets: GB = 10^9 bytes, TB/s = 10^12 bytes/s, TFLOPS = 10^12 dense FLOP/s,
params_b = 10^9 parameters.

Defaults that deserve a note:

- `activation_reserve_gb` is 0, so the deck's worked answers (which give all memory left after
  the weights to the KV cache) come out of the predictor unchanged. vLLM measures the real
  reserve at start-up; a few GB per GPU is typical.
- `compute_efficiency` and `bandwidth_efficiency` are 1 and `step_overhead_ms` is 0: predictions
  are the ideal roofline unless a lab lowers them (0.8-0.9 of peak bandwidth is reachable).
- Lengths drawn from a range: prompt_tokens x [1 - input_range_ratio, 1 + input_range_ratio], and
  likewise for outputs, as `vllm bench serve`'s random dataset draws them. The shared prefix is
  part of the prompt, not added to it.

Pure Python: no Django imports, so the simulator and the predictor can use it anywhere.

Why one module: every lab setting is described here once (its field, default, bounds, and the rules
that tie settings together), so that a new setting is taught in one place; split by topic, a rule
between two settings would have to live in one of two files.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from labs.parameters.catalog import (
    CPU_KIND,
    GB,
    GPUS,
    KV_DTYPE_BYTES,
    MODELS,
    TB,
    TFLOPS,
    WEIGHT_DTYPE_BYTES,
    Hardware,
    ModelSpec,
)

__all__ = [
    "CUSTOM",
    "DRAFT_SHARE_EVERY_STEP",
    "FIELDS_BY_NAME",
    "PARAM_FIELDS",
    "EngineConfig",
    "Hardware",
    "LabParams",
    "ModelSpec",
    "ParamError",
    "ParamField",
    "Workload",
    "param_default",
    "parse_lab_params",
    "stored_param",
]

Kind = Literal["int", "float", "choice", "bool"]
Group = Literal["model", "hardware", "engine", "workload"]

CUSTOM = "custom"
_TOKENS = 10_000_000
# No valid value is longer; refusing long strings early keeps parsing cheap.
_MAX_TEXT = 64


@dataclass(frozen=True)
class ParamField:
    """How one lab parameter is typed, bounded and explained.

    `default` is used when the parameter is absent, None or ""; a None default means "unset", and
    the help text says what an unset value stands for.
    """

    name: str
    kind: Kind
    default: object
    group: Group
    help: str
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    # Strict bounds, for values such as acceptance < 1 or gpu_memory_utilization > 0.
    above_minimum: bool = False
    below_maximum: bool = False
    choices: tuple[str, ...] = ()
    power_of_two: bool = False
    # request_rate: "inf", as `vllm bench serve` takes it, means every request arrives at once.
    inf_means_unset: bool = False

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def allowed(self) -> str:
        """What the field accepts, as the end of a sentence: 'a whole number between 1 and 64'."""
        if self.kind == "bool":
            return "true or false (also 1/0, on/off, yes/no)"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        low, high = _fmt(self.minimum), _fmt(self.maximum)
        if self.power_of_two:
            return f"a power of two between {low} and {high}"
        noun = "a whole number" if self.kind == "int" else "a number"
        if self.above_minimum:
            return f"{noun} greater than {low} and at most {high}"
        if self.below_maximum:
            return f"{noun} of at least {low} and less than {high}"
        return f"{noun} between {low} and {high}"


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


CUSTOM_MODEL_FIELDS = ("layers", "kv_heads", "head_dim", "params_b")
OPTIONAL_MODEL_FIELDS = ("hidden_size", "heads")
CUSTOM_GPU_FIELDS = ("hbm_gb", "bandwidth_tbs", "tflops")
SPEC_METHODS = ("none", "draft_model", "eagle", "ngram")
# Draft cost c relative to one target pass when not given: a small draft model costs about a
# tenth of the target (the deck's example), an EAGLE head less, prompt lookup next to nothing.
DEFAULT_DRAFT_COST = {"none": 0.0, "draft_model": 0.1, "eagle": 0.05, "ngram": 0.0}


def _int(name: str, default: int | None, low: int, high: int, **kw: Any) -> ParamField:
    return ParamField(name, "int", default, minimum=low, maximum=high, **kw)


def _float(name: str, default: float | None, low: float, high: float, **kw: Any) -> ParamField:
    return ParamField(name, "float", default, minimum=low, maximum=high, **kw)


def _tokens(name: str, default: int | None, help: str, low: int = 1) -> ParamField:
    return _int(name, default, low, _TOKENS, group="workload", unit="tokens", help=help)


PARAM_FIELDS: tuple[ParamField, ...] = (
    # The model: a catalog slug, or a custom one from its four numbers.
    ParamField(
        "model",
        "choice",
        "llama-3-8b",
        group="model",
        choices=(*MODELS, CUSTOM),
        help="model from the catalog, or custom (the default when layers, kv_heads, head_dim"
        " and params_b are given)",
    ),
    _int("layers", None, 1, 1024, group="model", help="custom model: transformer layers"),
    _int("kv_heads", None, 1, 1024, group="model", help="custom model: KV heads per layer"),
    _int("head_dim", None, 1, 4096, group="model", help="custom model: size of one head"),
    _float(
        "params_b",
        None,
        0,
        100_000,
        above_minimum=True,
        group="model",
        unit="10^9 parameters",
        help="custom model: parameter count",
    ),
    _int(
        "hidden_size",
        None,
        1,
        1_000_000,
        group="model",
        help="custom model: hidden size (unset: heads x head_dim)",
    ),
    _int(
        "heads",
        None,
        1,
        4096,
        group="model",
        help="custom model: attention heads (unset: kv_heads, no grouped-query attention)",
    ),
    # One GPU of a replica: a catalog slug, or a custom one from its three numbers.
    ParamField(
        "gpu",
        "choice",
        "h100-sxm",
        group="hardware",
        choices=(*GPUS, CPU_KIND, CUSTOM),
        help="GPU from the catalog, or custom (the default when hbm_gb, bandwidth_tbs and"
        " tflops are given), or cpu: a CPU vLLM worker's CPU, whose RAM, bandwidth and"
        " FLOP/s it measured come as those three",
    ),
    _float(
        "hbm_gb",
        None,
        0,
        100_000,
        above_minimum=True,
        group="hardware",
        unit="GB",
        help="custom GPU: memory of one GPU",
    ),
    _float(
        "bandwidth_tbs",
        None,
        0,
        1000,
        above_minimum=True,
        group="hardware",
        unit="TB/s",
        help="custom GPU: peak memory bandwidth",
    ),
    _float(
        "tflops",
        None,
        0,
        1_000_000,
        above_minimum=True,
        group="hardware",
        unit="TFLOPS",
        help="custom GPU: dense BF16 compute",
    ),
    # The engine.
    _int(
        "tp",
        1,
        1,
        64,
        power_of_two=True,
        group="engine",
        unit="GPUs",
        help="tensor-parallel degree: GPUs per replica, with weights and KV split across them",
    ),
    ParamField(
        "weight_dtype",
        "choice",
        "bf16",
        group="engine",
        choices=tuple(WEIGHT_DTYPE_BYTES),
        help="weight precision",
    ),
    ParamField(
        "kv_dtype",
        "choice",
        "auto",
        group="engine",
        choices=tuple(KV_DTYPE_BYTES),
        help="KV cache precision (auto: 16-bit)",
    ),
    _float(
        "gpu_memory_utilization",
        0.9,
        0,
        1,
        above_minimum=True,
        group="engine",
        help="fraction of each GPU's memory the engine may use",
    ),
    _int(
        "block_size",
        16,
        1,
        256,
        power_of_two=True,
        group="engine",
        unit="tokens",
        help="tokens per KV block",
    ),
    _int("max_num_seqs", 256, 1, 16_384, group="engine", help="most sequences in one step"),
    _int(
        "max_num_batched_tokens",
        2048,
        1,
        1_048_576,
        group="engine",
        unit="tokens",
        help="token budget of one step",
    ),
    ParamField(
        "kv_allocation",
        "choice",
        "paged",
        group="engine",
        choices=("paged", "contiguous"),
        help="KV in blocks on demand, or one contiguous prompt + max_tokens region per request",
    ),
    ParamField(
        "chunked_prefill",
        "bool",
        True,
        group="engine",
        help="split long prompts across steps to fit the token budget",
    ),
    ParamField(
        "prefix_caching",
        "bool",
        True,
        group="engine",
        help="reuse the KV blocks of an identical prompt prefix",
    ),
    _int(
        "kv_capacity_tokens",
        None,
        1,
        10**10,
        group="engine",
        unit="tokens",
        help="size of the KV pool (unset: predicted from memory)",
    ),
    ParamField(
        "spec_method",
        "choice",
        None,
        group="engine",
        choices=SPEC_METHODS,
        help="speculative decoding (unset: draft_model when spec_tokens > 0, else none)",
    ),
    _int(
        "spec_tokens",
        0,
        0,
        16,
        group="engine",
        unit="tokens",
        help="draft tokens proposed per step (k)",
    ),
    _float(
        "acceptance",
        0.7,
        0,
        1,
        below_maximum=True,
        group="engine",
        help="chance that each draft token is accepted (alpha)",
    ),
    _float(
        "draft_cost",
        None,
        0,
        1,
        group="engine",
        help="cost of one draft token as a fraction of one target pass (c; unset: 0.1 for"
        " draft_model, 0.05 for eagle, 0 for ngram)",
    ),
    _float(
        "step_overhead_ms",
        0.0,
        0,
        10_000,
        group="engine",
        unit="ms",
        help="fixed time added to every engine step (scheduling, kernel launches) by the"
        " formulas and the ideal simulator; the realistic simulator and vLLM have their own",
    ),
    ParamField(
        "sim_profile",
        "choice",
        "realistic",
        group="engine",
        choices=("realistic", "ideal"),
        help="simulator only: realistic (kernel efficiencies, per-step and communication costs"
        " calibrated to published vLLM runs) or ideal (the roofline, as the formulas price it)",
    ),
    _float(
        "activation_reserve_gb",
        0.0,
        0,
        100_000,
        group="engine",
        unit="GB",
        help="memory per GPU kept for activations; 0 matches the deck's worked answers",
    ),
    _float(
        "compute_efficiency",
        1.0,
        0,
        1,
        above_minimum=True,
        group="engine",
        help="fraction of peak FLOP/s the formulas and the ideal simulator assume (the realistic"
        " simulator uses its calibrated kernels; vLLM, the GPU)",
    ),
    _float(
        "bandwidth_efficiency",
        1.0,
        0,
        1,
        above_minimum=True,
        group="engine",
        help="fraction of peak memory bandwidth the formulas and the ideal simulator assume (the"
        " realistic simulator uses its calibrated kernels; vLLM, the GPU)",
    ),
    # The workload.
    _tokens("prompt_tokens", 1024, "prompt length (the mean when input_range_ratio > 0)"),
    _tokens("output_tokens", 256, "tokens generated per request (the mean with a range)"),
    _tokens("max_tokens", 2048, "a request's cap on output tokens; contiguous KV reserves it"),
    _int(
        "concurrency",
        1,
        1,
        _TOKENS,
        group="workload",
        unit="requests",
        help="requests in flight at once (the batch the prediction assumes)",
    ),
    _tokens(
        "context_tokens",
        None,
        "KV tokens each concurrent sequence holds (unset: prompt_tokens + output_tokens)",
    ),
    _int(
        "num_prompts",
        100,
        1,
        1_000_000,
        group="workload",
        unit="requests",
        help="requests in a simulated run",
    ),
    _float(
        "request_rate",
        None,
        0,
        1_000_000,
        above_minimum=True,
        inf_means_unset=True,
        group="workload",
        unit="requests/s",
        help="Poisson arrival rate (unset or inf: all requests at once)",
    ),
    _int(
        "max_concurrency",
        None,
        1,
        1_000_000,
        group="workload",
        unit="requests",
        help="most requests in flight at once (unset: no limit)",
    ),
    _tokens(
        "shared_prefix_tokens",
        0,
        "leading prompt tokens that are the same in every request",
        low=0,
    ),
    _float(
        "input_range_ratio",
        0.0,
        0,
        1,
        below_maximum=True,
        group="workload",
        help="prompt lengths drawn uniformly from prompt_tokens x [1 - r, 1 + r]",
    ),
    _float(
        "output_range_ratio",
        0.0,
        0,
        1,
        below_maximum=True,
        group="workload",
        help="output lengths drawn uniformly from output_tokens x [1 - r, 1 + r]",
    ),
    _int("seed", 0, 0, 2**32 - 1, group="workload", help="random seed of a simulated run"),
    _float(
        "temperature",
        0.0,
        0,
        2,
        group="workload",
        help="sampling temperature of a real engine's requests (0: greedy); only with"
        " speculation, where it decides whether ngram drafts are accepted (greedy accepts most"
        " of them, vllm bench serve's default of 1 almost none); the simulator uses acceptance",
    ),
)

FIELDS_BY_NAME: dict[str, ParamField] = {f.name: f for f in PARAM_FIELDS}


def param_default(name: str) -> Any:
    """A lab parameter's default, as its ParamField declares it (the one place it is declared)."""
    return FIELDS_BY_NAME[name].default


def stored_param(params: Mapping[str, object], name: str) -> Any:
    """A lab parameter of a stored run (`LabRun.params`, `as_dict()` of its LabParams): its
    value, or its declared default where the row lacks it (stored before the parameter existed)
    or left it unset."""
    value = params.get(name)
    return param_default(name) if value is None or value == "" else value


# A sequence drafts at every step, unless a device calibration measured the share of steps its
# engine drafted at (labs/calibration/sweep.py).
DRAFT_SHARE_EVERY_STEP = 1.0


class ParamError(ValueError):
    """Bad lab parameters. `errors` maps each bad field's name to a message that names it."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors: dict[str, str] = dict(errors)
        super().__init__("; ".join(self.errors.values()))


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings, named as vLLM names them; units in the names where they differ."""

    tp: int = param_default("tp")
    weight_dtype: str = param_default("weight_dtype")
    kv_dtype: str = param_default("kv_dtype")
    gpu_memory_utilization: float = param_default("gpu_memory_utilization")
    block_size: int = param_default("block_size")
    max_num_seqs: int = param_default("max_num_seqs")
    max_num_batched_tokens: int = param_default("max_num_batched_tokens")
    kv_allocation: str = param_default("kv_allocation")
    chunked_prefill: bool = param_default("chunked_prefill")
    prefix_caching: bool = param_default("prefix_caching")
    kv_capacity_tokens: int | None = param_default("kv_capacity_tokens")
    # The parsed value: "none" where the learner left speculation unset.
    spec_method: str = "none"
    spec_tokens: int = param_default("spec_tokens")
    acceptance: float = param_default("acceptance")
    # Not a lab parameter: the share of its steps in which a sequence drafts; only the
    # simulator reads it.
    draft_share: float = DRAFT_SHARE_EVERY_STEP
    # The parsed value: the method's own cost (DEFAULT_DRAFT_COST) where the learner left it unset.
    draft_cost: float = 0.0
    step_overhead_s: float = 0.0
    # Not a lab parameter: CPU time each sequence in a step adds to it, 0 unless a device
    # calibration measured it (labs/parameters/device_calibration.py); a CPU worker's is a large
    # share.
    seq_overhead_s: float = 0.0
    activation_reserve_bytes: int = 0
    compute_efficiency: float = param_default("compute_efficiency")
    bandwidth_efficiency: float = param_default("bandwidth_efficiency")
    sim_profile: str = param_default("sim_profile")


@dataclass(frozen=True)
class Workload:
    """What is asked of the engine. Lengths in tokens; `request_rate` None = all at once."""

    prompt_tokens: int = param_default("prompt_tokens")
    output_tokens: int = param_default("output_tokens")
    max_tokens: int = param_default("max_tokens")
    concurrency: int = param_default("concurrency")
    # The parsed value: prompt + output where the learner left it unset.
    context_tokens: int = 1280
    num_prompts: int = param_default("num_prompts")
    request_rate: float | None = param_default("request_rate")
    max_concurrency: int | None = param_default("max_concurrency")
    shared_prefix_tokens: int = param_default("shared_prefix_tokens")
    input_range_ratio: float = param_default("input_range_ratio")
    output_range_ratio: float = param_default("output_range_ratio")
    seed: int = param_default("seed")
    temperature: float = param_default(
        "temperature"
    )  # the requests' sampling on a real engine (0: greedy)

    @property
    def prompt_range(self) -> tuple[int, int]:
        """Shortest and longest prompt, in tokens."""
        return _length_range(self.prompt_tokens, self.input_range_ratio)

    @property
    def output_range(self) -> tuple[int, int]:
        """Shortest and longest output, in tokens."""
        return _length_range(self.output_tokens, self.output_range_ratio)


def _length_range(mean: int, ratio: float) -> tuple[int, int]:
    return max(1, math.ceil(mean * (1 - ratio))), math.floor(mean * (1 + ratio))


@dataclass(frozen=True)
class LabParams:
    """Validated parameters. `as_dict()` gives every field's normalised, JSON-safe value, and
    `parse_lab_params(p.as_dict())` gives back an equal LabParams."""

    model: ModelSpec
    hardware: Hardware
    engine: EngineConfig
    workload: Workload
    values: Mapping[str, object] = field(repr=False, compare=False, default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return dict(self.values)


# -- one value --------------------------------------------------------------------------------

_TRUE = frozenset({"true", "1", "on", "yes"})
_FALSE = frozenset({"false", "0", "off", "no"})


class _BadValue(Exception):
    """A value the field does not accept; parse_lab_params turns it into a message."""


def _shown(raw: object) -> str:
    if isinstance(raw, bool):
        return f"{str(raw).lower()} (a boolean)"
    if isinstance(raw, str):
        text = raw.strip()
        return text if len(text) <= 30 else text[:30] + "..."
    if isinstance(raw, float):
        return f"{raw:g}"
    if isinstance(raw, numbers.Integral):
        return str(raw) if abs(int(raw)) < 10**30 else "a number with more than 30 digits"
    return f"a value of type {type(raw).__name__}"


def _is_unset(raw: object) -> bool:
    return raw is None or (isinstance(raw, str) and not raw.strip())


def _number(f: ParamField, raw: object) -> float | int | None:
    """A finite int or float from a number or numeric text; None for request_rate's "inf"."""
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real | str):
        raise _BadValue
    if isinstance(raw, str):
        text = raw.strip()
        if len(text) > _MAX_TEXT:
            raise _BadValue
        try:
            return int(text, 10)
        except ValueError:
            pass
        try:
            raw = float(text)
        except ValueError:
            raise _BadValue from None
    if isinstance(raw, numbers.Integral):
        return int(raw)
    value = float(raw)
    if f.inf_means_unset and value == math.inf:
        return None
    if not math.isfinite(value):
        raise _BadValue
    return value


def _in_range(f: ParamField, value: float) -> bool:
    low, high = f.minimum, f.maximum
    if low is not None and (value <= low if f.above_minimum else value < low):
        return False
    return high is None or (value < high if f.below_maximum else value <= high)


def _coerce(f: ParamField, raw: object) -> Any:
    """The field's value from one raw value, or _BadValue."""
    if f.kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, numbers.Integral) and int(raw) in (0, 1):
            return bool(raw)
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise _BadValue
    if f.kind == "choice":
        if isinstance(raw, str) and raw.strip().lower() in f.choices:
            return raw.strip().lower()
        raise _BadValue
    value = _number(f, raw)
    if value is None:
        return None
    if f.kind == "int":
        if isinstance(value, float):
            if not value.is_integer():
                raise _BadValue
            value = int(value)
        if f.power_of_two and (value < 1 or value & (value - 1)):
            raise _BadValue
    else:
        value = float(value)
    if not _in_range(f, value):
        raise _BadValue
    return value


def _read_given(
    data: Mapping[Any, object], ignore_unknown: bool, errors: dict[str, str]
) -> dict[str, Any]:
    """The explicitly given values, typed; the bad ones go into `errors`."""
    given: dict[str, Any] = {}
    for key, raw in data.items():
        f = FIELDS_BY_NAME.get(key) if isinstance(key, str) else None
        if f is None:
            if not ignore_unknown:
                name = str(key)[:40]
                errors[name] = f"{name} is not a lab parameter"
            continue
        if _is_unset(raw):
            continue
        try:
            value = _coerce(f, raw)
        except _BadValue:
            errors[f.name] = f"{f.name} must be {f.allowed()}, got {_shown(raw)}"
            continue
        if value is not None:
            given[f.name] = value
    return given


# -- rules between fields ---------------------------------------------------------------------


def _catalog_or_custom(
    kind: str, given: dict[str, Any], custom_fields: tuple[str, ...], errors: dict[str, str]
) -> tuple[str | None, bool]:
    """Which catalog entry is asked for, or (None, True) for a custom one with all its fields."""
    named = given.get(kind)
    custom_given = [n for n in custom_fields if n in given]
    if named not in (None, CUSTOM):
        if custom_given:
            errors[kind] = (
                f"{kind} must be custom (or left out) when {', '.join(custom_given)} "
                f"{'is' if len(custom_given) == 1 else 'are'} given, got {named}"
            )
        return named, False
    if named is None and not custom_given:
        return str(FIELDS_BY_NAME[kind].default), False
    for name in custom_fields:
        if name not in given and name not in OPTIONAL_MODEL_FIELDS:
            # A bad value already has its own message; keep it.
            allowed = FIELDS_BY_NAME[name].allowed()
            errors.setdefault(name, f"{name} is required for a custom {kind} ({allowed})")
    return None, True


def _resolve_model(given: dict[str, Any], errors: dict[str, str]) -> ModelSpec | None:
    names = (*CUSTOM_MODEL_FIELDS, *OPTIONAL_MODEL_FIELDS)
    slug, custom = _catalog_or_custom("model", given, names, errors)
    if not custom:
        return MODELS[slug] if slug else None
    if any(n in errors for n in names):
        return None
    kv_heads, head_dim = given["kv_heads"], given["head_dim"]
    heads = given.get("heads", kv_heads)
    if heads % kv_heads:
        errors["heads"] = f"heads must be a multiple of kv_heads ({kv_heads}), got {heads}"
        return None
    params = given["params_b"] * 1e9
    return ModelSpec(
        name=CUSTOM,
        layers=given["layers"],
        hidden_size=given.get("hidden_size", heads * head_dim),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        params=params,
        active_params=params,
        source="custom model from the lab's parameters",
    )


def _resolve_gpu(given: dict[str, Any], errors: dict[str, str]) -> Hardware | None:
    if given.get("gpu") == CPU_KIND:
        return _resolve_cpu(given, errors)
    slug, custom = _catalog_or_custom("gpu", given, CUSTOM_GPU_FIELDS, errors)
    if not custom:
        return GPUS[slug] if slug else None
    if any(n in errors for n in CUSTOM_GPU_FIELDS):
        return None
    return _hardware_from(given, CUSTOM, "custom GPU from the lab's parameters")


def _hardware_from(given: dict[str, Any], name: str, source: str) -> Hardware:
    """A Hardware from the three figures (hbm_gb, bandwidth_tbs, tflops)."""
    return Hardware(
        name=name,
        hbm_bytes=round(given["hbm_gb"] * GB),
        bandwidth_bytes_per_s=given["bandwidth_tbs"] * TB,
        bf16_flops_per_s=given["tflops"] * TFLOPS,
        source=source,
    )


def _resolve_cpu(given: dict[str, Any], errors: dict[str, str]) -> Hardware | None:
    """gpu cpu: no catalog figures, the CPU's own (the lab page fills them in from the CPU
    worker's measurements; labs.runs.workers.cpu_figures)."""
    missing = [n for n in CUSTOM_GPU_FIELDS if n not in given]
    for name in missing:
        errors.setdefault(
            name,
            f"{name} is required for gpu cpu: the CPU's measured figures, which an online CPU "
            "vLLM worker announces",
        )
    if missing or any(n in errors for n in CUSTOM_GPU_FIELDS):
        return None
    return _hardware_from(given, CPU_KIND, "a CPU vLLM worker's CPU, as it measured itself")


def _check_tp(model: ModelSpec, tp: int, errors: dict[str, str]) -> None:
    # vLLM splits attention heads across the GPUs: tp must divide the heads, and the KV heads are
    # either split (kv_heads divisible by tp) or replicated (tp divisible by kv_heads).
    kv_ok = model.kv_heads % tp == 0 or tp % model.kv_heads == 0
    if model.heads % tp or not kv_ok:
        fits = [str(t) for t in (1, 2, 4, 8, 16, 32, 64) if not model.heads % t]
        errors["tp"] = (
            f"tp must divide {model.name}'s {model.heads} attention heads "
            f"({model.kv_heads} KV heads): allowed {', '.join(fits)}, got {tp}"
        )


def _check_lengths(v: dict[str, Any], model: ModelSpec | None, errors: dict[str, str]) -> None:
    """Rules between lengths and budgets; `v` holds every field with defaults applied."""
    shortest_prompt, longest_prompt = _length_range(v["prompt_tokens"], v["input_range_ratio"])
    longest_output = _length_range(v["output_tokens"], v["output_range_ratio"])[1]
    max_tokens, budget = v["max_tokens"], v["max_num_batched_tokens"]
    if max_tokens < longest_output:
        errors["max_tokens"] = (
            f"max_tokens must be at least the longest output ({longest_output:,} tokens) "
            f"so every request can finish, got {max_tokens:,}"
        )
    if budget < v["max_num_seqs"]:
        errors["max_num_batched_tokens"] = (
            f"max_num_batched_tokens must be at least max_num_seqs ({v['max_num_seqs']:,}), "
            f"as vLLM requires, got {budget:,}"
        )
    elif not v["chunked_prefill"] and budget < longest_prompt:
        errors["max_num_batched_tokens"] = (
            f"max_num_batched_tokens must hold the longest prompt ({longest_prompt:,} tokens) "
            f"when chunked_prefill is off, got {budget:,}"
        )
    if v["shared_prefix_tokens"] > shortest_prompt:
        errors["shared_prefix_tokens"] = (
            f"shared_prefix_tokens must be at most the shortest prompt "
            f"({shortest_prompt:,} tokens), got {v['shared_prefix_tokens']:,}"
        )
    limit = model.max_context if model is not None else None
    if limit is None:
        return
    if longest_prompt + max_tokens > limit and "max_tokens" not in errors:
        errors["max_tokens"] = (
            f"max_tokens plus the longest prompt ({longest_prompt:,} + {max_tokens:,}) "
            f"must fit {v['model']}'s context of {limit:,} tokens"
        )
    if v["context_tokens"] > limit:
        errors["context_tokens"] = (
            f"context_tokens must be at most {v['model']}'s context of {limit:,} tokens, "
            f"got {v['context_tokens']:,}"
        )


def _resolve_spec(v: dict[str, Any], errors: dict[str, str]) -> None:
    k = v["spec_tokens"]
    if v["spec_method"] is None:
        v["spec_method"] = "draft_model" if k > 0 else "none"
    method = v["spec_method"]
    if method == "none" and k > 0:
        errors["spec_tokens"] = f"spec_tokens must be 0 when spec_method is none, got {k}"
    elif method != "none" and k == 0:
        errors["spec_tokens"] = f"spec_tokens must be at least 1 when spec_method is {method}"
    if v["draft_cost"] is None:
        v["draft_cost"] = DEFAULT_DRAFT_COST[method]
    if method == "none" and v["temperature"] != 0:
        # Without drafts the sampled tokens change no timing (ignore_eos fixes every length).
        errors["temperature"] = (
            f"temperature must be 0 (greedy) when spec_method is none: it is a setting of "
            f"speculative runs, where it decides draft acceptance, got {v['temperature']:g}"
        )


def parse_lab_params(data: Mapping[str, object], *, ignore_unknown: bool = False) -> LabParams:
    """Validate raw lab parameters and build the dataclasses.

    Args:
        data: parameter name -> value. Values may be strings (from a form or the command line)
            or native values; None and "" mean "use the default". Booleans take
            true/false/1/0/on/off/yes/no.
        ignore_unknown: skip keys that are not parameters (a form's CSRF token) instead of
            reporting them.

    Raises:
        ParamError: `errors` = {field name: message} for every bad field, and only that.
    """
    if not isinstance(data, Mapping):
        raise ParamError({"params": f"lab parameters must be a mapping, got {_shown(data)}"})
    errors: dict[str, str] = {}
    given = _read_given(data, ignore_unknown, errors)
    model = _resolve_model(given, errors)
    hardware = _resolve_gpu(given, errors)
    v: dict[str, Any] = {f.name: given.get(f.name, f.default) for f in PARAM_FIELDS}
    if v["context_tokens"] is None:
        derived: int = v["prompt_tokens"] + v["output_tokens"]
        v["context_tokens"] = derived
        context = FIELDS_BY_NAME["context_tokens"]
        if not _in_range(context, derived):
            # Derived, it must still be a value the field accepts, or the saved run would not
            # parse again in the worker.
            errors["context_tokens"] = (
                f"context_tokens (unset: prompt_tokens + output_tokens = "
                f"{derived:,}) must be at most {_fmt(context.maximum)}; lower "
                "prompt_tokens or output_tokens, or set context_tokens"
            )
    if model is not None:
        v["model"] = model.name
        if model.name == CUSTOM:
            v["heads"], v["hidden_size"] = model.heads, model.hidden_size
        if "tp" not in errors:
            _check_tp(model, v["tp"], errors)
    if hardware is not None:
        v["gpu"] = hardware.name
    _check_lengths(v, model, errors)
    _resolve_spec(v, errors)
    if errors or model is None or hardware is None:
        raise ParamError(errors)
    return LabParams(model, hardware, _engine(v), _workload(v), values=v)


def _engine(v: dict[str, Any]) -> EngineConfig:
    # Fields named like a parameter take its value; the two with other units are converted.
    same = {f.name: v[f.name] for f in fields(EngineConfig) if f.name in FIELDS_BY_NAME}
    return EngineConfig(
        **same,
        step_overhead_s=v["step_overhead_ms"] / 1000,
        activation_reserve_bytes=round(v["activation_reserve_gb"] * GB),
    )


def _workload(v: dict[str, Any]) -> Workload:
    return Workload(**{f.name: v[f.name] for f in fields(Workload)})


def align_run_batch(data: Mapping[str, object]) -> dict[str, object]:
    """One batch for the prediction and the run, for the lab pages and `lab run` alike.

    The predictor's batch is `concurrency`; a run's is what it keeps in flight (`max_concurrency`,
    unset = every prompt at once, as `vllm bench serve` without a rate). Whichever of the two is
    missing follows the other; with neither, both are every prompt. Values stay as given (text or
    numbers): a bad one is left for `parse_lab_params` to name.
    """
    values = dict(data)

    def given(name: str) -> bool:
        return values.get(name) not in (None, "")

    if given("concurrency"):
        if not given("max_concurrency"):
            values["max_concurrency"] = values["concurrency"]
        return values
    default_prompts = FIELDS_BY_NAME["num_prompts"].default
    prompts = values["num_prompts"] if given("num_prompts") else default_prompts
    in_flight = values["max_concurrency"] if given("max_concurrency") else prompts
    # A value that is not a whole number is left for parse_lab_params to name.
    with contextlib.suppress(ValueError):
        values["concurrency"] = min(int(str(in_flight)), int(str(prompts)))
    return values


# A setting a lab does not show that another one needs: it follows the shown settings named here,
# and a refusal it still gets is shown on the first of them (labs/forms.py).
FOLLOWS: dict[str, tuple[str, ...]] = {
    "max_tokens": ("output_tokens", "prompt_tokens", "model"),
    "max_num_batched_tokens": ("max_num_seqs", "prompt_tokens"),
    "shared_prefix_tokens": ("prompt_tokens",),
}


def follow_unshown(data: Mapping[str, object], shown: Collection[str]) -> dict[str, object]:
    """The settings a lab does not show, moved to values the shown ones need.

    A learner who raises output_tokens in a lab without max_tokens cannot lower the hidden cap
    that refuses it; so, when not shown: max_tokens covers the longest output (and, when it can,
    leaves the longest prompt room in the model's context), max_num_batched_tokens holds
    max_num_seqs (and the longest prompt without chunked prefill), shared_prefix_tokens fits the
    shortest prompt. Values a learner can see are never changed; bad values are left for
    `parse_lab_params` to name.
    """
    values = dict(data)
    errors: dict[str, str] = {}
    given = _read_given(values, True, errors)
    model = _resolve_model(given, errors)
    if errors:
        return values
    v = {f.name: given.get(f.name, f.default) for f in PARAM_FIELDS}
    shortest_prompt, longest_prompt = _length_range(v["prompt_tokens"], v["input_range_ratio"])
    longest_output = _length_range(v["output_tokens"], v["output_range_ratio"])[1]

    def set_unshown(name: str, value: int) -> None:
        f = FIELDS_BY_NAME[name]
        if name not in shown and value != v[name] and _in_range(f, value):
            values[name] = value

    max_tokens = max(v["max_tokens"], longest_output)
    context = model.max_context if model is not None else None
    if context is not None and longest_prompt + max_tokens > context:
        max_tokens = max(longest_output, context - longest_prompt)
    set_unshown("max_tokens", max_tokens)
    budget_needs = (
        v["max_num_seqs"] if v["chunked_prefill"] else max(v["max_num_seqs"], longest_prompt)
    )
    set_unshown("max_num_batched_tokens", max(v["max_num_batched_tokens"], budget_needs))
    set_unshown("shared_prefix_tokens", min(v["shared_prefix_tokens"], shortest_prompt))
    return values
