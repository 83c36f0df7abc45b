"""Reads for lab questions: the panel a run page shows for a prediction, and the instincts page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from labs.models import LabRun
from labs.questions import instincts, services
from labs.questions.bands import RATING_NAMES
from labs.questions.figures import FIGURES, Figure
from labs.questions.models import LabQuestion, Prediction
from labs.questions.spec import Question, setting_words


@dataclass(frozen=True)
class PredictionPanel:
    prediction: Prediction
    question: Question | None
    figure: Figure
    yours: str
    measured: str
    formulas: str
    rating_name: str
    on_baseline: bool  # this page is the ratio's baseline run
    other: LabRun | None  # the other run of the pair

    @property
    def graded(self) -> bool:
        return self.prediction.state == Prediction.State.GRADED


def prediction_panel(run: LabRun) -> PredictionPanel | None:
    """The prediction committed before `run` (or before the ratio `run` is the baseline of),
    graded now if its runs have just finished; None when none was."""
    prediction = (
        Prediction.objects.filter(Q(run=run) | Q(baseline=run), source=Prediction.Source.LAB)
        .select_related("run", "baseline", "owner")
        .order_by("-id")
        .first()
    )
    if prediction is None:
        return None
    if prediction.state == Prediction.State.WAITING:
        prediction = services.prediction_grade(prediction)
    figure = FIGURES[prediction.figure]
    on_baseline = prediction.baseline_id == run.pk
    return PredictionPanel(
        prediction=prediction,
        question=services.question_get(prediction.question),
        figure=figure,
        yours=services.figure_text(figure, prediction.value),
        measured=services.figure_text(figure, prediction.measured),
        formulas=services.figure_text(figure, prediction.formulas),
        rating_name=RATING_NAMES.get(prediction.rating or 0, ""),
        on_baseline=on_baseline,
        other=prediction.run if on_baseline else prediction.baseline,
    )


def _point(p: Prediction, questions: dict[str, Question]) -> instincts.Point | None:
    figure = FIGURES.get(p.figure)
    if figure is None or p.measured is None or p.band is None or p.rating is None:
        return None
    q = questions.get(p.question)
    setting = ""
    if q is not None and q.neighbours:
        setting = next(iter(q.neighbours[0]), "")
    return instincts.Point(
        question=p.question,
        title=q.title if q else p.question,
        phrase=figure.phrase,
        unit=figure.unit,
        value=p.value,
        measured=p.measured,
        band=p.band,
        rating=p.rating,
        source=p.source,
        varies_word=q.varies if q else "",
        varies_value=p.varies,
        varies_setting=setting,
        count=figure.unit == "sequences",
        value_text=services.figure_text(figure, p.value),
        measured_text=services.figure_text(figure, p.measured),
    )


def instincts_for(*, owner: Any, limit: int = 2000) -> list[instincts.Topic]:
    """The learner's graded predictions (newest `limit`) grouped by topic, with the readings."""
    rows = list(
        Prediction.objects.filter(owner=owner, state=Prediction.State.GRADED).order_by("-id")[
            :limit
        ]
    )
    slugs = {p.question for p in rows}
    questions = {
        q.slug: q
        for q in map(services.checked, LabQuestion.objects.filter(slug__in=slugs))
        if q is not None
    }
    topic_of = {p.question: p.topic for p in rows}
    points = [pt for pt in (_point(p, questions) for p in reversed(rows)) if pt is not None]
    return instincts.topics(points, topic_of)


def point_words(question: Question, at: int) -> str:
    """'at concurrency 64' for a neighbour, 'at its own settings' for the question's."""
    return f"at {setting_words(question.changed(at))}" if at else "at the question's settings"
