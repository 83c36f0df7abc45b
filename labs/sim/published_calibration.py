"""The published vLLM runs of labs/sim/calibration.yaml, replayed on the simulator.

    python -m labs.sim.published_calibration           # source, settings, published, simulated
    python -m labs.sim.published_calibration --fit     # search the constants on the `fit` runs
    python -m labs.sim.published_calibration --fit --gpu l4   # that GPU kind's constants only
    python -m labs.sim.published_calibration --report  # leave-one-source-out and the aims first
                                                       # (minutes), then the constants beside
                                                       # their priors, per GPU kind, the hosts,
                                                       # the formulas' gaps
    python -m labs.sim.published_calibration --report --quick  # the same, folds not refitted
    python -m labs.sim.published_calibration --report --write  # and save labs/sim/accuracy.json

Each measurement's `settings` are lab parameters; the simulator runs them on the realistic profile
and reads `metric` from labs.measurement.metrics.summarize (for a ratio, the same with `baseline`
applied is the denominator). Virtual time only: the result is the same on any machine.

Leave-one-source-out: every run comes from a source (`source_id`: one sweep, table, post or
submitter). Each source's runs are predicted with constants refitted without that source's fit
runs; a constant every one of whose fit runs is left out starts from its `prior` (a GPU kind's
own constant from the `custom` entry's, its decode-step overhead from the global one, and a
source's own host is dropped, so its runs meet the median of the other hosts). The
simulator models vLLM's V1 engine: runs of older engines (role `v0`) never set a constant and
are predicted with the file's constants, which they did not shape.

Why one module: replaying the published runs and fitting to them read the same table of runs and
the same residuals; split, each half would restate the other's.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from labs.measurement.metrics import summarize
from labs.parameters.params import align_run_batch, parse_lab_params
from labs.sim.engine_model import (
    CALIBRATION_PATH,
    DEFAULT_HOST,
    Calibration,
    EngineModel,
    load_calibration,
    parse_calibration,
)
from labs.sim.lab import build_simulator

# How close each kind of measurement must come (tests/labs/sim/test_calibration.py).
TOLERANCE = {"fit": 0.10, "held_out": 0.20}
# A held-out TTFT carries its host's front end (the API server's time), which a host's two fit
# runs (one request, and one with others in flight) pin down only approximately.
HELD_OUT_TTFT_TOLERANCE = 0.40
# The folds' errors, which the lab page reads (labs/explanation/accuracy.py); `--report --write`
# rewrites it.
ACCURACY_PATH = Path(__file__).with_name("accuracy.json")
# Roles whose runs the leave-one-source-out table predicts; `v0` runs are never fitted.
SCORED = (*TOLERANCE, "v0")
ROLES = (*SCORED, "excluded")
GENERATIONS = ("V1", "V0", "unknown")
METRIC_KINDS = ("TTFT", "TPOT", "throughput", "E2E")


@dataclass(frozen=True)
class Measurement:
    id: str
    role: str  # "fit" | "held_out" | "v0" | "excluded"
    source: str
    what: str
    engine: str
    settings: Mapping[str, Any]
    metric: str
    published: float
    baseline: Mapping[str, Any] | None = None
    uncertain: str = ""
    excluded_because: str = ""
    # Moved to `excluded` after it had been simulated in its first role (the count is reported).
    moved_after_seen: bool = False
    source_id: str = ""  # the sweep, table, post or submitter: one leave-one-source-out fold
    vllm_version: str = ""
    engine_generation: str = "unknown"  # "V1" | "V0" | "unknown", as the source states
    # The host in front of the engine (calibration.yaml `hosts`): the source's own where it
    # measured one, else the default of its kind.
    host: str = DEFAULT_HOST

    @property
    def kind(self) -> str:
        return metric_kind(self.metric)

    @property
    def label(self) -> str:
        s = self.settings
        tp = f" x{s['tp']}" if s.get("tp", 1) > 1 else ""
        load = (
            f"c={s['max_concurrency']}"
            if s.get("max_concurrency")
            else (f"{s['request_rate']} req/s" if s.get("request_rate") else "all at once")
        )
        model = s.get("model", "llama-3-8b")
        if model == "custom":
            model = f"custom {s['params_b']}B"
        return f"{model}, {s['gpu']}{tp}, {s['prompt_tokens']}/{s['output_tokens']} tok, {load}"


@cache
def load_measurements() -> tuple[Measurement, ...]:
    data = yaml.safe_load(CALIBRATION_PATH.read_text())
    return tuple(
        Measurement(
            id=m["id"],
            role=m["role"],
            source=m["source"],
            what=m["what"],
            engine=m["engine"],
            settings=m["settings"],
            metric=m["metric"],
            published=float(m["published"]),
            baseline=m.get("baseline"),
            uncertain=m.get("uncertain", ""),
            excluded_because=m.get("excluded_because", ""),
            moved_after_seen=bool(m.get("moved_after_seen", False)),
            source_id=m["source_id"],
            vllm_version=str(m["vllm"]["version"]),
            engine_generation=str(m["vllm"]["engine"]),
            host=str(m.get("host", DEFAULT_HOST)),
        )
        for m in data["measurements"]
    )


def metric_kind(metric: str) -> str:
    """ "TTFT", "TPOT", "throughput" or "E2E": the rows of the leave-one-source-out table."""
    if metric.startswith("ttft"):
        return "TTFT"
    if metric.startswith(("tpot", "itl")):
        return "TPOT"
    if metric.startswith("e2e"):
        return "E2E"
    if metric.endswith("_per_s"):
        return "throughput"
    raise ValueError(f"no metric kind for {metric!r}")


def _metric(summary: Mapping[str, Any], path: str) -> float:
    value: Any = summary
    for part in path.split("."):
        value = value[part]
    return float(value)


def _run(settings: Mapping[str, Any], metric: str, cal: Calibration, host: str) -> float:
    params = parse_lab_params({**settings, "sim_profile": "realistic"})
    sim = build_simulator(params, calibration=cal, host=host)
    sim.cost_model = EngineModel(params.hardware, params.model, params.engine, calibration=cal)
    return _metric(summarize(sim.run()), metric)


def simulate(m: Measurement, cal: Calibration | None = None) -> float:
    """What the simulator gives for measurement `m` with calibration `cal` (default: the file)."""
    cal = cal or load_calibration()
    value = _run(m.settings, m.metric, cal, m.host)
    if m.baseline is not None:
        value /= _run({**m.settings, **m.baseline}, m.metric, cal, m.host)
    return value


def relative_error(simulated: float, published: float) -> float:
    return simulated / published - 1


def format_table(rows: list[tuple[Measurement, float]]) -> str:
    """source, settings, published, simulated, error: one line per measurement."""
    lines = [
        f"{'id':<4}{'role':<10}{'settings':<52}{'metric':<22}{'published':>12}"
        f"{'simulated':>12}{'error':>9}  source"
    ]
    for m, sim in rows:
        lines.append(
            f"{m.id:<4}{m.role:<10}{m.label:<52}{m.metric:<22}{_fmt(m.published, m.metric):>12}"
            f"{_fmt(sim, m.metric):>12}{relative_error(sim, m.published):>+9.1%}  {m.source}"
        )
    return "\n".join(lines)


def _fmt(value: float, metric: str) -> str:
    if metric.endswith("_s.mean") or metric.endswith("_s.p50"):
        return f"{value * 1000:.2f} ms"
    return f"{value:.3g}"


# -- the per-GPU report ------------------------------------------------------------------------


def tolerance(m: Measurement) -> float:
    """How close measurement `m` (fit or held out) must come."""
    if m.role == "held_out" and m.kind == "TTFT":
        return HELD_OUT_TTFT_TOLERANCE
    return TOLERANCE[m.role]


def held_out_errors(rows: list[tuple[Measurement, float]]) -> list[float]:
    """|relative error| of every held-out run."""
    return [abs(relative_error(sim, m.published)) for m, sim in rows if m.role == "held_out"]


def format_report(rows: list[tuple[Measurement, float]], cal: Calibration | None = None) -> str:
    """Every catalog GPU kind with its fitted and held-out runs and their errors, or "not
    calibrated" and the part whose constants it borrows; then the held-out summary and how many
    runs were moved out of fit/held-out after being seen."""
    from labs.parameters.catalog import GPUS

    cal = cal or load_calibration()
    lines = []
    for name in GPUS:
        gpu = cal.gpus.get(name)
        own = [(m, sim) for m, sim in rows if m.settings["gpu"] == name and m.role in TOLERANCE]
        title = f"{gpu.display if gpu else name} ({name})"
        if not own:
            borrows = gpu.borrows if gpu and gpu.borrows else "the custom GPU's"
            older = [m.id for m, _ in rows if m.settings["gpu"] == name and m.role == "v0"]
            v0 = f"; V0 engine runs only: {', '.join(older)}" if older else ""
            lines.append(
                f"{title}: not calibrated (no usable published vLLM V1 run{v0}); borrows {borrows}"
            )
            continue
        counts = {role: sum(m.role == role for m, _ in own) for role in TOLERANCE}
        lines.append(f"{title}: {counts['fit']} fit, {counts['held_out']} held out")
        for m, sim in own:
            lines.append(
                f"    {m.id:<4}{m.role:<10}{m.label:<52}{m.metric:<22}"
                f"{_fmt(m.published, m.metric):>12}{_fmt(sim, m.metric):>12}"
                f"{relative_error(sim, m.published):>+9.1%}"
            )
    errors = held_out_errors(rows)
    if errors:
        lines.append(
            f"held out: {len(errors)} runs, median |error| {statistics.median(errors):.1%},"
            f" worst {max(errors):.1%}"
        )
    for kind in METRIC_KINDS:
        misses = [
            abs(relative_error(sim, m.published))
            for m, sim in rows
            if m.role == "held_out" and m.kind == kind
        ]
        if misses:
            lines.append(
                f"  {kind}: {len(misses)} runs, median |error| {statistics.median(misses):.1%},"
                f" worst {max(misses):.1%}"
            )
    older_ids = [m.id for m, _ in rows if m.role == "v0"]
    lines.append(
        f"V0 engines: {len(older_ids)} runs ({', '.join(older_ids)}), fitted to nothing;"
        " predicted in the leave-one-source-out table"
    )
    excluded = [m for m, _ in rows if m.role == "excluded"]
    moved = sum(m.moved_after_seen for m in excluded)
    lines.append(
        f"excluded: {len(excluded)} runs, {moved} of them moved out of fit/held-out after being"
        " simulated (each says why in calibration.yaml)"
    )
    return "\n".join(lines)


# -- fitting ---------------------------------------------------------------------------------------

# Bounds of the global constants the search may move; a GPU kind's own use GPU_FREE's. Which
# constants move is the YAML's: every one with `fitted_to` (`fitted_constants`).
# NOTE: the bounds are wider than each constant's `prior_range` on purpose: a fit that wants to
# leave the range the physics allows must be seen to (`out_of_prior`), not stopped at its edge.
FREE = {
    "global.kernel_latency_us": (0.0, 12.0),
    "global.decode_step_overhead_ms": (0.05, 5.0),
    "global.mixed_step_overhead_ms": (0.1, 8.0),
    "global.attention_efficiency": (0.1, 0.95),
    "global.per_seq_overhead_us": (0.0, 60.0),
}

# A GPU kind's own constants (`--fit --gpu NAME`): fitted to that kind's `fit` runs alone, with
# every global constant and every other GPU left as they are. A decode-step overhead is searched
# only where the kind already has its own.
GPU_FREE = (
    ("bandwidth_efficiency", 0.5, 0.97),
    ("kv_bandwidth_efficiency", 0.3, 0.95),
    ("gemm_efficiency", 0.2, 0.9),
    ("gemm_half_tokens", 1.0, 2000.0),
    ("decode_step_overhead_ms", 0.05, 5.0),
)
# A published host's own front end (`hosts.<name>`), fitted to its source's fit runs.
HOST_FREE = (("latency_ms", 0.1, 60.0), ("per_stream_ms", 0.0, 40.0))


def _get(data: dict[str, Any], path: str) -> float:
    node: Any = data
    for part in path.split("."):
        node = node[part]
    return float(node["value"] if isinstance(node, dict) else node)


def _set(data: dict[str, Any], path: str, value: float) -> None:
    *head, last = path.split(".")
    node: Any = data
    for part in head:
        node = node[part]
    if isinstance(node[last], dict):
        node[last]["value"] = value
    else:
        node[last] = value


def coordinate_search(
    loss: Callable[[dict[str, float]], float],
    values: dict[str, float],
    bounds: Mapping[str, tuple[float, float]],
    rounds: int = 3,
    log: Callable[[str], None] = print,
    *,
    step: float = 0.25,
    max_moves: int = 1,
) -> tuple[dict[str, float], float]:
    """Minimise `loss` over `values` one constant at a time: each round tries every constant
    `step` (25%, then half that, ...) lower and higher within its bounds and keeps what lowers
    the loss, moving the same way up to `max_moves` times while it keeps helping (a device far
    from the published constants needs more than one move). The published fit (`fit`) and a
    device's own fit (labs/calibration/sweep.py) both use it."""
    best = loss(values)
    for r in range(rounds):
        for path, (low, high) in bounds.items():
            for factor in (1 - step, 1 + step):
                for _ in range(max_moves):
                    trial = dict(values)
                    trial[path] = min(high, max(low, values[path] * factor))
                    value = loss(trial) if trial[path] != values[path] else best
                    if value >= best:
                        break
                    best, values = value, trial
        log(f"round {r}: loss {best:.4f}")
        step /= 2
    return values, best


def log_error_loss(pairs: list[tuple[float, float]]) -> float:
    """Sum of squared log errors of (simulated, measured) pairs: a run 10% slow costs as much
    as one 10% fast, whatever its unit."""
    return sum(math.log(sim / measured) ** 2 for sim, measured in pairs)


@dataclass(frozen=True)
class Fitted:
    """A constant the fit moves: its dotted path, the fit runs it was fitted to, its search
    bounds, the value it starts from when every one of those runs is left out, and the range
    physics or vLLM's code allows it, stated beside it in the YAML before it was fitted."""

    path: str
    fitted_to: tuple[str, ...]
    low: float
    high: float
    # None: a GPU kind's decode-step overhead (then the global one prices it) or a published
    # host's constant (then its runs get the default host of their kind).
    prior: float | None
    prior_range: tuple[float, float] | None = None
    prior_why: str = ""

    def within_prior(self, value: float) -> bool:
        """Whether `value` lies in the range the constant's prior allows."""
        if self.prior_range is None:
            return True
        low, high = self.prior_range
        return low <= value <= high


def _fitted_entries(node: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, entry) of every mapping under `node` that has `fitted_to`."""
    if not isinstance(node, dict):
        return []
    if "fitted_to" in node:
        return [(path, node)]
    found = []
    for key, child in node.items():
        found += _fitted_entries(child, f"{path}.{key}")
    return found


def fitted_constants(data: dict[str, Any]) -> tuple[Fitted, ...]:
    """Every constant with `fitted_to` in the YAML: globals, then GPU kinds', then hosts'."""
    gpu_bounds = {key: (low, high) for key, low, high in GPU_FREE}
    host_bounds = {key: (low, high) for key, low, high in HOST_FREE}
    custom = data["gpus"]["custom"]
    found = []
    for section in ("global", "gpus", "hosts"):
        for path, entry in _fitted_entries(data[section], section):
            key = path.rsplit(".", 1)[1]
            prior: float | None
            if section == "global":
                (low, high), prior = FREE[path], float(entry["prior"])
            elif section == "gpus":
                (low, high) = gpu_bounds[key]
                prior = _get(data, f"gpus.custom.{key}") if key in custom else None
            else:
                (low, high), prior = host_bounds[key], None
            span = entry.get("prior_range")
            found.append(
                Fitted(
                    path,
                    tuple(entry["fitted_to"]),
                    low,
                    high,
                    prior,
                    (float(span[0]), float(span[1])) if span else None,
                    " ".join(str(entry.get("prior_why", "")).split()),
                )
            )
    return tuple(found)


def out_of_prior(data: dict[str, Any]) -> list[str]:
    """The fitted constants of `data` whose value lies outside their prior range, as lines
    ("path = value, outside [low, high]"): each is a model error to fix."""
    return [
        f"{c.path} = {_get(data, c.path):.4g}, outside [{c.prior_range[0]:g}, {c.prior_range[1]:g}]"
        for c in fitted_constants(data)
        if c.prior_range is not None and not c.within_prior(_get(data, c.path))
    ]


def gpu_free(data: dict[str, Any], gpu: str) -> tuple[tuple[str, float, float], ...]:
    """The (path, low, high) of GPU kind `gpu`'s own constants that `fit(gpu=...)` may move."""
    if gpu not in data["gpus"]:
        raise ValueError(f"no GPU kind {gpu!r} in calibration.yaml")
    own = data["gpus"][gpu]
    return tuple((f"gpus.{gpu}.{key}", low, high) for key, low, high in GPU_FREE if key in own)


def fit(
    rounds: int = 3,
    log: Callable[[str], None] = print,
    gpu: str | None = None,
    max_moves: int = 1,
) -> tuple[dict[str, float], float]:
    """Coordinate search of every fitted constant on the `fit` measurements: minimise the sum
    of squared log errors. Returns the constants found and the loss. With `gpu`, only that GPU
    kind's own constants (GPU_FREE) move, fitted to its own `fit` runs; nothing else changes."""
    data = yaml.safe_load(CALIBRATION_PATH.read_text())
    fitted = [
        m
        for m in load_measurements()
        if m.role == "fit" and (gpu is None or m.settings["gpu"] == gpu)
    ]
    free = (
        tuple((c.path, c.low, c.high) for c in fitted_constants(data))
        if gpu is None
        else gpu_free(data, gpu)
    )
    if not fitted:
        raise ValueError(f"no fit runs for {gpu or 'any GPU'}")
    return _search(data, fitted, free, rounds, log, max_moves)


def _search(
    data: dict[str, Any],
    runs: list[Measurement],
    free: tuple[tuple[str, float, float], ...],
    rounds: int,
    log: Callable[[str], None],
    max_moves: int = 1,
) -> tuple[dict[str, float], float]:
    """`coordinate_search` of `free` in `data` (changed in place) on `runs`."""

    def loss(values: dict[str, float]) -> float:
        for path, v in values.items():
            _set(data, path, v)
        cal = parse_calibration(data)
        return log_error_loss([(simulate(m, cal), m.published) for m in runs])

    values = {path: _get(data, path) for path, _, _ in free}
    bounds = {path: (low, high) for path, low, high in free}
    found, best = coordinate_search(loss, values, bounds, rounds, log, max_moves=max_moves)
    for path, v in found.items():
        _set(data, path, v)
    return found, best


# -- leave one source out --------------------------------------------------------------------


def fold_data(data: dict[str, Any], left_out: str) -> tuple[dict[str, Any], list[str]]:
    """A copy of the YAML's mapping for the fold without source `left_out`: every fitted
    constant none of whose fit runs remains is set to its prior. Returns it and those paths."""
    data = copy.deepcopy(data)
    remaining = {m.id for m in load_measurements() if m.role == "fit" and m.source_id != left_out}
    orphaned = []
    for c in fitted_constants(data):
        if remaining.intersection(c.fitted_to):
            continue
        orphaned.append(c.path)
        section, *rest = c.path.split(".")
        if section == "hosts":
            # Its runs get their kind's default, the median of the other sources' hosts.
            data["hosts"][rest[0]]["left_out"] = True
        elif c.prior is None:
            del data["gpus"][rest[0]][rest[1]]
        else:
            _set(data, c.path, c.prior)
    return data, orphaned


@dataclass(frozen=True)
class Fold:
    source_id: str
    orphaned: tuple[str, ...]  # constants that started from their prior
    rows: tuple[tuple[Measurement, float], ...]  # the source's scored runs, simulated
    # The fold's refitted constants that left the range their prior allows (`out_of_prior`).
    outside: tuple[str, ...] = ()


def leave_one_source_out(
    source_id: str, rounds: int = 2, log: Callable[[str], None] = lambda _: None
) -> Fold:
    """Source `source_id`'s scored runs (fit, held out, v0), simulated with every fitted
    constant refitted on the other sources' fit runs by the search `--fit` runs."""
    runs = load_measurements()
    own = [m for m in runs if m.source_id == source_id and m.role in SCORED]
    data, orphaned = fold_data(yaml.safe_load(CALIBRATION_PATH.read_text()), source_id)
    others = [m for m in runs if m.role == "fit" and m.source_id != source_id]
    if any(m.role == "fit" for m in own):
        # A GPU kind's constants move only where one of its fit runs remains.
        gpus = {m.settings["gpu"] for m in others}
        free = tuple(
            (c.path, c.low, c.high)
            for c in fitted_constants(data)
            if c.path.startswith("global.")
            or (c.path.startswith("gpus.") and c.path.split(".")[1] in gpus)
            or (c.path.startswith("hosts.") and c.path not in orphaned)
        )
        _search(data, others, free, rounds, log)
    cal = parse_calibration(data)
    rows = tuple((m, simulate(m, cal)) for m in own)
    return Fold(source_id, tuple(orphaned), rows, tuple(out_of_prior(data)))


def all_folds(rounds: int = 2, jobs: int = 1) -> list[Fold]:
    """`leave_one_source_out` for every source with a scored run, `jobs` folds at a time."""
    sources = sorted({m.source_id for m in load_measurements() if m.role in SCORED})
    if jobs <= 1:
        return [leave_one_source_out(s, rounds) for s in sources]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(leave_one_source_out, sources, [rounds] * len(sources)))


@dataclass(frozen=True)
class Summary:
    runs: int
    sources: int
    median: float  # of |relative error|
    worst: float  # the largest |relative error|, with its sign


def summarize_errors(rows: list[tuple[Measurement, float]]) -> Summary | None:
    """Median and worst error of `rows`; None when there are none."""
    if not rows:
        return None
    errors = [relative_error(sim, m.published) for m, sim in rows]
    return Summary(
        runs=len(rows),
        sources=len({m.source_id for m, _ in rows}),
        median=statistics.median(abs(e) for e in errors),
        worst=max(errors, key=abs),
    )


def _summary_cells(s: Summary | None) -> str:
    if s is None:
        return f"{'-':>5}{'':>8}{'-':>9}{'-':>9}"
    return f"{s.runs:>5}{s.sources:>8}{s.median:>9.1%}{s.worst:>+9.1%}"


# The aims for V1 engines, on runs from sources the constants never saw (docs/accuracy.md):
# (median |error|, worst |error|) per kind of figure.
AIMS = {"TTFT": (0.15, 0.35), "TPOT": (0.08, 0.25)}


def aims_lines(rows: list[tuple[Measurement, float]]) -> list[str]:
    """Whether the leave-one-source-out errors of V1 runs meet AIMS, one line per kind."""
    lines = []
    for kind, (median_aim, worst_aim) in AIMS.items():
        found = summarize_errors(
            [(m, s) for m, s in rows if m.engine_generation == "V1" and m.kind == kind]
        )
        if found is None:
            lines.append(f"  V1 {kind}: no run")
            continue
        met = found.median <= median_aim and abs(found.worst) <= worst_aim
        lines.append(
            f"  V1 {kind}: median {found.median:.1%} (aim <= {median_aim:.0%}), worst"
            f" {found.worst:+.1%} (aim <= {worst_aim:.0%}) over {found.runs} runs from"
            f" {found.sources} sources: {'MET' if met else 'NOT MET'}"
        )
    return lines


def format_folds(folds: list[Fold], refitted: bool = True) -> str:
    """Leave-one-source-out, the headline: whether the aims are met, the median and worst
    error per engine generation and metric and per GPU kind and metric (runs not known to be
    older than V1: what the lab page quotes), then each source's runs with constants refitted
    without it (`refitted` False: the file's constants, for a quick look, not the check)."""
    rows = [row for fold in folds for row in fold.rows]
    how = (
        "constants refitted without it"
        if refitted
        else "QUICK: the file's constants, not refitted (not the check)"
    )
    lines = [
        f"LEAVE ONE SOURCE OUT (each source's runs simulated with {how})",
        "aims for V1 engines:",
        *aims_lines(rows),
    ]
    header = f"  {'':<22}{'runs':>5}{'sources':>8}{'median':>9}{'worst':>9}"
    lines += ["by engine and metric (|error| median, worst with its sign):", header]
    for generation in GENERATIONS:
        for kind in METRIC_KINDS:
            own = [(m, s) for m, s in rows if m.engine_generation == generation and m.kind == kind]
            lines.append(f"  {generation + ' ' + kind:<22}{_summary_cells(summarize_errors(own))}")
    lines += ["by GPU and metric (V1 and unknown-version runs):", header]
    for gpu in sorted({m.settings["gpu"] for m, _ in rows}):
        for kind in METRIC_KINDS:
            own = [
                (m, s)
                for m, s in rows
                if m.settings["gpu"] == gpu and m.kind == kind and m.engine_generation != "V0"
            ]
            if own:
                lines.append(f"  {gpu + ' ' + kind:<22}{_summary_cells(summarize_errors(own))}")
    lines.append("each source:")
    for fold in folds:
        m0 = fold.rows[0][0]
        fitted = any(m.role == "fit" for m, _ in fold.rows)
        how = "refitted without it" if fitted and refitted else "the file's constants"
        if not fitted:
            how += " (it fits none)"
        priors = (
            f"; from their prior or default: {', '.join(fold.orphaned)}" if fold.orphaned else ""
        )
        lines.append(
            f"  {fold.source_id} ({m0.engine_generation}, vLLM {m0.vllm_version}): {how}{priors}"
        )
        lines += [f"    OUTSIDE ITS PRIOR in this fold: {line}" for line in fold.outside]
        for m, sim in fold.rows:
            lines.append(
                f"    {m.id:<4}{m.role:<10}{m.label:<52}{m.metric:<22}"
                f"{_fmt(m.published, m.metric):>12}{_fmt(sim, m.metric):>12}"
                f"{relative_error(sim, m.published):>+9.1%}"
            )
    return "\n".join(lines)


def format_constants(data: dict[str, Any]) -> str:
    """Every fitted constant beside the range its prior allows (stated in calibration.yaml
    before it was fitted), whether it lies inside, and the runs it was fitted to."""
    lines = ["FITTED CONSTANTS beside the range physics or vLLM's code allows:"]
    for c in fitted_constants(data):
        value = _get(data, c.path)
        span = f"[{c.prior_range[0]:g}, {c.prior_range[1]:g}]" if c.prior_range else "(no range)"
        verdict = "inside" if c.within_prior(value) else "OUTSIDE: a model error to fix"
        lines.append(
            f"  {c.path:<46}{value:>9.4g}  prior {span:<14}{verdict:<9}"
            f"  fitted to {', '.join(c.fitted_to)}"
        )
        if c.prior_why:
            lines.append(f"      why: {c.prior_why}")
    return "\n".join(lines)


def format_hosts(cal: Calibration) -> str:
    """The front end of each host: the published ones (each serving its own source's runs
    only), each kind's default, and the spread a learner's own host may fall in."""
    lines = ["HOSTS (the front end in front of the engine; a host's, not a GPU's):"]
    for host in cal.hosts.values():
        lines.append(
            f"  {host.name:<20}{host.kind:<12}{host.latency_s * 1e3:>6.1f} ms"
            f" + {host.per_stream_s * 1e3:>5.1f} ms per other stream   {host.display}"
        )
    published = cal.published_hosts()
    if published:
        lat = [h.latency_s * 1e3 for h in published]
        per = [h.per_stream_s * 1e3 for h in published]
        lines.append(
            f"  published API servers: {min(lat):.1f}-{max(lat):.1f} ms +"
            f" {min(per):.1f}-{max(per):.1f} ms per other stream ({len(published)} hosts);"
            " a lab run gets the default (their median)"
        )
    return "\n".join(lines)


# What the formulas (labs/prediction/predict.py) give for each kind of published figure: the
# predictor key beside a metric of the summary. The formulas price the ideal engine on purpose;
# their gap to a published run is what the labs teach, and the page quotes it beside the formula's
# figures.
FORMULA_KEYS = {
    "ttft_s.p50": "loaded_ttft_p50_s",
    "ttft_s.mean": "loaded_ttft_s",
    "tpot_s.p50": "tpot_s",
    "tpot_s.mean": "tpot_s",
    "e2e_s.mean": "loaded_e2e_s",
    "output_tokens_per_s": "output_tokens_per_s",
}


def _formula_run(settings: Mapping[str, Any], metric: str) -> float | None:
    from labs.prediction.predict import predict

    key = FORMULA_KEYS.get(metric)
    if key is None:
        return None
    # The formulas' batch is `concurrency`; a published run's is what it kept in flight.
    value = getattr(predict(parse_lab_params(align_run_batch(settings))), key)
    return None if value is None else float(value)


def formula(m: Measurement) -> float | None:
    """What the formulas predict for measurement `m` (None where they give no such figure)."""
    value = _formula_run(m.settings, m.metric)
    if value is None or m.baseline is None:
        return value
    base = _formula_run({**m.settings, **m.baseline}, m.metric)
    return None if not base else value / base


def format_formula_gaps(runs: list[Measurement]) -> str:
    """The formula's own typical gap to the published runs, per kind of figure (V1 and
    unknown-version runs): what the page quotes beside the predicted column."""
    lines = ["FORMULAS vs published runs (the predicted column's own gap; median |gap|, worst):"]
    for kind in METRIC_KINDS:
        gaps = [
            relative_error(value, m.published)
            for m in runs
            if m.kind == kind
            and m.engine_generation != "V0"
            and (value := formula(m)) is not None
            and value > 0
        ]
        if gaps:
            lines.append(
                f"  {kind:<12}{len(gaps):>4} runs  median {statistics.median(map(abs, gaps)):.0%},"
                f" worst {max(gaps, key=abs):+.0%}"
            )
    return "\n".join(lines)


def accuracy_records(folds: list[Fold]) -> list[dict[str, Any]]:
    """One record per scored run for labs/explanation/accuracy.py: what it is, its fold's error,
    and what the formulas give for it (`formula`, None where they give no such figure)."""
    records = []
    for fold in folds:
        for m, sim in fold.rows:
            predicted = formula(m)
            records.append(
                {
                    "id": m.id,
                    "source_id": m.source_id,
                    "gpu": m.settings["gpu"],
                    "metric": m.metric,
                    "kind": m.kind,
                    "engine": m.engine_generation,
                    "role": m.role,
                    "published": m.published,
                    "simulated": round(sim, 9),
                    "error": round(relative_error(sim, m.published), 4),
                    "formula": None if predicted is None else round(predicted, 9),
                }
            )
    return records


def write_accuracy(folds: list[Fold], path: Path = ACCURACY_PATH) -> None:
    """The folds' errors, one run a line (labs/explanation/accuracy.py reads them)."""
    runs = ",\n".join(f"  {json.dumps(r)}" for r in accuracy_records(folds))
    made_by = json.dumps("python -m labs.sim.published_calibration --report --write")
    path.write_text(f'{{"made_by": {made_by},\n "runs": [\n{runs}\n]}}\n')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="search the fitted constants")
    parser.add_argument(
        "--report",
        action="store_true",
        help="leave one source out (the headline, minutes), the constants beside their priors,"
        " every catalog GPU kind with its runs, the hosts, the formulas' gaps",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="with --report: folds with the file's constants, not refitted (seconds; for"
        " iterating, never the check)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="with --report: save the folds' errors for the lab page",
    )
    parser.add_argument("--jobs", type=int, default=1, help="with --report: folds run at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--gpu", help="with --fit: fit only this GPU kind's own constants to its own fit runs"
    )
    parser.add_argument(
        "--max-moves", type=int, default=1, help="with --fit: moves per constant and direction"
    )
    args = parser.parse_args(argv)
    if args.fit:
        values, best = fit(args.rounds, gpu=args.gpu, max_moves=args.max_moves)
        ranges = {c.path: c for c in fitted_constants(yaml.safe_load(CALIBRATION_PATH.read_text()))}
        for path, v in values.items():
            c = ranges[path]
            where = (
                ""
                if c.prior_range is None
                else f"  prior [{c.prior_range[0]:g}, {c.prior_range[1]:g}]"
                + ("" if c.within_prior(v) else " OUTSIDE: a model error to fix")
            )
            print(f"{path}: {v:.4g}{where}")
        print(f"loss {best:.4f}")
        return 0
    if args.write and (args.quick or not args.report):
        parser.error("--write saves a full --report's folds: drop --quick")
    rows = [(m, simulate(m)) for m in load_measurements()]
    if not args.report:
        print(format_table(rows))
        return 0
    folds = all_folds(rounds=0 if args.quick else 2, jobs=args.jobs)
    print(format_folds(folds, refitted=not args.quick))
    print()
    print(format_constants(yaml.safe_load(CALIBRATION_PATH.read_text())))
    print()
    print(format_report(rows))
    print()
    print(format_hosts(load_calibration()))
    print()
    print(format_formula_gaps([m for m, _ in rows if m.role in SCORED]))
    if args.write:
        write_accuracy(folds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
