"""`lab run`: run a workload on a backend and print what was measured next to the prediction.

    python manage.py lab run --backend sim --num-prompts 200 --request-rate 8 --seed 0 --json

With --json, one object: {"backend", "where", "measured": labs.measurement.metrics.summarize(...)
without the chart series, "predicted": labs.prediction.predict.lab_prediction(...), "breakdown":
where the mean E2E, TTFT and TPOT went (labs/sim/breakdown.py)}. Without it, a table, the breakdown
and why measured and predicted differ (labs/explanation/explain.py, as the run page words it).
Every lab parameter is an option (labs.cli.add_param_options), validated by parse_lab_params;
`--sim-profile realistic|ideal` picks the simulator's engine model.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO, runtime_checkable

from labs.backends import BACKENDS, get_backend
from labs.cli import add_param_options, params_from_args, stored_calibration
from labs.explanation.results import load_label
from labs.measurement.metrics import SLO_KEYS, summarize
from labs.parameters.params import LabParams, ParamError, align_run_batch
from labs.prediction.device_speculation import lab_prediction_on
from labs.sim.lab import run_breakdown

HELP = "run a workload on a backend (sim: simulated on CPU) and print measured vs predicted"


class ServedModel(Protocol):
    """What a backend measuring a running server (`--base-url`) reads of the model it serves."""

    @property
    def id(self) -> str: ...

    @property
    def root(self) -> str | None: ...

    @property
    def catalog_slug(self) -> str | None: ...

    def why_no_prediction(self) -> str | None: ...


@runtime_checkable
class MeasuresRunningServer(Protocol):
    """A backend that can measure a server already running (the vllm backend with a base URL)."""

    base_url: str | None

    def served_model(self) -> ServedModel: ...


# Options each backend takes besides the lab parameters (the vllm backend adds --base-url).
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {"sim": (), "vllm": ("base_url",)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_param_options(parser)
    parser.add_argument(
        "--backend", choices=tuple(BACKENDS), default="sim", help="where to run (default sim)"
    )
    parser.add_argument(
        "--base-url",
        default=None,
        help="vllm backend: measure the vLLM server already running at this URL",
    )
    parser.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        help="SLOs for goodput, as vllm bench serve takes them: ttft:500 tpot:50 e2el:2000",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (seconds, tokens, rates)"
    )


def parse_goodput(items: list[str] | None) -> dict[str, float] | None:
    """{'ttft': 500.0, ...} from ['ttft:500', ...]. Raises ParamError naming --goodput."""
    if not items:
        return None
    slos: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key not in SLO_KEYS or not ms > 0:
            raise ParamError(
                {
                    "goodput": f"--goodput: each SLO must be KEY:MS with KEY one of "
                    f"{', '.join(SLO_KEYS)} and MS a positive number, got {item[:30]}"
                }
            )
        slos[key] = ms
    return slos


def run(options: Mapping[str, Any], stdout: TextIO) -> None:
    """Run and print. Raises ParamError for bad options."""
    values = align_run_batch(options)
    params = params_from_args(values)
    slo_ms = parse_goodput(options.get("goodput"))
    name = options.get("backend") or "sim"
    extra = {k: options[k] for k in BACKEND_OPTIONS.get(name, ()) if options.get(k) is not None}
    backend = get_backend(name, **extra)
    no_prediction = None
    if isinstance(backend, MeasuresRunningServer) and backend.base_url:
        params, no_prediction = for_served_model(values, params, backend.served_model())
    record = backend.run(params)
    measured = summarize(record, slo_ms)
    predicted = None if no_prediction else lab_prediction_on(params, stored_calibration(params))
    breakdown = None if no_prediction else run_breakdown(params, record, measured)
    why = (
        ""
        if predicted is None
        else format_why({**measured, "breakdown": breakdown}, predicted, params.as_dict())
    )
    measured.pop("series")
    if options.get("json"):
        result = {
            "backend": record.backend,
            "where": record.where,
            "measured": measured,
            "predicted": predicted,
            "predicted_for": None if no_prediction else predicted_for(params),
            "no_prediction": no_prediction,
            "breakdown": breakdown,
            "definitions": record.meta.get("definitions"),
        }
        stdout.write(json.dumps(result) + "\n")
    else:
        stdout.write(format_table(record.where, measured, predicted, no_prediction, params))
        if predicted is not None:
            stdout.write(f"  predicted {load_label(params.as_dict())}\n")
        stdout.write(format_definitions(record.meta.get("definitions")))
        stdout.write(format_breakdown(breakdown))
        stdout.write(why)


def predicted_for(params: LabParams) -> str:
    """Which model and hardware the prediction prices: 'lab-llama-20m on h100-sxm'."""
    return f"{params.model.name} on {params.hardware.name}"


def for_served_model(
    values: Mapping[str, Any], params: LabParams, served: ServedModel
) -> tuple[LabParams, str | None]:
    """The lab's parameters for the model a running server serves, and why nothing is predicted
    (None when the served model is a catalog model). A prediction is for the served model on the
    hardware the learner names, never for the lab's default model.

    Raises:
        ParamError: --model names another model than the one the server serves.
    """
    slug = served.catalog_slug
    if slug is None:
        return params, served.why_no_prediction()
    named = str(values.get("model") or "").strip().lower()
    if named and named != slug:
        raise ParamError(
            {
                "model": f"model must be {slug} (what the server serves: {served.id} from "
                f"{served.root}) or left out, got {named[:40]}"
            }
        )
    return params_from_args({**values, "model": slug}), None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.2f} ms"


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda value: "-" if value is None else format(value, fmt)


def format_table(
    where: str,
    measured: Mapping[str, Any],
    predicted: Mapping[str, Any] | None,
    no_prediction: str | None = None,
    params: LabParams | None = None,
) -> str:
    """Measured (mean, p50, p99) beside predicted, in ms and tokens/s; without a prediction, the
    reason instead of the column."""
    has_prediction = predicted is not None
    if predicted is None:
        lines = [f"measured: {where}", f"{no_prediction or 'no prediction'}"]
        predicted = {}
    else:
        pricing = f" for {predicted_for(params)}" if params is not None else ""
        lines = [
            f"measured: {where}; predicted{pricing}: closed-form formulas (labs/prediction/),"
            " TTFT and E2E under this load (queueing included)"
        ]
    column = "predicted" if has_prediction else ""
    header = f"  {'':<24}{'mean':>13}{'p50':>13}{'p99':>13}{column:>15}"
    lines.append(header)
    for key, label, pred_key in (
        ("ttft_s", "TTFT", "loaded_ttft_s"),
        ("ttft_bench_s", "TTFT (bench's stamps)", None),
        ("tpot_s", "TPOT", "tpot_s"),
        ("itl_s", "ITL", None),
        ("e2e_s", "E2E", "loaded_e2e_s"),
    ):
        d = measured.get(key)
        if d is None:
            continue  # bench's TTFT: only a real engine's requests carry its stamp
        pred = _ms(predicted.get(pred_key)) if pred_key and has_prediction else ""
        lines.append(
            f"  {label:<24}{_ms(d['mean']):>13}{_ms(d['p50']):>13}{_ms(d['p99']):>13}{pred:>15}"
        )

    def row(label: str, shown: str, pred: str = "") -> str:
        return f"  {label:<24}{shown:>39}{pred:>15}"

    def metric(label: str, key: str, fmt: Callable[[Any], str], pred_key: str | None = None) -> str:
        pred = fmt(predicted.get(pred_key)) if pred_key and has_prediction else ""
        return row(label, fmt(measured[key]), pred)

    lines += [
        metric("output tokens/s", "output_tokens_per_s", _num(",.1f"), "output_tokens_per_s"),
        metric("requests/s", "requests_per_s", _num(",.3f")),
        metric("goodput requests/s", "goodput_requests_per_s", _num(",.3f")),
        row("completed / failed", f"{measured['completed']:,} / {measured['failed']:,}"),
        metric("most running sequences", "max_running_seqs", _num(","), "running_seqs"),
        metric("preemptions", "preemptions", _num(",")),
        metric("KV usage peak", "kv_usage_peak", _num(".1%")),
        metric("prefix-cache hit rate", "prefix_cache_hit_rate", _num(".1%")),
        metric("draft acceptance rate", "spec_acceptance_rate", _num(".1%")),
        metric("simulated seconds", "simulated_s", _num(",.3f")),
        metric("wall seconds", "wall_s", _num(",.3f")),
    ]
    return "\n".join(lines) + "\n"


def format_definitions(said: Mapping[str, Any] | None) -> str:
    """How TTFT was stamped (and bench's beside it) and which sampling the requests used."""
    if not said:
        return ""
    lines = [f"  TTFT: {said['ttft']}"]
    if said.get("ttft_bench"):
        lines.append(f"  TTFT (bench's stamps): {said['ttft_bench']}")
    if said.get("e2e"):
        lines.append(f"  E2E and goodput: {said['e2e']}")
    lines.append(f"  sampling: {said['sampling']}")
    return "\n".join(lines) + "\n"


def format_breakdown(breakdown: Mapping[str, Any] | None) -> str:
    """Where the mean E2E and TPOT went, one line per part, and the sentence naming the largest."""
    from labs.explanation.results import breakdown_sentence
    from labs.sim.breakdown import PART_LABELS

    if not breakdown:
        return ""
    lines = [f"where the time went ({breakdown['source']}):"]
    for key, label in (("e2e_s", "mean E2E"), ("ttft_s", "mean TTFT"), ("tpot_s", "mean TPOT")):
        section = breakdown.get(key)
        if not section:
            continue
        lines.append(f"  {label} {_ms(section['total'])}")
        for name, value in section["parts"].items():
            if abs(value) >= 1e-9:
                lines.append(f"    {PART_LABELS.get(name, name):<40}{_ms(value):>13}")
    lines.append("  " + breakdown_sentence(breakdown))
    return "\n".join(lines) + "\n"


def format_why(
    summary: Mapping[str, Any], predicted: Mapping[str, Any], params: Mapping[str, Any]
) -> str:
    """The run page's "why they differ" for each compared metric, and its reading."""
    from labs.explanation.results import compare, headline

    rows = compare(summary, predicted, params)
    lines = ["why they differ (measured vs predicted):"]
    for row in rows:
        if row.reading and row.diff:
            lines.append(f"  {row.label}: {row.measured} vs {row.predicted} ({row.diff})")
            lines.append(f"    {row.reading}")
    lines.append("reading: " + headline(rows, summary.get("breakdown")))
    return "\n".join(lines) + "\n"
