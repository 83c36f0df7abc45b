"""One device's own calibration: constants fitted to runs measured on that device.

    device_calibration.py        the constants (`DeviceConstants`), their bounds, device keys
    device_calibration_sweep.py  the runs that measure a device, and the fit of its constants
    device_calibration_jobs.py   a calibration run on the device's own worker and stored
                                 (`manage.py lab calibrate`, the staff's devices page)

The published calibration every other device keeps is labs/sim/published_calibration.py's.

A worker that calibrates itself (a sweep on its own vLLM engine, fitted with the code of
labs/sim/published_calibration.py) stores a `labs.models.DeviceCalibration` row;
`DeviceConstants` is that row as plain data, so the predictor (labs/prediction/predict.py) and the
simulator's engine model (labs/sim/engine_model.py) can take it as an argument without importing
Django.

A device is a catalog GPU kind ("h100-sxm") or a CPU model with its core count
(`cpu_device_key`). Only runs priced for that device use its constants; every other device keeps
the published calibration of labs/sim/calibration.yaml.

Plain Python; never Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labs.parameters.params import EngineConfig

# The constants a device calibration holds, with the range a fit may give each (fractions of the
# data-sheet peaks; overheads in seconds).
CONSTANT_BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.001, 1.0),
    "kv_bandwidth_efficiency": (0.001, 1.0),
    "gemm_efficiency": (0.001, 1.0),
    "decode_step_overhead_s": (0.0, 0.5),
    "mixed_step_overhead_s": (0.0, 0.5),
    # Tokens at which GEMMs reach half their ceiling: tens on a GPU (idle tensor cores at small
    # batches), near zero on a CPU, whose matmul is as efficient for one row as for many.
    "gemm_half_tokens": (0.01, 4096.0),
    # CPU time a step with drafts adds (the ngram proposer's search, the rejection sampler).
    "spec_step_overhead_s": (0.0, 0.5),
    # Share of peak FLOP/s prefill attention reaches: FlashAttention on a GPU, a CPU's own
    # attention kernels far below its matmul rate.
    "attention_efficiency": (0.001, 1.0),
    # CPU time each sequence adds to a step (scheduling, inputs, sampling, outputs): microseconds
    # where a GPU's CPU works ahead of it, a large share of the step on a CPU worker.
    "per_seq_overhead_s": (1e-7, 0.05),
    # Measured, not fitted (device_calibration_sweep.device_frontend_line): the API server's time
    # per request, off the engine, that every TTFT carries and a busy engine does not wait for,
    # with the request alone ...
    "frontend_latency_s": (0.0, 1.0),
    # ... and what each other stream in flight adds to it: one Python process relays every
    # stream (a CPU worker's API server took 4 ms alone, 10 ms beside 3 others, 17 ms beside 7).
    "frontend_per_stream_s": (0.0, 1.0),
    # ... and the front end's CPU time per request that a busy engine loses: a CPU worker's API
    # server and client run on the core its scheduler uses (vLLM's CPU backend keeps one core
    # for all three), so a request handed to an engine running others lengthens its next step.
    # On a CPU worker what each other stream adds to the front end's time; 0 on a GPU worker.
    "frontend_cpu_s": (0.0, 1.0),
    # Measured, not fitted, on a CPU worker (device_calibration_sweep.ngram_drafting): its
    # engine's ngram acceptance per draft where it drafted, and the share of steps that did.
    "ngram_acceptance": (0.0, 1.0),
    "ngram_draft_share": (0.0, 1.0),
}
# A calibration stored before these constants were fitted keeps the published values.
OPTIONAL_CONSTANTS = frozenset(
    {
        "gemm_half_tokens",
        "spec_step_overhead_s",
        "attention_efficiency",
        "per_seq_overhead_s",
        "frontend_latency_s",
        "frontend_per_stream_s",
        "frontend_cpu_s",
        "ngram_acceptance",
        "ngram_draft_share",
    }
)
# Constants a device's fit takes as measured and never searches.
MEASURED_CONSTANTS = frozenset(
    {
        "frontend_latency_s",
        "frontend_per_stream_s",
        "frontend_cpu_s",
        "ngram_acceptance",
        "ngram_draft_share",
    }
)


def cpu_device_key(cpu_model: str, cores: int) -> str:
    """The device key of a CPU worker: its model name and core count ("cpu:AMD EPYC 7763:2")."""
    return f"cpu:{' '.join(cpu_model.split())}:{int(cores)}"


def announced_cpu_key(gpus: Mapping[str, Any]) -> str:
    """The device key of the CPU worker whose heartbeat announced `gpus` (name, cores)."""
    return cpu_device_key(str(gpus.get("name") or ""), int(gpus.get("cores") or 0))


def check_constants(constants: dict[str, Any]) -> dict[str, float]:
    """The constants as floats, each within CONSTANT_BOUNDS.

    Raises:
        ValueError: a constant is missing, not a number or out of range (the message names it).
    """
    checked = {}
    for name, (low, high) in CONSTANT_BOUNDS.items():
        if name not in constants and name in OPTIONAL_CONSTANTS:
            continue
        if name not in constants:
            raise ValueError(f"{name} is missing from the device's constants")
        try:
            value = float(constants[name])
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {constants[name]!r}") from None
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {value:g}")
        checked[name] = value
    return checked


@dataclass(frozen=True)
class DeviceConstants:
    """A device's fitted constants and how well they did on the runs the fit never saw."""

    device: str
    bandwidth_efficiency: float
    kv_bandwidth_efficiency: float
    gemm_efficiency: float
    decode_step_overhead_s: float
    mixed_step_overhead_s: float
    fitted_on: date
    fit_error: float  # median |relative error| of the fitted points
    held_out_error: float  # median |relative error| of the held-out points
    where: str = "this worker"
    gemm_half_tokens: float | None = None  # None: the GPU kind's published value
    spec_step_overhead_s: float | None = None  # None: the published (global) value
    attention_efficiency: float | None = None  # None: the published (global) value
    per_seq_overhead_s: float | None = None  # None: the published (global) value
    # None: 0, a calibration stored before the front end was measured.
    frontend_latency_s: float | None = None
    frontend_per_stream_s: float | None = None  # None: 0, a flat front end
    frontend_cpu_s: float | None = None  # None: 0, a front end on cores of its own
    ngram_acceptance: float | None = None  # None: the lab's alpha (no CPU ngram measured)
    ngram_draft_share: float | None = None

    def label(self) -> str:
        """What every number priced with these constants says about them."""
        return (
            f"calibrated on {self.where}, {self.fitted_on.isoformat()},"
            f" held-out error {self.held_out_error:.0%}"
        )

    def predictor_engine(self, engine: EngineConfig) -> EngineConfig:
        """The predictor's efficiency knobs from this device's fit: GEMMs reach
        `gemm_efficiency` of peak, weight reads `bandwidth_efficiency`, a decode step pays
        `decode_step_overhead_s` and each sequence in it `per_seq_overhead_s`. A knob the lab
        set away from its ideal default is the learner's choice and stays."""
        return replace(
            engine,
            compute_efficiency=(
                self.gemm_efficiency
                if engine.compute_efficiency == 1.0
                else engine.compute_efficiency
            ),
            bandwidth_efficiency=(
                self.bandwidth_efficiency
                if engine.bandwidth_efficiency == 1.0
                else engine.bandwidth_efficiency
            ),
            step_overhead_s=(
                self.decode_step_overhead_s
                if engine.step_overhead_s == 0.0
                else engine.step_overhead_s
            ),
            seq_overhead_s=self.per_seq_overhead_s or 0.0,
        )


def every_step_acceptance(k: int, tokens_per_step: float) -> float:
    """The acceptance at which k drafts at every step make `tokens_per_step` on average:
    (1 - a^(k+1)) / (1 - a), which rises with a, solved by halving."""
    target = min(max(tokens_per_step, 1.0), k + 1 - 1e-9)
    low, high = 0.0, 1.0 - 1e-9
    for _ in range(60):
        mid = (low + high) / 2
        if (1 - mid ** (k + 1)) / (1 - mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2
