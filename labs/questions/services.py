"""Lab questions at work: commit a prediction and run, grade it once the runs are done and hand
the grade to the quiz, simulate the questions' points ahead of time on the lab worker, and grade
what the quiz asks against those simulations.

Grading is a conditional UPDATE on the prediction's state (waiting -> graded), so the worker that
finished the run and a page showing it can both try, and one grades. The grade goes to the quiz
once (`reported_at` claimed the same way) through labs.hooks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Mapping
from datetime import timedelta
from functools import lru_cache
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from labs import hooks
from labs.backends import get_backend
from labs.explanation.results import derived_predictions, format_value
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState
from labs.parameters.params import ParamError, parse_lab_params
from labs.questions import bands
from labs.questions.content import question_of
from labs.questions.figures import FIGURES, Figure
from labs.questions.models import LabQuestion, Prediction, QuestionSimulation
from labs.questions.spec import Question, QuestionError, baseline_params, setting_words
from labs.runs import queueing, submission, turns
from labs.runs.selectors import device_prediction, lab_calibration

logger = logging.getLogger(__name__)

# A value a learner may commit: positive and finite, at most this.
MAX_VALUE = 1e12
# A question's simulation holds itself to this, well inside the lab worker's turn (its points
# are checked at load to take at most labs.questions.spec.MAX_SIM_STEPS steps).
SIM_SOFT_TIME_LIMIT_S = 60
# A simulation that failed is tried again when asked for after this long; one running this long
# lost its worker, one queued this long lost its message.
RETRY_FAILED = timedelta(hours=1)
RUNNING_STALE = timedelta(seconds=SIM_SOFT_TIME_LIMIT_S + 180)
QUEUED_STALE = timedelta(hours=6)


class PredictionRefused(ValueError):
    """The figure cannot be committed; the message says why, for the learner."""


# -- questions ---------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _checked(slug: str, data_json: str) -> Question:
    row = LabQuestion(slug=slug)
    data = json.loads(data_json)
    for name in ("lab", "title", "figure", "topic", "preset", "varies", "prompt"):
        setattr(row, name, data[name])
    row.settings_json = json.dumps(data["settings"], ensure_ascii=False)
    row.neighbours_json = json.dumps(data["neighbours"], ensure_ascii=False)
    return question_of(row)


def checked(row: LabQuestion) -> Question | None:
    """The row as a checked question, kept per content (checking resolves every point); None
    (logged) for a row no file could hold."""
    try:
        return _checked(row.slug, json.dumps(row.data(), ensure_ascii=False, sort_keys=True))
    except QuestionError as exc:
        logger.error("lab question %s cannot be asked: %s", row.slug, exc)
        return None


def question_get(slug: str) -> Question | None:
    row = LabQuestion.objects.filter(slug=slug, is_active=True).first()
    return None if row is None else checked(row)


def questions_for_lab(lab: str) -> list[Question]:
    rows = LabQuestion.objects.filter(lab=lab, is_active=True).order_by("slug")
    return [q for q in map(checked, rows) if q is not None]


def question_for_preset(preset: str) -> Question | None:
    if not preset:
        return None
    row = LabQuestion.objects.filter(preset=preset, is_active=True).order_by("slug").first()
    return None if row is None else checked(row)


def varied_value(question: Question, at: int) -> Any:
    """The value of the setting the neighbours vary (the first one a neighbour changes) at point
    `at`, for the instincts page's "at large batch"."""
    for neighbour in question.neighbours:
        for name in neighbour:
            return question.points[at].get(name)
    return None


# -- commit and run ----------------------------------------------------------------------------


def check_value(raw: object) -> float:
    """The learner's figure, or PredictionRefused saying what is allowed."""
    text = str(raw or "").strip().replace(",", "").replace("\u2212", "-").rstrip("×x%")
    try:
        value = float(text)
    except ValueError:
        raise PredictionRefused(
            f"Your prediction must be a number, such as 1200 or 3.5; got {str(raw)[:30]!r}."
        ) from None
    if not math.isfinite(value) or not 0 < value <= MAX_VALUE:
        raise PredictionRefused(
            f"Your prediction must be a positive number up to {MAX_VALUE:,.0f}; got {text[:30]}."
        )
    return value


def prediction_request(
    *, owner: Any, question: Question, at: int, value: float, backend: str
) -> Prediction:
    """Commit `value` for point `at` of `question` and queue its run (and a ratio's baseline run)
    in one transaction: nothing is saved if a run is refused.

    Raises:
        ParamError: the point cannot run on `backend`.
        submission.RunRefused: it cannot run now (no worker, quota, queue full).
    """
    params = question.points[at]
    base = baseline_params(question, at)
    made: list[Prediction] = []

    def save_prediction(runs: list[LabRun]) -> None:
        made.append(
            Prediction.objects.create(
                owner=owner,
                question=question.slug,
                topic=question.topic,
                figure=question.figure,
                at=at,
                changed=question.changed(at),
                varies=varied_value(question, at),
                value=value,
                run=runs[0],
                baseline=runs[1] if base is not None else None,
            )
        )

    submission.runs_request(
        owner=owner,
        lab=question.lab,
        backend=backend,
        datas=[params, *([base] if base is not None else [])],
        preset=question.preset,
        then=save_prediction,
    )
    return made[0]


# -- grading -----------------------------------------------------------------------------------


def formulas_figure(
    figure: Figure, predicted: Mapping[str, Any], params: Mapping[str, Any]
) -> float | None:
    if figure.predicted is None:
        return None
    return figure.of(derived_predictions(predicted, params), figure.predicted)


def _ratio_of(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def _repeats(figure: Figure, run: LabRun) -> list[float]:
    """The figure from every finished run of the same settings on the same device as `run`
    (its own included): a real engine's run-to-run spread."""
    others = LabRun.objects.filter(
        backend=run.backend, where=run.where, lab=run.lab, state=RunState.DONE
    ).order_by("-id")[:200]
    values = (figure.of(other.result) for other in others if other.params == run.params)
    return [v for v in values if v is not None]


def _void(prediction: Prediction, why: str) -> None:
    Prediction.objects.filter(pk=prediction.pk, state=Prediction.State.WAITING).update(
        state=Prediction.State.VOID, error=why[:400], graded_at=timezone.now()
    )


def prediction_grade(prediction: Prediction) -> Prediction:
    """Grade a prediction made before a run once its runs are done (void if one failed), hand
    the grade to the quiz and have the question's points simulated for it. Returns it as it
    stands; a prediction still waiting, or graded already, is returned as it is."""
    if prediction.state != Prediction.State.WAITING or prediction.source != Prediction.Source.LAB:
        return prediction
    runs = [r for r in (prediction.run, prediction.baseline) if r is not None]
    figure = FIGURES.get(prediction.figure)
    if figure is None or not runs or (figure.ratio is not None and len(runs) < 2):
        _void(prediction, "Its run was deleted.")
    elif any(r.state in (RunState.FAILED, RunState.CANCELLED) for r in runs):
        _void(prediction, "A run it waited for did not finish, so it was not graded.")
    elif all(r.state == RunState.DONE for r in runs):
        _grade_runs(prediction, figure, runs)
    prediction.refresh_from_db()
    if prediction.state == Prediction.State.GRADED:
        prediction_report(prediction)
        question = question_get(prediction.question)
        if question is not None:
            simulations_ensure(question, requested_by=prediction.owner)
    return prediction


def _grade_runs(prediction: Prediction, figure: Figure, runs: list[LabRun]) -> None:
    run = runs[0]
    measured = figure.of(run.result)
    formulas = formulas_figure(figure, run.predicted, run.params)
    if figure.ratio is not None:
        base = runs[1]
        measured = _ratio_of(measured, figure.of(base.result))
        formulas = _ratio_of(formulas, formulas_figure(figure, base.predicted, base.params))
    if measured is None or measured <= 0:
        _void(prediction, f"The run measured no {figure.label}.")
        return
    band = bands.expected_band(figure, run.params, run.backend, _repeats(figure, run))
    grade = bands.grade(prediction.value, measured, band, count=figure.unit == "sequences")
    Prediction.objects.filter(pk=prediction.pk, state=Prediction.State.WAITING).update(
        state=Prediction.State.GRADED,
        measured=measured,
        formulas=formulas,
        band=band.relative,
        band_words=band.words[:300],
        rating=grade.rating,
        grade_words=grade.words[:400],
        where=run.where[:200],
        graded_at=timezone.now(),
    )


def figure_text(figure: Figure, value: float | None) -> str:
    """A figure as the pages write it, in its unit: '5.2×', '1,240 tok/s', '310 ms'."""
    if value is None:
        return "—"
    if figure.unit == "×":
        return f"{value:.3g}×"
    if figure.unit == "s":
        return format_value(value, "s")
    text = format_value(value, "")
    return f"{text} {figure.unit}"


def prediction_report(prediction: Prediction) -> bool:
    """Hand a graded prediction to the quiz (a review of the question), once: the claim on
    `reported_at` is taken back if the quiz failed, so a later call tries again."""
    claimed = Prediction.objects.filter(
        pk=prediction.pk, state=Prediction.State.GRADED, reported_at__isnull=True
    ).update(reported_at=timezone.now())
    if not claimed:
        return False
    question = question_get(prediction.question)
    figure = FIGURES[prediction.figure]
    data = {
        "prediction": prediction.pk,
        "user_id": prediction.owner_id,
        "question": prediction.question,
        "title": question.title if question else prediction.question,
        "rating": prediction.rating,
        "answer": figure_text(figure, prediction.value),
        "measured": figure_text(figure, prediction.measured),
        "graded_at": prediction.graded_at,
    }
    try:
        hooks.prediction_graded(data)
    except Exception:
        Prediction.objects.filter(pk=prediction.pk).update(reported_at=None)
        logger.exception("the quiz did not take the grade of prediction %s", prediction.pk)
        return False
    return True


def on_run_finished(sender: object, run_id: int, **_: object) -> None:
    """labs.runs.events.run_finished: grade the predictions that waited for this run."""
    waiting = Prediction.objects.filter(
        Q(run_id=run_id) | Q(baseline_id=run_id), state=Prediction.State.WAITING
    ).select_related("run", "baseline", "owner")
    for prediction in waiting:
        prediction_grade(prediction)


# -- simulations of a question's points, ahead of time -----------------------------------------


def simulation_key(question: Question, at: int) -> str:
    """What a stored simulation depends on: the figure and the settings (and baseline) run."""
    data = [question.figure, question.points[at], baseline_params(question, at)]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _needs_queueing(sim: QuestionSimulation, now: Any) -> bool:
    if sim.state == QuestionSimulation.State.FAILED:
        return sim.finished_at is None or sim.finished_at < now - RETRY_FAILED
    if sim.state == QuestionSimulation.State.RUNNING:
        return sim.started_at is None or sim.started_at < now - RUNNING_STALE
    if sim.state == QuestionSimulation.State.QUEUED:
        return sim.created_at < now - QUEUED_STALE
    return False


def simulations_ensure(question: Question, *, requested_by: Any) -> int:
    """Queue on the lab worker the simulation of every point of `question` not stored yet (or
    failed an hour ago, or lost): the quiz grades its asks against them. Returns how many were
    queued; a turn is sent for each after the transaction commits."""
    now = timezone.now()
    queued = 0
    for at in range(len(question.points)):
        key = simulation_key(question, at)
        try:
            with transaction.atomic():
                sim, created = QuestionSimulation.objects.get_or_create(
                    question=question.slug,
                    key=key,
                    defaults={
                        "at": at,
                        "params": question.points[at],
                        "baseline": baseline_params(question, at),
                        "requested_by": requested_by,
                    },
                )
        except IntegrityError:  # made by another request meanwhile
            continue
        if not created:
            if not _needs_queueing(sim, now):
                continue
            again = QuestionSimulation.objects.filter(pk=sim.pk, state=sim.state).update(
                state=QuestionSimulation.State.QUEUED,
                created_at=now,
                started_at=None,
                error="",
                requested_by=requested_by,
            )
            if not again:
                continue
        queued += 1
    if queued:
        queue = queueing.backend_queue("sim")
        transaction.on_commit(lambda: _send_turns(queue, queued, question.slug))
    return queued


def _send_turns(queue: str, count: int, slug: str) -> None:
    try:
        queueing.send_turns([queue] * count, for_what=f"question {slug}'s simulations")
    except queueing.QueueUnavailable:
        # Queued rows with no turn: the next ask finds them stale after QUEUED_STALE and sends
        # one again; meanwhile the quiz asks against the learner's own run.
        logger.warning("no turns sent for question %s's simulations", slug)


def _sims_waiting(queue: str) -> list[turns.Waiting]:
    if queue != queueing.backend_queue("sim"):
        return []
    rows = QuestionSimulation.objects.filter(state=QuestionSimulation.State.QUEUED)
    return [
        turns.Waiting(owner_id=owner_id, pk=pk, created_at=created_at)
        for owner_id, pk, created_at in rows.values_list("requested_by_id", "pk", "created_at")
    ]


def _sim_claim(pk: int, _hostname: str) -> bool:
    return bool(
        QuestionSimulation.objects.filter(pk=pk, state=QuestionSimulation.State.QUEUED).update(
            state=QuestionSimulation.State.RUNNING, started_at=timezone.now()
        )
    )


def _simulate(values: Mapping[str, Any], until: float) -> tuple[dict[str, Any], str]:
    """One simulation as a lab run on the simulator makes it (with the device's calibration),
    held to the `until` deadline: its summary and where it ran."""
    params = parse_lab_params(values)
    backend = get_backend(
        "sim", max_run_mb=settings.LABS_SIM_MAX_RUN_MB, device=lab_calibration(params)
    )

    def on_progress(fraction: float, phase: object = None) -> None:
        if time.monotonic() > until:
            raise SoftTimeLimitExceeded("the simulation passed its deadline")

    record = backend.run(params, on_progress)
    return summarize(record), str(record.where)


def _sim_finish(pk: int, *, error: str = "", **values: Any) -> None:
    QuestionSimulation.objects.filter(pk=pk, state=QuestionSimulation.State.RUNNING).update(
        state=QuestionSimulation.State.FAILED if error else QuestionSimulation.State.DONE,
        error=error,
        finished_at=timezone.now(),
        **values,
    )


def _sim_execute(pk: int, _hostname: str = "") -> str:
    """Simulate a claimed point (and a ratio's baseline): the figure, the formulas' and the
    band the quiz grades within."""
    until = time.monotonic() + SIM_SOFT_TIME_LIMIT_S
    sim = QuestionSimulation.objects.get(pk=pk)
    question = question_get(sim.question)
    figure = FIGURES.get(question.figure) if question else None
    if figure is None:
        _sim_finish(pk, error="The question was retired or changed.")
        return f"question simulation {pk} dropped"
    try:
        summary, where = _simulate(sim.params, until)
        measured = figure.of(summary)
        formulas = formulas_figure(
            figure, device_prediction(parse_lab_params(sim.params)), sim.params
        )
        if sim.baseline is not None:
            base, _ = _simulate(sim.baseline, until)
            measured = _ratio_of(measured, figure.of(base))
            base_formulas = device_prediction(parse_lab_params(sim.baseline))
            formulas = _ratio_of(formulas, formulas_figure(figure, base_formulas, sim.baseline))
    except (ParamError, MemoryError, SoftTimeLimitExceeded) as exc:
        _sim_finish(pk, error=f"{type(exc).__name__}: {exc}"[:2000])
        return f"question simulation {pk} failed"
    if measured is None or measured <= 0:
        _sim_finish(pk, error=f"The simulation measured no {figure.label}.")
        return f"question simulation {pk} measured nothing"
    band = bands.expected_band(figure, sim.params, "sim")
    _sim_finish(
        pk,
        measured=measured,
        formulas=formulas,
        band=band.relative,
        band_words=band.words[:300],
        where=where[:200],
    )
    return f"question simulation {pk} done"


QUESTION_SIMULATIONS = turns.WorkKind(
    name="question simulation",
    waiting=_sims_waiting,
    claim=_sim_claim,
    execute=_sim_execute,
    fail=lambda pk, exc: _sim_finish(pk, error=f"{type(exc).__name__}: {exc}"[:2000]),
)


# -- what the quiz asks --------------------------------------------------------------------------


def _ready(question: Question) -> dict[int, QuestionSimulation]:
    keys = {simulation_key(question, at): at for at in range(len(question.points))}
    done = QuestionSimulation.objects.filter(
        question=question.slug, key__in=keys, state=QuestionSimulation.State.DONE
    )
    return {keys[sim.key]: sim for sim in done}


def ask(*, question: Question, user_id: int, turn: int) -> dict[str, Any] | None:
    """What the quiz asks of a learner who reviews `question` for the `turn`-th time: a
    neighbouring point (in turn) whose simulation is stored, else the learner's own graded run
    of it. Plain data, graded later by `answer` (the quiz keeps it with the showing). None when
    the learner has no graded run of it and nothing is simulated yet."""
    figure = question.the_figure
    ready = _ready(question)
    n = len(question.neighbours)
    order = [1 + (turn + i) % n for i in range(n)] + [0]
    at = next((i for i in order if i in ready), None)
    base: dict[str, Any] = {
        "question": question.slug,
        "title": question.title,
        "lab": question.lab,
        "figure": figure.key,
        "label": figure.label,
        "phrase": figure.phrase,
        "unit": figure.unit,
        "count": figure.unit == "sequences",
    }
    if at is not None:
        sim = ready[at]
        return {
            **base,
            "at": at,
            "changed": setting_words(question.changed(at)),
            "settings": {k: question.points[at].get(k) for k in question.the_lab.fields},
            "measured": sim.measured,
            "formulas": sim.formulas,
            "band": sim.band,
            "band_words": sim.band_words,
            "where": sim.where,
            "simulation": sim.pk,
            "source": "simulation",
        }
    own = (
        Prediction.objects.filter(
            owner_id=user_id,
            question=question.slug,
            source=Prediction.Source.LAB,
            state=Prediction.State.GRADED,
        )
        .order_by("-graded_at", "-id")
        .first()
    )
    if own is None or own.measured is None or own.band is None:
        return None
    # The settings the run had (the question may have been edited since).
    ran = own.run.params if own.run is not None else {}
    return {
        **base,
        "at": own.at,
        "changed": setting_words(own.changed or {}),
        "settings": {k: ran.get(k) for k in question.the_lab.fields},
        "measured": own.measured,
        "formulas": own.formulas,
        "band": own.band,
        "band_words": own.band_words,
        "where": own.where,
        "simulation": None,
        "run": own.run_id,
        "source": "run",
    }


def answer(*, owner: Any, asked: Mapping[str, Any], value: float, token: str) -> bands.Grade:
    """Grade the learner's `value` for what `ask` asked, and keep it with their predictions (one
    per `token`, the quiz's name for the ask: answering it again replaces it)."""
    figure = FIGURES[str(asked["figure"])]
    band = bands.Band(float(asked["band"]), str(asked["band_words"]), "stored")
    measured = float(asked["measured"])
    grade = bands.grade(value, measured, band, count=bool(asked.get("count")))
    question = question_get(str(asked["question"]))
    at = int(asked["at"])
    Prediction.objects.update_or_create(
        owner=owner,
        token=token,
        defaults={
            "question": str(asked["question"]),
            "topic": question.topic if question else "",
            "figure": figure.key,
            "at": at,
            "changed": question.changed(at) if question else {},
            "varies": varied_value(question, at) if question else None,
            "value": value,
            "source": Prediction.Source.QUIZ,
            "state": Prediction.State.GRADED,
            "simulation_id": asked.get("simulation"),
            "run_id": asked.get("run"),
            "measured": measured,
            "formulas": asked.get("formulas"),
            "band": band.relative,
            "band_words": band.words[:300],
            "rating": grade.rating,
            "grade_words": grade.words[:400],
            "where": str(asked.get("where") or "")[:200],
            "graded_at": timezone.now(),
            "reported_at": timezone.now(),  # the quiz grades it itself
        },
    )
    return grade
