"""Why measured and predicted differ, derived from the run's own evidence.

Both sides of a run's table have the same parts: the measured breakdown (labs/sim/breakdown.py,
step by step on the simulator, or the engine model's expected parts plus "unexplained" for a vLLM
run) and the predicted one (labs.prediction.predict.predicted_breakdown, under the formulas'
assumptions). A metric's difference is split over those parts; the explanation names them largest
first, whichever way they push, until they cover the difference, so that no part left out is larger
than one named, and says what the rest adds up to. Where a queueing or occupancy part is named, the
cap that held admission (labs/explanation/limits.py, from the run's engine series) is said with its
figures; ramp-up and drain are a part of their own only where the running series shows them.
Counters are explained where the run holds their cause (preemptions, a cold first request) and
cited beside the parts when they are non-zero and push the way the difference went. On a real
engine whose device has no calibration (or a run priced from a CPU worker's start-up probe), the
engine model's parts are not sized for that device: no part is named, only the difference.

On a real engine the parts are the engine model's expectation, and what the run had beyond it is
"not explained". Where a part would be larger than the whole difference, the row is said in two
steps, each with its figures: the engine model's expectation against the formula, split over its
parts by the simulator's rules, then the run against the engine model (with the device's
held-out error). Throughput's occupancy is the run's own (its running gauge over the run), and
its time per request in the engine follows from it by Little's law, not from the model's parts.

Pure functions over the stored JSON (`LabRun.result`, `LabRun.predicted`); no Django.

Why one module: each reason reads the same evidence of one run (its engine series and parameters)
and the reasons are ranked against each other; split, the ranking would import every reason back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from labs.explanation.limits import Caps, Limit, Ramp, binding_limit, formula_batch_reason, ramp
from labs.parameters.params import stored_param
from labs.sim.breakdown import PART_LABELS as BREAKDOWN_LABELS

# Parts are named largest first until what is left is at most COVER of the difference; after
# that, a part moving it by NAME_SHARE or more is still named (a large part is never left out
# because others happen to net it away). A part under MIN_SHARE is never named on its own.
COVER = 0.1
NAME_SHARE = 0.2
MIN_SHARE = 0.05
# At most this many parts per explanation; what the rest add up to is said as one figure.
MAX_CAUSES = 6
# A rest under this share of the difference is rounding, not said.
SHOWN_REST = 0.005

PART_LABELS = {**BREAKDOWN_LABELS, "unexplained": "not explained by the engine model"}
NO_PARTS = {"unexplained": "not explained by the model"}
# What the formulas assume about a part they never have.
FORMULA_HAS_NONE = {
    "communication": "the formula has no all-reduce",
    "prefill_interference": "the formula prices pure decode steps",
    "preemption": "the formula never preempts",
    "frontend": "the formula has no API server",
}
FORMULA_NOTE = {
    "queueing": ", for a slot and behind the prompts admitted with it",
}
# Throughput is in flight x tokens / time: these causes are not parts of a time.
OCCUPANCY, RAMP, OUTPUT_LENGTH = "occupancy", "ramp", "output_length"
# A real engine's time per request in the engine, from its own occupancy (not the model's parts).
ENGINE_TIME = "engine_time"
LIMIT = "limit"  # a counter's cause: the cap that held admission
UNCALIBRATED = (
    "the engine model is not calibrated on this device, so it sizes none of the parts; "
    "measured against predicted only"
)
PROBE = (
    "predicted from the device's start-up probe, which sizes none of the engine model's "
    "parts; measured against predicted only"
)


@dataclass(frozen=True)
class Evidence:
    """What a run's explanations read besides the two breakdowns: the caps its admission obeyed and
    the one that held (labs.explanation.limits), its ramp, what sets the formulas' batch, the
    workload's shape, and whether the engine model is calibrated on the device (False only for a
    real engine on a device without a calibration)."""

    caps: Caps | None = None
    limit: Limit | None = None
    ramp: Ramp | None = None
    formula_batch: str = ""
    num_prompts: int = 0
    uniform_prompts: bool = False  # every prompt the same length
    calibrated: bool = True
    priced_from: str = ""  # "probe": priced from a CPU worker's start-up probe
    # A real engine's run: how far the engine model lands on this device (its calibration's
    # held-out error, when it has one), and the sequences running on average over the run
    # from its own gauge series (None: not polled, or a simulated run).
    held_out_error: float | None = None
    running_mean: float | None = None


def evidence(
    summary: Mapping[str, Any], prediction: Mapping[str, Any], params: Mapping[str, Any]
) -> Evidence:
    """The evidence of one stored run (`LabRun.result`, its prediction and parameters)."""
    caps = Caps.of_run(params, prediction, summary.get("meta"))
    breakdown = summary.get("breakdown") or {}
    return Evidence(
        caps=caps,
        limit=binding_limit(summary, caps) if caps else None,
        ramp=ramp(summary),
        formula_batch=formula_batch_reason(prediction, caps) if caps else "",
        num_prompts=int(_finite(stored_param(params, "num_prompts")) or 0),
        uniform_prompts=not _finite(params.get("input_range_ratio")),
        calibrated=breakdown.get("calibrated") is not False,
        priced_from=str(breakdown.get("priced_from") or ""),
        held_out_error=_finite((prediction.get("priced_with") or {}).get("held_out_error")),
        running_mean=running_mean(summary) if breakdown.get("source") == "expected" else None,
    )


# Fewer polls than this and the gauge's average over the run says little.
MIN_POLLS = 3


def running_mean(summary: Mapping[str, Any]) -> float | None:
    """Sequences running on average over a real run, from its own gauge series (polled
    /metrics): each poll's value held until the next, over the run's duration. None with
    fewer than MIN_POLLS polls."""
    engine = (summary.get("series") or {}).get("engine") or {}
    times, running = engine.get("t_s") or [], engine.get("running") or []
    duration = _finite(summary.get("duration_s"))
    if len(times) < MIN_POLLS or len(times) != len(running) or not duration:
        return None
    ends = [*times[1:], max(duration, times[-1])]
    spans = [max(min(b, duration) - max(a, 0.0), 0.0) for a, b in zip(times, ends, strict=True)]
    covered = sum(spans)
    if covered <= 0:
        return None
    return sum(r * w for r, w in zip(running, spans, strict=True)) / covered


@dataclass(frozen=True)
class Cause:
    """One named part: `key` (a breakdown part, OCCUPANCY / RAMP / OUTPUT_LENGTH for
    throughput, or LIMIT for a counter), `size` (its share of measured - predicted, in the
    metric's unit) and the words."""

    key: str
    size: float
    text: str


@dataclass(frozen=True)
class Counter:
    """A counter cited beside the causes: its measured value (never 0) and the direction it
    pushes the metric (+1: up, -1: down)."""

    key: str
    value: float
    direction: int
    text: str


@dataclass(frozen=True)
class Explanation:
    difference: float  # measured - predicted, in the metric's unit
    causes: tuple[Cause, ...]
    counters: tuple[Counter, ...]
    rest: float  # the difference less the named causes: the parts not named, summed
    says_not_explained: bool
    text: str
    limit: Limit | None = None  # the cap the text says held admission


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _signed(value: float, fmt: Any) -> str:
    text = fmt(abs(value))
    return f"+{text}" if value >= 0 else f"−{text}"


def _negligible(measured: float, predicted: float) -> bool:
    """A difference that is only floating-point rounding of two equal figures."""
    return abs(measured - predicted) <= 1e-9 * max(abs(measured), abs(predicted))


def _none() -> Explanation:
    return Explanation(0.0, (), (), 0.0, False, "")


def _section(breakdown: Mapping[str, Any] | None, key: str) -> Mapping[str, float] | None:
    section = (breakdown or {}).get(key)
    if not isinstance(section, Mapping) or not isinstance(section.get("parts"), Mapping):
        return None
    return section["parts"]


def _pick(contributions: Mapping[str, float], difference: float) -> list[str]:
    """The parts to name: largest first, whichever way they push, until the rest is within
    COVER of the difference and the next part is under NAME_SHARE of it; at most MAX_CAUSES.
    Every part left out is thus no larger than the smallest one named."""
    scale = abs(difference)
    ordered = sorted(
        (k for k, v in contributions.items() if v), key=lambda k: -abs(contributions[k])
    )
    chosen: list[str] = []
    named = 0.0
    for key in ordered:
        size = abs(contributions[key])
        if len(chosen) == MAX_CAUSES or (chosen and size < MIN_SHARE * scale):
            break
        if chosen and abs(difference - named) <= COVER * scale and size < NAME_SHARE * scale:
            break
        chosen.append(key)
        named += contributions[key]
    return chosen


def _sentence(clause: str) -> str:
    """A clause as a sentence of its own (a setting's name keeps its case)."""
    if clause.startswith("max_num_"):
        return clause + "."
    return clause[:1].upper() + clause[1:] + "."


def _assemble(
    difference: float,
    contributions: dict[str, float],
    words: Mapping[str, str],
    fmt: Any,
    counters: list[Counter],
    *,
    limit: Limit | None = None,
    limit_parts: tuple[str, ...] = (),
) -> Explanation:
    """Name the parts `_pick` chooses with their sizes, then what the others add up to, so that
    the sentence sums to the difference; the cap that held admission when a part in
    `limit_parts` is named; then the counters."""
    if difference == 0:
        return _none()
    chosen = _pick(contributions, difference)
    causes = tuple(
        Cause(key, contributions[key], f"{_signed(contributions[key], fmt)} {words[key]}")
        for key in chosen
    )
    rest = difference - sum(c.size for c in causes)
    pieces = [c.text for c in causes]
    if abs(rest) > SHOWN_REST * abs(difference):
        pieces.append(f"{_signed(rest, fmt)} in the other parts")
    text = "; ".join(pieces) + "."
    named_limit = limit if limit is not None and set(chosen) & set(limit_parts) else None
    if named_limit is not None:
        text += " " + _sentence(named_limit.text)
    if counters:
        text += " " + "; ".join(c.text for c in counters) + "."
    return Explanation(
        difference=difference,
        causes=causes,
        counters=tuple(counters),
        rest=rest,
        says_not_explained=any(c.key == "unexplained" for c in causes),
        text=text,
        limit=named_limit,
    )


def _uncalibrated(
    difference: float, fmt: Any, counters: list[Counter], why: str = UNCALIBRATED
) -> Explanation:
    """A real engine's device without a calibration (or a run priced from its probe): the
    difference, no parts."""
    if difference == 0:
        return _none()
    text = f"{_signed(difference, fmt)}: {why}."
    if counters:
        text += " " + "; ".join(c.text for c in counters) + "."
    return Explanation(difference, (), tuple(counters), difference, False, text)


def _part_words(
    name: str, measured: float, predicted: float, fmt: Any, expected: bool, per: str = ""
) -> str:
    label = PART_LABELS.get(name, name)
    if name == "unexplained":
        return label
    side = "engine model expects" if expected else "run"
    run = f"{side} {fmt(measured)}{per}"
    if predicted == 0 and name in FORMULA_HAS_NONE:
        return f"{label} ({run}; {FORMULA_HAS_NONE[name]})"
    return f"{label} ({run}, formula {fmt(predicted)}{FORMULA_NOTE.get(name, '')})"


# -- counters ----------------------------------------------------------------------------------


def hit_rate_cause(
    measured: float, predicted: float, summary: Mapping[str, Any], ev: Evidence
) -> str:
    """Why the prefix-cache hit rate is off the formula's, where the run shows it: recomputed
    prompts after preemptions find their own blocks cached (more hits), or the first requests
    found the cache cold (fewer, by exactly their share); "" otherwise."""
    preempted = _finite(summary.get("preemptions")) or 0.0
    if measured > predicted and preempted:
        return (
            f"{_count(preempted, 'preemption')}: a preempted sequence finds its own blocks still "
            "cached when it is recomputed, and the formula never preempts"
        )
    n = ev.num_prompts
    if measured >= predicted or preempted or not (n and predicted > 0 and ev.uniform_prompts):
        return ""
    cold = round(n * (1 - measured / predicted))
    if not 1 <= cold < n or abs(predicted * (n - cold) / n - measured) > 0.002:
        return ""
    first = "the first request" if cold == 1 else f"the first {cold:,} requests"
    return (
        f"{first} found the cache cold: the formula's {predicted * 100:.3g}% on the other "
        f"{n - cold:,} of {n:,} requests is {predicted * (n - cold) / n * 100:.3g}%"
    )


def _counters(
    summary: Mapping[str, Any],
    predicted: Mapping[str, Any],
    slower: bool,
    metric: str,
    ev: Evidence,
) -> list[Counter]:
    """Counters that push the metric the way it went (`slower`: the run took longer, or made
    fewer tokens per second, than predicted), each non-zero."""
    found: list[Counter] = []
    hits = _finite(summary.get("prefix_cache_hit_rate"))
    expected_hits = _finite(predicted.get("prefix_hit_rate")) or 0.0
    if hits and metric in ("ttft_s", "e2e_s", "output_tokens_per_s"):
        # More hits than the formula's warm cache is less to prefill.
        fewer = hits < expected_hits
        if hits != expected_hits and fewer == slower:
            why = hit_rate_cause(hits, expected_hits, summary, ev)
            found.append(
                Counter(
                    "prefix_cache_hit_rate",
                    hits,
                    1 if fewer else -1,
                    f"Prefix-cache hit rate {hits * 100:.3g}% (formula "
                    f"{expected_hits * 100:.3g}%{'; ' + why if why else ''})",
                )
            )
    preemptions = _finite(summary.get("preemptions"))
    if preemptions and slower and metric in ("tpot_s", "e2e_s", "output_tokens_per_s"):
        found.append(
            Counter(
                "preemptions",
                preemptions,
                1,
                f"{_count(preemptions, 'preemption')} (the formula never preempts)",
            )
        )
    return found


# -- the metrics -------------------------------------------------------------------------------


def explain_time(
    key: str,
    measured: float,
    predicted: float,
    summary: Mapping[str, Any],
    prediction: Mapping[str, Any],
    fmt: Any,
    ev: Evidence | None = None,
) -> Explanation:
    """A latency (`key` one of ttft_s, tpot_s, e2e_s; its mean): the difference split over the
    parts of the two breakdowns, the rest of it (a stored breakdown that does not add up to the
    mean) counted as not explained."""
    ev = ev or Evidence()
    if _negligible(measured, predicted):
        return _none()
    difference = measured - predicted
    breakdown = summary.get("breakdown")
    ran = _section(breakdown, key)
    formula = _section(prediction.get("breakdown"), key)
    slower = difference > 0
    counters = _counters(summary, prediction, slower, key, ev)
    if not ev.calibrated:
        return _uncalibrated(difference, fmt, counters, PROBE if ev.priced_from else UNCALIBRATED)
    if ran is None or formula is None:
        return _assemble(difference, {"unexplained": difference}, NO_PARTS, fmt, counters)
    expected = (breakdown or {}).get("source") == "expected"
    names = list(dict.fromkeys([*ran, *formula]))
    contributions = {n: (ran.get(n) or 0.0) - (formula.get(n) or 0.0) for n in names}
    residual = difference - sum(contributions.values())
    contributions["unexplained"] = contributions.get("unexplained", 0.0) + residual
    words = {
        n: _part_words(n, ran.get(n) or 0.0, formula.get(n) or 0.0, fmt, expected) for n in names
    }
    words["unexplained"] = PART_LABELS["unexplained"]
    one_step = _assemble(
        difference, contributions, words, fmt, counters, limit=ev.limit, limit_parts=("queueing",)
    )
    if not expected or all(abs(c.size) <= abs(difference) * (1 + 1e-9) for c in one_step.causes):
        return one_step
    return _two_steps(
        difference,
        measured,
        predicted,
        contributions,
        words,
        fmt,
        counters,
        ev,
    )


def _two_steps(
    difference: float,
    measured: float,
    predicted: float,
    contributions: dict[str, float],
    words: Mapping[str, str],
    fmt: Any,
    counters: list[Counter],
    ev: Evidence,
) -> Explanation:
    """A real engine's row where a part would be larger than the difference: the engine
    model's expectation against the formula, split over its parts by the simulator's rules (as
    a simulated run's row is), then the run against the engine model, which the model does not
    explain; each step with its own figures, so a part larger than the whole difference stands
    beside the step it belongs to."""
    residual = contributions.get("unexplained", 0.0)
    model = {k: v for k, v in contributions.items() if k != "unexplained"}
    model_gap = difference - residual
    expected = predicted + model_gap
    chosen = _pick(model, model_gap) if model_gap else []
    causes = [Cause(k, model[k], f"{_signed(model[k], fmt)} {words[k]}") for k in chosen]
    rest = model_gap - sum(c.size for c in causes)
    pieces = [c.text for c in causes]
    if model_gap and abs(rest) > SHOWN_REST * abs(model_gap):
        pieces.append(f"{_signed(rest, fmt)} in the other parts")
    first = (
        f"the engine model expected {fmt(expected)}, {_signed(model_gap, fmt)} against the "
        f"formula's {fmt(predicted)}" + (f" ({'; '.join(pieces)})" if pieces else "")
    )
    held_out = (
        f"; its held-out error on this device is {ev.held_out_error:.0%}"
        if ev.held_out_error is not None
        else ""
    )
    second = (
        f"the run measured {fmt(measured)}, {_signed(residual, fmt)} against the engine model "
        f"(not explained by it{held_out})"
    )
    text = f"{_signed(difference, fmt)}: {first}; {second}."
    named_limit = ev.limit if ev.limit is not None and "queueing" in chosen else None
    if named_limit is not None:
        text += " " + _sentence(named_limit.text)
    if counters:
        text += " " + "; ".join(c.text for c in counters) + "."
    causes.append(Cause("unexplained", residual, f"{_signed(residual, fmt)} not explained"))
    return Explanation(
        difference=difference,
        causes=tuple(causes),
        counters=tuple(counters),
        rest=rest,
        says_not_explained=bool(residual),
        text=text,
        limit=named_limit,
    )


def explain_throughput(
    measured: float,
    predicted: float,
    summary: Mapping[str, Any],
    prediction: Mapping[str, Any],
    output_tokens: float | None,
    fmt: Any,
    ev: Evidence | None = None,
) -> Explanation:
    """Output tokens/s. Measured, it is exactly L x n / S (Little's law): L the sequences in the
    engine on average (sum of each request's time after queueing over the run's duration), n
    the mean output tokens, S the mean time a request spends in the engine. The formula's is
    batch x n / (n x TPOT): a steady batch of pure decodes. The log of the ratio splits into
    L / batch, n / n and the parts of S against those of n x TPOT; each share is then scaled to
    tok/s. Where the running series shows ramp-up and drain, L / batch splits once more: the
    plateau against the batch, and L against the plateau (what the two ends lost)."""
    ev = ev or Evidence()
    if _negligible(measured, predicted):
        return _none()
    difference = measured - predicted
    slower = difference < 0
    counters = _counters(summary, prediction, slower, "output_tokens_per_s", ev)
    if not ev.calibrated:
        return _uncalibrated(difference, fmt, counters, PROBE if ev.priced_from else UNCALIBRATED)
    ran = _section(summary.get("breakdown"), "e2e_s")
    formula = _section(prediction.get("breakdown"), "tpot_s")
    batch = _finite((prediction.get("breakdown") or {}).get("batch"))
    completed = _finite(summary.get("completed"))
    duration = _finite(summary.get("duration_s"))
    n_formula = _finite(output_tokens)
    if not (ran and formula and batch and completed and duration and n_formula) or measured <= 0:
        return _assemble(difference, {"unexplained": difference}, NO_PARTS, fmt, counters)
    expected = (summary.get("breakdown") or {}).get("source") == "expected"
    in_engine = {k: v for k, v in ran.items() if k != "queueing"}
    per_request = sum(in_engine.values())
    n_run = measured * duration / completed
    occupancy = completed * per_request / duration
    formula_time = {k: v * n_formula for k, v in formula.items() if k != "queueing"}
    per_request_formula = sum(formula_time.values())
    own = expected and ev.running_mean is not None and ev.running_mean > 0
    if own:
        # A real engine: the sequences it ran, from its own gauge, and the time each spent in
        # it that Little's law then gives (L x n / tokens per second); the engine model's
        # expected parts are its guesses, not what this run had.
        occupancy = float(ev.running_mean or 0.0)
        per_request = occupancy * n_run / measured
        in_engine = {ENGINE_TIME: per_request}
        formula_time = {ENGINE_TIME: per_request_formula}
    if per_request <= 0 or per_request_formula <= 0 or occupancy <= 0:
        return _assemble(difference, {"unexplained": difference}, NO_PARTS, fmt, counters)
    reason = f" ({ev.formula_batch})" if ev.formula_batch else ""
    ramped = ev.ramp if ev.ramp is not None and ev.ramp.shown else None
    words = {
        OUTPUT_LENGTH: f"output tokens per request: {n_run:,.0f}, formula {n_formula:,.0f}",
        "unexplained": PART_LABELS["unexplained"],
    }
    logs = {OUTPUT_LENGTH: math.log(n_run / n_formula)}
    gauge = " (the engine's own running gauge, polled)" if own else ""
    plain_occupancy = (
        f"sequences in the engine on average{gauge}: {occupancy:,.1f}, formula a steady "
        f"{batch:,.0f}{reason}"
    )
    if ramped is not None:
        plateau = occupancy + ramped.lost
        logs[OCCUPANCY] = math.log(plateau / batch)
        logs[RAMP] = math.log(occupancy / plateau)
        words[OCCUPANCY] = (
            f"sequences in the engine on average past ramp-up and drain: {plateau:,.1f}, "
            f"formula a steady {batch:,.0f}{reason}"
        )
        words[RAMP] = ramped.words()
    else:
        logs[OCCUPANCY] = math.log(occupancy / batch)
        words[OCCUPANCY] = plain_occupancy
    time_log = math.log(per_request / per_request_formula)
    gap = per_request - per_request_formula
    names = list(dict.fromkeys([*in_engine, *formula_time]))
    for name in names:
        delta = in_engine.get(name, 0.0) - formula_time.get(name, 0.0)
        logs[name] = -time_log * (delta / gap) if gap else 0.0
    total_log = math.log(measured / predicted)
    scale = difference / total_log if total_log else 0.0
    contributions = {k: v * scale for k, v in logs.items()}
    # Rounding and a breakdown that does not add up: not explained.
    contributions["unexplained"] = contributions.get("unexplained", 0.0) + (
        difference - sum(contributions.values())
    )
    if RAMP in contributions and RAMP not in _pick(contributions, difference):
        # A ramp too small to name stays inside occupancy (the logs add up either way).
        contributions[OCCUPANCY] += contributions.pop(RAMP)
        words[OCCUPANCY] = plain_occupancy
    for name in names:
        if name == ENGINE_TIME:
            words[name] = (
                f"time in the engine per request: {_seconds(per_request)} (the run's, by "
                f"Little's law), formula {_seconds(per_request_formula)}"
            )
            continue
        words[name] = _part_words(
            name,
            in_engine.get(name, 0.0),
            formula_time.get(name, 0.0),
            _seconds,
            expected,
            per=" per request",
        )
    return _assemble(
        difference, contributions, words, fmt, counters, limit=ev.limit, limit_parts=(OCCUPANCY,)
    )


def explain_counter(
    key: str,
    measured: float,
    predicted: float,
    summary: Mapping[str, Any],
    fmt: Any,
    ev: Evidence | None = None,
) -> Explanation:
    """A count or rate the breakdown has no parts for. The running peak is explained by the cap
    that held admission (and what sets the formulas' batch), the prefix-cache hit rate by
    preemptions or a cold first request where the run shows them; otherwise the size is not
    explained by the model."""
    ev = ev or Evidence()
    if _negligible(measured, predicted):
        return _none()
    difference = measured - predicted
    why = ""
    if key == "max_running_seqs" and ev.limit is not None:
        why = _running_reason(measured, predicted, summary, ev)
    elif key == "prefix_cache_hit_rate":
        why = hit_rate_cause(measured, predicted, summary, ev)
    if why:
        text = f"{_signed(difference, fmt)}: {why}" + ("" if why.endswith(".") else ".")
        limit = ev.limit if key == "max_running_seqs" else None
        cause = Cause(LIMIT if limit else key, difference, text)
        return Explanation(difference, (cause,), (), 0.0, False, text, limit)
    counters: list[Counter] = []
    usage = _finite(summary.get("kv_usage_peak")) or 0.0
    preemptions = _finite(summary.get("preemptions")) or 0.0
    requests = (_finite(summary.get("completed")) or 0) + (_finite(summary.get("failed")) or 0)
    if key == "max_running_seqs" and difference < 0 and 0 < requests < predicted:
        counters.append(
            Counter(
                "requests",
                requests,
                -1,
                f"The run had only {_count(requests, 'request')}; the formula's batch is "
                f"{predicted:,.0f}",
            )
        )
    if key == "max_running_seqs" and difference < 0 and usage >= 0.95 and preemptions:
        counters.append(
            Counter(
                "kv_pool_full",
                preemptions,
                -1,
                f"The KV pool filled (peak usage {usage * 100:.0f}%, "
                f"{_count(preemptions, 'preemption')})",
            )
        )
    return _assemble(difference, {"unexplained": difference}, NO_PARTS, fmt, counters)


def _running_reason(
    measured: float, predicted: float, summary: Mapping[str, Any], ev: Evidence
) -> str:
    """The running peak against the formulas' batch: the cap that held admission, then what
    sets the formulas' batch."""
    assert ev.limit is not None
    text = ev.limit.text + "."
    if ev.formula_batch:
        text += f" The formula's {predicted:,.0f} is {ev.formula_batch}"
        preempted = _finite(summary.get("preemptions")) or 0.0
        if measured > predicted and ev.formula_batch.startswith("the sequences that fit"):
            text += (
                "; a sequence is admitted with only its prompt's blocks, so more ran while they "
                "were short"
            )
            if preempted:
                text += f", and {_count(preempted, 'preemption')} followed as they grew"
        text += "."
    return text


def _count(value: float, noun: str) -> str:
    return f"{value:,.0f} {noun}" + ("" if value == 1 else "s")


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s"
