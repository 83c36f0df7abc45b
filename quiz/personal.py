"""A learner's finished lab run becomes a personal card: predict a neighbouring setting.

"Run #12 at max_num_seqs 64: predict the output tokens/s at max_num_seqs 16. Your run:
llama-3-8b on h100-sxm, max_num_seqs 64; workload: 128 requests of 512 prompt + 128 output
tokens, 32 in flight. It measured output tokens/s = 4,482 tok/s. Everything else stays the
same." The neighbouring setting is the nearest one at which the predictor's figure changes (with
32 in flight, max_num_seqs 128 would change nothing). The graded answer is what the worked
steps compute: the measurement scaled by the predictor's ratio between the two settings. What a
run measured at the neighbouring setting (the learner's own sweep point, else the simulator now,
same workload and seed) is shown beside it, and the tolerance holds it when it is near: at least
5%, the metric's spread over other seeds, and the gap to that measurement up to 25%.

Making a card simulates, so it runs on the lab worker (`card_request` queues it, one per learner
at a time; `card_request_execute` is the worker's side); the web request does O(1) checks only.
It waits on the simulator's queue with the lab runs and takes its turn among them (labs.runs.turns,
through `CARD_REQUESTS`): a learner's card waits for the learners before it in turn, not for
every run queued before it.

The card is owned by the learner (Card.owner), lives in the "my-runs" deck, is scheduled by FSRS
like any other, and never enters content/; its owner's Anki download holds it (deck "Your runs").
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from labs import api as labs_api
from labs.api import Lab, ParamError, RunData, SweepData
from quiz.models import PERSONAL_DECK, Card, Deck, ParameterFit, PersonalCardRequest

logger = logging.getLogger(__name__)

NOISE_SEEDS = 2  # extra seeds the neighbour is simulated with, to measure the metric's noise
# The worker's time limits for making one card; the soft limit lets the request record why it
# stopped.
CARD_SOFT_TIME_LIMIT_S = 120
# The lab worker simulates the neighbour once per seed: bound that work by its cost, the simulated
# steps (labs.prediction.sizing.sim_steps, O(1)), so a card that could not be made within the time
# limit is refused in the request instead of holding the worker until it fails. A simulated step
# takes under 10 microseconds on one core (measured on the lab presets and on sandbox runs); a card
# may use a quarter of its limit, leaving room for a slower or busier worker.
SIM_SECONDS_PER_STEP = 10e-6
MAX_SIM_STEPS = int(CARD_SOFT_TIME_LIMIT_S / 4 / (NOISE_SEEDS + 1) / SIM_SECONDS_PER_STEP)
MIN_RELATIVE_TOLERANCE = 0.05
# Neighbouring settings tried for one where the setting binds: a prediction each (~10 ms) in the
# web request that queues the card.
NEIGHBOURS_TRIED = 4
# The tolerance widens to hold what the run measured at the neighbour, up to this far from the
# method's result; further than that, the card says the closed form misses it.
MAX_RELATIVE_TOLERANCE = 0.25


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
    metric = labs_api.metric(key)
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


def _decimals(value: float) -> int:
    """Decimals that show three significant figures of `value` (none from 100 up): every number
    of one card in the card's unit is written with the same count, the answer's."""
    if value == 0 or abs(value) >= 100:
        return 0
    return min(4, 2 - math.floor(math.log10(abs(value))))


def _fmt(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def _workload(params: Mapping[str, Any]) -> str:
    """The whole workload in words, so the card still makes sense when it returns weeks later."""
    requests = int(params.get("num_prompts") or 0)
    text = (
        f"{requests:,} requests of {int(params.get('prompt_tokens') or 0):,} prompt + "
        f"{int(params.get('output_tokens') or 0):,} output tokens"
    )
    rate, cap = params.get("request_rate"), params.get("max_concurrency")
    if rate:
        text += f", arriving at {float(rate):g} req/s"
        if cap:
            text += f" (at most {int(cap):,} in flight)"
    else:
        text += f", {int(params.get('concurrency') or 0):,} in flight"
    if params.get("shared_prefix_tokens"):
        text += f", the first {int(params['shared_prefix_tokens']):,} prompt tokens shared"
    spread = [
        f"{name} lengths ± {float(params[key]):.0%}"
        for name, key in (("prompt", "input_range_ratio"), ("output", "output_range_ratio"))
        if params.get(key)
    ]
    return text + (f", {', '.join(spread)}" if spread else "")


def _hardware(params: Mapping[str, Any]) -> str:
    tp = int(params.get("tp") or 1)
    return f"{params.get('model')} on {params.get('gpu')}" + (
        f" × {tp} (tp {tp})" if tp > 1 else ""
    )


def _round_up(value: float) -> float:
    """Up to two significant figures ("± 290 tok/s", "± 0.41 ms"), never below `value`, so the
    figures the tolerance was chosen to hold stay inside it."""
    if value <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(value)) - 1)
    return round(math.ceil(value / step - 1e-9) * step, 12)


def _neighbour_from_lab(lab: Lab, field: str, params: Mapping[str, Any]) -> Any:
    """The nearest value of the lab's sweep list (by ratio; the larger first) at which the
    predictor's figure for the lab's metric changes, so the card asks where the setting binds
    (max_num_seqs 128 with 32 requests in flight changes nothing: a ratio of 1.000). Without
    such a value, or a predicted figure to tell, the next larger value (the next smaller at the
    top)."""
    current = params.get(field)
    candidates = []
    for item in lab.sweep_values.split(","):
        try:
            value = labs_api.checked_params({**params, field: item.strip()})[field]
        except ParamError:
            continue  # a value this run's other settings cannot take
        if isinstance(value, int | float) and value != current:
            candidates.append(value)
    if not isinstance(current, int | float) or not candidates:
        raise CardRefused(f"This lab has no neighbouring {field} to predict.")
    larger = sorted(v for v in candidates if v > current)
    fallback = larger[0] if larger else max(candidates)
    predicted_key = lab.sweep_metrics[0][1]
    if not predicted_key or current <= 0:
        return fallback
    here = _predicted(params)
    positive = [v for v in candidates if v > 0]
    by_distance = sorted(positive, key=lambda v: (abs(math.log(v / current)), v < current))
    for value in by_distance[:NEIGHBOURS_TRIED]:
        pair = _predicted_pair(here, _predicted({**params, field: value}), predicted_key)
        if pair is not None and round(pair[1] / pair[0], 3) != 1:
            return value
    return fallback


def _simulate(
    params: Mapping[str, Any], key: str, seeds: list[int], until: float | None = None
) -> list[float]:
    # The lab worker's memory bound: refused by the O(1) estimate before anything is built, and the
    # address space capped while it runs (labs/prediction/sizing.py). `until`: the card's time
    # limit.
    values = []
    for seed in seeds:
        try:
            summary = labs_api.simulate({**params, "seed": seed}, until=until)
        except ParamError as exc:  # RunTooLarge among them
            raise CardRefused(f"The neighbouring setting cannot be simulated: {exc}") from None
        value = labs_api.dig(summary, key)
        if not isinstance(value, int | float):
            raise CardRefused(f"The simulator measured no {key} at that setting.")
        values.append(float(value))
    return values


def _check_bounded(params: Mapping[str, Any]) -> None:
    """Refuse, in O(1), a simulation whose simulated steps could not finish within the card's
    time limit."""
    try:
        steps = labs_api.simulation_steps(params)
    except ParamError as exc:
        raise CardRefused(f"The neighbouring setting cannot be simulated: {exc}") from None
    if steps > MAX_SIM_STEPS:
        raise CardRefused(
            f"This run is too large to re-simulate for a card: each simulation of it may take up "
            f"to {steps:,} simulated steps, and a card may take {MAX_SIM_STEPS:,} (it simulates "
            f"{NOISE_SEEDS + 1} times within {CARD_SOFT_TIME_LIMIT_S} s). Make a card from a run "
            "with fewer num_prompts or output_tokens."
        )


def _to_simulate(run: RunData) -> dict[str, Any] | None:
    """The settings the worker will simulate for a card from `run` (its neighbour), or None when
    the learner's own sweep point answers unsimulated. O(1) but for one query on a sweep.

    Raises:
        CardRefused: no neighbouring setting, or it cannot run.
    """
    lab = labs_api.lab_of(run)
    key = lab.sweep_metrics[0][0]
    if run.sweep is not None:
        field = run.sweep.field
        neighbour, known = _sweep_answer(run, key)
    else:
        field = lab.sweep_field
        neighbour, known = _neighbour_from_lab(lab, field, run.params), None
    params = {**run.params, field: neighbour}
    if known is not None:
        try:
            _check_bounded(params)
        except CardRefused:
            return None  # as in _answer: the learner's own point, no noise measured
    return params


def _check_fits_worker(params: Mapping[str, Any]) -> None:
    """The lab submit's O(1) memory estimate (labs/prediction/sizing.py), in the web before
    anything is queued; the worker checks the neighbouring setting itself again."""
    try:
        labs_api.simulation_fits(params)
    except ParamError as exc:
        raise CardRefused(f"This run is too large to re-simulate for a card: {exc}") from None


def _predicted(params: Mapping[str, Any]) -> dict[str, Any]:
    return labs_api.prediction(params)


@dataclass(frozen=True)
class _Answer:
    value: float  # summary units
    origin: str
    spread: float | None  # max distance over other seeds, summary units


def _sweep_answer(run: RunData, key: str) -> tuple[Any, _Answer | None]:
    """The neighbouring point of the learner's own sweep, and its measurement if it has one."""
    sweep = run.sweep
    assert sweep is not None and run.sweep_index is not None
    if len(sweep.values) < 2:
        raise CardRefused("A sweep of one value has no neighbouring setting to ask about.")
    index = run.sweep_index + 1 if run.sweep_index + 1 < len(sweep.values) else run.sweep_index - 1
    value = sweep.values[index]
    point = labs_api.finished_points(sweep).get(index)
    measured = labs_api.dig(point.result, key) if point else None
    if point is None or not isinstance(measured, int | float):
        return value, None
    where = labs_api.short_where_label(point.where)
    return value, _Answer(float(measured), f"your sweep's run #{point.pk} ({where})", None)


def _answer(
    run: RunData,
    field: str,
    neighbour: Any,
    key: str,
    known: _Answer | None,
    until: float | None = None,
) -> _Answer:
    params = {**run.params, field: neighbour}
    try:
        labs_api.checked_params(params)
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
    values = _simulate(params, key, [seed + i for i in range(NOISE_SEEDS + 1)], until)
    spread = max(abs(v - values[0]) for v in values)
    if known is not None:
        return _Answer(known.value, known.origin, spread)
    return _Answer(values[0], "simulated with the same workload and seed", spread)


@dataclass(frozen=True)
class _Content:
    prompt: str
    answer: str
    steps: list[str]
    explanation: str
    value: float  # in the figure's unit, as written on the card
    tolerance: float


def _predictor_steps(
    here: Mapping[str, Any], there: Mapping[str, Any], current: Any, neighbour: Any
) -> list[str]:
    steps = []
    for name, label, factor, decimals in (
        ("running_seqs", "sequences in a step", 1, 0),
        (
            "decode_step_s",
            "decode step (weights + the batch's KV read, over bandwidth), ms",
            1000,
            2,
        ),
    ):
        a, b = here.get(name), there.get(name)
        if isinstance(a, int | float) and isinstance(b, int | float):
            steps.append(
                f"Predictor, {label}: {_fmt(a * factor, decimals)} at {current} → "
                f"{_fmt(b * factor, decimals)} at {neighbour}."
            )
    return steps


def _predicted_pair(
    here: Mapping[str, Any], there: Mapping[str, Any], key: str | None
) -> tuple[float, float] | None:
    """The predictor's figure at both settings, if it has one to scale by (positive here)."""
    before, after = (here.get(key), there.get(key)) if key else (None, None)
    if isinstance(before, int | float) and isinstance(after, int | float) and before > 0:
        return before, after
    return None


def _content(
    run: RunData, field: str, neighbour: Any, figure: Figure, measured: float, answer: _Answer
) -> _Content:
    """The card's words and numbers. The graded answer is what the worked method computes (your
    measurement scaled by the predictor's ratio between the two settings), written with the
    numbers the steps show; what the run measured at the neighbour is shown beside it. Without a
    predicted ratio the method is the measurement itself."""
    params, scale, unit = run.params, figure.scale, figure.unit
    current = params.get(field)
    label = _phrase(figure.label)
    here = _predicted(params)
    there = _predicted({**params, field: neighbour})
    predicted = _predicted_pair(here, there, figure.predicted_key)
    ratio = round(predicted[1] / predicted[0], 3) if predicted is not None else None
    observed = answer.value * scale
    decimals = _decimals((measured * ratio if ratio else answer.value) * scale)
    mine = round(measured * scale, decimals)
    value = round(mine * ratio, decimals) if ratio is not None else round(observed, decimals)

    steps = [
        f"Your run #{run.pk} at {field} {current}: {figure.label} = {_fmt(mine, decimals)} {unit}."
    ]
    steps += _predictor_steps(here, there, current, neighbour)
    if predicted is not None:
        before, after = predicted
        p_decimals = _decimals(after * scale)
        steps += [
            f"Predicted {label}: {_fmt(before * scale, p_decimals)} at {current} → "
            f"{_fmt(after * scale, p_decimals)} {unit} at {neighbour}, a ratio of {ratio:.3f}.",
            f"Scale your measurement by it: {_fmt(mine, decimals)} × {ratio:.3f} = "
            f"{_fmt(value, decimals)} {unit}.",
        ]
        method = f"your measurement × the predictor's ratio ({ratio:.3f})"
    else:
        steps.append(
            f"The predictor has no {label} to scale by: at {field} {neighbour}, {answer.origin}: "
            f"{_fmt(value, decimals)} {unit}."
        )
        method = answer.origin
    gap = abs(observed - value)
    noise = (answer.spread or 0.0) * scale * 2
    covers_run = gap <= MAX_RELATIVE_TOLERANCE * abs(value)
    tolerance = _round_up(
        max(noise, abs(value) * MIN_RELATIVE_TOLERANCE, gap if covers_run else 0.0)
    )
    # Two significant figures of the tolerance at least, so "± 0.94" is not written "± 0.9".
    tolerance_decimals = max(decimals, 1 - math.floor(math.log10(tolerance)) if tolerance else 0)
    measured_words = (
        f"What the run measured: at {field} {neighbour}, {answer.origin}, "
        f"{_fmt(observed, decimals)} {unit}"
    )
    if ratio is not None:
        change = (observed - value) / value if value else 0.0
        measured_words += (
            f" ({change:+.0%} from the method: queueing, batching and preemption are what the "
            "closed form leaves out)"
        )
    reasons = [f"the metric's spread over {NOISE_SEEDS} other simulator seeds (x2)"]
    if covers_run and gap > 0:
        reasons.append("what the run measured")
    if not covers_run:
        measured_words += (
            f"; more than {MAX_RELATIVE_TOLERANCE:.0%} from the method, so typing it is graded "
            "wrong: the closed form misses what this setting changes"
        )
    explanation = (
        f"{measured_words}. Answers within ± {_fmt(tolerance, tolerance_decimals)} {unit} of "
        f"{_fmt(value, decimals)} count: at least {MIN_RELATIVE_TOLERANCE:.0%}, and wide enough "
        f"for {' and '.join(reasons)}."
    )
    where = labs_api.short_where_label(run.where) or run.backend
    # The first line is the card's title in lists: the run and the two settings tell one
    # learner's cards of the same lab apart.
    prompt = (
        f"Run #{run.pk} at {field} {current}: predict the {label} at {field} {neighbour}.\n\n"
        f"Your run: {_hardware(params)}, {field} {current}; workload: {_workload(params)}. "
        f"It measured {label} = {_fmt(mine, decimals)} {unit} ({where}). "
        "Everything else stays the same."
    )
    return _Content(
        prompt=prompt,
        answer=f"≈ {_fmt(value, decimals)} {unit} at {field} {neighbour} ({method}).",
        steps=steps,
        explanation=explanation,
        value=value,
        tolerance=tolerance,
    )


def _slug(user: AbstractBaseUser, run: RunData) -> str:
    return f"mine-{user.pk}-run-{run.pk}"


def card_from_run(*, user: AbstractBaseUser, run: RunData, until: float | None = None) -> Card:
    """Make (or return, reactivated) the learner's personal card for a finished run. It simulates:
    the lab worker calls it (`card_request_execute`), never a web request. `until`: a
    time.monotonic() deadline for its simulations (SoftTimeLimitExceeded past it).

    Raises:
        CardRefused: the run is not the learner's, not finished, measured nothing the card can
            ask about, or is too large to re-simulate.
    """
    _check_makeable(user, run)
    slug = _slug(user, run)
    existing = Card.objects.filter(slug=slug, owner=user).first()
    if existing is not None:
        if not existing.is_active:
            existing.is_active = True
            existing.save(update_fields=["is_active", "updated_at"])
        return existing

    lab = labs_api.lab_of(run)
    key, predicted_key = lab.sweep_metrics[0]
    figure = figure_for(key, predicted_key)
    measured = labs_api.dig(run.result, key)
    if not isinstance(measured, int | float):
        raise CardRefused(f"This run measured no {figure.label}.")
    if run.sweep is not None:
        field = run.sweep.field
        neighbour, known = _sweep_answer(run, key)
    else:
        field = lab.sweep_field
        neighbour, known = _neighbour_from_lab(lab, field, run.params), None
    answer = _answer(run, field, neighbour, key, known, until)
    content = _content(run, field, neighbour, figure, float(measured), answer)

    deck, _ = Deck.objects.get_or_create(
        slug=PERSONAL_DECK,
        defaults={"title": "Your runs", "description": "Cards made from your own lab runs."},
    )
    try:
        # A second press of the button can race this one to the unique slug.
        with transaction.atomic():
            return Card.objects.create(
                owner=user,
                deck=deck,
                slug=slug,
                kind=Card.Kind.NUMERIC,
                prompt=content.prompt,
                answer=content.answer,
                steps=content.steps,
                explanation=content.explanation,
                numeric_value=content.value,
                numeric_unit=figure.unit,
                numeric_tolerance=content.tolerance,
                source=f"lab run {run.pk}",
            )
    except IntegrityError:
        return Card.objects.get(slug=slug, owner=user)


# -- making it on the lab worker -----------------------------------------------------------------

# A request still running this long after a worker claimed it lost that worker: it no longer
# holds the learner's lock.
CARD_REQUEST_STALE = dt.timedelta(seconds=CARD_SOFT_TIME_LIMIT_S + 180)
# A request still queued this long after it was made lost its message: it waits its turn behind
# other learners' work (one turn each, labs/runs/turns.py), which takes minutes, not hours.
CARD_QUEUED_STALE = dt.timedelta(hours=6)


def _stale(now: dt.datetime) -> Q:
    """Card requests in flight that lost their worker or their message."""
    running = Q(state=PersonalCardRequest.State.RUNNING) & (
        Q(started_at__lt=now - CARD_REQUEST_STALE)
        | Q(started_at__isnull=True, created_at__lt=now - CARD_REQUEST_STALE)
    )
    queued = Q(state=PersonalCardRequest.State.QUEUED, created_at__lt=now - CARD_QUEUED_STALE)
    return running | queued


def _check_makeable(user: AbstractBaseUser, run: RunData) -> None:
    if run.owner_id != user.pk:
        raise CardRefused("Only the learner who ran it can make a card from a run.")
    if not run.finished or not run.result:
        raise CardRefused("Only a finished run can become a card.")


def _enqueue(request_id: int) -> None:
    # A turn on the lab worker's queue, which takes whoever's work is next in turn
    # (labs.runs.turns): this card, or a run, as this card may be taken by an earlier turn.
    try:
        labs_api.send_turn(labs_api.sim_queue(), for_what=f"card request {request_id}")
    except Exception as exc:  # noqa: BLE001 - any broker failure: the row must not wait forever
        logger.warning("could not send card request %s: %r", request_id, exc)
        _finish(request_id, error="The lab queue is unavailable right now; try again in a minute.")


def _finish(request_id: int, *, error: str = "", card: Card | None = None) -> None:
    PersonalCardRequest.objects.filter(
        pk=request_id, state__in=PersonalCardRequest.IN_FLIGHT
    ).update(
        state=PersonalCardRequest.State.FAILED if error else PersonalCardRequest.State.DONE,
        error=error,
        card=card,
        finished_at=timezone.now(),
    )


def _release_stale(user: AbstractBaseUser) -> None:
    """A request that lost its worker or its message (`_stale`): fail it, which frees the
    learner's lock and ends the page's wait."""
    now = timezone.now()
    state = PersonalCardRequest.State
    why = {
        state.RUNNING: "The lab worker stopped before the card was made",
        state.QUEUED: "The lab queue lost this request before a worker took it",
    }
    for in_flight, reason in why.items():
        PersonalCardRequest.objects.filter(_stale(now), owner=user, state=in_flight).update(
            state=state.FAILED,
            error=f"{reason}; make it again.",
            finished_at=now,
        )


def card_request(*, user: AbstractBaseUser, run: RunData) -> PersonalCardRequest:
    """Queue the making of a card from `run` on the lab worker; nothing is simulated here.

    A card already made from the run is returned at once (reactivated), as a finished request.

    Raises:
        CardRefused: not the learner's finished run, too large to re-simulate, no lab worker
            online, or another card of this learner is still being made (one at a time).
    """
    _check_makeable(user, run)
    existing = Card.objects.filter(slug=_slug(user, run), owner=user).first()
    if existing is not None:
        if not existing.is_active:
            existing.is_active = True
            existing.save(update_fields=["is_active", "updated_at"])
        return PersonalCardRequest.objects.create(
            owner=user,
            run_id=run.pk,
            state=PersonalCardRequest.State.DONE,
            card=existing,
            finished_at=timezone.now(),
        )
    simulated = _to_simulate(run)
    if simulated is not None:
        _check_bounded(simulated)
        _check_fits_worker(simulated)
    if not labs_api.sim_worker_online():
        raise CardRefused(
            "No lab worker is online right now, so the card was not queued. Try again in a "
            "minute; the site's staff have been told how to start one."
        )
    _release_stale(user)
    try:
        with transaction.atomic():
            # Counted with the learner's runs: their quota, their share of the simulator queue
            # and its cap, as a run is; refused the same way, before anything is written.
            try:
                labs_api.sim_work_check(owner=user)
            except labs_api.RunRefused as exc:
                raise CardRefused(f"{exc} A card being made counts as a run.") from None
            request = PersonalCardRequest.objects.create(owner=user, run_id=run.pk)
    except IntegrityError:
        busy = PersonalCardRequest.objects.filter(
            owner=user, state__in=PersonalCardRequest.IN_FLIGHT
        ).first()
        which = f" (from run #{busy.run_id})" if busy else ""
        raise CardRefused(
            f"You are already making a card{which}; cards are made one at a time. Wait until "
            "it is ready on My cards, then make this one."
        ) from None
    transaction.on_commit(lambda: _enqueue(request.pk))
    return request


def card_request_execute(*, request_id: int) -> str:
    """The worker's side: claim the request, make the card, record the card or the reason."""
    if not _card_claim(request_id, ""):
        return f"card request {request_id} not claimed"
    return _card_make(request_id)


def _card_claim(request_id: int, _hostname: str) -> bool:
    return bool(
        PersonalCardRequest.objects.filter(
            pk=request_id, state=PersonalCardRequest.State.QUEUED
        ).update(state=PersonalCardRequest.State.RUNNING, started_at=timezone.now())
    )


def _card_make(request_id: int, _hostname: str = "") -> str:
    """Make the card of a request this worker claimed; record the card or the reason."""
    # The turn it runs in has a lab run's longer time limits; the card keeps to its own.
    until = time.monotonic() + CARD_SOFT_TIME_LIMIT_S
    request = PersonalCardRequest.objects.select_related("owner").get(pk=request_id)
    try:
        card = card_from_run(user=request.owner, run=labs_api.run_data(request.run_id), until=until)
    except CardRefused as exc:
        _finish(request_id, error=str(exc))
        return f"card request {request_id} refused"
    except SoftTimeLimitExceeded:
        _finish(
            request_id,
            error=f"Making this card took longer than {CARD_SOFT_TIME_LIMIT_S} s, so it was "
            "stopped. Make a card from a run with fewer num_prompts.",
        )
        return f"card request {request_id} timed out"
    except MemoryError:
        _finish(
            request_id,
            error="Making this card needed more memory than a lab run may use, so it was "
            "stopped. Make a card from a run with fewer num_prompts.",
        )
        return f"card request {request_id} out of memory"
    _finish(request_id, card=card)
    return f"card request {request_id} made card {card.pk}"


def card_request_fail(*, request_id: int, error: str) -> None:
    """What escaped making the card (a lost database connection, say), recorded."""
    _finish(request_id, error=error)


def _cards_waiting(queue: str) -> list[labs_api.Waiting]:
    if queue != labs_api.sim_queue():
        return []
    return [
        labs_api.Waiting(owner_id=owner_id, pk=pk, created_at=created_at)
        for owner_id, pk, created_at in PersonalCardRequest.objects.filter(
            state=PersonalCardRequest.State.QUEUED
        ).values_list("owner_id", "pk", "created_at")
    ]


# Card requests wait on the lab worker's queue and take their turns there with the lab runs
# (registered in QuizConfig.ready through labs' hooks).
CARD_REQUESTS = labs_api.WorkKind(
    name="card request",
    waiting=_cards_waiting,
    claim=_card_claim,
    execute=_card_make,
    fail=lambda request_id, exc: card_request_fail(
        request_id=request_id,
        error=f"The card could not be made ({type(exc).__name__}); make it again.",
    ),
)


@shared_task(name="quiz.card_make", bind=True, ignore_result=True, acks_late=True)
def card_make_task(self: Task, request_id: int) -> str:
    """A message sent before card requests took turns names its request: it is a turn on the lab
    worker's queue now, so requests waiting in the broker across an upgrade are all made."""
    return labs_api.take_turn(queue=labs_api.sim_queue(), hostname=self.request.hostname or "")


def card_request_get(*, user: AbstractBaseUser, pk: int) -> PersonalCardRequest:
    """Raises PersonalCardRequest.DoesNotExist for a request that is not this learner's."""
    _release_stale(user)
    return PersonalCardRequest.objects.select_related("card").get(pk=pk, owner=user)


def sweep_card_run(sweep: SweepData) -> RunData:
    """The sweep point a card asks from: the first finished one whose neighbour finished too."""
    done = labs_api.finished_points(sweep)
    for index in sorted(done):
        if index + 1 in done:
            return done[index]
    raise CardRefused("A card needs two neighbouring points of the sweep to have finished.")


def card_retire(*, user: AbstractBaseUser, slug: str) -> bool:
    """Retire one of the learner's own personal cards (its history is kept)."""
    return bool(Card.objects.filter(slug=slug, owner=user).update(is_active=False))


# -- your numbers on the deck's cards ------------------------------------------------------------


def your_number(*, user_id: int | None, card: Card) -> labs_api.YourNumber | None:
    """The newest finished run of the card's preset by this learner, and the figure it measured
    that matches the card's check (else the lab's headline metric). One query."""
    if not card.lab_preset or user_id is None:
        return None
    check = card.check_spec or {}
    return labs_api.your_number(
        user_id=user_id,
        preset=card.lab_preset,
        check_key=str(check.get("key") or ""),
        numeric_card=card.kind == Card.Kind.NUMERIC,
    )


# -- when the learner's cards come ---------------------------------------------------------------


@dataclass(frozen=True)
class Coming:
    """One of the learner's personal cards and when it is next shown."""

    card: Card
    is_new: bool
    today: bool
    when: str  # "today", "Thu 3 Dec, from 04:00", "suspended", ...
    # A new card waiting for a later day: the learner's daily limit it waits behind.
    new_per_day: int | None = None

    @property
    def question(self) -> str:
        """What the card asks ("Predict the output tokens/s at max_num_seqs 128, ..."), which
        the prompt ends with after the run's numbers."""
        start = self.card.prompt.rfind("Predict ")
        return self.card.prompt[start:] if start >= 0 else self.card.prompt


def _day_words(instant: dt.datetime, zone: Any, *, hour: bool) -> str:
    local = instant.astimezone(zone)
    text = f"{local:%a} {local.day} {local:%b %Y}"
    return f"{text}, from {local:%H:%M}" if hour else text


def my_cards(*, user: AbstractBaseUser, now: dt.datetime) -> list[Coming]:
    """The learner's active personal cards, newest first, each with when it comes next.

    New cards come in the quiz's order (the learner's own before the deck's, oldest first), as
    many a day as the learner's new-cards-per-day limit allows: those that fit in what is left of
    today come today, the rest on the days the limit reaches them (if the learner studies daily).
    """
    from quiz import scheduling, selectors
    from quiz.models import ReviewState

    settings = selectors.learner_settings_get(user=user)
    queue = selectors.queue_today(user=user, now=now, settings=settings, pick_next=False)
    day = queue.day
    cards = list(Card.objects.filter(owner=user, is_active=True).order_by("id"))
    states = {
        state.card_id: state
        for state in ReviewState.objects.filter(user=user, card__owner=user, card__is_active=True)
    }
    found = []
    position = 0  # among the learner's new cards, in the order the quiz takes them
    for card in cards:
        state = states.get(card.pk)
        if state is not None and state.suspended:
            found.append(Coming(card, state.is_new, False, "suspended"))
        elif state is None or state.is_new:
            found.append(_new_coming(card, position, queue, settings, day))
            position += 1
        elif state.due < day.end:
            found.append(Coming(card, False, True, "today"))
        else:
            local_day = scheduling.study_date(state.due, day.tz, day.rollover_hour)
            starts = scheduling.day_start(local_day, day.tz, day.rollover_hour)
            found.append(Coming(card, False, False, _day_words(starts, day.tz, hour=False)))
    return found[::-1]


def _new_coming(card: Card, position: int, queue: Any, settings: Any, day: Any) -> Coming:
    from quiz import scheduling

    if position < queue.new_left:
        return Coming(card, True, True, "today")
    per_day = settings.new_per_day
    if per_day <= 0:
        return Coming(card, True, False, "when you allow new cards (your limit is 0 a day)", 0)
    days_later = 1 + (position - queue.new_left) // per_day
    starts = scheduling.day_start(
        day.date + dt.timedelta(days=days_later), day.tz, day.rollover_hour
    )
    return Coming(card, True, False, _day_words(starts, day.tz, hour=True), per_day)


def made_message(*, user: AbstractBaseUser, card: Card, now: dt.datetime) -> str:
    """What the made-card message says about when the card comes: the truth, from `my_cards`."""
    coming = next((c for c in my_cards(user=user, now=now) if c.card.pk == card.pk), None)
    if coming is None:
        return "It is retired, so it will not come."
    if coming.today:
        return (
            "It comes today, before the deck's new cards." if coming.is_new else "It is due today."
        )
    if coming.new_per_day == 0:
        return f"It comes {coming.when}."
    if coming.new_per_day is not None:
        return (
            f"No new card is left for it today (your limit is {coming.new_per_day} a day), so "
            f"it comes on {coming.when}, when new cards are next available."
        )
    if coming.when == "suspended":
        return "It is suspended: unsuspend it on its page to study it."
    return f"It comes on {coming.when}."


def work_in_flight(user_id: int | None) -> tuple[int, int]:
    """The learner's (None: everyone's) card requests and parameter fits queued or running, for
    labs' caps (labs/hooks.py). A card request that lost its worker or its message (`_stale`)
    is not counted."""
    cards = PersonalCardRequest.objects.filter(state__in=PersonalCardRequest.IN_FLIGHT).exclude(
        _stale(timezone.now())
    )
    fits = ParameterFit.objects.filter(
        status__in=(ParameterFit.Status.QUEUED, ParameterFit.Status.RUNNING)
    )
    if user_id is not None:
        cards, fits = cards.filter(owner_id=user_id), fits.filter(user_id=user_id)
    return cards.count(), fits.count()
