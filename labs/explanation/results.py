"""Measured next to predicted: the rows of a finished run's table, their formatting, the percent
difference and a one-line reading of why they differ. Pure functions over the stored JSON
(`LabRun.result`, `LabRun.predicted`, `LabRun.params`); no database access.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from labs.explanation import explain
from labs.explanation.explain import Evidence, Explanation
from labs.parameters.params import stored_param

# Within this fraction, measured and predicted "agree"; a rate within this many points.
AGREE = 0.15
AGREE_POINTS = 5.0

Summary = Mapping[str, Any]


def dig(data: Mapping[str, Any] | None, path: str | None) -> Any:
    """`dig(summary, "ttft_s.p50")`: a dotted path into nested dicts, or None."""
    if data is None or not path:
        return None
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# Count units in the singular, for exactly one.
_SINGULAR = {
    "seqs": "seq",
    "sequences": "sequence",
    "tokens": "token",
    "blocks": "block",
    "slots": "slot",
    "requests": "request",
    "replicas": "replica",
    "GPUs": "GPU",
}


def format_value(value: Any, unit: str) -> str:
    """A number as a learner reads it: 8.31 ms, 5,719 tok/s, 75%, 128 KiB."""
    number = _finite(value)
    if number is None:
        return "—" if value is None else str(value)
    if unit == "s":
        if abs(number) < 1:
            return f"{number * 1000:.3g} ms"
        return f"{number:.3g} s"
    if unit == "ratio":
        return f"{number * 100:.3g}%"
    if unit == "x":
        return f"{number:.3g}×"
    if unit == "bytes":
        for scale, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(number) >= scale:
                return f"{number / scale:.3g} {name}"
        return f"{number:,.0f} B"
    if number == 1:
        unit = _SINGULAR.get(unit, unit)  # "1 seq", not "1 seqs"
    suffix = f" {unit}" if unit else ""
    if number.is_integer() or abs(number) >= 100:
        return f"{number:,.0f}{suffix}"
    return f"{number:.3g}{suffix}"


# What the predictor's keys mean, for the live prediction panel.
PREDICTED_LABELS: dict[str, tuple[str, str]] = {
    "kv_bytes_per_token": ("KV bytes per token", "bytes"),
    "kv_bytes_per_seq": ("KV bytes per sequence", "bytes"),
    "blocks_per_seq": ("Blocks per sequence", "blocks"),
    "prompt_blocks": ("Blocks for the prompt", "blocks"),
    "slots_wasted_per_seq": ("Slots wasted per sequence (paged)", "slots"),
    "contiguous_reserved_slots": ("Slots reserved per sequence (contiguous)", "slots"),
    "contiguous_wasted_slots": ("Slots wasted per sequence (contiguous)", "slots"),
    "contiguous_waste_fraction": ("Share of a contiguous reservation wasted", "ratio"),
    "weight_bytes": ("Weights per replica", "bytes"),
    "kv_memory_bytes": ("KV pool per replica", "bytes"),
    "kv_capacity_tokens": ("KV capacity", "tokens"),
    "max_concurrent_seqs": ("Sequences that fit (paged)", "seqs"),
    "contiguous_max_concurrent_seqs": ("Sequences that fit (contiguous)", "seqs"),
    "running_seqs": ("Sequences running at once", "seqs"),
    "replicas_needed": ("Replicas needed", ""),
    "gpus_needed": ("GPUs needed", ""),
    "prefix_cached_tokens": ("Prompt tokens served from the prefix cache", "tokens"),
    "prefill_s": ("Prefill of one prompt", "s"),
    "ttft_s": ("Time to first token, one request on an idle engine", "s"),
    "weight_read_s": ("Weight read per step", "s"),
    "kv_read_s": ("KV read per step", "s"),
    "decode_step_s": ("Decode step", "s"),
    "tpot_s": ("Time per output token", "s"),
    "e2e_s": ("End-to-end latency, one request on an idle engine", "s"),
    "output_tokens_per_s": ("Output tokens per second", "tok/s"),
    "batch_speedup_vs_batch1": ("Throughput vs batch 1", "x"),
    "spec_tokens_per_step": ("Tokens per target pass", "tokens"),
    "spec_speedup": ("Speculative speedup at batch 1", "x"),
    "spec_speedup_at_batch": ("Speculative speedup at this batch", "x"),
    "bound": ("Decode is bound by", ""),
    "fits": ("Fits in memory", ""),
    "capacity_requests_per_s": ("Requests per second the engine finishes", "req/s"),
    "queue_wait_s": ("Wait for a slot under this load (mean)", "s"),
    "loaded_ttft_s": ("Time to first token under this load (mean)", "s"),
    "loaded_ttft_p50_s": ("Time to first token under this load (median)", "s"),
    "loaded_e2e_s": ("End-to-end latency under this load (mean)", "s"),
}


def load_label(params: Mapping[str, Any]) -> str:
    """The load a prediction assumes, as the lab page, the run page and the CLI say it:
    'under this load: concurrency 64, max_num_seqs 8, 128 prompts of 512 + 128 tokens'."""
    rate = _finite(params.get("request_rate"))
    in_flight = params.get("max_concurrency") or params.get("concurrency")
    arrivals = (
        f"Poisson arrivals at {format_value(rate, 'req/s')}"
        if rate is not None
        else f"concurrency {in_flight}"
    )
    prompts = _finite(stored_param(params, "num_prompts")) or 0
    return (
        f"under this load: {arrivals}, max_num_seqs {params.get('max_num_seqs')}, "
        f"{prompts:,.0f} prompts of {params.get('prompt_tokens')} + "
        f"{params.get('output_tokens')} tokens"
    )


def not_covered(label: str) -> str:
    """What a page prints instead of a figure the formulas do not cover for these settings."""
    acronym = label[:2].isupper()  # "TTFT, mean" stays as it is
    return f"the formulas do not cover {label if acronym else label[0].lower() + label[1:]} here"


def predicted_items(predicted: Mapping[str, Any], keys: tuple[str, ...]) -> list[dict[str, str]]:
    """The lab page's predicted figures; one the formulas do not cover for these settings
    (`Prediction.uncovered`) is said so in words, with why (`note`), never as a number."""
    uncovered = predicted.get("uncovered") or {}
    items = []
    for key in keys:
        label, unit = PREDICTED_LABELS.get(key, (key, ""))
        value = predicted.get(key)
        if key in uncovered:
            items.append(
                {"key": key, "label": label, "value": not_covered(label), "note": uncovered[key]}
            )
            continue
        text = value.replace("-", " ") if isinstance(value, str) else format_value(value, unit)
        items.append({"key": key, "label": label, "value": text})
    return items


@dataclass(frozen=True)
class Metric:
    label: str
    measured: str
    predicted: str | None
    unit: str
    # How "why they differ" is derived (labs/explanation/explain.py): "time" (a mean split over the
    # breakdowns' parts), "throughput", "counter" (no parts), or None (nothing predicted).
    derive: str | None = None


METRICS: tuple[Metric, ...] = (
    Metric("TTFT, mean", "ttft_s.mean", "loaded_ttft_s", "s", "time"),
    Metric("TTFT, median", "ttft_s.p50", "loaded_ttft_p50_s", "s"),
    Metric("TTFT, p99", "ttft_s.p99", None, "s"),
    Metric("TPOT, mean", "tpot_s.mean", "tpot_s", "s", "time"),
    Metric("TPOT, median", "tpot_s.p50", None, "s"),
    Metric("ITL, p99", "itl_s.p99", None, "s"),
    Metric("E2E latency, mean", "e2e_s.mean", "loaded_e2e_s", "s", "time"),
    Metric("Output tokens/s", "output_tokens_per_s", "output_tokens_per_s", "tok/s", "throughput"),
    Metric("Requests/s", "requests_per_s", None, "req/s"),
    Metric("Running sequences, peak", "max_running_seqs", "running_seqs", "", "counter"),
    Metric("KV usage, peak", "kv_usage_peak", None, "ratio"),
    Metric("Preemptions", "preemptions", None, ""),
    Metric("Prefix-cache hit rate", "prefix_cache_hit_rate", "prefix_hit_rate", "ratio", "counter"),
    Metric(
        "Draft tokens accepted", "spec_acceptance_rate", "draft_acceptance_rate", "ratio", "counter"
    ),
)


def derived_predictions(predicted: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Predicted values the table compares that the predictor does not name directly (runs stored
    since labs.prediction.predict.lab_prediction have them; older rows get them here). Nothing when
    the run stored why it has no prediction (a server that served a model outside the catalog)."""
    if "no_prediction" in predicted:
        return {}
    extra: dict[str, Any] = dict(predicted)
    if "breakdown" not in extra:
        extra["breakdown"] = _predicted_breakdown(params)
    # Runs stored before the load-aware predictions compare with the idle numbers.
    extra.setdefault("loaded_ttft_p50_s", predicted.get("ttft_s"))
    extra.setdefault("loaded_e2e_s", predicted.get("e2e_s"))
    prompt = _finite(params.get("prompt_tokens"))
    cached = _finite(predicted.get("prefix_cached_tokens"))
    if params.get("prefix_caching") and prompt and cached is not None:
        extra["prefix_hit_rate"] = cached / prompt
    k = _finite(stored_param(params, "spec_tokens")) or 0
    per_step = _finite(predicted.get("spec_tokens_per_step"))
    if k > 0 and per_step is not None:
        # Accepted drafts per step are (tokens per step - 1); vLLM's rate divides by k drafted.
        # A rate stored with the prediction (a CPU worker's measured ngram drafting) stands.
        extra.setdefault("draft_acceptance_rate", (per_step - 1) / k)
    return extra


def _predicted_breakdown(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The predicted parts of a run stored before they were (by today's formulas; a figure the
    formulas have changed since shows as "not explained")."""
    from labs.parameters.params import ParamError, parse_lab_params
    from labs.prediction.predict import predicted_breakdown

    try:
        return predicted_breakdown(parse_lab_params(params, ignore_unknown=True))
    except (ParamError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Row:
    label: str
    measured: str
    predicted: str
    diff: str  # "+12%", "−40%", "" when there is nothing to compare
    diff_class: str  # "agree" | "off" | ""
    reading: str
    ratio: float | None
    explanation: Explanation | None = None
    # The difference as `diff` shows it: percent, or points for a rate; None: from `ratio`.
    shown: float | None = None
    evidence: Evidence | None = None  # the run's, the same for every row

    @property
    def shown_percent(self) -> float | None:
        """The difference as the page shows it, in percent or, for a rate, in points (what
        "differs most" ranks by)."""
        if self.shown is not None:
            return self.shown
        return None if self.ratio is None else (self.ratio - 1) * 100


def change(before: Any, after: Any) -> float | None:
    """after / before, the change between two runs or two points of a sweep (the batching
    gain of a throughput, the speedup of a TPOT, the ratio of two TTFTs); None when either is
    missing, not a number, or before is 0."""
    a, b = _finite(before), _finite(after)
    if a is None or b is None or a == 0:
        return None
    return b / a


def format_change(ratio: float | None) -> str:
    """'×3.1' (3.1 times), '×0.52'; '' when there is no change to show."""
    return "" if ratio is None else f"×{ratio:.3g}"


def percent_diff(measured: float | None, predicted: float | None) -> tuple[str, float | None]:
    if measured is None or predicted is None or predicted == 0:
        return "", None
    ratio = measured / predicted
    pct = (ratio - 1) * 100
    sign = "+" if pct >= 0 else "−"
    return f"{sign}{abs(pct):,.0f}%", ratio


def points(value: float) -> str:
    """A difference of two rates in percentage points: '1.6 pt'."""
    return f"{abs(value) * 100:.3g} pt"


def _shown_diff(
    measured: float, predicted: float | None, unit: str
) -> tuple[str, float | None, float | None]:
    """(Diff column, the number it shows, measured / predicted). A rate's difference is in
    points, as its "why they differ" says it; anything else's in percent."""
    diff, ratio = percent_diff(measured, predicted)
    if unit != "ratio" or predicted is None:
        return diff, None if ratio is None else (ratio - 1) * 100, ratio
    delta = measured - predicted
    return f"{'+' if delta >= 0 else '−'}{points(delta)}", delta * 100, ratio


def compare(
    summary: Summary | None, predicted: Mapping[str, Any], params: Mapping[str, Any]
) -> list[Row]:
    """The measured-vs-predicted rows for a finished run (rows with nothing measured are left
    out, so a run without speculation has no acceptance row)."""
    if not summary:
        return []
    expected = derived_predictions(predicted, params)
    evidence = explain.evidence(summary, expected, params)
    uncovered = expected.get("uncovered") or {}
    rows = []
    for m in METRICS:
        measured = _finite(dig(summary, m.measured))
        if measured is None:
            if m.measured == "preemptions" and m.measured in summary:
                rows.append(_not_reported(m.label))
            elif m.measured in GAUGE_PEAKS and summary.get("gauges_unobserved"):
                rows.append(_not_observed(m.label))
            continue
        if m.predicted in uncovered:
            # No figure, so no difference and no "why they differ" built on one.
            reading = f"{not_covered(m.label).capitalize()}: {uncovered[m.predicted]}."
            rows.append(
                Row(
                    label=m.label,
                    measured=format_value(measured, m.unit),
                    predicted="not covered",
                    diff="",
                    diff_class="",
                    reading=reading,
                    ratio=None,
                    evidence=evidence,
                )
            )
            continue
        want = _finite(expected.get(m.predicted)) if m.predicted else None
        diff, shown, ratio = _shown_diff(measured, want, m.unit)
        explanation = None
        if m.derive and want is not None:
            explanation = _explain(m, measured, want, summary, expected, params, evidence)
        if m.unit == "ratio" and shown is not None:
            agree = abs(shown) <= AGREE_POINTS
        else:
            agree = ratio is not None and abs(ratio - 1) <= AGREE
        rows.append(
            Row(
                label=m.label,
                measured=format_value(measured, m.unit),
                predicted=format_value(want, m.unit) if m.predicted else "",
                diff=diff,
                diff_class="" if shown is None else ("agree" if agree else "off"),
                reading=explanation.text if explanation else "",
                ratio=ratio,
                explanation=explanation,
                shown=shown,
                evidence=evidence,
            )
        )
    return rows


def _explain(
    m: Metric,
    measured: float,
    predicted: float,
    summary: Summary,
    prediction: Mapping[str, Any],
    params: Mapping[str, Any],
    evidence: Evidence,
) -> Explanation:
    def fmt(value: float) -> str:
        return format_value(value, m.unit)

    if m.derive == "time":
        key = m.measured.split(".", 1)[0]
        return explain.explain_time(key, measured, predicted, summary, prediction, fmt, evidence)
    if m.derive == "throughput":
        n = _finite(params.get("output_tokens"))
        return explain.explain_throughput(
            measured, predicted, summary, prediction, n, fmt, evidence
        )
    # A rate's difference in points, as the Diff column shows it.
    unit_fmt = points if m.unit == "ratio" else fmt
    return explain.explain_counter(m.measured, measured, predicted, summary, unit_fmt, evidence)


# Peaks read from the server's polled gauges (labs.measurement.metrics: gauges_unobserved).
GAUGE_PEAKS = ("max_running_seqs", "kv_usage_peak")


def _unmeasured(label: str, shown: str, reading: str) -> Row:
    """A row with no number: said why, never shown as 0."""
    return Row(
        label=label,
        measured=shown,
        predicted="",
        diff="",
        diff_class="",
        reading=reading,
        ratio=None,
    )


def _not_observed(label: str) -> Row:
    """A gauge no /metrics poll caught with a request running."""
    return _unmeasured(
        label,
        "not observed",
        "No /metrics poll fell while requests were running, so this peak was not seen.",
    )


def _not_reported(label: str) -> Row:
    """A counter the server did not report (no vLLM /metrics)."""
    return _unmeasured(
        label, "not reported", "The server's /metrics page did not include this counter."
    )


def headline(rows: list[Row], breakdown: Mapping[str, Any] | None = None) -> str:
    """One line: on a device the engine model is not calibrated on, that first; the row whose
    shown difference is largest and why (or that all agree), then where the time went when the
    run has a breakdown."""
    compared = [r for r in rows if r.shown_percent is not None]
    evidence = next((r.evidence for r in rows if r.evidence is not None), None)
    worst = max(compared, key=lambda r: abs(r.shown_percent or 0.0)) if compared else None
    # The cap that held admission is said once: by the row, or else by the breakdown.
    said = worst is not None and worst.explanation is not None and worst.explanation.limit
    where = breakdown_sentence(breakdown, None if said else evidence)
    uncalibrated = evidence is not None and not evidence.calibrated
    note = ""
    if uncalibrated:
        note = PROBE_NOTE if evidence is not None and evidence.priced_from else UNCALIBRATED_NOTE
    uncovered = [r for r in rows if r.predicted == "not covered"]
    if worst is None:
        line = ""
    elif worst.diff_class == "agree" and uncovered:
        # "The run behaved like the formulas" would claim the figures they do not cover too.
        line = (
            "The figures the formulas cover agree within 15% "
            f"(largest difference: {worst.label}, {worst.diff})."
        )
    elif worst.diff_class == "agree":
        line = (
            "Measured and predicted agree within 15%: the run behaved like the formulas "
            f"(largest difference: {worst.label}, {worst.diff})."
        )
    elif uncalibrated and worst.explanation is not None and not worst.explanation.causes:
        line = f"{worst.label} differs most ({worst.diff})."  # the note says why no part
    else:
        line = f"{worst.label} differs most ({worst.diff}): {worst.reading}"
    if uncovered:
        names = ", ".join(r.label for r in uncovered)
        why = uncovered[0].reading.split(": ", 1)[-1]
        line = " ".join(p for p in (line, f"The formulas do not cover {names} here: {why}") if p)
    return " ".join(p for p in (note, line, where) if p)


# -- where the time went -----------------------------------------------------------------------

# Why each part of a breakdown exists, for the sentence naming the largest.
PART_WHY: dict[str, str] = {
    "ideal": "the roofline work itself (weights and KV read at peak bandwidth, FLOPs at peak)",
    "efficiency": "kernels running below the device's peak bandwidth and FLOP/s",
    "overhead": "fixed per-step costs (scheduling, launches, sampling) and per-sequence work",
    "frontend": "the API server's work on each request (HTTP, tokenization, the hand-over to "
    "the engine), longer with every other stream it relays",
    "communication": "all-reduces between the tensor-parallel GPUs",
    "queueing": "waiting to be admitted while others ran",
    "prefill_interference": "decode steps that also carried other requests' prompts",
    "preemption": "recomputing sequences the KV pool evicted",
    "speculation": "drafting and verifying speculative tokens",
    "unexplained": "what the engine model does not account for on this hardware",
}


def breakdown_bars(
    breakdown: Mapping[str, Any] | None, predicted: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The stacked bars of a run page: for mean E2E, TTFT and TPOT, each non-zero part with its
    seconds and share of the total (a negative "unexplained" is listed, not drawn), and beside it
    the formulas' value of the same part (`predicted`:
    labs.prediction.predict.predicted_breakdown), so that "why they differ" can be checked against
    both."""
    from labs.sim.breakdown import PART_LABELS

    bars = []
    for key, label in (
        ("e2e_s", "Mean end-to-end latency"),
        ("ttft_s", "Mean time to first token"),
        ("tpot_s", "Mean time per output token"),
    ):
        section = (breakdown or {}).get(key)
        total = _finite((section or {}).get("total"))
        if not section or not total:
            continue
        formula = ((predicted or {}).get(key) or {}).get("parts") or {}
        drawn = sum(max(0.0, _finite(v) or 0.0) for v in section["parts"].values()) or 1.0
        # Expected parts above the measured total (a negative "unexplained"): shares are of
        # what the engine model expected, so none passes 100%.
        whole = max(total, drawn)
        parts = []
        for name in dict.fromkeys([*section["parts"], *formula]):
            seconds = _finite(section["parts"].get(name)) or 0.0
            expected = _finite(formula.get(name))
            if abs(seconds) < total * 1e-4 and abs(expected or 0.0) < total * 1e-4:
                continue
            parts.append(
                {
                    "name": name,
                    "label": PART_LABELS.get(name, name),
                    "value": format_value(seconds, "s"),
                    "share": (
                        f"{seconds / whole * 100:.0f}%"
                        if seconds >= 0
                        else "the engine model expected this much more"
                    ),
                    "width": f"{max(seconds, 0.0) / drawn * 100:.2f}",
                    "formula": "" if expected is None else format_value(expected, "s"),
                }
            )
        formula_total = ((predicted or {}).get(key) or {}).get("total")
        bars.append(
            {
                "key": key,
                "label": label,
                "total": format_value(total, "s"),
                "formula_total": "" if formula_total is None else format_value(formula_total, "s"),
                "expected_total": format_value(drawn, "s") if drawn > total * 1.0001 else "",
                "parts": parts,
            }
        )
    return bars


# Said once on the page of a real engine's run on a device without a calibration.
UNCALIBRATED_NOTE = (
    "This device has no calibration of its own (neither its runs nor published vLLM runs of its "
    "kind): the engine model's parts are not sized for it, so the rows compare measured with "
    "predicted and name no part."
)


# ... and on the page of a run priced from a CPU worker's start-up probe.
PROBE_NOTE = (
    "This run was predicted from the device's start-up probe, not a calibration (see "
    '"Predicted with" below): the engine model\'s parts are not sized from a probe, so the '
    "rows compare measured with predicted and name no part."
)


def breakdown_sentence(
    breakdown: Mapping[str, Any] | None, evidence: Evidence | None = None
) -> str:
    """'Most of the mean E2E (62%) went to queueing before the first step: ...', naming the cap
    that held admission where the largest part is queueing (`evidence`); nothing on a device
    the engine model is not calibrated on."""
    from labs.sim.breakdown import PART_LABELS, largest_part

    name, share = largest_part(breakdown)
    if not name or (evidence is not None and not evidence.calibrated):
        return ""
    why = PART_WHY.get(name, name)
    if name == "queueing" and evidence is not None and evidence.limit is not None:
        why = evidence.limit.text
    expected = (breakdown or {}).get("source") == "expected"
    section = (breakdown or {})["e2e_s"]
    over = -float(section["parts"].get("unexplained", 0.0))
    if expected and over > 0:
        # The engine model expected more time than the run took: shares of the measured mean
        # would pass 100%, so the largest part is given as a share of what the model expected.
        total = float(section["total"])
        model = total + over
        return (
            f"The engine model expected {format_value(model, 's')} for the mean end-to-end "
            f"latency, {model / total:.1f}× the {format_value(total, 's')} measured; the "
            f"largest part it expected ({section['parts'][name] / model * 100:.0f}%) is "
            f"{PART_LABELS.get(name, name)}: {why}."
        )
    verb = "is expected to have gone" if expected and name != "unexplained" else "went"
    return (
        f"The largest part of the mean end-to-end latency ({share * 100:.0f}%) {verb} to "
        f"{PART_LABELS.get(name, name)}: {why}."
    )
