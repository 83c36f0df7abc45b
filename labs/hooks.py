"""What labs asks of the rest of the site without importing it: the quiz answers, by registering
its functions from its AppConfig.ready (through labs.api.answer_for_labs).

- `reviews_at_least(user_id, count)`: whether a learner has answered at least `count` quiz cards
  (new accounts get a smaller allowance of lab runs until then; labs.runs.submission);
- `cards_using(presets)`: the active cards that open one of these lab presets, for a lab's page
  ("cards that use this lab"; labs.runs.selectors.cards_for_lab);
- `work_in_flight(user_id)`: the quiz's work a learner (None: all learners) has queued or
  running, as (on the lab worker's queue, elsewhere): card requests simulate on the lab worker,
  optimizer fits run on their own queue. Both count against the learner's quota of work in
  flight; the first also against the simulator queue's cap and the learner's share of it;
- `queued_work`: the kinds of the quiz's work that wait on a lab queue (card requests, on the
  simulator's), taken in turn with lab runs (labs.runs.turns): a learner's card waits for the
  learners before it in turn, not for every run queued before it;
- `prediction_graded(data)`: a prediction a learner committed before a run was graded
  (labs.questions): the quiz records it as a review of that lab question. `data` is plain:
  prediction (id), user_id, question (slug), title, rating (1 Again, 2 Hard, 3 Good), answer and
  measured (the two figures as words), graded_at.

Unanswered (no quiz installed), a learner has answered nothing, no card uses a lab, no other
work is in flight or queued, and a graded prediction is remembered by labs alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labs.runs.turns import WorkKind

ReviewsAtLeast = Callable[[int, int], bool]
CardsUsing = Callable[[Sequence[str]], list[dict[str, Any]]]
WorkInFlight = Callable[[int | None], tuple[int, int]]
PredictionGraded = Callable[[dict[str, Any]], object]

_answers: dict[str, Any] = {}


def answer(
    *,
    reviews_at_least: ReviewsAtLeast,
    cards_using: CardsUsing,
    work_in_flight: WorkInFlight | None = None,
    queued_work: Sequence[WorkKind] = (),
    prediction_graded: PredictionGraded | None = None,
) -> None:
    """Register the functions that answer labs' questions (see the module docstring)."""
    _answers.update(reviews_at_least=reviews_at_least, cards_using=cards_using)
    if work_in_flight is not None:
        _answers["work_in_flight"] = work_in_flight
    if prediction_graded is not None:
        _answers["prediction_graded"] = prediction_graded
    _answers["queued_work"] = tuple(queued_work)


def reviews_at_least(user_id: int, count: int) -> bool:
    ask: ReviewsAtLeast | None = _answers.get("reviews_at_least")
    return ask is not None and bool(ask(user_id, count))


def cards_using(presets: Sequence[str]) -> list[dict[str, Any]]:
    """Each card as {"slug", "title", "prompt", "url", "preset"}, at most 12."""
    ask: CardsUsing | None = _answers.get("cards_using")
    return [] if ask is None else list(ask(presets))


def work_in_flight(user_id: int | None) -> tuple[int, int]:
    """(on the lab worker's queue, elsewhere); (0, 0) unanswered."""
    ask: WorkInFlight | None = _answers.get("work_in_flight")
    if ask is None:
        return 0, 0
    on_lab, elsewhere = ask(user_id)
    return int(on_lab), int(elsewhere)


def queued_work() -> tuple[WorkKind, ...]:
    """The other apps' kinds of work that wait on lab queues; () unanswered."""
    return tuple(_answers.get("queued_work", ()))


def prediction_graded(data: dict[str, Any]) -> bool:
    """Tell the quiz a prediction was graded; False when nothing listens."""
    tell: PredictionGraded | None = _answers.get("prediction_graded")
    if tell is None:
        return False
    tell(data)
    return True
