"""Which queue a run goes to, and the turns sent on it.

A turn is a message that names only its queue: the worker that takes it asks labs.runs.turns
whose turn it is there. A broker that is down is a `QueueUnavailable`, said to the learner.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import group
from django.conf import settings

from config.celery import app as celery_app
from labs.parameters.params import ParamError

logger = logging.getLogger(__name__)

# The task labs.runs.tasks defines, looked up by its name when a turn is sent: the tasks sit above
# this module (they run turns and reap), so sending one must not import them.
RUN_NEXT = "labs.run_next"


def backend_queue(backend: str) -> str:
    try:
        return settings.LABS_BACKEND_QUEUES[backend]
    except KeyError:
        known = ", ".join(settings.LABS_BACKEND_QUEUES)
        raise ParamError(
            {"backend": f"backend must be one of {known}, got {backend[:40]}"}
        ) from None


class QueueUnavailable(Exception):
    """The broker refused or could not take the message."""


def _enqueue(run_ids: Sequence[int], backend: str, queues: Sequence[str] | None = None) -> None:
    """Send one turn per run to its queue (`queues`, one per run; else the backend's). A turn
    names no run: the worker that takes it runs whichever run's turn it is then (labs.runs.turns).

    Raises:
        QueueUnavailable: the broker did not take them (down, refused, timed out).
    """
    send_turns(
        list(queues or [backend_queue(backend)] * len(run_ids)), for_what=f"runs {list(run_ids)}"
    )


def _turn_options(queue: str) -> dict[str, object]:
    # The hard limit kills the process; the soft one lets the service record why it stopped. A
    # turn may take any work on its queue, so it has the queue's lab run limits (work with a
    # shorter limit of its own, a card, holds itself to it).
    gpu = queue == "labs.gpu" or queue.startswith("labs.gpu.")
    soft = settings.LABS_GPU_TIME_LIMIT_S if gpu else settings.LABS_SIM_TIME_LIMIT_S
    return {"queue": queue, "soft_time_limit": soft, "time_limit": soft + 60}


def send_turns(queues: Sequence[str], *, for_what: str = "") -> None:
    """Send one turn to each of `queues` (a queue named twice gets two): one for each piece of
    work just queued there, sent after the transaction that saved the work commits.

    Raises:
        QueueUnavailable: the broker did not take them (down, refused, timed out).
    """
    try:
        if len(queues) == 1:
            celery_app.tasks[RUN_NEXT].apply_async(args=[queues[0]], **_turn_options(queues[0]))
        else:
            group(
                celery_app.tasks[RUN_NEXT].si(queue).set(**_turn_options(queue)) for queue in queues
            ).apply_async()
    except Exception as exc:
        # Any failure to hand over the message (connection refused, timeout, auth) would leave a
        # queued row no worker will ever take.
        logger.warning("could not send turns for %s to %s: %r", for_what, list(queues), exc)
        raise QueueUnavailable(str(exc)) from exc
