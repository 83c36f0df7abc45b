"""Random settings across the whole lab form, and how the formulas agree with the ideal engine.

The formulas (`labs.prediction.predict.lab_prediction`, what `lab predict` prints) are meant to be
the closed form of the engine the simulator's `ideal` profile runs (`lab run --backend sim
--sim-profile ideal`). This module checks that where a learner may click, not on presets: it draws
settings from every field of the form (labs.parameters.params.PARAM_FIELDS: its choices, and its
numeric ranges log-uniformly), validates them as the form does (`align_run_batch`, then
`parse_lab_params`), runs the ideal simulation and compares, per draw:

- TTFT mean and median (predicted under the load: `loaded_ttft_s`, `loaded_ttft_p50_s`),
- TPOT (mean), output tokens/s, and running sequences (the most that ran at once).

A metric agrees when the prediction is within TOLERANCE of the simulation, as the run page and
tests compare them; a metric the formulas do not cover (`Prediction.uncovered` names why) is left
unpredicted, never counted as agreeing. Each draw is classed by what bound its run, read from the
run's own engine series (labs.explanation.limits.binding_limit): the token budget, max_num_seqs,
the KV pool, the client's concurrency, or a request rate below or above what the engine serves.

Draws are bounded only as the form bounds a run: a simulated run must pass the form's size check
(labs.prediction.sizing.sim_precheck) at DRAW_RUN_MB, and its cost bound
(labs.prediction.sizing.sim_steps) stay under DRAW_STEPS, so a draw costs the CPU a fraction of a
second.

    python -m labs.explanation.form_draws --draws 450 --seed 0       # a table by binding limit
    python -m labs.explanation.form_draws --draws 40 --show-misses   # and each miss's settings

Standard library, numpy and labs only; no Django.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labs.explanation.limits import BUDGET, KV, SEQS, UNCLEAR, Caps, binding_limit
from labs.measurement.metrics import summarize
from labs.parameters.catalog import GPUS, MODELS
from labs.parameters.params import (
    FIELDS_BY_NAME,
    SPEC_METHODS,
    LabParams,
    ParamError,
    align_run_batch,
    parse_lab_params,
)
from labs.prediction.predict import lab_prediction
from labs.prediction.sizing import sim_precheck, sim_steps
from labs.sim.lab import build_simulator

TOLERANCE = 0.25
# The form's own size check, at a run budget that keeps one draw cheap.
DRAW_RUN_MB = 48
DRAW_STEPS = 60_000

# metric -> (measured path in labs.measurement.metrics.summarize, predicted key in lab_prediction)
METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "ttft_mean": (("ttft_s", "mean"), "loaded_ttft_s"),
    "ttft_p50": (("ttft_s", "p50"), "loaded_ttft_p50_s"),
    "tpot": (("tpot_s", "mean"), "tpot_s"),
    "output_tokens_per_s": (("output_tokens_per_s",), "output_tokens_per_s"),
    "running_seqs": (("max_running_seqs",), "running_seqs"),
}

# What bound a run (`classify`).
CLASSES = (
    "token budget",
    "max_num_seqs",
    "KV pool",
    "concurrency",
    "rate below capacity",
    "rate above capacity",
    "unclear",
)
_CAP_CLASS = {BUDGET: "token budget", SEQS: "max_num_seqs", KV: "KV pool"}


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _log_int(rng: np.random.Generator, low: int, high: int) -> int:
    """A whole number in [low, high], log-uniformly."""
    return min(high, max(low, int(_log_uniform(rng, low, high + 1))))


def _powers_of_two(name: str) -> list[int]:
    f = FIELDS_BY_NAME[name]
    low, high = int(f.minimum or 1), int(f.maximum or 1)
    return [2**i for i in range(high.bit_length()) if low <= 2**i <= high]


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def draw_values(rng: np.random.Generator) -> dict[str, object]:
    """One learner's settings, as the form would post them (before `align_run_batch`).

    Every field of the form that changes what the ideal engine does is drawn: catalog model and
    GPU, tp among the values the model's heads allow, dtypes, memory share, block size, the
    caps (max_num_seqs, max_num_batched_tokens at least as vLLM requires), chunked prefill,
    prefix caching with a shared prefix, a KV pool of its own size, speculation, a step
    overhead, efficiencies, prompt and output lengths (with ranges), and the load: closed-loop
    concurrency or a Poisson rate. Lengths and counts are log-uniform over what the form allows
    for the model (its context) and what a run may hold (see the module docstring)."""
    model_name = _pick(rng, list(MODELS))
    model = MODELS[model_name]
    gpu = _pick(rng, list(GPUS))
    tps = [t for t in _powers_of_two("tp") if not model.heads % t]
    tps = [t for t in tps if not model.kv_heads % t or not t % model.kv_heads]
    v: dict[str, object] = {
        "model": model_name,
        "gpu": gpu,
        "tp": _pick(rng, [t for t in tps if t <= 8]),
        "weight_dtype": _pick(rng, FIELDS_BY_NAME["weight_dtype"].choices),
        "kv_dtype": _pick(rng, FIELDS_BY_NAME["kv_dtype"].choices),
        "gpu_memory_utilization": round(float(rng.uniform(0.5, 0.95)), 2),
        "block_size": _pick(rng, _powers_of_two("block_size")),
        "chunked_prefill": bool(rng.random() < 0.5),
        "prefix_caching": bool(rng.random() < 0.5),
        "sim_profile": "ideal",
        "seed": int(rng.integers(0, 2**31)),
    }
    context = model.max_context or 8192
    prompt = _log_int(rng, 1, min(context // 2, 32_768))
    output = _log_int(rng, 1, min(context - prompt, 4096))
    v["prompt_tokens"], v["output_tokens"] = prompt, output
    input_ratio = output_ratio = 0.0
    if rng.random() < 0.25:
        input_ratio = v["input_range_ratio"] = round(float(rng.uniform(0, 0.9)), 2)
    if rng.random() < 0.25:
        output_ratio = v["output_range_ratio"] = round(float(rng.uniform(0, 0.9)), 2)
    longest_prompt = math.floor(prompt * (1 + input_ratio))
    longest_output = math.floor(output * (1 + output_ratio))
    v["max_tokens"] = min(context - longest_prompt, longest_output + _log_int(rng, 1, 2048) - 1)
    shortest_prompt = max(1, math.ceil(prompt * (1 - input_ratio)))
    if rng.random() < 0.5:
        v["shared_prefix_tokens"] = int(rng.integers(0, shortest_prompt + 1))
    seqs = _log_int(rng, 1, 1024)
    v["max_num_seqs"] = seqs
    budget_low = seqs if v["chunked_prefill"] else max(seqs, longest_prompt)
    v["max_num_batched_tokens"] = _log_int(rng, budget_low, max(budget_low, 65_536))
    if rng.random() < 0.35:
        longest = longest_prompt + int(v["max_tokens"])  # type: ignore[call-overload]
        v["kv_capacity_tokens"] = _log_int(rng, longest, 64 * longest)
    if rng.random() < 0.15:
        v["kv_allocation"] = "contiguous"
    if rng.random() < 0.3:
        v["spec_method"] = _pick(rng, [m for m in SPEC_METHODS if m != "none"])
        v["spec_tokens"] = int(rng.integers(1, 9))
        v["acceptance"] = round(float(rng.uniform(0, 0.95)), 2)
    if rng.random() < 0.2:
        v["step_overhead_ms"] = round(_log_uniform(rng, 0.01, 20), 3)
    if rng.random() < 0.2:
        v["compute_efficiency"] = round(float(rng.uniform(0.3, 1)), 2)
        v["bandwidth_efficiency"] = round(float(rng.uniform(0.3, 1)), 2)
    prompts = _log_int(rng, 1, 2000)
    v["num_prompts"] = prompts
    if rng.random() < 0.4:
        v["request_rate"] = round(_log_uniform(rng, 0.05, 500), 3)
        if rng.random() < 0.25:
            v["max_concurrency"] = _log_int(rng, 1, prompts)
    else:
        v["concurrency"] = _log_int(rng, 1, prompts)
    return v


@dataclass
class Draw:
    """One valid setting of the form, its prediction and its ideal simulation."""

    index: int
    values: dict[str, object]
    params: LabParams
    predicted: dict[str, Any]
    measured: dict[str, Any]
    limit: str  # one of CLASSES
    # metric -> (predicted, measured) where both are numbers; metric -> reason where the
    # prediction leaves it uncovered.
    figures: dict[str, tuple[float, float]] = field(default_factory=dict)
    uncovered: dict[str, str] = field(default_factory=dict)

    def errors(self) -> dict[str, float]:
        """Relative error of each compared metric: predicted / measured - 1."""
        return {
            name: (p - m) / abs(m) if m else (0.0 if p == m else math.inf)
            for name, (p, m) in self.figures.items()
        }

    def misses(self) -> dict[str, float]:
        return {k: e for k, e in self.errors().items() if not abs(e) <= TOLERANCE}

    @property
    def outcome(self) -> str:
        """ "agree" (every metric within TOLERANCE), "miss", or "unpredicted" (no miss, but a
        metric the formulas leave uncovered)."""
        if self.misses():
            return "miss"
        return "unpredicted" if self.uncovered else "agree"


def _measured_value(measured: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = measured
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return float(value) if isinstance(value, int | float) else None


def compare(predicted: Mapping[str, Any], measured: Mapping[str, Any]) -> tuple[dict, dict]:
    """(figures, uncovered): the metrics both sides give a number for, and those the
    prediction leaves uncovered with its reason. A metric neither side has (TPOT of one-token
    outputs) is left out."""
    uncovered_reasons = predicted.get("uncovered") or {}
    figures: dict[str, tuple[float, float]] = {}
    uncovered: dict[str, str] = {}
    for name, (path, key) in METRICS.items():
        got = _measured_value(measured, path)
        if key in uncovered_reasons:
            uncovered[name] = str(uncovered_reasons[key])
            continue
        value = predicted.get(key)
        if got is None and value is None:
            continue
        if got is None or value is None:
            uncovered[name] = "no figure" if value is None else "nothing measured"
            continue
        figures[name] = (float(value), got)
    return figures, uncovered


def classify(params: LabParams, summary: Mapping[str, Any], caps: Caps | None) -> str:
    """What bound the run (CLASSES), from its engine series: a cap that held admission, or the
    arrivals. A Poisson rate whose requests waited on a cap (or on the engine with none at its
    limit) was above what the engine serves; one that never made them wait, below it."""
    found = binding_limit(summary, caps) if caps is not None else None
    key = found.key if found is not None else UNCLEAR
    if params.workload.request_rate is not None:
        return "rate below capacity" if key not in (*_CAP_CLASS, UNCLEAR) else "rate above capacity"
    if key in _CAP_CLASS:
        return _CAP_CLASS[key]
    return "unclear" if key == UNCLEAR else "concurrency"


def run_draw(index: int, values: Mapping[str, object], params: LabParams) -> Draw:
    """Predict and simulate one setting, compare, classify."""
    predicted = lab_prediction(params)
    record = build_simulator(params).run()
    summary = summarize(record)
    meta = {"num_gpu_blocks": record.counters.num_gpu_blocks}
    caps = Caps.of_run(params.as_dict(), predicted, meta)
    limit = classify(params, summary, caps)
    summary.pop("series")
    figures, uncovered = compare(predicted, summary)
    return Draw(index, dict(values), params, predicted, summary, limit, figures, uncovered)


def valid_draws(seed: int, count: int) -> Iterator[tuple[int, dict[str, object], LabParams]]:
    """`count` valid settings from `seed`: each draw is redrawn until the form accepts it (the
    same validation as the form) and the run passes the form's size check at DRAW_RUN_MB
    with a cost bound under DRAW_STEPS. The same seed gives the same settings whatever the
    prediction code: nothing here reads a prediction."""
    rng = np.random.default_rng(seed)
    made = 0
    while made < count:
        values = draw_values(rng)
        try:
            params = parse_lab_params(align_run_batch(values))
            sim_precheck(params, max_run_mb=DRAW_RUN_MB)
        except ParamError:
            continue
        if sim_steps(params) > DRAW_STEPS:
            continue
        yield made, values, params
        made += 1


def run_draws(seed: int, count: int) -> list[Draw]:
    return [run_draw(i, values, params) for i, values, params in valid_draws(seed, count)]


@dataclass(frozen=True)
class Tally:
    """Draws by outcome, overall and per binding limit."""

    by_limit: dict[str, Counter]
    total: Counter
    metric_agree: Counter
    metric_seen: Counter

    @classmethod
    def of(cls, draws: Sequence[Draw]) -> Tally:
        by_limit: dict[str, Counter] = {name: Counter() for name in CLASSES}
        total: Counter = Counter()
        agree: Counter = Counter()
        seen: Counter = Counter()
        for draw in draws:
            by_limit[draw.limit][draw.outcome] += 1
            total[draw.outcome] += 1
            misses = draw.misses()
            for name in METRICS:
                if name in draw.figures:
                    seen[name] += 1
                    agree[name] += name not in misses
        return cls(by_limit, total, agree, seen)

    def table(self) -> str:
        lines = [f"{'binding limit':<22}{'draws':>7}{'agree':>7}{'miss':>6}{'unpred.':>9}"]
        for name, c in [*self.by_limit.items(), ("all", self.total)]:
            n = sum(c.values())
            if n:
                lines.append(f"{name:<22}{n:>7}{c['agree']:>7}{c['miss']:>6}{c['unpredicted']:>9}")
        n = sum(self.total.values())
        lines.append(
            f"agree within {TOLERANCE:.0%} on all metrics: {self.total['agree']}/{n} "
            f"({self.total['agree'] / max(n, 1):.0%}); unpredicted {self.total['unpredicted']}"
        )
        per = ", ".join(
            f"{name} {self.metric_agree[name]}/{self.metric_seen[name]}" for name in METRICS
        )
        lines.append(f"per metric (within / compared): {per}")
        return "\n".join(lines) + "\n"


def describe(draw: Draw) -> str:
    """A draw's settings and each metric's predicted vs simulated figure, on a few lines."""
    shown = ", ".join(f"{k}={v}" for k, v in draw.values.items() if k not in ("sim_profile",))
    lines = [f"#{draw.index} [{draw.limit}] {shown}"]
    for name, (p, m) in draw.figures.items():
        err = draw.errors()[name]
        mark = "  " if abs(err) <= TOLERANCE else "!!"
        lines.append(f"   {mark} {name:<20} predicted {p:<12.4g} ideal sim {m:<12.4g} {err:+.0%}")
    for name, why in draw.uncovered.items():
        lines.append(f"   -- {name:<20} not covered: {why}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-misses", action="store_true", help="print each miss")
    parser.add_argument("--show-all", action="store_true", help="print every draw")
    args = parser.parse_args(argv)
    draws = run_draws(args.seed, args.draws)
    for draw in draws:
        if args.show_all or (args.show_misses and draw.outcome != "agree"):
            print(describe(draw))
    sys.stdout.write(Tally.of(draws).table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
