"""The learner's own FSRS parameters: fitting them on the worker, using them, going back.

"Optimize my parameters" creates a ParameterFit and sends it to the worker (default queue); the
task calls `fit_run`, which reads the log, fits with quiz/optimizer.py and stores the figures.
The fit also simulates the workload/retention trade-off (reviews a day at desired retention
0.80-0.95, Anki's "Help me decide") for the learner's deck under both parameter sets: it takes
about a second for a large deck, too long for a page. Nothing changes for the learner until they
choose "Use these parameters"; the parameters they replace are kept, so "Go back" restores them.
New reviews are scheduled with the parameters in force, and each log row records them (replay
uses them).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from quiz import optimizer, scheduling
from quiz.models import LearnerSettings, ParameterFit, ReviewLog
from quiz.selectors import learner_settings_get

logger = logging.getLogger(__name__)
RUNNING = (ParameterFit.Status.QUEUED, ParameterFit.Status.RUNNING)


def _reviews(user_id: int) -> list[optimizer.Review]:
    rows = (
        ReviewLog.objects.filter(user_id=user_id)
        .order_by("id")
        .values_list("card_id", "rating", "study_date")
    )
    return [optimizer.Review(card, rating, day) for card, rating, day in rows]


def fit_latest(*, user: AbstractBaseUser) -> ParameterFit | None:
    return ParameterFit.objects.filter(user=user).first()


def fit_start(*, user: AbstractBaseUser) -> ParameterFit:
    """Queue a fit of the learner's parameters. Raises ValidationError (nothing queued) below
    optimizer.MIN_REVIEWS usable reviews or while a fit is already queued or running."""
    usable = optimizer.count_long_term(_reviews(user.pk))
    if usable < optimizer.MIN_REVIEWS:
        raise ValidationError(
            f"Optimizing needs at least {optimizer.MIN_REVIEWS} reviews made a day or more after"
            f" the card's previous review; you have {usable}. Until then the defaults fit you"
            " better than a fit to so few reviews would."
        )
    with transaction.atomic():
        LearnerSettings.objects.get_or_create(user=user)
        # One fit at a time per learner: lock their settings row while checking.
        LearnerSettings.objects.select_for_update().filter(user=user).first()
        if ParameterFit.objects.filter(user=user, status__in=RUNNING).exists():
            raise ValidationError("Your parameters are already being optimized.")
        fit = ParameterFit.objects.create(user=user, created_at=timezone.now(), reviews=usable)
        transaction.on_commit(lambda: fit_parameters_task.apply_async(args=[fit.pk]))
    return fit


def fit_run(*, fit_id: int) -> None:
    """On the worker: fit, compare with the parameters in force, store the figures."""
    fit = ParameterFit.objects.select_related("user").get(pk=fit_id)
    if fit.status != ParameterFit.Status.QUEUED:
        return  # a redelivered message: already done or in hand

    def progress(percent: int, stage: str) -> None:
        ParameterFit.objects.filter(pk=fit_id).update(
            status=ParameterFit.Status.RUNNING, progress=percent, stage=stage
        )

    settings = learner_settings_get(user=fit.user)
    reviews = _reviews(fit.user_id)
    try:
        result = optimizer.fit(
            reviews,
            current=settings.fsrs_parameters,
            desired_retention=settings.desired_retention,
            progress=progress,
        )
    except (optimizer.NotEnoughReviews, ValueError) as exc:
        ParameterFit.objects.filter(pk=fit_id).update(
            status=ParameterFit.Status.FAILED, error=str(exc), finished_at=timezone.now()
        )
        return
    progress(90, "Simulating your workload at each retention")
    deck = len({review.card_id for review in reviews})
    current = settings.fsrs_parameters or scheduling.DEFAULT_PARAMETERS
    workload = [
        {"retention": now["retention"], "current": now, "fitted": fitted}
        for now, fitted in zip(
            optimizer.workload(current, deck_size=deck, new_per_day=settings.new_per_day),
            optimizer.workload(result.parameters, deck_size=deck, new_per_day=settings.new_per_day),
            strict=True,
        )
    ]
    ParameterFit.objects.filter(pk=fit_id).update(
        status=ParameterFit.Status.DONE,
        progress=100,
        stage="Done",
        reviews=result.reviews,
        parameters=result.parameters,
        evaluation={"current": result.current, "fitted": result.fitted, "workload": workload},
        intervals=result.intervals,
        finished_at=timezone.now(),
    )


def fit_fail(*, fit_id: int, error: str) -> None:
    ParameterFit.objects.filter(pk=fit_id, status__in=RUNNING).update(
        status=ParameterFit.Status.FAILED, error=error, finished_at=timezone.now()
    )


def parameters_use(*, user: AbstractBaseUser, fit_id: int) -> LearnerSettings:
    """Schedule from now on with a finished fit's parameters, keeping the ones they replace."""
    fit = ParameterFit.objects.filter(user=user, pk=fit_id, status=ParameterFit.Status.DONE).first()
    if fit is None:
        raise ValidationError("That fit is not yours or has not finished.")
    settings, _ = LearnerSettings.objects.get_or_create(user=user)
    settings.previous_parameters = settings.fsrs_parameters
    settings.fsrs_parameters = fit.parameters
    settings.parameters_changed_at = timezone.now()
    settings.save(update_fields=["previous_parameters", "fsrs_parameters", "parameters_changed_at"])
    user.quiz_settings = settings  # what this request reads from now on
    return settings


def parameters_revert(*, user: AbstractBaseUser) -> LearnerSettings:
    """Go back to the parameters in force before the last change (the defaults, if none)."""
    settings, _ = LearnerSettings.objects.get_or_create(user=user)
    if settings.parameters_changed_at is None:
        raise ValidationError("Your parameters have not been changed, so there is nothing to undo.")
    settings.fsrs_parameters = settings.previous_parameters
    settings.previous_parameters = None
    settings.parameters_changed_at = None
    settings.save(update_fields=["previous_parameters", "fsrs_parameters", "parameters_changed_at"])
    user.quiz_settings = settings
    return settings


# -- the Celery task (quiz.tasks lists it for the workers) ---------------------------------------


class _FitTask(Task):
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # A fit that died unexpectedly says so instead of running forever.
        if args:
            fit_fail(fit_id=int(args[0]), error=f"{type(exc).__name__}: {exc}")


@shared_task(name="quiz.fit_parameters", base=_FitTask, ignore_result=True, queue="default")
def fit_parameters_task(fit_id: int) -> None:
    fit_run(fit_id=int(fit_id))
