"""Lab question pages: predict, then run; and your instincts over time. Thin: parse, call one
service or selector, render."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from labs.backends import is_simulated
from labs.forms import BACKEND_LABELS
from labs.parameters.params import ParamError
from labs.parameters.presets import rerun_values
from labs.questions import selectors as question_selectors
from labs.questions import services as questions
from labs.questions.spec import Question, setting_words
from labs.runs import selectors, submission
from labs.views import REFUSAL_STATUS


def _question_or_404(lab: str, slug: str) -> Question:
    question = questions.question_get(slug)
    if question is None or question.lab != lab:
        raise Http404("No such question in this lab")
    return question


def _at(raw: object, question: Question) -> int:
    text = str(raw or "0")
    if not (text.isascii() and text.isdigit()) or int(text) > len(question.neighbours):
        raise Http404(f"This question asks at points 0 to {len(question.neighbours)}")
    return int(text)


def skip_url(question: Question, at: int) -> str:
    """The lab page set to the point's settings, with the formulas' figures shown."""
    values = rerun_values(question.the_lab, question.points[at])
    if question.preset:
        values = {"preset": question.preset, **values}
    query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()}
    return f"{reverse('labs:lab-detail', args=[question.lab])}?{urlencode(query)}"


def _backends() -> list[tuple[str, str]]:
    online = {b.backend for b in selectors.backends_online() if b.online}
    return [
        (name, BACKEND_LABELS.get(name, name))
        for name in settings.LABS_BACKEND_QUEUES
        if is_simulated(name) or name in online
    ]


def _page(
    request: HttpRequest,
    question: Question,
    at: int,
    *,
    status: int = 200,
    error: str = "",
    value: str = "",
    backend: str = "sim",
) -> HttpResponse:
    params = question.points[at]
    context: dict[str, Any] = {
        "lab": question.the_lab,
        "question": question,
        "figure": question.the_figure,
        "at": at,
        "changed": setting_words(question.changed(at)),
        "shown": [(name, params.get(name)) for name in question.the_lab.fields],
        "baseline": question.the_figure.ratio,
        "points": [
            {"at": i, "words": question_selectors.point_words(question, i)}
            for i in range(len(question.points))
        ],
        "skip_url": skip_url(question, at),
        "backends": _backends(),
        "backend": backend,
        "error": error,
        "value": value,
        "others": [q for q in questions.questions_for_lab(question.lab) if q.slug != question.slug],
    }
    return render(request, "labs/question_detail.html", context, status=status)


@require_GET
@login_required
def question_detail(request: HttpRequest, lab: str, slug: str) -> HttpResponse:
    question = _question_or_404(lab, slug)
    return _page(request, question, _at(request.GET.get("at"), question))


@require_POST
@login_required
def question_run(request: HttpRequest, lab: str, slug: str) -> HttpResponse:
    """Commit the learner's figure and queue the question's run (or pair of runs)."""
    question = _question_or_404(lab, slug)
    at = _at(request.POST.get("at"), question)
    raw = str(request.POST.get("value", ""))[:40]
    backend = str(request.POST.get("backend") or "sim")
    if backend not in settings.LABS_BACKEND_QUEUES:
        allowed = ", ".join(settings.LABS_BACKEND_QUEUES)
        return _page(
            request, question, at, status=400, value=raw,
            error=f"backend must be one of {allowed}, got {backend[:30]!r}.",
        )  # fmt: skip
    try:
        value = questions.check_value(raw)
        prediction = questions.prediction_request(
            owner=request.user, question=question, at=at, value=value, backend=backend
        )
    except questions.PredictionRefused as exc:
        return _page(request, question, at, status=400, error=str(exc), value=raw, backend=backend)
    except ParamError as exc:
        error = f"This point cannot run on {backend}: {exc}"
        return _page(request, question, at, status=400, error=error, value=raw, backend=backend)
    except submission.RunRefused as exc:
        hint = exc.operator_hint if request.user.is_staff else ""
        return _page(
            request, question, at, status=REFUSAL_STATUS[exc.kind], value=raw, backend=backend,
            error=f"Not queued: {exc.reason} {hint}".strip(),
        )  # fmt: skip
    assert prediction.run is not None
    return redirect(prediction.run)


@require_GET
@login_required
def instincts(request: HttpRequest) -> HttpResponse:
    topics = question_selectors.instincts_for(owner=request.user)
    context = {
        "topics": topics,
        "charts": {t.topic: t.chart() for t in topics},
        "total": sum(len(t.points) for t in topics),
    }
    return render(request, "labs/instincts.html", context)
