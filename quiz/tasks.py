"""Celery tasks of the quiz: thin. Making a personal card simulates, so it runs on the lab
worker's queue (`quiz.personal._enqueue` chooses it and the time limits); fitting a learner's
parameters runs on the default queue (quiz/parameters.py does the work, the row holds the state)."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task


class _CardTask(Task):
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # The service records refusals and limits; this catches what escapes it, so the
        # learner's lock is released and the page says it failed.
        from quiz.personal import card_request_fail

        request_id = args[0] if args else kwargs.get("request_id")
        if request_id is not None:
            card_request_fail(
                request_id=int(request_id),
                error=f"The card could not be made ({type(exc).__name__}); make it again.",
            )


@shared_task(name="quiz.card_make", base=_CardTask, ignore_result=True, acks_late=True)
def card_make_task(request_id: int) -> str:
    from quiz.personal import card_request_execute

    return card_request_execute(request_id=int(request_id))


class _FitTask(Task):
    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # A fit that died unexpectedly says so instead of running forever.
        from quiz.parameters import fit_fail

        if args:
            fit_fail(fit_id=int(args[0]), error=f"{type(exc).__name__}: {exc}")


@shared_task(name="quiz.fit_parameters", base=_FitTask, ignore_result=True, queue="default")
def fit_parameters_task(fit_id: int) -> None:
    from quiz.parameters import fit_run

    fit_run(fit_id=int(fit_id))
