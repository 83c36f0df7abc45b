"""The Celery tasks of the quiz, for the workers to find (Celery's autodiscovery imports this
module). Each is defined beside the service that does its work, and is thin: it carries an id,
the service does the work and the row holds the state.

- `quiz.card_make`: a personal card made from a lab run (quiz.personal). It simulates, so it
  runs on the lab worker's queue, chosen with its time limits when it is enqueued;
- `quiz.fit_parameters`: a fit of a learner's FSRS parameters, on its own queue `quiz.fit`
  (routed in config/celery.py), with its time limits (quiz.parameters).
"""

from __future__ import annotations

from quiz.parameters import fit_parameters_task
from quiz.personal import card_make_task

__all__ = ["card_make_task", "fit_parameters_task"]
