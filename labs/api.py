"""What the quiz may use of labs: the one labs module it imports (tests/test_imports.py checks it).

The quiz makes personal cards from a learner's lab runs (quiz/personal.py) and shows a learner's
own measurement beside a deck card's answer; for that it reads runs and sweeps as plain frozen
data (`RunData`, `SweepData`; never a model or a queryset), asks for predictions and simulations,
and words figures as the lab pages do. It asks lab questions again
(quiz/lab_questions.py): what to ask at a neighbouring setting and how an answer grades, as plain
data. Labs never imports the quiz: what it asks of the quiz is registered here
(`answer_for_labs`, from the quiz's AppConfig.ready).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.urls import reverse

from labs import hooks
from labs.backends import get_backend
from labs.explanation import results
from labs.explanation.results import Metric, dig
from labs.explanation.your_number import YourNumber, your_number
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState, Sweep, WorkerHeartbeat
from labs.parameters.params import ParamError, parse_lab_params
from labs.parameters.presets import LABS, Lab
from labs.prediction.sizing import sim_precheck, sim_steps
from labs.questions import content as question_content
from labs.questions import services as questions
from labs.questions.figures import FIGURES
from labs.runs import execution, queueing, selectors, submission, turns
from labs.sim.engine_model import short_where_label

__all__ = [
    "Lab",
    "Metric",
    "ParamError",
    "RunData",
    "SweepData",
    "Waiting",
    "WorkKind",
    "YourNumber",
    "answer_for_labs",
    "checked_params",
    "dig",
    "finished_points",
    "lab_of",
    "metric",
    "prediction",
    "question_answer",
    "question_ask",
    "question_card",
    "question_figure_text",
    "question_url",
    "questions_edited",
    "questions_export",
    "questions_load",
    "questions_read",
    "run_data",
    "run_get_for_owner",
    "send_turn",
    "short_where_label",
    "sim_queue",
    "sim_worker_online",
    "simulate",
    "simulation_fits",
    "simulation_steps",
    "sim_work_check",
    "RunRefused",
    "sweep_data",
    "sweep_get_for_owner",
    "take_turn",
    "your_number",
]

answer_for_labs = hooks.answer
RunRefused = submission.RunRefused
sim_work_check = submission.sim_work_check
Waiting = turns.Waiting
WorkKind = turns.WorkKind


# -- runs and sweeps -----------------------------------------------------------------------------


# The quiz reads runs and sweeps as plain frozen data, never as rows: what it may rely on is
# named here, and a change to the models shows up here, not in the quiz.


@dataclass(frozen=True)
class SweepData:
    """A learner's sweep: the setting it varies and its values, in order."""

    pk: int
    field: str
    values: tuple[Any, ...]
    url: str


@dataclass(frozen=True)
class RunData:
    """A learner's lab run: its settings, what it measured (`result`, a metrics summary; None
    until it finished), where it ran, and its sweep and index in it if it is a sweep's point."""

    pk: int
    owner_id: int
    lab: str
    backend: str
    where: str
    finished: bool  # finished and measured (not queued, running, failed or cancelled)
    params: dict[str, Any]
    result: dict[str, Any] | None
    url: str
    sweep: SweepData | None
    sweep_index: int | None


def _sweep_data(sweep: Sweep) -> SweepData:
    return SweepData(
        pk=sweep.pk, field=sweep.field, values=tuple(sweep.values), url=sweep.get_absolute_url()
    )


def _run_data(run: LabRun) -> RunData:
    return RunData(
        pk=run.pk,
        owner_id=run.owner_id,
        lab=run.lab,
        backend=run.backend,
        where=run.where,
        finished=run.state == RunState.DONE,
        params=dict(run.params),
        result=dict(run.result) if run.result else None,
        url=run.get_absolute_url(),
        sweep=_sweep_data(run.sweep) if run.sweep is not None else None,
        sweep_index=run.sweep_index,
    )


def run_get_for_owner(*, user: Any, pk: int) -> RunData:
    """The learner's own run; anyone else's is a 404, so ids reveal nothing."""
    return _run_data(selectors.run_get_for_owner(user=user, pk=pk))


def sweep_get_for_owner(*, user: Any, pk: int) -> SweepData:
    """The learner's own sweep; anyone else's is a 404."""
    return _sweep_data(selectors.sweep_get_for_owner(user=user, pk=pk))


def run_data(pk: int) -> RunData:
    """Any run by its id, for work that already checked whose it is (a card being made).

    Raises:
        LabRun.DoesNotExist: no such run.
    """
    return _run_data(LabRun.objects.select_related("sweep").get(pk=pk))


def sweep_data(pk: int) -> SweepData:
    """Any sweep by its id (Sweep.DoesNotExist for none)."""
    return _sweep_data(Sweep.objects.get(pk=pk))


def finished_points(sweep: SweepData) -> dict[int, RunData]:
    """The sweep's finished runs by their index in its values."""
    runs = LabRun.objects.filter(sweep_id=sweep.pk, state=RunState.DONE).select_related("sweep")
    return {r.sweep_index: _run_data(r) for r in runs}


def lab_of(run: RunData) -> Lab:
    """The lab the run was made in (the sandbox for a lab that no longer exists)."""
    return LABS.get(run.lab) or LABS["sandbox"]


# -- settings, predictions, simulations ----------------------------------------------------------


def checked_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """The lab settings `values` stand for, every one of them, as a run stores them.

    Raises:
        ParamError: what cannot be run, by field.
    """
    return parse_lab_params(values).as_dict()


def prediction(values: Mapping[str, Any]) -> dict[str, Any]:
    """The predictor's figures for lab settings, priced with their device's own calibration
    when it has one (as a run's page shows them)."""
    return selectors.device_prediction(parse_lab_params(values))


def simulation_fits(values: Mapping[str, Any]) -> None:
    """Refuse, in O(1), settings too large to simulate on a lab worker (nothing is built).

    Raises:
        ParamError: why (RunTooLarge among them).
    """
    sim_precheck(parse_lab_params(values), max_run_mb=settings.LABS_SIM_MAX_RUN_MB)


def simulation_steps(values: Mapping[str, Any]) -> int:
    """An upper bound (O(1)) on the simulated steps one simulation of these settings takes: its
    cost in the lab worker's time (labs.prediction.sizing.sim_steps).

    Raises:
        ParamError: settings that cannot be simulated.
    """
    return sim_steps(parse_lab_params(values))


def simulate(values: Mapping[str, Any], *, until: float | None = None) -> dict[str, Any]:
    """Simulate lab settings as a lab worker does (within its memory allowance): the run's summary
    (labs.measurement.metrics.summarize). `until`, a time.monotonic() deadline: past it the
    simulation stops with SoftTimeLimitExceeded, as a worker's soft time limit would stop it (for
    work that holds itself to a shorter limit than the turn it runs in, see `send_turn`).

    Raises:
        ParamError: settings that cannot run or are too large (RunTooLarge among them).
        SoftTimeLimitExceeded: past `until`.
    """
    backend = get_backend("sim", max_run_mb=settings.LABS_SIM_MAX_RUN_MB)

    def on_progress(fraction: float, phase: object = None) -> None:
        if until is not None and time.monotonic() > until:
            raise SoftTimeLimitExceeded("the simulation passed its deadline")

    return summarize(
        backend.run(parse_lab_params(values), on_progress if until is not None else None)
    )


def sim_queue() -> str:
    """The lab worker's queue, where work that simulates is sent."""
    return queueing.backend_queue("sim")


def send_turn(queue: str, *, for_what: str) -> None:
    """Send a turn to a lab queue for one piece of work just queued there, once the transaction
    that saved it has committed. Whoever's turn it is when a worker takes it goes (labs.runs.turns):
    register the work's kind (`answer_for_labs(queued_work=...)`) for it to be taken. The turn
    has the queue's lab run time limits; work with a shorter limit holds itself to it.

    Raises:
        queueing.QueueUnavailable: the broker did not take it.
    """
    queueing.send_turns([queue], for_what=for_what)


def take_turn(*, queue: str, hostname: str) -> str:
    """Be the worker receiving a turn on `queue`: take the work whose turn it is and do it
    (labs.runs.execution.run_next). Returns a line for the worker's log."""
    return execution.run_next(queue=queue, hostname=hostname)


def sim_worker_online() -> bool:
    return WorkerHeartbeat.objects.online().filter(backend="sim").exists()


# -- figures -------------------------------------------------------------------------------------


def metric(key: str) -> Metric | None:
    """The metric a run's summary `key` holds, with its label and unit as the lab pages show
    them; None for a key no lab page shows."""
    return next((m for m in results.METRICS if m.measured == key), None)


# -- lab questions -------------------------------------------------------------------------------

QuestionError = questions.QuestionError
questions_read = question_content.questions_read
questions_load = question_content.questions_load
questions_export = question_content.questions_export
questions_edited = question_content.questions_edited


def question_card(slug: str) -> dict[str, Any] | None:
    """What a quiz card of the question says: {slug, title, prompt, lab, topic, figure, unit};
    None for a question retired or unknown."""
    question = questions.question_get(slug)
    if question is None:
        return None
    figure = question.the_figure
    return {
        "slug": question.slug,
        "title": question.title,
        "prompt": question.prompt,
        "lab": question.lab,
        "topic": question.topic,
        "figure": figure.label,
        "unit": figure.unit,
    }


def question_ask(slug: str, *, user_id: int, turn: int) -> dict[str, Any] | None:
    """What to ask a learner reviewing the question for the `turn`-th time: a neighbouring point
    whose simulation is stored (in turn), else their own graded run of it. Plain data (JSON):
    question, title, figure, label, unit, at, changed, settings, measured, formulas, band,
    band_words, where, source. None when there is nothing to grade an answer against."""
    question = questions.question_get(slug)
    if question is None:
        return None
    return questions.ask(question=question, user_id=user_id, turn=turn)


def question_answer(
    *, owner: Any, asked: Mapping[str, Any], value: float, token: str
) -> dict[str, Any]:
    """Grade `value` against what `question_ask` asked and keep it with the learner's
    predictions (one per `token`). Returns {rating (1, 2 or 3), name, words}."""
    grade = questions.answer(owner=owner, asked=asked, value=value, token=token)
    return {"rating": grade.rating, "name": grade.name, "words": grade.words}


def question_figure_text(figure: str, value: float | None) -> str:
    """A question's figure as the lab pages write it ("5.2×", "1,240 tok/s")."""
    return questions.figure_text(FIGURES[figure], value)


def question_url(slug: str, at: int = 0) -> str:
    """The lab page that predicts and runs the question at point `at` ("run it")."""
    question = questions.question_get(slug)
    lab = question.lab if question is not None else "sandbox"
    url = reverse("labs:question-detail", args=[lab, slug])
    return f"{url}?at={at}" if at else url
