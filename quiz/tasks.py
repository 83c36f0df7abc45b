"""The Celery tasks of the quiz, for the workers to find (Celery's autodiscovery imports this
module). Each is defined beside the service that does its work, and is thin: it carries an id,
the service does the work and the row holds the state.

- `quiz.card_make`: only for messages sent before card requests took turns on the lab
  worker's queue (a personal card made from a lab run, quiz.personal, simulates, so it runs
  there; it is now sent as a turn, labs.api.send_turn, and made when its turn comes);
- `quiz.fit_parameters`: a fit of a learner's FSRS parameters, on its own queue `quiz.fit`
  (routed in config/celery.py), with its time limits (quiz.parameters).
"""

from __future__ import annotations

from quiz.parameters import fit_parameters_task
from quiz.personal import card_make_task

__all__ = ["card_make_task", "fit_parameters_task"]
