"""The "Your FSRS parameters" page: optimize, use the fit, go back; the workload trade-off."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from quiz import optimizer, parameters, scheduling
from quiz.selectors import learner_settings_get


@require_GET
@login_required
def parameters_page(request: HttpRequest) -> HttpResponse:
    settings = learner_settings_get(user=request.user)
    fit = parameters.fit_latest(user=request.user)
    context = {
        "settings": settings,
        "fit": fit,
        "running": fit is not None and fit.status in parameters.RUNNING,
        "in_use": fit is not None and fit.parameters == settings.fsrs_parameters,
        "current": settings.fsrs_parameters or list(scheduling.DEFAULT_PARAMETERS),
        "min_reviews": optimizer.MIN_REVIEWS,
    }
    return render(request, "quiz/parameters.html", context)


def _act(request: HttpRequest, action: Callable[[], object], done: str = "") -> HttpResponse:
    """Run one of the page's actions; a refusal is shown as its message, never a 500. `done`:
    what to say once it is done ("": the page itself shows it)."""
    try:
        action()
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        if done:
            messages.success(request, done)
    return redirect("quiz:parameters")


@require_POST
@login_required
def parameters_optimize(request: HttpRequest) -> HttpResponse:
    # No message above the page: the fit's own section says it is optimizing, and the poll
    # replaces that section with the result (a message stayed above it).
    return _act(request, lambda: parameters.fit_start(user=request.user))


@require_POST
@login_required
def parameters_use(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(
        request,
        lambda: parameters.parameters_use(user=request.user, fit_id=pk),
        "Your next reviews are scheduled with the fitted parameters.",
    )


@require_POST
@login_required
def parameters_revert(request: HttpRequest) -> HttpResponse:
    return _act(
        request,
        lambda: parameters.parameters_revert(user=request.user),
        "Back to your previous parameters.",
    )
