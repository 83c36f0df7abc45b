"""The `sim` backend: lab parameters -> the simulator in labs/sim/ (built by labs/sim/lab.py)
-> a RunRecord, priced by the engine model of the lab's `sim_profile` (labs/sim/engine_model.py:
`realistic`, calibrated to published vLLM runs, or `ideal`, the predictor's roofline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labs.backends.base import Device, Placement, ProgressCallback, RunRecord
from labs.explanation.definitions import definitions
from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import LabParams
from labs.prediction.sizing import MB, address_space_limit, sim_precheck
from labs.sim.engine_model import where_label
from labs.sim.lab import build_simulator
from labs.sim.simulator import WHERE

# Address space beyond the run's budget: thread stacks and malloc arenas reserve far more than
# they touch, and numpy's temporaries come and go.
_HEADROOM_BYTES = 256 * MB


# Runs are simulations: labelled simulated, run by CPU workers under the simulator's queue cap.
SIMULATED = True


def check_can_start(
    params: LabParams,
    devices: Sequence[Device] = (),
    /,
    *,
    max_run_mb: int | None = None,
    elsewhere: bool = False,
) -> Placement | None:
    """The simulator's start-up check (labs.backends.check_can_start): its pool must hold the
    longest request and the run fit `max_run_mb` (None: no limit). Any CPU worker runs it, so
    no placement."""
    sim_precheck(params, max_run_mb=max_run_mb)
    return None


def backend_for_run(*, max_run_mb: int | None, device: DeviceConstants | None) -> SimBackend:
    return SimBackend(max_run_mb, device)


def requirement(params: LabParams) -> str:
    return ""  # any CPU worker runs it


def device_lab_settings(kind: str, start: Mapping[str, Any] | None = None) -> dict[str, str]:
    return {}


def worker_inventory() -> dict[str, Any] | None:
    return None  # no devices: it runs on the worker's CPU


def describe() -> dict[str, Any]:
    return {"where": WHERE}


def device_label(announced: Mapping[str, Any]) -> str:
    return ""


def this_device(params: LabParams) -> str:
    return params.hardware.name  # the GPU it simulates, whose calibration prices it


def served_instead(params: LabParams, meta: Mapping[str, Any]) -> None:
    return None  # it serves the lab's own model


def server_argv(
    params: LabParams,
    *,
    model_path: str | None = None,
    executable: str | None = None,
    port: int | None = None,
) -> list[str]:
    raise ValueError("backend sim starts no server")


def device_state() -> dict[str, Any]:
    return {}  # no devices


def engine_busy() -> str:
    return ""  # every run has an engine of its own


def server_port() -> None:
    return None


def make_model(slug: str, *, force: bool = False) -> dict[str, Any]:
    raise ValueError("backend sim builds no models")


class SimBackend:
    """Runs a lab on the simulator, on the CPU, in virtual time.

    Args:
        max_run_mb: memory one run may use (the worker passes LABS_SIM_MAX_RUN_MB). A run whose
            estimate is larger is refused before anything is built (RunTooLarge), and the process
            may grow by at most twice that while the run lasts, so a wrong estimate ends in a
            MemoryError for this run, never in the OOM killer taking the worker. None: no limit.
        device: the calibration measured on the lab's GPU kind, if one is stored
            (labs.runs.selectors.device_calibration); the caller looks it up for the run's GPU.
    """

    name = "sim"

    def __init__(
        self, max_run_mb: int | None = None, device: DeviceConstants | None = None
    ) -> None:
        self.max_run_mb = max_run_mb
        self.device = device

    def run(self, params: LabParams, on_progress: ProgressCallback | None = None) -> RunRecord:
        if self.max_run_mb is None:
            return self._run(params, on_progress)
        check_can_start(params, max_run_mb=self.max_run_mb)
        with address_space_limit(2 * self.max_run_mb * MB + _HEADROOM_BYTES):
            return self._run(params, on_progress)

    def _run(self, params: LabParams, on_progress: ProgressCallback | None) -> RunRecord:
        device = self.device if self.device and self.device.device == params.hardware.name else None
        simulator = build_simulator(params, on_progress=on_progress, device=device)
        record = simulator.run()
        config = simulator.config
        record.where = where_label(params.hardware, params.engine.sim_profile, device)
        record.meta.update(
            {
                "sim_profile": params.engine.sim_profile,
                "seed": params.workload.seed,
                "params": params.as_dict(),
                "num_gpu_blocks": config.num_gpu_blocks,
                "kv_capacity_tokens": config.num_gpu_blocks * config.block_size,
                "definitions": definitions(self.name, params.workload.temperature),
                "device_calibration": device.label() if device else None,
            }
        )
        return record


BACKEND = SimBackend
