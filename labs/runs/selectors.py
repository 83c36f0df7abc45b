"""Reads for the lab pages: a learner's runs (404 for anyone else's), backends online, the
cards a lab exercises, and the data of a run's and a sweep's charts."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min
from django.shortcuts import get_object_or_404

from labs import hooks
from labs.backends import device_label, is_simulated
from labs.backends.base import Phase
from labs.explanation import results
from labs.models import DeviceCalibration, LabRun, RunState, Sweep, WorkerHeartbeat
from labs.parameters.catalog import CPU_KIND
from labs.parameters.device_calibration import DeviceConstants, announced_cpu_key
from labs.parameters.params import LabParams
from labs.parameters.presets import LABS, Lab, load_presets
from labs.runs.workers import cpu_worker_hardware, start_command
from labs.sim.engine_model import short_where_label

logger = logging.getLogger(__name__)


def run_get_for_owner(*, user: Any, pk: int) -> LabRun:
    """The learner's own run; anyone else's is a 404, not a 403, so ids reveal nothing."""
    return get_object_or_404(LabRun.objects.select_related("sweep"), pk=pk, owner=user)


def sweep_get_for_owner(*, user: Any, pk: int) -> Sweep:
    return get_object_or_404(Sweep, pk=pk, owner=user)


def run_list_for_owner(*, user: Any, limit: int = 100) -> list[LabRun]:
    """Newest first, sweep runs included, so any two can be compared. Each run carries
    `settings_shown`: the settings that tell it apart from the owner's other runs of its lab."""
    runs = list(LabRun.objects.for_owner(user).select_related("sweep")[:limit])
    shown = distinguishing_settings([(run.lab, run.params) for run in runs])
    for run, settings_shown in zip(runs, shown, strict=True):
        run.settings_shown = settings_shown
    return runs


# A lab with a single run has nothing to be told apart from; show its first few settings.
_LONE_RUN_SETTINGS = 3


def distinguishing_settings(
    runs: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[list[tuple[str, Any]]]:
    """For each (lab, params): the lab's settings whose values differ between its runs, in the
    lab's order, so a history row says more than the lab's name ("batching: max_num_seqs 64")."""
    by_lab: dict[str, list[Mapping[str, Any]]] = {}
    for lab, params in runs:
        by_lab.setdefault(lab, []).append(params)
    differing: dict[str, list[str]] = {}
    for lab, all_params in by_lab.items():
        fields = LABS[lab].fields if lab in LABS else tuple(sorted(all_params[0]))
        varied = [f for f in fields if len({repr(p.get(f)) for p in all_params}) > 1]
        differing[lab] = varied or list(fields[:_LONE_RUN_SETTINGS])
    return [[(name, params.get(name)) for name in differing[lab]] for lab, params in runs]


def sweep_list_for_owner(*, user: Any, limit: int = 50) -> list[Sweep]:
    return list(Sweep.objects.filter(owner=user).annotate(num_runs=Count("runs"))[:limit])


@dataclass(frozen=True)
class BackendStatus:
    backend: str
    queue: str
    start_command: str
    online: bool
    workers: int
    where: str
    gpu_name: str
    versions: dict[str, Any]
    gpus: tuple[str, ...] = ()  # each online GPU worker's inventory, "2× NVIDIA L4 (l4, ...)"


def backends_online() -> list[BackendStatus]:
    """Every configured backend, online or not, with what its live workers say about it."""
    live = list(WorkerHeartbeat.objects.online())
    statuses = []
    for backend, queue in settings.LABS_BACKEND_QUEUES.items():
        mine = [w for w in live if w.backend == backend]
        newest = max(mine, key=lambda w: w.last_seen) if mine else None
        statuses.append(
            BackendStatus(
                backend=backend,
                queue=queue,
                start_command=start_command(queue),
                online=bool(mine),
                workers=len(mine),
                where=newest.where if newest else "",
                gpu_name=newest.gpu_name if newest else "",
                versions=dict(newest.versions) if newest else {},
                gpus=_gpu_labels(mine),
            )
        )
    return statuses


def _gpu_labels(workers: list[WorkerHeartbeat]) -> tuple[str, ...]:
    """Each worker's GPUs as it announced them; a GPU outside the catalog shows its own name."""
    labels = []
    for w in workers:
        g = w.gpus or {}
        if not g.get("name"):
            continue
        version = f", vLLM {g['vllm']}" if g.get("vllm") else ""
        labels.append(f"{device_label(w.backend, g)}{version}")
    return tuple(labels)


def device_calibration(device: str) -> DeviceConstants | None:
    """The newest calibration measured on `device` (a GPU kind or a CPU key), or None: the
    device then keeps the published constants of labs/sim/calibration.yaml."""
    row = DeviceCalibration.objects.filter(device=device).order_by("-fitted_at", "-id").first()
    return row.to_constants() if row else None


def device_key(params: LabParams) -> str:
    """The device these settings run on, as calibrations are stored: the GPU kind, or for gpu
    cpu the online CPU worker's model and core count (cpu_device_key); "cpu" with none online."""
    if params.hardware.name != CPU_KIND:
        return params.hardware.name
    found = cpu_worker_hardware()
    if found is None:
        return CPU_KIND
    return announced_cpu_key(found[1])


def lab_calibration(params: LabParams) -> DeviceConstants | None:
    """The stored calibration of the device these settings run on (device_key), or None."""
    return device_calibration(device_key(params))


def pricing(params: LabParams) -> dict[str, Any]:
    """What a prediction made now is priced with, stored beside it on a run (its
    `predicted["priced_with"]`) so the run's parts are sized by the same and its page can say:
    the device's own calibration (its row, label and held-out error), or, on a device without
    one, the published constants of its kind or a CPU worker's start-up probe (and whether
    the device was calibrating itself then)."""
    key = device_key(params)
    row = DeviceCalibration.objects.filter(device=key).order_by("-fitted_at", "-id").first()
    if row is not None:
        return {
            "device": key,
            "calibration_id": row.pk,
            "label": row.to_constants().label(),
            "held_out_error": row.held_out_error,
        }
    from labs.models import CalibrationJob

    calibrating = CalibrationJob.objects.active().filter(device=key).exists()
    source = "probe" if params.hardware.name == CPU_KIND else "published"
    return {"device": key, "source": source, "calibrating": calibrating}


def priced_calibration(params: LabParams, priced: Any) -> DeviceConstants | None:
    """The device calibration a run's prediction was priced with (`pricing`), to size its parts
    by the same: its row even if a newer one exists since, none if it was the probe or the
    published constants; for a run stored before this was recorded, the device's newest."""
    if not isinstance(priced, Mapping):
        return lab_calibration(params)
    found = priced.get("calibration_id")
    if not isinstance(found, int):
        return None
    row = DeviceCalibration.objects.filter(pk=found).first()
    return row.to_constants() if row is not None else lab_calibration(params)


def pricing_line(run: LabRun) -> str:
    """How a real engine's run was predicted, for its page: with the device's own calibration
    (when, how well), or its start-up probe (it was calibrating itself, or had none), or the
    published constants."""
    if is_simulated(run.backend):
        return ""
    priced = (run.predicted or {}).get("priced_with")
    if not isinstance(priced, Mapping):
        return ""
    key = str(priced.get("device") or "")
    newest = DeviceCalibration.objects.filter(device=key).order_by("-fitted_at", "-id").first()
    if "calibration_id" in priced:
        line = (
            f"Predicted, and its parts sized, with this device's own calibration: "
            f"{priced.get('label')} (how far its simulation landed from the runs its fit never "
            "saw)."
        )
        if newest is not None and newest.pk != priced["calibration_id"]:
            line += f" A newer one prices runs sent since: {newest.to_constants().label()}."
        return line
    if priced.get("source") == "probe":
        when = (
            "it was calibrating itself when this run was sent"
            if priced.get("calibrating")
            else "it had no calibration when this run was sent"
        )
        line = (
            "Predicted from this CPU's start-up probe (its bandwidth and matmul rate), not a "
            f"calibration: {when}, and a probe sizes none of the parts."
        )
        if newest is not None:
            line += (
                f" Its calibration has finished since ({newest.to_constants().label()}): run "
                "again to be predicted and explained with it."
            )
        return line
    return (
        "This GPU kind has no calibration of its own: predicted, and its parts sized, with "
        "the published constants of its kind."
    )


def device_prediction(params: LabParams) -> dict[str, object]:
    """The one prediction (labs.prediction.predict.lab_prediction) for these settings, priced by
    the lab device's own calibration when it has one: the lab page, runs, `lab predict` and
    personal cards all call this, so they show the same figures."""
    from labs.prediction.device_speculation import lab_prediction_on

    return lab_prediction_on(params, lab_calibration(params))


def where_label(run: LabRun) -> str:
    """Where a run's numbers come from: the record's label once done, else the worker's."""
    if run.where:
        return run.where
    if is_simulated(run.backend):
        return "simulated on CPU"
    beat = WorkerHeartbeat.objects.filter(hostname=run.worker, backend=run.backend).first()
    return beat.where if beat else run.backend


def phase_note(run: LabRun) -> str:
    """What the backend of a running run said it is doing besides requests ("Starting vLLM
    (engine arguments changed): 34 s so far; ..."), or "" (the simulator, a queued or ended run)."""
    if run.state != RunState.RUNNING:
        return ""
    phase = Phase.from_dict(run.phase)
    return phase.note() if phase is not None else ""


def served_note(run: LabRun) -> str:
    """Which model an already-running server (LABS_VLLM_BASE_URL) served, when the run's record
    says, and what the prediction is for: "" for runs that started their own engine."""
    meta = (run.result or {}).get("meta") or {}
    served = meta.get("served_model")
    if not isinstance(served, dict):
        return ""
    name, slug = served.get("id"), served.get("catalog_model")
    submitted = (run.params or {}).get("model")
    if slug == submitted:
        return f"The server served {slug} (as {name!r}), the model you chose."
    if slug:
        return (
            f"The server served {slug} (as {name!r}), not the {submitted} you chose: the "
            f"measured numbers are {slug}'s, and the prediction is for {slug}."
        )
    reason = (run.predicted or {}).get("no_prediction") or meta.get("no_prediction")
    said = f"The server served {name!r}, not the {submitted} you chose"
    return f"{said}: {reason}." if reason else f"{said}."


def where_badge(run: LabRun) -> str:
    """The short form of `where_label`: "simulated · H100 SXM · calibrated"."""
    return short_where_label(where_label(run))


def cards_for_lab(lab_slug: str) -> list[dict[str, Any]]:
    """Cards whose preset opens this lab, for "cards that use this lab" links."""
    slugs = [p.slug for p in load_presets().values() if p.lab == lab_slug]
    if not slugs:
        return []
    return hooks.cards_using(slugs)


# -- charts --------------------------------------------------------------------------------------


def run_charts(run: LabRun) -> dict[str, Any]:
    """The JSON the page's charts draw (static/js/labs.js), from the stored summary."""
    series = results.dig(run.result, "series") or {}
    return {"simulated": is_simulated(run.backend), **series}


@dataclass(frozen=True)
class SweepPoint:
    value: Any
    run: LabRun
    rows: dict[str, tuple[float | None, float | None]]


def sweep_detail(sweep: Sweep) -> dict[str, Any]:
    """Runs in order, their progress, and measured vs predicted per metric against the value."""
    lab: Lab = LABS.get(sweep.lab) or LABS["sandbox"]
    runs = list(sweep.runs.order_by("sweep_index"))
    metrics = []
    for measured_key, predicted_key in lab.sweep_metrics:
        metric = next((m for m in results.METRICS if m.measured == measured_key), None)
        label, unit = (metric.label, metric.unit) if metric else (measured_key, "")
        points = []
        for run in runs:
            measured = results.dig(run.result, measured_key) if run.state == RunState.DONE else None
            expected = (
                results.derived_predictions(run.predicted, run.params).get(predicted_key)
                if predicted_key
                else None
            )
            points.append({"measured": measured, "predicted": expected})
        metrics.append(
            {
                "key": measured_key,
                "label": label,
                "unit": unit,
                "points": points,
                "gap": _largest_gap(sweep.values, points),
                "changes": _changes(sweep.values, points),
            }
        )
    agg = sweep.runs.aggregate(first=Min("started_at"), last=Max("finished_at"))
    done = sum(r.state == RunState.DONE for r in runs)
    # Each finished point's "why": the run page's reading (the figure that differs most and why,
    # the cap that held admission, where the time went), shown under the point on demand.
    whys = [
        results.headline(
            results.compare(run.result, run.predicted, run.params),
            (run.result or {}).get("breakdown"),
        )
        if run.state == RunState.DONE
        else ""
        for run in runs
    ]
    finished = sum(r.is_terminal for r in runs)
    return {
        "lab": lab,
        "runs": runs,
        "whys": whys,
        "metrics": metrics,
        "chart": {
            "field": sweep.field,
            "values": [str(v) for v in sweep.values],
            "simulated": is_simulated(sweep.backend),
            "metrics": metrics,
        },
        "done": done,
        "finished": finished,
        "total": len(runs),
        "terminal": finished == len(runs),
        "progress": sum(r.progress if not r.is_terminal else 1.0 for r in runs) / max(1, len(runs)),
        "started_at": agg["first"],
        "finished_at": agg["last"],
    }


def _changes(values: list[Any], points: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Each point after the first against the first, measured and predicted: the lesson of a
    sweep (batching gain, speculation speedup, how TTFT grows) without arithmetic. Only points
    where both sides have a figure at both ends."""
    if not points:
        return []
    first = points[0]
    rows = []
    for value, point in zip(values[1:], points[1:], strict=False):
        measured = results.change(first["measured"], point["measured"])
        predicted = results.change(first["predicted"], point["predicted"])
        if measured is None and predicted is None:
            continue
        rows.append(
            {
                "value": str(value),
                "measured": results.format_change(measured),
                "predicted": results.format_change(predicted),
            }
        )
    return rows


def _largest_gap(values: list[Any], points: list[dict[str, Any]]) -> str:
    """'32 (−24%)': the swept value where measured and predicted differ most."""
    gaps = []
    for value, point in zip(values, points, strict=False):
        m, p = point["measured"], point["predicted"]
        if isinstance(m, int | float) and isinstance(p, int | float) and p:
            text, ratio = results.percent_diff(float(m), float(p))
            gaps.append((abs((ratio or 1) - 1), f"{value} ({text})"))
    return max(gaps)[1] if gaps else ""


def run_compare(a: LabRun, b: LabRun) -> dict[str, Any]:
    """Two runs side by side: the settings that differ, then every metric both measured."""
    keys = sorted(set(a.params) | set(b.params))
    changed = [
        (k, a.params.get(k), b.params.get(k)) for k in keys if a.params.get(k) != b.params.get(k)
    ]
    rows = []
    expected_a = results.derived_predictions(a.predicted or {}, a.params)
    expected_b = results.derived_predictions(b.predicted or {}, b.params)
    for m in results.METRICS:
        va = results.dig(a.result, m.measured)
        vb = results.dig(b.result, m.measured)
        if va is None and vb is None:
            continue
        diff, _ = results.percent_diff(
            vb if isinstance(vb, int | float) else None, va if isinstance(va, int | float) else None
        )
        predicted = None
        if m.predicted:
            # A figure the formulas do not cover is None: no predicted change built on it.
            predicted = results.change(expected_a.get(m.predicted), expected_b.get(m.predicted))
        rows.append(
            {
                "label": m.label,
                "a": results.format_value(va, m.unit),
                "b": results.format_value(vb, m.unit),
                "diff": diff,
                "change": results.format_change(results.change(va, vb)),
                "predicted_change": results.format_change(predicted),
            }
        )
    return {"changed": changed, "rows": rows}
