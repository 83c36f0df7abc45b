"""Why measured and predicted differ, derived from the run's own evidence.

Both sides of a run's table have the same parts: the measured breakdown (labs/sim/breakdown.py,
step by step on the simulator, or the engine model's expected parts plus "unexplained" for a
vLLM run) and the predicted one (labs.predict.predicted_breakdown, under the formulas'
assumptions). A metric's difference is split over those parts; the explanation names the
parts that moved it most in the direction it went, each with its size, until they cover at
least half of it, and says "not explained by the model" for the rest when they do not. Counters
(prefix-cache hit rate, preemptions, KV usage, time spent ramping up or draining) are cited only
when they are non-zero and push the way the difference went.

Pure functions over the stored JSON (`LabRun.result`, `LabRun.predicted`); no Django.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from labs.sim.breakdown import PART_LABELS as BREAKDOWN_LABELS

# A part is named when it moves the difference by at least this share of it.
MIN_SHARE = 0.05
# At most this many parts per explanation.
MAX_CAUSES = 3

PART_LABELS = {**BREAKDOWN_LABELS, "unexplained": "not explained by the engine model"}
NO_PARTS = {"unexplained": "not explained by the model"}
# What the formulas assume about a part they never have.
FORMULA_HAS_NONE = {
    "communication": "the formula has no all-reduce",
    "prefill_interference": "the formula prices pure decode steps",
    "preemption": "the formula never preempts",
}
FORMULA_NOTE = {
    "queueing": ", for a slot and behind the prompts admitted with it",
}
# Throughput is in flight x tokens / time: these two causes are not parts of a time.
OCCUPANCY, OUTPUT_LENGTH = "occupancy", "output_length"


@dataclass(frozen=True)
class Cause:
    """One named part: `key` (a breakdown part, or OCCUPANCY / OUTPUT_LENGTH for throughput),
    `size` (its share of measured - predicted, in the metric's unit) and the words."""

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
    unexplained: float  # the part of the difference the named causes leave, when said
    says_not_explained: bool
    text: str


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _signed(value: float, fmt: Any) -> str:
    text = fmt(abs(value))
    return f"+{text}" if value >= 0 else f"−{text}"


def _section(breakdown: Mapping[str, Any] | None, key: str) -> Mapping[str, float] | None:
    section = (breakdown or {}).get(key)
    if not isinstance(section, Mapping) or not isinstance(section.get("parts"), Mapping):
        return None
    return section["parts"]


def _pick(contributions: dict[str, float], difference: float) -> list[str]:
    """The parts to name: those pushing the way `difference` went, largest first, until they
    cover half of it (then any other that moves it by a fifth or more), at most MAX_CAUSES."""
    sign = 1.0 if difference > 0 else -1.0
    same = sorted(
        (
            k
            for k, v in contributions.items()
            if v * sign > 0 and abs(v) >= MIN_SHARE * abs(difference)
        ),
        key=lambda k: -abs(contributions[k]),
    )
    chosen: list[str] = []
    covered = 0.0
    for key in same[:MAX_CAUSES]:
        if covered >= 0.5 * abs(difference) and abs(contributions[key]) < 0.2 * abs(difference):
            break
        chosen.append(key)
        # What the model does not explain covers nothing: go on naming the parts it has.
        covered += abs(contributions[key]) if key != "unexplained" else 0.0
    return chosen


def _assemble(
    difference: float,
    contributions: dict[str, float],
    words: Mapping[str, str],
    fmt: Any,
    counters: list[Counter],
) -> Explanation:
    """Name the parts `_pick` chooses, say what is left when they cover less than half, and
    append the counters."""
    if difference == 0:
        return Explanation(0.0, (), (), 0.0, False, "")
    chosen = _pick(contributions, difference)
    causes = tuple(
        Cause(key, contributions[key], f"{_signed(contributions[key], fmt)} {words[key]}")
        for key in chosen
    )
    explained = sum(c.size for c in causes if c.key != "unexplained")
    rest = difference - explained
    names_unexplained = any(c.key == "unexplained" for c in causes)
    short = abs(explained) < 0.5 * abs(difference) and not names_unexplained
    pieces = [c.text for c in causes]
    if short:
        pieces.append(f"{_signed(rest, fmt)} not explained by the model")
    text = "; ".join(pieces) if pieces else f"{_signed(difference, fmt)} not explained by the model"
    if counters:
        text += ". " + "; ".join(c.text for c in counters)
    return Explanation(
        difference=difference,
        causes=causes,
        counters=tuple(counters),
        unexplained=rest if (short or not causes) else 0.0,
        says_not_explained=short or not causes or names_unexplained,
        text=text + ".",
    )


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


def _counters(
    summary: Mapping[str, Any], predicted: Mapping[str, Any], slower: bool, metric: str
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
            found.append(
                Counter(
                    "prefix_cache_hit_rate",
                    hits,
                    1 if fewer else -1,
                    f"Prefix-cache hit rate {hits * 100:.0f}% (formula {expected_hits * 100:.0f}%)",
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


def ramp_fraction(summary: Mapping[str, Any]) -> float:
    """The share of the run's duration with fewer sequences running than at its peak (ramp-up
    at the start, drain at the end, or a queue that ran dry), from the engine samples."""
    engine = (summary.get("series") or {}).get("engine") or {}
    times, running = engine.get("t_s") or [], engine.get("running") or []
    duration = _finite(summary.get("duration_s"))
    if len(times) < 2 or len(times) != len(running) or not duration:
        return 0.0
    peak = max(running)
    below = 0.0
    for i in range(len(times) - 1):
        if running[i] < peak:
            below += times[i + 1] - times[i]
    return min(1.0, max(0.0, below / duration))


# -- the metrics -------------------------------------------------------------------------------


def explain_time(
    key: str,
    measured: float,
    predicted: float,
    summary: Mapping[str, Any],
    prediction: Mapping[str, Any],
    fmt: Any,
) -> Explanation:
    """A latency (`key` one of ttft_s, tpot_s, e2e_s; its mean): the difference split over the
    parts of the two breakdowns, the rest of it (a stored breakdown that does not add up to the
    mean) counted as not explained."""
    difference = measured - predicted
    breakdown = summary.get("breakdown")
    ran = _section(breakdown, key)
    formula = _section(prediction.get("breakdown"), key)
    slower = difference > 0
    counters = _counters(summary, prediction, slower, key)
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
    return _assemble(difference, contributions, words, fmt, counters)


def explain_throughput(
    measured: float,
    predicted: float,
    summary: Mapping[str, Any],
    prediction: Mapping[str, Any],
    output_tokens: float | None,
    fmt: Any,
) -> Explanation:
    """Output tokens/s. Measured, it is exactly L x n / S (Little's law): L the sequences in the
    engine on average (sum of each request's time after queueing over the run's duration), n
    the mean output tokens, S the mean time a request spends in the engine. The formula's is
    batch x n / (n x TPOT): a steady batch of pure decodes. The log of the ratio splits into
    L / batch, n / n and the parts of S against those of n x TPOT; each share is then scaled to
    tok/s."""
    difference = measured - predicted
    slower = difference < 0
    counters = _counters(summary, prediction, slower, "output_tokens_per_s")
    ran = _section(summary.get("breakdown"), "e2e_s")
    formula = _section(prediction.get("breakdown"), "tpot_s")
    batch = _finite((prediction.get("breakdown") or {}).get("batch"))
    completed = _finite(summary.get("completed"))
    duration = _finite(summary.get("duration_s"))
    n_formula = _finite(output_tokens)
    if not (ran and formula and batch and completed and duration and n_formula) or measured <= 0:
        return _assemble(difference, {"unexplained": difference}, NO_PARTS, fmt, counters)
    in_engine = {k: v for k, v in ran.items() if k != "queueing"}
    per_request = sum(in_engine.values())
    n_run = measured * duration / completed
    occupancy = completed * per_request / duration
    formula_time = {k: v * n_formula for k, v in formula.items() if k != "queueing"}
    per_request_formula = sum(formula_time.values())
    if per_request <= 0 or per_request_formula <= 0 or occupancy <= 0:
        return _assemble(difference, {"unexplained": difference}, NO_PARTS, fmt, counters)
    logs = {
        OCCUPANCY: math.log(occupancy / batch),
        OUTPUT_LENGTH: math.log(n_run / n_formula),
    }
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
    expected = (summary.get("breakdown") or {}).get("source") == "expected"
    ramp = ramp_fraction(summary)
    ramp_note = (
        f", fewer than at the peak for {ramp * 100:.0f}% of the run (ramp-up and drain)"
        if ramp > 0 and occupancy < batch
        else ""
    )
    words = {
        OCCUPANCY: (
            f"sequences in the engine on average: {occupancy:,.1f}, formula a steady "
            f"{batch:,.0f}{ramp_note}"
        ),
        OUTPUT_LENGTH: f"output tokens per request: {n_run:,.0f}, formula {n_formula:,.0f}",
        "unexplained": PART_LABELS["unexplained"],
    }
    for name in names:
        words[name] = _part_words(
            name,
            in_engine.get(name, 0.0),
            formula_time.get(name, 0.0),
            _seconds,
            expected,
            per=" per request",
        )
    return _assemble(difference, contributions, words, fmt, counters)


def explain_counter(
    key: str, measured: float, predicted: float, summary: Mapping[str, Any], fmt: Any
) -> Explanation:
    """A count or rate the breakdown has no parts for: the size is not explained by the model;
    a full KV pool with preemptions is cited where fewer sequences ran than predicted."""
    difference = measured - predicted
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


def _count(value: float, noun: str) -> str:
    return f"{value:,.0f} {noun}" + ("" if value == 1 else "s")


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s"
