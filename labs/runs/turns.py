"""Whose turn it is on a lab queue: a queue serves learners in turn, not in the order work came.

Celery's queue is one FIFO list, so work sent to it runs in the order it was sent: one learner's
many long runs would all go before another learner's one short run. So the message sent for each
piece of queued work (a lab run, each point of a sweep, a card being made) names no work: it is a
turn on its queue (`labs.run_next`). The worker that receives it asks `take` what goes now: the
oldest waiting work of the learner whose work was last taken from that queue longest ago (one never
served before anyone; between equals, whoever has waited longest), claimed in the same transaction.
One message per queued piece of work, so none waits without one; a message whose work was cancelled
takes another learner's work, or finds nothing.

The work comes from `WorkKind`s: lab runs (labs.runs.submission), labs' other kinds (`register`: the
simulations lab questions store ahead of time) and what other apps queue on a lab queue (the
quiz's card requests, through labs.hooks), so they all take their turns together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from config.locks import transaction_lock
from labs.models import QueueTurn


@dataclass(frozen=True)
class Waiting:
    """One piece of queued work: whose it is and since when it waits."""

    owner_id: int
    pk: int
    created_at: datetime


@dataclass(frozen=True)
class WorkKind:
    """Work of one kind that waits on lab queues. Every function takes the work's id; `waiting`
    takes a queue's name and lists what waits there, in any order (nothing, for a queue this
    kind is never sent to)."""

    name: str  # for the log: "lab run", "card request"
    waiting: Callable[[str], Iterable[Waiting]]
    # queued -> running on the worker named (its hostname); False when it is no longer queued.
    claim: Callable[[int, str], bool]
    # Do the claimed work on the worker; a line for the worker's log.
    execute: Callable[[int, str], str]
    # Record that claimed work stopped on what escaped `execute`.
    fail: Callable[[int, Exception], object]


_registered: dict[str, WorkKind] = {}


def register(kind: WorkKind) -> None:
    """Take `kind` in turn with lab runs on every lab queue (labs' own kinds, from its
    AppConfig.ready); registering a kind of the same name again replaces it."""
    _registered[kind.name] = kind


def registered() -> tuple[WorkKind, ...]:
    return tuple(_registered.values())


@dataclass(frozen=True)
class Taken:
    kind: WorkKind
    pk: int
    owner_id: int


def choose(
    waiting: Iterable[tuple[WorkKind, Waiting]], last_turns: Mapping[int, datetime]
) -> tuple[WorkKind, Waiting] | None:
    """The work to take next, or None when nothing waits: of the learners with work waiting,
    the one whose last turn (`last_turns`, by owner id) is oldest, one who has none first; between
    equals, the one whose oldest work has waited longest. Their oldest work goes."""
    oldest: dict[int, tuple[tuple[datetime, int], tuple[WorkKind, Waiting]]] = {}
    for kind, item in waiting:
        key = (item.created_at, item.pk)
        if item.owner_id not in oldest or key < oldest[item.owner_id][0]:
            oldest[item.owner_id] = (key, (kind, item))
    if not oldest:
        return None

    def order(owner_id: int) -> tuple[bool, datetime, tuple[datetime, int]]:
        turn = last_turns.get(owner_id)
        waited_since = oldest[owner_id][0]
        return (turn is not None, turn if turn is not None else waited_since[0], waited_since)

    return oldest[min(oldest, key=order)][1]


def take(queue: str, hostname: str, kinds: Sequence[WorkKind]) -> Taken | None:
    """Claim for the worker `hostname` the work whose turn it is on `queue` (see `choose`), and
    record the learner's turn; None when nothing waits there. One transaction, so two workers
    never take the same work or both give one learner a turn."""
    with transaction.atomic():
        _lock_queue_turns(queue)
        waiting = [(kind, item) for kind in kinds for item in kind.waiting(queue)]
        owners = {item.owner_id for _, item in waiting}
        last_turns = dict(
            QueueTurn.objects.filter(queue=queue, owner_id__in=owners).values_list(
                "owner_id", "taken_at"
            )
        )
        while (chosen := choose(waiting, last_turns)) is not None:
            kind, item = chosen
            if kind.claim(item.pk, hostname):
                QueueTurn.objects.update_or_create(
                    queue=queue, owner_id=item.owner_id, defaults={"taken_at": timezone.now()}
                )
                return Taken(kind=kind, pk=item.pk, owner_id=item.owner_id)
            # Cancelled since it was read: the next in turn instead.
            waiting.remove(chosen)
    return None


def _lock_queue_turns(queue: str) -> None:
    """Serialise the takers of one queue until the transaction ends, so a second worker sees the
    first one's claim and turn: a PostgreSQL advisory lock (held for one small read and two
    writes). SQLite needs none: its IMMEDIATE transactions take one write lock at BEGIN."""
    transaction_lock(f"labs.queue-turn:{queue}")
