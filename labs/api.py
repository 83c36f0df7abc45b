"""What the quiz may use of labs: the one labs module it imports (tests/test_imports.py checks it).

The quiz makes personal cards from a learner's lab runs (quiz/personal.py) and shows a learner's
own measurement beside a deck card's answer; for that it reads runs, asks for predictions and
simulations, and words figures as the lab pages do. Labs never imports the quiz: what it asks of
the quiz is registered here (`answer_for_labs`, from the quiz's AppConfig.ready).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from labs import hooks, results, selectors, services, turns
from labs.backends import get_backend
from labs.metrics import summarize
from labs.models import LabRun, RunState, Sweep, WorkerHeartbeat
from labs.params import ParamError, parse_lab_params
from labs.presets import LABS, Lab
from labs.results import Metric, dig
from labs.sim.engine_model import short_where_label
from labs.sizing import sim_precheck, sim_steps
from labs.your_number import YourNumber, your_number

__all__ = [
    "Lab",
    "LabRun",
    "Metric",
    "ParamError",
    "Sweep",
    "Waiting",
    "WorkKind",
    "YourNumber",
    "answer_for_labs",
    "checked_params",
    "dig",
    "finished",
    "finished_points",
    "lab_of",
    "metric",
    "prediction",
    "run_get_for_owner",
    "send_turn",
    "short_where_label",
    "sim_queue",
    "sim_worker_online",
    "simulate",
    "simulation_fits",
    "simulation_steps",
    "sim_work_check",
    "RunRefused",
    "sweep_get_for_owner",
    "take_turn",
    "your_number",
]

answer_for_labs = hooks.answer
run_get_for_owner = selectors.run_get_for_owner
RunRefused = services.RunRefused
sim_work_check = services.sim_work_check
sweep_get_for_owner = selectors.sweep_get_for_owner
Waiting = turns.Waiting
WorkKind = turns.WorkKind


# -- runs and sweeps -----------------------------------------------------------------------------


def finished(run: LabRun) -> bool:
    """Whether the run finished and measured (not queued, running, failed or cancelled)."""
    return run.state == RunState.DONE


def finished_points(sweep: Sweep) -> dict[int, LabRun]:
    """The sweep's finished runs by their index in its values."""
    return {r.sweep_index: r for r in sweep.runs.filter(state=RunState.DONE)}


def lab_of(run: LabRun) -> Lab:
    """The lab the run was made in (the sandbox for a lab that no longer exists)."""
    return LABS.get(run.lab) or LABS["sandbox"]


# -- settings, predictions, simulations ----------------------------------------------------------


def checked_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """The lab settings `values` stand for, every one of them, as a run stores them.

    Raises:
        ParamError: what cannot be run, by field.
    """
    return parse_lab_params(values).as_dict()


def prediction(values: Mapping[str, Any]) -> dict[str, Any]:
    """The predictor's figures for lab settings, priced with their device's own calibration
    when it has one (as a run's page shows them)."""
    return selectors.device_prediction(parse_lab_params(values))


def simulation_fits(values: Mapping[str, Any]) -> None:
    """Refuse, in O(1), settings too large to simulate on a lab worker (nothing is built).

    Raises:
        ParamError: why (RunTooLarge among them).
    """
    sim_precheck(parse_lab_params(values), max_run_mb=settings.LABS_SIM_MAX_RUN_MB)


def simulation_steps(values: Mapping[str, Any]) -> int:
    """An upper bound (O(1)) on the simulated steps one simulation of these settings takes: its
    cost in the lab worker's time (labs.sizing.sim_steps).

    Raises:
        ParamError: settings that cannot be simulated.
    """
    return sim_steps(parse_lab_params(values))


def simulate(values: Mapping[str, Any], *, until: float | None = None) -> dict[str, Any]:
    """Simulate lab settings as a lab worker does (within its memory allowance): the run's
    summary (labs.metrics.summarize). `until`, a time.monotonic() deadline: past it the simulation
    stops with SoftTimeLimitExceeded, as a worker's soft time limit would stop it (for work that
    holds itself to a shorter limit than the turn it runs in, see `send_turn`).

    Raises:
        ParamError: settings that cannot run or are too large (RunTooLarge among them).
        SoftTimeLimitExceeded: past `until`.
    """
    backend = get_backend("sim", max_run_mb=settings.LABS_SIM_MAX_RUN_MB)

    def on_progress(fraction: float, phase: object = None) -> None:
        if until is not None and time.monotonic() > until:
            raise SoftTimeLimitExceeded("the simulation passed its deadline")

    return summarize(
        backend.run(parse_lab_params(values), on_progress if until is not None else None)
    )


def sim_queue() -> str:
    """The lab worker's queue, where work that simulates is sent."""
    return services.backend_queue("sim")


def send_turn(queue: str, *, for_what: str) -> None:
    """Send a turn to a lab queue for one piece of work just queued there, once the transaction
    that saved it has committed. Whoever's turn it is when a worker takes it goes (labs.turns):
    register the work's kind (`answer_for_labs(queued_work=...)`) for it to be taken. The turn
    has the queue's lab run time limits; work with a shorter limit holds itself to it.

    Raises:
        services.QueueUnavailable: the broker did not take it.
    """
    services.send_turns([queue], for_what=for_what)


def take_turn(*, queue: str, hostname: str) -> str:
    """Be the worker receiving a turn on `queue`: take the work whose turn it is and do it
    (labs.services.run_next). Returns a line for the worker's log."""
    return services.run_next(queue=queue, hostname=hostname)


def sim_worker_online() -> bool:
    return WorkerHeartbeat.objects.online().filter(backend="sim").exists()


# -- figures -------------------------------------------------------------------------------------


def metric(key: str) -> Metric | None:
    """The metric a run's summary `key` holds, with its label and unit as the lab pages show
    them; None for a key no lab page shows."""
    return next((m for m in results.METRICS if m.measured == key), None)
