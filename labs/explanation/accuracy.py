"""The errors a learner should read beside each kind of figure, for the lab's GPU.

Two columns, two errors, each beside what it describes:

- the **simulated** figures (the realistic profile): how far the simulation landed from published
  vLLM runs whose whole source its constants were refitted without (leave one source out), as a
  median and a worst, with the runs and sources counted. A calibrated GPU quotes its own runs of
  that kind of figure where it has some; an uncalibrated one quotes every GPU's V1 runs and names
  the GPU whose constants it borrows.
- the **formulas'** figures (the predicted column): their own typical gap to the same published
  runs. The formulas price the ideal engine on purpose, so this gap is large; it is what a run
  shows beside them.

Both come from `python -m labs.sim.published_calibration --report --write`, saved in
labs/sim/accuracy.json (docs/accuracy.md). Runs of engines older than V1 are never the quoted
figure (the simulator models V1); a GPU whose only runs are older says so. TTFT also carries the
host's front end (labs.sim.engine_model.Host): its line says what the simulation assumes and
the spread of published hosts. Pure Python, no Django.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from labs.parameters.catalog import CPU_KIND, GPUS, Hardware
from labs.sim.engine_model import calibration_evidence, gpu_display_name, load_calibration

ACCURACY_PATH = Path(__file__).parent.parent / "sim" / "accuracy.json"
KINDS = ("TTFT", "TPOT", "throughput", "E2E")


@dataclass(frozen=True)
class RunError:
    id: str
    gpu: str
    kind: str  # one of KINDS
    engine: str  # "V1" | "V0" | "unknown"
    source_id: str
    error: float  # simulated / published - 1, in the run's leave-one-source-out fold
    formula_error: float | None = None  # the formulas' figure / published - 1, if they give one


@dataclass(frozen=True)
class Estimate:
    """The median and worst of some runs' errors of one kind of figure, and where they are from."""

    kind: str
    median: float  # of |error|
    worst: float  # the largest |error|, with its sign
    runs: int
    sources: int
    own_gpu: bool  # False: the V1 runs of every GPU (this one has none of this kind)

    def counted(self) -> str:
        """ "3 runs from 1 source on this GPU"."""
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        sources = f"{self.sources} source{'s' if self.sources != 1 else ''}"
        where = "on this GPU" if self.own_gpu else "on every GPU (V1 engines)"
        return f"{runs} from {sources} {where}"

    def line(self) -> str:
        """ "TTFT: median error ±7%, worst +30% (3 runs from 1 source on this GPU)"."""
        return (
            f"{self.kind}: median error ±{max(self.median, 0.01):.0%}, worst {self.worst:+.0%}"
            f" ({self.counted()})"
        )

    def formula_line(self) -> str:
        """ "TPOT: the formulas land a median 34% from published runs, worst +1057% (...)"."""
        return (
            f"{self.kind}: the formulas land a median {self.median:.0%} from published runs,"
            f" worst {self.worst:+.0%} ({self.counted()})"
        )


@cache
def load_errors(path: Path = ACCURACY_PATH) -> tuple[RunError, ...]:
    runs = json.loads(path.read_text())["runs"]
    return tuple(
        RunError(
            r["id"],
            r["gpu"],
            r["kind"],
            r["engine"],
            r["source_id"],
            float(r["error"]),
            None if r.get("formula") is None else float(r["formula"]) / r["published"] - 1,
        )
        for r in runs
    )


def _estimate(kind: str, runs: list[RunError], errors: list[float], own_gpu: bool) -> Estimate:
    return Estimate(
        kind=kind,
        median=statistics.median(abs(e) for e in errors),
        worst=max(errors, key=abs),
        runs=len(errors),
        sources=len({r.source_id for r in runs}),
        own_gpu=own_gpu,
    )


def expected_error(
    gpu: str, kind: str, runs: Iterable[RunError], *, own: bool = True, formula: bool = False
) -> Estimate | None:
    """This GPU kind's runs of `kind` not known to be older than V1 (`own`, a GPU calibrated by
    them), else every GPU's V1 runs of `kind`; None when no published run of that kind was
    checked. `formula`: the formulas' gaps instead of the simulation's errors."""
    runs = [r for r in runs if r.kind == kind and (not formula or r.formula_error is not None)]

    def errors(chosen: list[RunError]) -> list[float]:
        return [(r.formula_error if formula else r.error) or 0.0 for r in chosen]

    mine = [r for r in runs if r.gpu == gpu and r.engine != "V0"] if own else []
    if mine:
        return _estimate(kind, mine, errors(mine), own_gpu=True)
    v1 = [r for r in runs if r.engine == "V1"]
    return _estimate(kind, v1, errors(v1), own_gpu=False) if v1 else None


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
    """What the page says beside each column for one GPU: `provenance` and `simulated` beside
    the simulated figures, `formula` beside the formulas' figures, `frontend` beside a TTFT."""

    provenance: str  # "H200 · calibrated to 3 published vLLM runs, checked against 2 more"
    simulated: tuple[str, ...]  # one per kind of figure shown
    formula: tuple[str, ...]
    frontend: str = ""
    calibrated: bool = True
    older_runs: str = ""  # an uncalibrated GPU's own runs of an older engine, if any


def frontend_line() -> str:
    """What the simulation puts in front of the engine, and the spread of published hosts."""
    cal = load_calibration()
    default = cal.host()
    published = cal.published_hosts()
    line = (
        f"TTFT includes the host's front end, not the GPU's: the simulation assumes"
        f" {default.latency_s * 1e3:.1f} ms a request + {default.per_stream_s * 1e3:.1f} ms"
        " for each other request in flight (the median of published API-server hosts)"
    )
    if published:
        lat = [h.latency_s * 1e3 for h in published]
        per = [h.per_stream_s * 1e3 for h in published]
        line += (
            f"; the {len(published)} published hosts range {min(lat):.1f}-{max(lat):.1f} ms +"
            f" {min(per):.1f}-{max(per):.1f} ms, so at low load a TTFT of a few milliseconds"
            " is as uncertain as the host"
        )
    return line


def _provenance(hardware: Hardware) -> tuple[str, bool]:
    name = gpu_display_name(hardware)
    gpu = load_calibration().gpus.get(hardware.name)
    if hardware.name == CPU_KIND:
        return f"{name} · not calibrated to any published run", False
    if gpu is not None and gpu.calibrated:
        return f"{name} · {calibration_evidence(hardware)}", True
    source = gpu.borrows_from if gpu is not None else ""
    lender = GPUS.get(source)
    if lender is not None:
        borrowed = f"constants borrowed from {gpu_display_name(lender)}"
    else:
        borrowed = "constants assumed between the A100's and the H100's"
    return (
        f"{name} · not calibrated: no published vLLM V1 run of this GPU; {borrowed};"
        " its error is every calibrated GPU's",
        False,
    )


def _older_runs(hardware: Hardware, runs: tuple[RunError, ...]) -> str:
    own = [r for r in runs if r.gpu == hardware.name and r.engine == "V0"]
    if not own:
        return ""
    estimate = _estimate(own[0].kind, own, [r.error for r in own], own_gpu=True)
    return (
        f"Its published runs of an older V0 engine ({', '.join(r.id for r in own)}) set no"
        f" constant, since the simulator models V1: it lands a median {estimate.median:.0%}"
        f" from them, worst {estimate.worst:+.0%}"
    )


# The kinds of figure a run's results table shows (labs/explanation/results.py METRICS), each
# simulated.
RUN_FIGURES = ("ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s")


def expected_errors(
    hardware: Hardware, predicted: Iterable[str], simulated: Iterable[str] = RUN_FIGURES
) -> ExpectedError:
    """For the GPU: the simulation's expected error of each kind of figure among `simulated`
    (a run's), the formulas' typical gap for each among `predicted` (the keys shown in the
    predicted column), and the host's front end where a TTFT is simulated."""
    provenance, calibrated = _provenance(hardware)
    runs = load_errors()
    sim_kinds = {figure_kind(k) for k in simulated}
    formula_kinds = {figure_kind(k) for k in predicted}
    sim_lines, formula_lines = [], []
    for kind in KINDS:
        if kind in sim_kinds:
            found = expected_error(hardware.name, kind, runs, own=calibrated)
            sim_lines.append(found.line() if found else f"{kind}: no published run checks it")
        if kind in formula_kinds:
            gap = expected_error(hardware.name, kind, runs, own=calibrated, formula=True)
            if gap is not None:
                formula_lines.append(gap.formula_line())
    return ExpectedError(
        provenance,
        tuple(sim_lines),
        tuple(formula_lines),
        frontend_line() if "TTFT" in sim_kinds else "",
        calibrated,
        _older_runs(hardware, runs),
    )
