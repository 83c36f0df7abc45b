"""Signals labs sends to its own parts (never to other apps: those are asked through labs.hooks).

- `run_finished(run_id)`: a run's worker is done with it (done, failed or stopped); sent after
  its state is stored, in the worker. Lab questions grade a prediction waiting for it.
"""

from __future__ import annotations

from django.dispatch import Signal

run_finished = Signal()
