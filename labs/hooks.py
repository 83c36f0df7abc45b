"""What labs asks of the rest of the site without importing it: the quiz answers, by registering
its functions from its AppConfig.ready (through labs.api.answer_for_labs).

- `reviews_at_least(user_id, count)`: whether a learner has answered at least `count` quiz cards
  (new accounts get a smaller allowance of lab runs until then; labs.services);
- `cards_using(presets)`: the active cards that open one of these lab presets, for a lab's page
  ("cards that use this lab"; labs.selectors.cards_for_lab).

Unanswered (no quiz installed), a learner has answered nothing and no card uses a lab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

ReviewsAtLeast = Callable[[int, int], bool]
CardsUsing = Callable[[Sequence[str]], list[dict[str, Any]]]

_answers: dict[str, Any] = {}


def answer(*, reviews_at_least: ReviewsAtLeast, cards_using: CardsUsing) -> None:
    """Register the functions that answer labs' questions (see the module docstring)."""
    _answers.update(reviews_at_least=reviews_at_least, cards_using=cards_using)


def reviews_at_least(user_id: int, count: int) -> bool:
    ask: ReviewsAtLeast | None = _answers.get("reviews_at_least")
    return ask is not None and bool(ask(user_id, count))


def cards_using(presets: Sequence[str]) -> list[dict[str, Any]]:
    """Each card as {"slug", "title", "prompt", "url", "preset"}, at most 12."""
    ask: CardsUsing | None = _answers.get("cards_using")
    return [] if ask is None else list(ask(presets))
