"""The published vLLM runs of labs/sim/calibration.yaml, replayed on the simulator.

    python -m labs.sim.published_calibration           # source, settings, published, simulated
    python -m labs.sim.published_calibration --fit     # search the constants on the `fit` runs
    python -m labs.sim.published_calibration --fit --gpu l4   # that GPU kind's constants only
    python -m labs.sim.published_calibration --report  # per GPU kind: its runs, or what it borrows

Each measurement's `settings` are lab parameters; the simulator runs them on the realistic
profile and reads `metric` from labs.metrics.summarize (for a ratio, the same with `baseline`
applied is the denominator). Virtual time only: the result is the same on any machine.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from labs.metrics import summarize
from labs.params import parse_lab_params
from labs.sim.engine_model import (
    CALIBRATION_PATH,
    Calibration,
    EngineModel,
    load_calibration,
    parse_calibration,
)
from labs.sim.lab import build_simulator

# How close each kind of measurement must come (tests/labs/sim/test_calibration.py).
TOLERANCE = {"fit": 0.10, "held_out": 0.20}


@dataclass(frozen=True)
class Measurement:
    id: str
    role: str  # "fit" | "held_out"
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
        )
        for m in data["measurements"]
    )


def _metric(summary: Mapping[str, Any], path: str) -> float:
    value: Any = summary
    for part in path.split("."):
        value = value[part]
    return float(value)


def _run(settings: Mapping[str, Any], metric: str, cal: Calibration) -> float:
    params = parse_lab_params({**settings, "sim_profile": "realistic"})
    sim = build_simulator(params)
    sim.cost_model = EngineModel(params.hardware, params.model, params.engine, calibration=cal)
    return _metric(summarize(sim.run()), metric)


def simulate(m: Measurement, cal: Calibration | None = None) -> float:
    """What the simulator gives for measurement `m` with calibration `cal` (default: the file)."""
    cal = cal or load_calibration()
    value = _run(m.settings, m.metric, cal)
    if m.baseline is not None:
        value /= _run({**m.settings, **m.baseline}, m.metric, cal)
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


def held_out_errors(rows: list[tuple[Measurement, float]]) -> list[float]:
    """|relative error| of every held-out run."""
    return [abs(relative_error(sim, m.published)) for m, sim in rows if m.role == "held_out"]


def format_report(rows: list[tuple[Measurement, float]], cal: Calibration | None = None) -> str:
    """Every catalog GPU kind with its fitted and held-out runs and their errors, or "not
    calibrated" and the part whose constants it borrows; then the held-out summary and how many
    runs were moved out of fit/held-out after being seen."""
    from labs.catalog import GPUS

    cal = cal or load_calibration()
    lines = []
    for name in GPUS:
        gpu = cal.gpus.get(name)
        own = [(m, sim) for m, sim in rows if m.settings["gpu"] == name and m.role in TOLERANCE]
        title = f"{gpu.display if gpu else name} ({name})"
        if not own:
            borrows = gpu.borrows if gpu and gpu.borrows else "the custom GPU's"
            lines.append(
                f"{title}: not calibrated (no usable published vLLM run); borrows {borrows}"
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
    excluded = [m for m, _ in rows if m.role == "excluded"]
    moved = sum(m.moved_after_seen for m in excluded)
    lines.append(
        f"excluded: {len(excluded)} runs, {moved} of them moved out of fit/held-out after being"
        " simulated (each says why in calibration.yaml)"
    )
    return "\n".join(lines)


# -- fitting ---------------------------------------------------------------------------------------

# (dotted path in the YAML, lower bound, upper bound) of every constant the search may move.
FREE = (
    ("global.kernel_latency_us", 0.0, 6.0),
    ("global.decode_step_overhead_ms", 0.1, 2.5),
    ("global.mixed_step_overhead_ms", 0.2, 5.0),
    ("global.attention_efficiency", 0.2, 0.9),
    ("global.per_seq_overhead_us", 0.0, 40.0),
    ("global.allreduce_latency_us.nvlink", 2.0, 40.0),
    ("gpus.h100-sxm.bandwidth_efficiency", 0.6, 0.97),
    ("gpus.h100-sxm.gemm_efficiency", 0.4, 0.9),
    ("gpus.a100-40gb.bandwidth_efficiency", 0.6, 0.97),
    ("gpus.a100-80gb.bandwidth_efficiency", 0.6, 0.97),
    ("gpus.b200.decode_step_overhead_ms", 0.05, 2.5),
)

# A GPU kind's own constants (`--fit --gpu NAME`): fitted to that kind's `fit` runs alone, with
# every global constant and every other GPU left as they are. A decode-step overhead is searched
# only where the kind already has its own.
GPU_FREE = (
    ("bandwidth_efficiency", 0.5, 0.97),
    ("kv_bandwidth_efficiency", 0.3, 0.95),
    ("gemm_efficiency", 0.2, 0.9),
    ("gemm_half_tokens", 1.0, 2000.0),
    ("decode_step_overhead_ms", 0.05, 2.5),
)


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
    device's own fit (labs/device_calibration_sweep.py) both use it."""
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
    """Coordinate search of FREE on the `fit` measurements: minimise the sum of squared log
    errors. Returns the constants found and the loss. With `gpu`, only that GPU kind's own
    constants (GPU_FREE) move, fitted to its own `fit` runs; nothing else changes."""
    data = yaml.safe_load(CALIBRATION_PATH.read_text())
    fitted = [
        m
        for m in load_measurements()
        if m.role == "fit" and (gpu is None or m.settings["gpu"] == gpu)
    ]
    free = FREE if gpu is None else gpu_free(data, gpu)
    if not fitted:
        raise ValueError(f"no fit runs for {gpu or 'any GPU'}")

    def loss(values: dict[str, float]) -> float:
        for path, v in values.items():
            _set(data, path, v)
        cal = parse_calibration(data)
        return log_error_loss([(simulate(m, cal), m.published) for m in fitted])

    values = {path: _get(data, path) for path, _, _ in free}
    bounds = {path: (low, high) for path, low, high in free}
    return coordinate_search(loss, values, bounds, rounds, log, max_moves=max_moves)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fit", action="store_true", help="search the fitted constants")
    parser.add_argument(
        "--report", action="store_true", help="every catalog GPU kind with its runs and errors"
    )
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
        for path, v in values.items():
            print(f"{path}: {v:.4g}")
        print(f"loss {best:.4f}")
        return 0
    rows = [(m, simulate(m)) for m in load_measurements()]
    print(format_report(rows) if args.report else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
