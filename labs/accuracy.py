"""The error a learner should expect of a simulated figure: for the lab's GPU and each kind of
figure (TTFT, TPOT, throughput, E2E), how far the realistic simulation landed from published vLLM
runs its constants were not fitted to.

The figures are the leave-one-source-out errors that
`python -m labs.sim.published_calibration --report --write` saves in labs/sim/accuracy.json
(docs/accuracy.md): each run predicted with constants fitted without its whole source. A GPU
kind's own runs are used where it has runs of that kind; otherwise the V1 runs of every GPU. Runs
of engines older than V1 are never used: the simulator models V1. Pure Python, no Django.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from labs.catalog import Hardware
from labs.sim.engine_model import calibration_evidence, gpu_display_name, load_calibration

ACCURACY_PATH = Path(__file__).parent / "sim" / "accuracy.json"
KINDS = ("TTFT", "TPOT", "throughput", "E2E")
NOT_CALIBRATED = "not calibrated to any published run: no error estimate"


@dataclass(frozen=True)
class RunError:
    id: str
    gpu: str
    kind: str  # one of KINDS
    engine: str  # "V1" | "V0" | "unknown"
    source_id: str
    error: float  # simulated / published - 1, in the run's leave-one-source-out fold


@dataclass(frozen=True)
class Estimate:
    kind: str
    median: float  # of |error|
    worst: float  # the largest |error|, with its sign
    runs: int
    own_gpu: bool  # False: the V1 runs of every GPU (this one has none of this kind)

    def line(self) -> str:
        """ "TTFT: within about ±7% on published runs like this (...)"."""
        where = (
            f"{self.runs} run{'s' if self.runs != 1 else ''} on this GPU"
            if self.own_gpu
            else f"none on this GPU; {self.runs} V1 run{'s' if self.runs != 1 else ''} on others"
        )
        return (
            f"{self.kind}: within about ±{max(self.median, 0.01):.0%} on published runs like"
            f" this (worst {self.worst:+.0%}; {where})"
        )


@cache
def load_errors(path: Path = ACCURACY_PATH) -> tuple[RunError, ...]:
    runs = json.loads(path.read_text())["runs"]
    return tuple(
        RunError(r["id"], r["gpu"], r["kind"], r["engine"], r["source_id"], float(r["error"]))
        for r in runs
    )


def _estimate(kind: str, errors: list[float], own_gpu: bool) -> Estimate:
    return Estimate(
        kind=kind,
        median=statistics.median(abs(e) for e in errors),
        worst=max(errors, key=abs),
        runs=len(errors),
        own_gpu=own_gpu,
    )


def expected_error(gpu: str, kind: str, runs: Iterable[RunError]) -> Estimate | None:
    """This GPU kind's runs of `kind` not known to be older than V1, else every GPU's V1 runs
    of `kind`; None when no published run of that kind was checked."""
    runs = [r for r in runs if r.kind == kind]
    own = [r.error for r in runs if r.gpu == gpu and r.engine != "V0"]
    if own:
        return _estimate(kind, own, own_gpu=True)
    v1 = [r.error for r in runs if r.engine == "V1"]
    return _estimate(kind, v1, own_gpu=False) if v1 else None


def figure_kind(key: str) -> str | None:
    """Which kind of figure a predicted key is ("loaded_ttft_s" -> "TTFT"), or None."""
    name = key.removeprefix("loaded_")
    if name.startswith("ttft"):
        return "TTFT"
    if name.startswith("tpot"):
        return "TPOT"
    if name.startswith("e2e"):
        return "E2E"
    if name.endswith("tokens_per_s") or name == "requests_per_s":
        return "throughput"
    return None


@dataclass(frozen=True)
class ExpectedError:
    provenance: str  # "H200 · calibrated to 1 published vLLM run, checked against 1 more"
    lines: tuple[str, ...]  # one per kind of figure shown, or NOT_CALIBRATED
    calibrated: bool = True


def expected_errors(hardware: Hardware, keys: Iterable[str]) -> ExpectedError:
    """The provenance of the GPU's constants and one line per kind of figure among `keys`."""
    name = gpu_display_name(hardware)
    gpu = load_calibration().gpus.get(hardware.name)
    if gpu is None or not gpu.calibrated:
        return ExpectedError(
            f"{name} · constants borrowed from a calibrated GPU", (NOT_CALIBRATED,), False
        )
    provenance = f"{name} · {calibration_evidence(hardware)}"
    present = {figure_kind(k) for k in keys}
    lines = []
    for kind in KINDS:
        if kind not in present:
            continue
        estimate = expected_error(hardware.name, kind, load_errors())
        lines.append(estimate.line() if estimate else f"{kind}: no published run checks it")
    return ExpectedError(provenance, tuple(lines))
