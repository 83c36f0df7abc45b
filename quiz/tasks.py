"""Celery tasks for the quiz: thin; quiz/parameters.py does the work and the row holds the state."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task


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
