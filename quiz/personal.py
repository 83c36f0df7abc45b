"""A learner's finished lab run becomes a personal card: predict a neighbouring setting.

"Your run: llama-3-8b on h100-sxm, max_num_seqs 64, measured 5,719 tok/s. Predict the output
tokens/s at max_num_seqs 128." The answer is fixed when the card is made: the learner's own sweep
point when they ran that setting, else the simulator run now for the neighbouring setting (the
same workload and seed, so only the setting changes). The tolerance is the metric's noise: the
spread of the simulator's answer over other seeds, never tighter than 5%. The worked steps come
from the run's numbers and the predictor's formulas at both settings.

The card is owned by the learner (Card.owner), lives in the "my-runs" deck, is scheduled by FSRS
like any other, and never enters content/ or the Anki export.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, connections, transaction

from config import rows
from labs import ratios, results
from labs.models import LabRun, RunState, Sweep
from labs.params import ParamError, parse_lab_params
from labs.presets import LABS, Lab
from quiz.models import PERSONAL_DECK, Card, Deck

# The simulator runs in the request (about 0.1 s for a lab's workload): bound the work so a card
# from a huge sandbox run is refused instead of tying up the web process.
MAX_SIM_TOKENS = 1_000_000
NOISE_SEEDS = 2  # extra seeds the neighbour is simulated with, to measure the metric's noise
MIN_RELATIVE_TOLERANCE = 0.05


class CardRefused(Exception):
    """The run cannot become a card; the message says why, for the learner."""


@dataclass(frozen=True)
class Figure:
    """How a metric is asked and typed: the summary key, its words, and its display unit."""

    key: str
    label: str
    unit: str  # what the learner types the answer in
    scale: float  # summary value x scale = value in `unit`
    predicted_key: str | None


def figure_for(key: str, predicted_key: str | None = None) -> Figure:
    metric = next((m for m in results.METRICS if m.measured == key), None)
    label = metric.label if metric else key
    unit = metric.unit if metric else ""
    if unit == "s":
        return Figure(key, label, "ms", 1000.0, predicted_key)
    if unit == "ratio":
        return Figure(key, label, "%", 100.0, predicted_key)
    return Figure(key, label, unit or "sequences", 1.0, predicted_key)


def _phrase(label: str) -> str:
    """'Output tokens/s' -> 'output tokens/s' inside a sentence; 'TPOT, median' stays."""
    return label[0].lower() + label[1:] if label[1:2].islower() else label


def _fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _round_tolerance(value: float) -> float:
    # Two significant figures: "± 290 tok/s", "± 0.41 ms".
    return float(f"{value:.2g}")


def _lab(run: LabRun) -> Lab:
    return LABS.get(run.lab) or LABS["sandbox"]


def _neighbour_from_lab(lab: Lab, field: str, params: Mapping[str, Any]) -> Any:
    """The next larger value of the lab's sweep list (the next smaller at the top)."""
    current = params.get(field)
    candidates = []
    for item in lab.sweep_values.split(","):
        try:
            value = parse_lab_params({**params, field: item.strip()}).as_dict()[field]
        except ParamError:
            continue  # a value this run's other settings cannot take
        if isinstance(value, int | float) and value != current:
            candidates.append(value)
    if not isinstance(current, int | float) or not candidates:
        raise CardRefused(f"This lab has no neighbouring {field} to predict.")
    larger = sorted(v for v in candidates if v > current)
    return larger[0] if larger else max(candidates)


def _simulate(params: Mapping[str, Any], key: str, seeds: list[int]) -> list[float]:
    from labs.backends import get_backend
    from labs.metrics import summarize

    values = []
    for seed in seeds:
        record = get_backend("sim").run(parse_lab_params({**params, "seed": seed}), lambda _: None)
        value = results.dig(summarize(record), key)
        if not isinstance(value, int | float):
            raise CardRefused(f"The simulator measured no {key} at that setting.")
        values.append(float(value))
    return values


def _check_bounded(params: Mapping[str, Any]) -> None:
    work = int(params.get("num_prompts") or 0) * (
        int(params.get("prompt_tokens") or 0) + int(params.get("output_tokens") or 0)
    )
    if work > MAX_SIM_TOKENS:
        raise CardRefused(
            f"This run is too large to re-simulate for a card (num_prompts x (prompt_tokens + "
            f"output_tokens) = {work:,}; the limit is {MAX_SIM_TOKENS:,}). Make a card from a run "
            "with fewer num_prompts."
        )


def _predicted(params: Mapping[str, Any]) -> dict[str, Any]:
    from labs.predict import predict

    return results.derived_predictions(predict(parse_lab_params(params)).as_dict(), params)


@dataclass(frozen=True)
class _Answer:
    value: float  # summary units
    origin: str
    spread: float | None  # max distance over other seeds, summary units


def _sweep_answer(run: LabRun, key: str) -> tuple[Any, _Answer | None]:
    """The neighbouring point of the learner's own sweep, and its measurement if it has one."""
    sweep = run.sweep
    assert sweep is not None and run.sweep_index is not None
    if len(sweep.values) < 2:
        raise CardRefused("A sweep of one value has no neighbouring setting to ask about.")
    index = run.sweep_index + 1 if run.sweep_index + 1 < len(sweep.values) else run.sweep_index - 1
    value = sweep.values[index]
    point = sweep.runs.filter(sweep_index=index, state=RunState.DONE).first()
    measured = results.dig(point.result, key) if point else None
    if not isinstance(measured, int | float):
        return value, None
    return value, _Answer(float(measured), f"your sweep's run #{point.pk} ({point.where})", None)


def _answer(run: LabRun, field: str, neighbour: Any, key: str, known: _Answer | None) -> _Answer:
    params = {**run.params, field: neighbour}
    try:
        parse_lab_params(params)
    except ParamError as exc:
        raise CardRefused(
            f"{field} {neighbour} cannot run with this run's settings: {exc}"
        ) from None
    try:
        _check_bounded(params)
    except CardRefused:
        if known is None:
            raise
        return known  # the learner's own point; too large to measure the noise again
    seed = int(run.params.get("seed") or 0)
    values = _simulate(params, key, [seed + i for i in range(NOISE_SEEDS + 1)])
    spread = max(abs(v - values[0]) for v in values)
    if known is not None:
        return _Answer(known.value, known.origin, spread)
    return _Answer(values[0], "simulated with the same workload and seed", spread)


def _steps(
    run: LabRun, field: str, neighbour: Any, figure: Figure, measured: float, answer: _Answer
) -> list[str]:
    scale, unit = figure.scale, figure.unit
    current = run.params.get(field)
    steps = [
        f"Your run #{run.pk} ({run.where or run.backend}) at {field} {current}: "
        f"{figure.label} = {_fmt(measured * scale)} {unit}."
    ]
    here = _predicted(run.params)
    there = _predicted({**run.params, field: neighbour})
    for name, label in (
        ("running_seqs", "sequences in a step"),
        ("decode_step_s", "decode step (weights + the batch's KV read, over bandwidth), ms"),
    ):
        a, b = here.get(name), there.get(name)
        if isinstance(a, int | float) and isinstance(b, int | float):
            factor = 1000 if name == "decode_step_s" else 1
            steps.append(
                f"Predictor, {label}: {_fmt(a * factor)} at {current} → "
                f"{_fmt(b * factor)} at {neighbour}."
            )
    key = figure.predicted_key
    before, after = (here.get(key), there.get(key)) if key else (None, None)
    if isinstance(before, int | float) and isinstance(after, int | float) and before:
        ratio = after / before
        steps.append(
            f"Predicted {figure.label}: {_fmt(before * scale)} → {_fmt(after * scale)} {unit} "
            f"(× {ratio:.2f}); scaling your measurement: {_fmt(measured * scale)} × {ratio:.2f} "
            f"≈ {_fmt(measured * ratio * scale)} {unit}."
        )
    steps.append(
        f"At {field} {neighbour}, {answer.origin}: {_fmt(answer.value * scale)} {unit}. Queueing, "
        "batching and preemption are what the closed form leaves out."
    )
    return steps


@transaction.atomic
def card_from_run(*, user: AbstractBaseUser, run: LabRun) -> Card:
    """Make (or return, reactivated) the learner's personal card for a finished run.

    Raises:
        CardRefused: the run is not the learner's, not finished, measured nothing the card can
            ask about, or is too large to re-simulate.
    """
    if run.owner_id != user.pk:
        raise CardRefused("Only the learner who ran it can make a card from a run.")
    if run.state != RunState.DONE or not run.result:
        raise CardRefused("Only a finished run can become a card.")
    slug = f"mine-{user.pk}-run-{run.pk}"
    existing = Card.objects.filter(slug=slug, owner=user).first()
    if existing is not None:
        if not existing.is_active:
            existing.is_active = True
            existing.save(update_fields=["is_active", "updated_at"])
        return existing

    lab = _lab(run)
    key, predicted_key = lab.sweep_metrics[0]
    figure = figure_for(key, predicted_key)
    measured = results.dig(run.result, key)
    if not isinstance(measured, int | float):
        raise CardRefused(f"This run measured no {figure.label}.")
    if run.sweep is not None:
        field = run.sweep.field
        neighbour, known = _sweep_answer(run, key)
    else:
        field = lab.sweep_field
        neighbour, known = _neighbour_from_lab(lab, field, run.params), None
    answer = _answer(run, field, neighbour, key, known)
    noise = (answer.spread or 0.0) * 2
    tolerance = max(noise, abs(answer.value) * MIN_RELATIVE_TOLERANCE) * figure.scale

    deck, _ = Deck.objects.get_or_create(
        slug=PERSONAL_DECK,
        defaults={"title": "Your runs", "description": "Cards made from your own lab runs."},
    )
    params = run.params
    where = run.where or run.backend
    prompt = (
        f"Your run: {params.get('model')} on {params.get('gpu')}, {field} "
        f"{params.get(field)}, measured {_phrase(figure.label)} = "
        f"{_fmt(float(measured) * figure.scale)} {figure.unit} ({where}). "
        f"Predict the {_phrase(figure.label)} at {field} {neighbour}."
    )
    value = answer.value * figure.scale
    try:
        # A second press of the button can race this one to the unique slug.
        with transaction.atomic():
            return Card.objects.create(
                owner=user,
                deck=deck,
                slug=slug,
                kind=Card.Kind.NUMERIC,
                prompt=prompt,
                answer=f"≈ {_fmt(value)} {figure.unit} at {field} {neighbour} ({answer.origin}).",
                steps=_steps(run, field, neighbour, figure, float(measured), answer),
                explanation=(
                    f"Answers within ± {_fmt(_round_tolerance(tolerance))} {figure.unit} "
                    f"count: the metric's spread over {NOISE_SEEDS} other simulator seeds "
                    f"(x2), at least {MIN_RELATIVE_TOLERANCE:.0%}."
                ),
                numeric_value=float(f"{value:.4g}"),  # as a person would write it: 8,051 tok/s
                numeric_unit=figure.unit,
                numeric_tolerance=_round_tolerance(tolerance),
                source=f"lab run {run.pk}",
            )
    except IntegrityError:
        return Card.objects.get(slug=slug, owner=user)


def sweep_card_run(sweep: Sweep) -> LabRun:
    """The sweep point a card asks from: the first finished one whose neighbour finished too."""
    done = {r.sweep_index: r for r in sweep.runs.filter(state=RunState.DONE)}
    for index in sorted(done):
        if index + 1 in done:
            return done[index]
    raise CardRefused("A card needs two neighbouring points of the sweep to have finished.")


def card_retire(*, user: AbstractBaseUser, slug: str) -> bool:
    """Retire one of the learner's own personal cards (its history is kept)."""
    return bool(Card.objects.filter(slug=slug, owner=user).update(is_active=False))


# -- your numbers on the deck's cards ------------------------------------------------------------


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


def your_number(*, user_id: int | None, card: Card) -> YourNumber | None:
    """The newest finished run of the card's preset by this learner, and the figure it measured
    that matches the card's check (else the lab's headline metric). One query."""
    if not card.lab_preset or user_id is None:
        return None
    run = latest_done_run(user_id=user_id, preset=card.lab_preset)
    if run is None or not run.result:
        return None
    check = card.check_spec or {}
    ratio = ratios.RATIO_CHECKS.get(str(check.get("key")))
    if ratio is not None:
        return _your_ratio(ratio, run)
    figure = _card_figure(str(check.get("key") or ""))
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
        card_quantity=figure is not None or card.kind != Card.Kind.NUMERIC,
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
    return _measured_figure(_lab(run).sweep_metrics[0][0])


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
