"""Your number: a learner's own measurement of the figure a deck card asks about, from their
newest finished run of the card's lab preset (the quiz shows it beside the answer, through
labs.api). A ratio card divides the run by its baseline run; a card whose quantity no run
measures gets the lab's headline figure, said to be something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.db import connections

from config import rows
from labs.explanation import ratios, results
from labs.models import LabRun, RunState
from labs.parameters.presets import LABS


@dataclass(frozen=True)
class YourNumber:
    """The learner's own measurement for a card whose lab preset they ran."""

    run: LabRun
    label: str
    value: str  # formatted, with its unit
    where: str
    gpu: str
    # A ratio card: the run it divides by, or (not run yet) the link that runs it.
    baseline: LabRun | None = None
    baseline_url: str = ""
    baseline_label: str = ""
    card_quantity: bool = True  # False: the run's headline figure, not the card's quantity


@cache
def _latest_done_run_sql(alias: str) -> str:
    # By hand: every reveal of most deck cards asks, and the ORM's statement cost more CPU to
    # build than the database spent answering it (config/rows.py).
    return (
        f"SELECT {rows.select_list(LabRun, 'r', alias)} FROM {LabRun._meta.db_table} r"  # noqa: S608 - names from the model; values are bound parameters
        " WHERE r.owner_id = %s AND r.preset = %s AND r.state = %s"
        " ORDER BY r.finished_at DESC, r.id DESC LIMIT 1"
    )


def latest_done_run(*, user_id: int, preset: str) -> LabRun | None:
    """The learner's newest finished run of a lab preset."""
    alias = "default"
    with connections[alias].cursor() as cursor:
        cursor.execute(_latest_done_run_sql(alias), [user_id, preset, RunState.DONE.value])
        row = cursor.fetchone()
    return None if row is None else rows.from_row(LabRun, row, alias)


def your_number(
    *, user_id: int, preset: str, check_key: str, numeric_card: bool
) -> YourNumber | None:
    """The newest finished run of `preset` by this learner, and the figure it measured that
    matches a card's check (`check_key`, a predictor key), else the lab's headline metric. One
    query. `numeric_card`: the card asks for a number (the headline figure is then said not to be
    the card's quantity)."""
    run = latest_done_run(user_id=user_id, preset=preset)
    if run is None or not run.result:
        return None
    ratio = ratios.RATIO_CHECKS.get(check_key)
    if ratio is not None:
        return _your_ratio(ratio, run)
    figure = _card_figure(check_key)
    key, label, unit = figure or _headline_figure(run)
    value = results.dig(run.result, key)
    if not isinstance(value, int | float):
        return None
    return YourNumber(
        run=run,
        label=label,
        value=results.format_value(value, unit),
        where=run.where or run.backend,
        gpu=str(run.params.get("gpu") or ""),
        # A numeric card whose quantity no run measures (KiB per token, GPUs needed): the run's
        # headline figure, said not to be the card's number.
        card_quantity=figure is not None or not numeric_card,
    )


# Card quantities a run measures under another name: predictor key -> (summary key, label, unit).
_MEASURED_AS: dict[str, tuple[str, str, str]] = {
    "decode_step_s": ("tpot_s.p50", "one decode step: TPOT, median", "s"),
    "spec_tokens_per_step": ("spec_acceptance_length", "tokens per target pass", "tokens"),
    # The KV pool caps the batch: with more requests in flight than fit, the peak is the limit.
    "max_concurrent_seqs": ("max_running_seqs", "sequences running at once, peak", "sequences"),
}


def _card_figure(predicted_key: str) -> tuple[str, str, str] | None:
    """The measured figure that is the card's checked quantity, if a run measures it."""
    if predicted_key in _MEASURED_AS:
        return _MEASURED_AS[predicted_key]
    metric = next(
        (m for m in results.METRICS if predicted_key and m.predicted == predicted_key), None
    )
    return (metric.measured, metric.label, metric.unit) if metric else None


def _measured_figure(key: str) -> tuple[str, str, str]:
    metric = next((m for m in results.METRICS if m.measured == key), None)
    return (key, metric.label, metric.unit) if metric else (key, key, "")


def _headline_figure(run: LabRun) -> tuple[str, str, str]:
    lab = LABS.get(run.lab) or LABS["sandbox"]
    return _measured_figure(lab.sweep_metrics[0][0])


def _your_ratio(check: ratios.RatioCheck, run: LabRun) -> YourNumber | None:
    """A ratio card's number: the run over its baseline run, in the card's unit (×); without a
    baseline run, the run's own figure and the link that runs the baseline."""
    baseline = ratios.find_baseline_run(check, run)
    ratio = ratios.measured_ratio(check, run, baseline) if baseline is not None else None
    if ratio is not None:
        value, label = results.format_value(ratio, "x"), check.label
    else:
        _, label, unit = _measured_figure(check.metric)
        value = results.format_value((run.result or {}).get(check.metric), unit)
        baseline = None
    return YourNumber(
        run=run,
        label=label,
        value=value,
        where=run.where or run.backend,
        gpu=str(run.params.get("gpu") or ""),
        baseline=baseline,
        baseline_url="" if baseline is not None else ratios.baseline_url(check, run),
        baseline_label=check.baseline_label,
    )
