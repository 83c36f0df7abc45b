"""The learner's own FSRS parameters: fitting them on the worker, using them, going back.

"Optimize my parameters" creates a ParameterFit and sends it to the worker (queue `quiz.fit`,
config/celery.py, which a fit-only worker consumes, so a fit never waits behind labs nor takes a
lab's slot); the press reads no more of the log than MIN_REVIEWS rows, after the
one-fit-at-a-time check. The task calls `fit_run`, which streams the log to a process of its own
capped at QUIZ_FIT_MEMORY_LIMIT_MB (quiz/fitting.py: fsrs-rs aborts the process it runs in when
an allocation fails), fits there with quiz/optimizer.py and stores the figures, under a time
limit; a fit past its memory or time limit fails and says so, and a fit whose worker died is
failed at the learner's next visit to the page.
The fit also simulates the workload/retention trade-off (reviews a day at desired retention
0.80-0.95, Anki's "Help me decide") for the learner's deck under both parameter sets: it takes
about a second for a large deck, too long for a page. Nothing changes for the learner until they
choose "Use these parameters", which is offered only for a fit that predicts their latest,
held-out reviews better than the parameters in force; the parameters they replace are kept, so
"Go back" restores them.
New reviews are scheduled with the parameters in force, and each log row records them (replay
uses them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings as django_settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connections, transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from quiz import fitting, optimizer
from quiz.models import LearnerSettings, ParameterFit, ReviewLog
from quiz.selectors import learner_settings_get

logger = logging.getLogger(__name__)
RUNNING = (ParameterFit.Status.QUEUED, ParameterFit.Status.RUNNING)


def _reviews(user_id: int) -> Iterator[tuple[int, int, date]]:
    """The learner's log in the order made, (card_id, rating, study_date), read in chunks: on the
    worker only, which streams it to the fit's process without holding it."""
    return (
        ReviewLog.objects.filter(user_id=user_id)
        .order_by("reviewed_at", "id")
        .values_list("card_id", "rating", "study_date")
        .iterator(10_000)
    )


def _release_stale(user: AbstractBaseUser) -> None:
    """Fail the learner's fit whose worker died (killed, out of memory, restarted): running with
    no heartbeat for QUIZ_FIT_STALE_S, or queued so long that no fit worker can be taking it.
    Without this the row stays "running" and the learner can never optimize again. The fit's
    time limit is the fit worker's to enforce (its settings, not this process's)."""
    now = timezone.now()
    silent_since = now - timedelta(seconds=django_settings.QUIZ_FIT_STALE_S)
    ParameterFit.objects.filter(user=user, status=ParameterFit.Status.RUNNING).annotate(
        alive_at=Coalesce("heartbeat_at", "started_at")
    ).filter(alive_at__lt=silent_since).update(
        status=ParameterFit.Status.FAILED,
        error="The worker stopped before the fit finished; optimize again.",
        finished_at=now,
    )
    ParameterFit.objects.filter(
        user=user,
        status=ParameterFit.Status.QUEUED,
        created_at__lt=now - timedelta(seconds=django_settings.QUIZ_FIT_QUEUED_STALE_S),
    ).update(
        status=ParameterFit.Status.FAILED,
        error="No worker took the fit; optimize again later.",
        finished_at=now,
    )


def fit_latest(*, user: AbstractBaseUser) -> ParameterFit | None:
    _release_stale(user)
    return ParameterFit.objects.filter(user=user).first()


def fit_start(*, user: AbstractBaseUser) -> ParameterFit:
    """Queue a fit of the learner's parameters. Raises ValidationError (nothing queued) while a
    fit is already queued or running, or with fewer than optimizer.MIN_REVIEWS reviews in all
    (the worker counts the usable ones)."""
    _release_stale(user)
    with transaction.atomic():
        LearnerSettings.objects.get_or_create(user=user)
        # One fit at a time per learner: lock their settings row while checking.
        LearnerSettings.objects.select_for_update().filter(user=user).first()
        if ParameterFit.objects.filter(user=user, status__in=RUNNING).exists():
            raise ValidationError("Your parameters are already being optimized.")
        # Bounded: reads at most MIN_REVIEWS index entries, however long the log.
        some = ReviewLog.objects.filter(user=user).values("id")[: optimizer.MIN_REVIEWS].count()
        if some < optimizer.MIN_REVIEWS:
            raise ValidationError(
                f"Optimizing needs at least {optimizer.MIN_REVIEWS} reviews made a day or more"
                f" after the card's previous review; you have {some} reviews in all. Until then"
                " the defaults fit you better than a fit to so few reviews would."
            )
        fit = ParameterFit.objects.create(user=user, created_at=timezone.now())
        transaction.on_commit(lambda: fit_parameters_task.apply_async(args=[fit.pk]))
    return fit


class _Heartbeat:
    """On the worker, while a fit runs: bumps its heartbeat_at from a side thread every
    `interval_s`, so a page can tell a long fit from one whose worker was killed."""

    def __init__(self, fit_id: int, interval_s: float) -> None:
        self.fit_id = fit_id
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"fit-{fit_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _beat(self) -> None:
        ParameterFit.objects.filter(pk=self.fit_id, status=ParameterFit.Status.RUNNING).update(
            heartbeat_at=timezone.now()
        )

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self._beat()
                except DatabaseError:
                    # A database restart: the next beat reconnects (a fit lives through it).
                    logger.warning("heartbeat of fit %s: database unavailable", self.fit_id)
                    connections["default"].close()
        finally:
            connections.close_all()  # this thread's own connection


def fit_run(*, fit_id: int) -> None:
    """On the worker: fit, compare with the parameters in force, store the figures."""
    claimed = ParameterFit.objects.filter(pk=fit_id, status=ParameterFit.Status.QUEUED).update(
        status=ParameterFit.Status.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return  # a redelivered message: already done, in hand, or failed as stale
    fit = ParameterFit.objects.select_related("user").get(pk=fit_id)

    def progress(percent: int, stage: str) -> None:
        ParameterFit.objects.filter(pk=fit_id, status=ParameterFit.Status.RUNNING).update(
            progress=percent, stage=stage
        )

    settings = learner_settings_get(user=fit.user)
    limit_mb = django_settings.QUIZ_FIT_MEMORY_LIMIT_MB
    try:
        progress(2, "Reading your reviews")
        with _Heartbeat(fit_id, django_settings.QUIZ_FIT_HEARTBEAT_S):
            result = fitting.run(
                _reviews(fit.user_id),
                current=settings.fsrs_parameters,
                desired_retention=settings.desired_retention,
                new_per_day=settings.new_per_day,
                memory_limit_mb=limit_mb,
                # A backstop for a fit process whose worker was killed: the hard limit + margin.
                cpu_limit_s=django_settings.QUIZ_FIT_TIME_LIMIT_S + 60,
                progress=progress,
            )
    except SoftTimeLimitExceeded:
        fit_fail(
            fit_id=fit_id,
            error=f"The fit took longer than {django_settings.QUIZ_FIT_TIME_LIMIT_S} s, so it"
            " was stopped.",
        )
        return
    except fitting.OutOfMemory:
        logger.warning("fit %s stopped at its memory limit (%s MB)", fit_id, limit_mb)
        fit_fail(
            fit_id=fit_id,
            error=f"Fitting your reviews needed more memory than one fit may use ({limit_mb:,}"
            " MB), so it was stopped and the parameters in force are kept. You can optimize"
            " again, but with this many reviews it will likely stop the same way until the"
            " site's staff raise that limit.",
        )
        return
    except fitting.ChildFailed:
        fit_fail(fit_id=fit_id, error="The fit stopped unexpectedly; optimize again.")
        return
    except ValueError as exc:  # optimizer.NotEnoughReviews, or a fit py-fsrs refuses
        fit_fail(fit_id=fit_id, error=str(exc))
        return
    ParameterFit.objects.filter(pk=fit_id, status=ParameterFit.Status.RUNNING).update(
        status=ParameterFit.Status.DONE,
        progress=100,
        stage="Done",
        reviews=result["reviews"],
        parameters=result["parameters"],
        evaluation={
            "training": result["training"],
            "held_out": result["held_out"],
            "held_out_reviews": result["held_out_reviews"],
            "wins": result["wins"],
            "current_is_default": not settings.fsrs_parameters,
            "workload": result["workload"],
        },
        intervals=result["intervals"],
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
    if not (fit.evaluation or {}).get("wins"):
        raise ValidationError(
            "That fit predicted your latest reviews no better than the parameters in force,"
            " so they are kept."
        )
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


# Its queue (quiz.fit) is chosen in config/celery.py; a fit past its hard limit is killed and
# failed by _release_stale.
@shared_task(
    name="quiz.fit_parameters",
    base=_FitTask,
    ignore_result=True,
    soft_time_limit=django_settings.QUIZ_FIT_TIME_LIMIT_S,
    time_limit=django_settings.QUIZ_FIT_TIME_LIMIT_S + 30,
)
def fit_parameters_task(fit_id: int) -> None:
    fit_run(fit_id=int(fit_id))
