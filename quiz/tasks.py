"""Celery tasks of the quiz: thin. Making a personal card simulates, so it runs on the lab
worker's queue (`quiz.personal._enqueue` chooses it and the time limits)."""

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
