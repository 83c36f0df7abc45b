"""Closed-form serving predictions: the numbers every lab shows as "predicted".

"Predicted" means these formulas, the deck's own arithmetic at the hardware's peak figures
(labs/prediction/: `memory`, `steps`, `load`; docs/prediction.md derives them):

- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element.
- Blocks per sequence = ceil(tokens / block_size); the last block wastes the rest. A contiguous
  reservation holds prompt + max_tokens slots and wastes what the sequence does not use.
- KV capacity = (HBM x gpu_memory_utilization - weights - activation reserve) / KV bytes per
  token, in whole blocks; concurrent sequences = capacity / blocks per sequence, the blocks of a
  prefix every request shares held once.
- A step takes max(compute, memory) + a fixed overhead, where compute = 2 x active parameters x
  tokens / FLOP/s and memory = (weights read + KV read) / bandwidth (`step_time_s`). Prefill
  is compute-bound, a decode step memory-bound; both come out of the same function.
- E2E = TTFT + TPOT x (output tokens - 1).
- Speculative decoding, k drafts accepted with probability alpha and costing c each relative to
  a target pass: (1 - alpha^(k+1)) / (1 - alpha) tokens per pass, a speedup of that / (k c + 1)
  at batch 1; at a batch, verifying k + 1 tokens per sequence costs what it costs
  (`spec_speedup_at_batch`).

Under the learner's load (`labs.prediction.load.predict_load`): the engine holds R sequences
(the load, max_num_seqs, the KV pool, or what the token budget lets through), each cycling
prompt -> decode -> done in steps that carry prompts beside decodes; a closed loop runs its
first wave and then cycles, a Poisson rate runs rate x E2E sequences (Little's law) below
capacity and queues above it, and output tokens/s is the run's tokens over its length. Where
the formulas do not cover a figure for these settings, `Prediction.uncovered` says why instead.
The idle numbers (`ttft_s`, `e2e_s`: one request on an idle engine) stay as the deck's cards use
them.

Left out on purpose: attention FLOPs (small next to 2 x parameters below ~10k tokens), tensor-
parallel communication, the kernels' real efficiencies, and that vLLM looks the input embedding
up and runs the LM head only where it samples (the deck teaches every weight read and multiplied
per token: 16 GB and 4.8 ms per Llama-3-8B decode step on an H100); the simulator's engine model
(labs/sim/engine_model.py) adds those on its realistic profile.

Standard library and numpy only; never Django (a test checks it), so the simulator and the lab
pages can call it on every step or slider change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Literal

from labs.parameters.params import EngineConfig, LabParams, Workload
from labs.prediction.load import (
    BudgetSteady,
    BudgetTimes,
    LoadPrediction,
    budget_steady,
    budget_times,
    closed_loop_wait_s,
    pipeline_wait_s,
    predict_load,
)
from labs.prediction.memory import (
    blocks_for_tokens,
    concurrent_seqs,
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_memory_bytes,
    kv_replication,
    slots_wasted,
    weight_bytes,
    weight_bytes_read,
)
from labs.prediction.steps import (
    compute_rate,
    decode_step_time,
    draft_time_s,
    e2e_time_s,
    memory_rate,
    prefill_time_s,
    spec_speedup,
    spec_tokens_per_step,
    step_compute_s,
    step_memory_s,
    step_time_s,
    token_time_s,
)

if TYPE_CHECKING:
    from labs.parameters.device_calibration import DeviceConstants

# The formulas' public names: the deck's cards cite them as labs.prediction.predict.<name>, the
# simulator prices its ideal steps with them.
__all__ = [
    "BREAKDOWN_PARTS",
    "BudgetSteady",
    "BudgetTimes",
    "LoadPrediction",
    "Prediction",
    "blocks_for_tokens",
    "budget_notice",
    "budget_steady",
    "budget_times",
    "closed_loop_wait_s",
    "compute_rate",
    "concurrent_seqs",
    "decode_step_time",
    "draft_time_s",
    "e2e_time_s",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "kv_memory_bytes",
    "kv_replication",
    "lab_prediction",
    "memory_rate",
    "pipeline_wait_s",
    "predict",
    "predict_load",
    "predicted_breakdown",
    "prefill_time_s",
    "prefix_cached_tokens",
    "slots_wasted",
    "spec_speedup",
    "spec_tokens_per_step",
    "step_compute_s",
    "step_memory_s",
    "step_time_s",
    "token_time_s",
    "weight_bytes",
    "weight_bytes_read",
]

Bound = Literal["compute", "memory-bandwidth", "kv-capacity"]


# -- the whole prediction ----------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Every predicted number of a lab. Bytes, tokens, seconds; None where nothing fits, or
    where `uncovered` says the formulas do not cover the figure for these settings."""

    kv_bytes_per_token: int
    kv_bytes_per_seq: int
    blocks_per_seq: int
    prompt_blocks: int
    slots_wasted_per_seq: int
    contiguous_reserved_slots: int
    contiguous_wasted_slots: int
    contiguous_waste_fraction: float
    weight_bytes: int
    kv_memory_bytes: int
    kv_capacity_tokens: int
    max_concurrent_seqs: int
    contiguous_max_concurrent_seqs: int
    running_seqs: int | None
    replicas_needed: int | None
    gpus_needed: int | None
    prefix_cached_tokens: int
    prefill_s: float
    ttft_s: float | None
    weight_read_s: float
    kv_read_s: float
    decode_step_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    output_tokens_per_s: float | None
    # The batch's steady decode throughput, running / (time per token at that batch): the
    # deck's "tokens/s" of a decode step, without the run's prefills, waits and ends.
    decode_tokens_per_s: float | None
    batch_speedup_vs_batch1: float | None
    spec_tokens_per_step: float
    spec_speedup: float
    spec_speedup_at_batch: float | None
    bound: Bound
    fits: bool
    # Under the learner's load (labs.prediction.load): None where nothing fits.
    capacity_requests_per_s: float | None = None
    queue_wait_s: float | None = None
    loaded_ttft_s: float | None = None
    loaded_ttft_p50_s: float | None = None
    loaded_e2e_s: float | None = None
    # What max_num_seqs, the KV pool and the load would let run when the token budget lets
    # fewer (`budget_steady`); None when the budget is not what caps running_seqs.
    running_seqs_without_budget: int | None = None
    # What sets the run's pace: "concurrency", "max_num_seqs or KV pool", "token budget",
    # "rate below capacity", "rate above capacity"; "" where nothing fits.
    regime: str = ""
    # Figure -> why the formulas do not cover it for these settings (the figure is None).
    uncovered: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def prefix_cached_tokens(engine: EngineConfig, workload: Workload) -> int:
    """Prompt tokens a warm prefix cache serves: whole blocks of the shared prefix, and never
    the block holding the prompt's last token (vLLM always computes it to get the first output
    token). Contiguous reservations are private to a request: nothing is shared."""
    if not engine.prefix_caching or engine.kv_allocation == "contiguous":
        return 0
    bs = engine.block_size
    shared_blocks = workload.shared_prefix_tokens // bs
    return min(shared_blocks, (workload.prompt_tokens - 1) // bs) * bs


def shared_kv_seqs(capacity_tokens: int, tokens_per_seq: int, block_size: int, shared: int) -> int:
    """Sequences of `tokens_per_seq` that fit in the pool when the first `shared` tokens (whole
    blocks of a prefix every request has) are held once for all of them:
    (pool blocks - shared blocks) / (blocks per sequence - shared blocks)."""
    pool = capacity_tokens // block_size
    shared_blocks = shared // block_size
    # A sequence's last block is its own, however much of it the prefix covers.
    own = max(blocks_for_tokens(tokens_per_seq, block_size) - shared_blocks, 1)
    return max(pool - shared_blocks, 0) // own


def _spec_speedup_under_load(
    params: LabParams, seq_cap: int, cached: int, load: LoadPrediction | None
) -> float | None:
    """TPOT without drafts over TPOT with them, both under this load: at batch 1 the small-batch
    speedup (tokens per pass / (k c + 1)); at a batch its verified k + 1 tokens per sequence
    cost compute and budget the prompts also need, so the gain shrinks. None without
    speculation's figures (nothing fits, one-token outputs)."""
    if load is None or load.tpot_s is None:
        return None
    engine = params.engine
    if not engine.spec_tokens:
        return 1.0
    plain_engine = replace(engine, spec_tokens=0, spec_method="none", draft_cost=0.0)
    hw, model, work = params.hardware, params.model, params.workload
    plain = predict_load(hw, model, plain_engine, work, seq_cap, cached)
    return plain.tpot_s / load.tpot_s if plain.tpot_s else None


LOADED_FIGURES = (
    "running_seqs",
    "loaded_ttft_s",
    "loaded_ttft_p50_s",
    "loaded_e2e_s",
    "tpot_s",
    "output_tokens_per_s",
)


def _preemption_uncovered(
    params: LabParams, cached: int, capacity: int, running: int
) -> dict[str, str]:
    """Every loaded figure, with why, when the paged KV pool is what caps the `running`
    sequences and admits more of them on their prompts than it holds at their full length: the
    engine then preempts and recomputes, which no formula here follows. {} otherwise."""
    engine, work = params.engine, params.workload
    if engine.kv_allocation != "paged":
        return {}
    in_flight = work.concurrency
    if work.request_rate is not None and work.max_concurrency is not None:
        in_flight = work.max_concurrency
    wanted = min(in_flight, work.num_prompts, engine.max_num_seqs)
    used = work.prompt_tokens + work.output_tokens
    full = shared_kv_seqs(capacity, used, engine.block_size, cached)
    on_prompts = shared_kv_seqs(capacity, work.prompt_tokens, engine.block_size, cached)
    if running < full or wanted <= full or on_prompts <= full:
        return {}
    why = (
        f"the KV pool holds {full:,} sequences at their full length but admits {on_prompts:,} on "
        f"their prompts, so they outgrow it mid-decode and are preempted and recomputed; the "
        "formulas do not follow preemption"
    )
    return dict.fromkeys(LOADED_FIGURES, why)


def predict(params: LabParams, device: DeviceConstants | None = None) -> Prediction:
    """All predictions for one lab: one request alone for TTFT, the run under its load for the
    loaded figures (`predict_load`), capacity and fleet figures.

    `device`: the calibration measured on the lab's device, if it has one; its fitted
    efficiencies and step overhead replace the knobs the lab left at their ideal defaults."""
    if device is not None:
        params = replace(params, engine=device.predictor_engine(params.engine))
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    bs = engine.block_size
    used = work.prompt_tokens + work.output_tokens
    reserved = work.prompt_tokens + work.max_tokens
    per_token = kv_bytes_per_token(model, engine.kv_dtype)
    capacity = kv_capacity_tokens(model, hw, engine)
    cached = prefix_cached_tokens(engine, work)
    contiguous_seqs = capacity // reserved
    paged_seqs = shared_kv_seqs(capacity, work.context_tokens, bs, cached)
    max_seqs = contiguous_seqs if engine.kv_allocation == "contiguous" else paged_seqs
    per_replica = min(max_seqs, engine.max_num_seqs)
    allowed = min(work.concurrency, per_replica)
    fits = allowed >= 1
    load = predict_load(hw, model, engine, work, per_replica, cached) if fits else None
    running = load.batch if load is not None else max(allowed, 0)
    batch = max(running, 1)

    decode_s = decode_step_time(hw, model, engine, batch, work.context_tokens)
    k, alpha = engine.spec_tokens, engine.acceptance
    ttft = prefill_time_s(hw, model, engine, work.prompt_tokens, cached)
    single = decode_step_time(hw, model, engine, 1, work.context_tokens)
    replicas = math.ceil(work.concurrency / per_replica) if fits else None
    tpot = load.tpot_s if load is not None else None

    if not fits or work.concurrency > max_seqs:
        bound: Bound = "kv-capacity"
    elif step_compute_s(hw, model, engine, batch) > step_memory_s(
        hw, model, engine, batch, batch * work.context_tokens
    ):
        bound = "compute"
    else:
        bound = "memory-bandwidth"

    rate = memory_rate(hw, engine)
    budget_capped = load is not None and load.regime == "token budget" and running < allowed
    uncovered = dict(load.uncovered) if load is not None else {}
    if work.output_tokens <= 1 and work.output_range[1] <= 1:
        tpot = None  # one token each: no request has a TPOT
    if load is not None:
        uncovered.update(_preemption_uncovered(params, cached, capacity, load.batch))
    return Prediction(
        kv_bytes_per_token=per_token,
        kv_bytes_per_seq=blocks_for_tokens(work.context_tokens, bs) * bs * per_token,
        blocks_per_seq=blocks_for_tokens(used, bs),
        prompt_blocks=blocks_for_tokens(work.prompt_tokens, bs),
        slots_wasted_per_seq=slots_wasted(used, bs),
        contiguous_reserved_slots=reserved,
        contiguous_wasted_slots=reserved - used,
        contiguous_waste_fraction=(reserved - used) / reserved,
        weight_bytes=round(weight_bytes(model, engine.weight_dtype)),
        kv_memory_bytes=max(0, round(kv_memory_bytes(model, hw, engine))),
        kv_capacity_tokens=capacity,
        max_concurrent_seqs=max_seqs,
        contiguous_max_concurrent_seqs=contiguous_seqs,
        running_seqs=None if "running_seqs" in uncovered else running,
        replicas_needed=replicas,
        gpus_needed=None if replicas is None else replicas * engine.tp,
        prefix_cached_tokens=cached,
        prefill_s=step_compute_s(hw, model, engine, work.prompt_tokens - cached),
        ttft_s=ttft if fits else None,
        weight_read_s=weight_bytes_read(model, engine.weight_dtype, batch) / rate,
        kv_read_s=batch * work.context_tokens * per_token * kv_replication(model, engine.tp) / rate,
        decode_step_s=decode_s if fits else None,
        tpot_s=None if "tpot_s" in uncovered else tpot,
        e2e_s=(
            e2e_time_s(ttft, tpot or 0.0, work.output_tokens)
            if fits and "tpot_s" not in uncovered
            else None
        ),
        output_tokens_per_s=(
            None if load is None or "output_tokens_per_s" in uncovered else load.output_tokens_per_s
        ),
        decode_tokens_per_s=(
            batch / token_time_s(hw, model, engine, batch, work.context_tokens) if fits else None
        ),
        batch_speedup_vs_batch1=batch * single / decode_s if fits else None,
        spec_tokens_per_step=spec_tokens_per_step(k, alpha),
        spec_speedup=spec_speedup(k, alpha, engine.draft_cost),
        spec_speedup_at_batch=_spec_speedup_under_load(params, per_replica, cached, load),
        bound=bound,
        fits=fits,
        capacity_requests_per_s=load.capacity_requests_per_s if load else None,
        queue_wait_s=load.queue_wait_s if load else None,
        loaded_ttft_s=None if load is None or "loaded_ttft_s" in uncovered else load.ttft_s,
        loaded_ttft_p50_s=(
            None if load is None or "loaded_ttft_p50_s" in uncovered else load.ttft_p50_s
        ),
        loaded_e2e_s=None if load is None or "loaded_e2e_s" in uncovered else load.e2e_s,
        running_seqs_without_budget=allowed if budget_capped else None,
        regime=load.regime if load is not None else "",
        uncovered=uncovered,
    )


# -- the prediction's parts ------------------------------------------------------------------------

# The parts of a run's breakdown (labs/sim/breakdown.py) and of the prediction's. The formulas
# have no tensor-parallel communication and no preemption, and share decode steps with prompts
# only where the token budget caps the batch (`budget_steady`): the rest is 0 on the predicted
# side by assumption.
BREAKDOWN_PARTS = (
    "ideal",
    "efficiency",
    "overhead",
    "frontend",
    "communication",
    "queueing",
    "prefill_interference",
    "preemption",
    "speculation",
)


def _section(parts: dict[str, float]) -> dict[str, object]:
    full = {name: float(parts.get(name, 0.0)) for name in BREAKDOWN_PARTS}
    return {"total": sum(full.values()), "parts": full}


def predicted_breakdown(params: LabParams) -> dict[str, object] | None:
    """The predicted mean TTFT, TPOT and E2E under this load (`predict_load`), split into the
    parts the run's breakdown has, under the formulas' assumptions; None when nothing fits. A
    section is None where the formulas do not cover its figure (`Prediction.uncovered`), so
    "why they differ" never builds on it.

    The parts come from pricing the same figures with fewer of the lab's knobs: with the fixed
    per-step overhead set to 0 (the difference is `overhead`), then with the efficiencies at
    1 as well (`efficiency`); what is left is the roofline (`ideal`), except that speculation's
    drafts and its extra verified tokens count as `speculation`, as the simulator counts them.
    `queueing` is the mean wait before a request's first step: for a slot, behind its wave's
    other prompts, or for the step in progress. The time decode steps spend on others' prompt
    tokens is `prefill_interference`, as the simulator counts it. Each section's parts add up
    to its total. Also `batch`: the sequences decoding together on average, output tokens/s x
    TPOT (fewer than running_seqs when prompts take part of the engine's time).
    """
    model, hw, engine, work = params.model, params.hardware, params.engine, params.workload
    prediction = predict(params)
    if not prediction.fits:
        return None
    per_replica = min(prediction.max_concurrent_seqs, engine.max_num_seqs)
    cached = prediction.prefix_cached_tokens
    no_overhead = replace(engine, step_overhead_s=0.0, seq_overhead_s=0.0)
    at_peak = replace(no_overhead, compute_efficiency=1.0, bandwidth_efficiency=1.0)
    d = work.output_tokens - 1

    def figures(e: EngineConfig) -> tuple[float, float, LoadPrediction]:
        """(own prefill, TPOT without others' prompts in its steps, the load) priced with `e`."""
        load = predict_load(hw, model, e, work, per_replica, cached)
        # A cycle's heavy steps decode fewer sequences than its light ones, so TPOT can come
        # out a hair under a light step's: then no prompt time is left to charge.
        plain = min(load.plain_tpot_s or 0.0, load.tpot_s or 0.0)
        return load.own_prefill_s, plain, load

    full, bare, peak = figures(engine), figures(no_overhead), figures(at_peak)
    load = full[2]
    batch = max(prediction.running_seqs or load.batch, 1)

    def plain_share(batch_size: float, context: int) -> float:
        """The share of a token's roofline time that is a plain decode step (no drafts)."""
        if not engine.spec_tokens:
            return 1.0
        size = max(1, round(batch_size))
        spread = spec_tokens_per_step(engine.spec_tokens, engine.acceptance)
        plain = decode_step_time(hw, model, at_peak, size, context) / spread
        return min(1.0, plain / token_time_s(hw, model, at_peak, size, context))

    share = plain_share(batch, work.prompt_tokens + work.output_tokens // 2)
    tpot_total = load.tpot_s or 0.0
    ttft = {
        "queueing": load.ttft_s - full[0],
        "overhead": full[0] - bare[0],
        "efficiency": bare[0] - peak[0],
        "ideal": peak[0],
    }
    tpot = {
        "prefill_interference": tpot_total - full[1],
        "overhead": full[1] - bare[1],
        "efficiency": bare[1] - peak[1],
        "ideal": peak[1] * share,
        "speculation": peak[1] * (1 - share),
    }
    decode = {name: value * d for name, value in tpot.items()}
    e2e = {name: ttft.get(name, 0.0) + decode.get(name, 0.0) for name in BREAKDOWN_PARTS}
    uncovered = prediction.uncovered
    tokens_per_s = prediction.output_tokens_per_s
    return {
        "source": "formulas",
        "ttft_s": None if "loaded_ttft_s" in uncovered else _section(ttft),
        "tpot_s": None if "tpot_s" in uncovered or not d else _section(tpot),
        "e2e_s": None if "loaded_e2e_s" in uncovered else _section(e2e),
        "batch": tokens_per_s * tpot_total if tokens_per_s and tpot_total else batch,
    }


def lab_prediction(params: LabParams, device: DeviceConstants | None = None) -> dict[str, object]:
    """The one prediction every page, the CLI and the personal cards show for a lab's settings:
    `predict(params)` as a dict, the rates the run's table compares (prefix-cache hit rate,
    draft acceptance) and the predicted breakdown (`predicted_breakdown`).

    `device`: the lab device's own calibration, if it has one; the figures and the breakdown
    are then both priced by it (see `predict`)."""
    if device is not None:
        params = replace(params, engine=device.predictor_engine(params.engine))
    values = predict(params).as_dict()
    engine, work = params.engine, params.workload
    if engine.prefix_caching and work.prompt_tokens:
        values["prefix_hit_rate"] = int(values["prefix_cached_tokens"]) / work.prompt_tokens  # type: ignore[call-overload]
    if engine.spec_tokens:
        # Accepted drafts per step are (tokens per step - 1); vLLM's rate divides by k drafted.
        values["draft_acceptance_rate"] = (
            float(values["spec_tokens_per_step"]) - 1  # type: ignore[arg-type]
        ) / engine.spec_tokens
    values["breakdown"] = predicted_breakdown(params)
    return values


def _seconds_words(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds >= 1 else f"{seconds * 1000:,.0f} ms"


def budget_notice(params: LabParams, predicted: Mapping[str, object]) -> str:
    """In plain words, when the token budget runs fewer sequences than max_num_seqs, the KV pool
    and the load allow (`predicted`: a `lab_prediction`): what it does and the figures that
    follow; "" when it is not what caps the batch. The lab page shows it before a run."""
    allowed = predicted.get("running_seqs_without_budget")
    if not isinstance(allowed, int):
        return ""
    engine, work = params.engine, params.workload
    budget = f"max_num_batched_tokens ({engine.max_num_batched_tokens:,})"
    prompt = f"{work.prompt_tokens:,}-token prompt"
    running = int(predicted["running_seqs"])  # type: ignore[call-overload]
    if not engine.chunked_prefill and running == 1:
        what = (
            f"{budget} serialises the engine: with chunked prefill off, a {prompt} needs the "
            "whole step's budget, so it never joins a step that carries a decode and requests "
            f"run one at a time, not {allowed:,} together."
        )
    else:
        why = (
            f"with chunked prefill off, a {prompt} joins a step only whole, in the room its "
            "decodes leave"
            if not engine.chunked_prefill
            else f"every step is full, each decode taking a token of it and {prompt}s the rest"
        )
        what = (
            f"{budget} lets only about {running:,} sequences run at once, not the {allowed:,} "
            f"that max_num_seqs, the KV pool and the load allow: {why}."
        )
    tokens_per_s = float(predicted["output_tokens_per_s"])  # type: ignore[arg-type]
    ttft = float(predicted["loaded_ttft_s"])  # type: ignore[arg-type]
    return (
        f"{what} Predicted under this load: {tokens_per_s:,.0f} output tokens/s, "
        f"time to first token {_seconds_words(ttft)}."
    )
