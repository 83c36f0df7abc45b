"""Lab pages. Thin: parse, call one service or selector, render the page or its partial."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseStopPolling

from labs.backends import check_can_start, device_lab_settings, is_simulated, requirement
from labs.calibration import jobs as calibration_jobs
from labs.explanation import definitions, results
from labs.explanation.accuracy import expected_errors
from labs.explanation.waterfall import run_waterfalls
from labs.forms import LabParamsForm, SweepForm
from labs.parameters.catalog import CPU_KIND
from labs.parameters.params import FIELDS_BY_NAME, LabParams, ParamError, parse_lab_params
from labs.parameters.presets import LABS, Lab, lab_initial, load_presets, rerun_values
from labs.prediction.predict import budget_notice
from labs.questions import selectors as question_selectors
from labs.questions import services as questions
from labs.runs import busy, reaping, selectors, submission
from labs.runs.workers import (
    cpu_worker_hardware,
    devices_online,
    engines_busy,
    gpu_offer,
    online_without_devices,
)

# A refusal is not the learner's mistake: no worker or no queue is the service being unavailable.
REFUSAL_STATUS = {
    "no-worker": 503,
    "busy": 503,
    "queue-down": 503,
    "quota": 429,
    "gpu-cap": 429,
    "sim-cap": 429,
}


def _lab_or_404(slug: str) -> Lab:
    try:
        return LABS[slug]
    except KeyError:
        raise Http404("No such lab") from None


def _prediction(lab: Lab, form: LabParamsForm) -> dict[str, Any]:
    """The live panel: the lab's predicted figures, what the token budget does to them, and the
    error to expect on this GPU (labs.explanation.accuracy)."""
    if form.params is None:
        return {"prediction": [], "budget_notice": ""}
    values = selectors.device_prediction(form.params)
    return {
        "prediction": results.predicted_items(values, lab.predicted),
        "budget_notice": budget_notice(form.params, values),
        "expected_error": expected_errors(form.params.hardware, lab.predicted),
    }


def _prediction_calibration(form: LabParamsForm) -> str:
    """ "calibrated on this worker, <date>, held-out error N%" when the lab's GPU has its own."""
    if form.params is None:
        return ""
    device = selectors.lab_calibration(form.params)
    return device.label() if device else ""


def _calibrating_note(params: LabParams | None) -> str:
    """ "This device is calibrating itself: ..." while the lab's device has a calibration queued
    or running."""
    return "" if params is None else busy.calibrating_note(selectors.device_key(params))


def _load(form: LabParamsForm) -> str:
    return "" if form.params is None else results.load_label(form.params.as_dict())


def _lab_page(
    request: HttpRequest,
    lab: Lab,
    form: SweepForm,
    *,
    status: int = 200,
    refusal: str = "",
    preset: Any = None,
) -> HttpResponse:
    if form.is_bound:
        form.is_valid()
    backends = selectors.backends_online()
    offer = gpu_offer()
    vllm_online = any(b.online for b in backends if not is_simulated(b.backend))
    form.offer_gpus(vllm_online, offer, elsewhere=online_without_devices("vllm"))
    context = {
        "lab": lab,
        "labs": LABS.values(),
        "form": form,
        **_prediction(lab, form),
        "prediction_calibration": _prediction_calibration(form),
        "calibrating_note": _calibrating_note(form.params),
        "load": _load(form),
        "refusal": refusal,
        "preset": preset,
        "presets": [p for p in load_presets().values() if p.lab == lab.slug],
        "cards": selectors.cards_for_lab(lab.slug),
        "questions": questions.questions_for_lab(lab.slug),
        "preset_question": questions.question_for_preset(preset.slug if preset else ""),
        "backends": backends,
        "preset_gpu_note": _preset_gpu_note(preset, form, vllm_online),
        "cpu_worker": _cpu_worker_offer(lab),
        "engines_busy": _engines_busy(request),
        "recent": [
            r
            for r in selectors.run_list_for_owner(user=request.user, limit=50)
            if r.lab == lab.slug
        ][:5],
    }
    return render(request, "labs/lab_detail.html", context, status=status)


def _engines_busy(request: HttpRequest) -> list[str]:
    """Why a device's engine cannot run now, in a learner's words ("The CPU engine is
    calibrating itself, about 6 minutes left; ..."); staff also read the worker's own, which
    names the processes."""
    said = []
    for device, operators in sorted(engines_busy().items()):
        words = busy.busy_words(device)
        said.append(f"{words} ({operators})" if request.user.is_staff else words)
    return said


def _cpu_worker_offer(lab: Lab) -> dict[str, object] | None:
    """ "vLLM on this CPU": the online CPU worker's CPU and a link that opens this lab on it
    with the CPU build's settings; None when no CPU worker is online."""
    found = cpu_worker_hardware()
    if found is None:
        return None
    _, gpus = found
    if gpus.get("busy"):
        return None  # its engine is held by another process: a run would fail (engines_busy)
    url = reverse("labs:lab-detail", args=[lab.slug])
    return {
        "name": gpus.get("name") or "CPU",
        "cores": gpus.get("cores"),
        "url": f"{url}?{urlencode(device_lab_settings('vllm', CPU_KIND, lab_initial(lab)))}",
    }


def _preset_gpu_note(preset: Any, form: SweepForm, vllm_online: bool) -> str:
    """For a preset no online vLLM worker would take: what GPU it needs (it opens on the
    simulator, as every lab does); "" when a run of it on vLLM would be accepted now (by a
    worker with its GPU, or one measuring a server elsewhere)."""
    if preset is None or form.params is None:
        return ""
    params = form.params
    if vllm_online:
        try:
            check_can_start(
                "vllm", params, devices_online("vllm"), **submission.start_options("vllm")
            )
            return ""
        except ParamError:
            pass
    return (
        f"On vLLM this preset {requirement('vllm', params)}; no online GPU worker has that, "
        "so it runs on the simulator here."
    )


@require_GET
@login_required
def index(request: HttpRequest) -> HttpResponse:
    context = {
        "labs": LABS.values(),
        "backends": selectors.backends_online(),
        "recent": selectors.run_list_for_owner(user=request.user, limit=5),
    }
    return render(request, "labs/index.html", context)


@require_GET
@login_required
def lab_detail(request: HttpRequest, lab: str) -> HttpResponse:
    the_lab = _lab_or_404(lab)
    preset = load_presets().get(request.GET.get("preset", ""))
    if preset is not None and preset.lab != the_lab.slug:
        preset = None
    # "?block_size=32": a link that opens the lab with a setting changed (from a run's page).
    overrides = {k: v for k, v in request.GET.items() if k in FIELDS_BY_NAME}
    initial = lab_initial(the_lab, preset, overrides)
    data = {k: _text(v) for k, v in initial.items()}
    if request.GET.get("backend") in settings.LABS_BACKEND_QUEUES:
        data["backend"] = request.GET["backend"]  # "vLLM on this CPU" opens on vLLM
    form = SweepForm(data=data, lab=the_lab)
    return _lab_page(request, the_lab, form, preset=preset)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


@require_GET
@login_required
def lab_predict(request: HttpRequest, lab: str) -> HttpResponse:
    """The live prediction for the form's current values (htmx, on every change)."""
    the_lab = _lab_or_404(lab)
    form = LabParamsForm(request.GET, lab=the_lab)
    valid = form.is_valid()
    context = {
        "lab": the_lab,
        "form": form,
        **_prediction(the_lab, form),
        "prediction_calibration": _prediction_calibration(form),
        "calibrating_note": _calibrating_note(form.params),
        "load": _load(form),
    }
    # The simulation's expected error sits in the run panel, beside what a run will show; it
    # follows the form's GPU by an out-of-band swap.
    body = render_to_string("labs/lab_detail.html#prediction", context, request=request)
    body += render_to_string(
        "labs/lab_detail.html#sim-error", {**context, "oob": True}, request=request
    )
    return HttpResponse(body, status=200 if valid else 400)


@require_GET
@login_required
def preset_open(request: HttpRequest, slug: str) -> HttpResponse:
    preset = load_presets().get(slug)
    if preset is None:
        raise Http404("No such preset")
    url = reverse("labs:lab-detail", args=[preset.lab])
    return redirect(f"{url}?{urlencode({'preset': preset.slug})}")


def _submit(
    request: HttpRequest, lab_slug: str, create: Callable[[Lab, SweepForm], Any]
) -> HttpResponse:
    """Validate the lab form, call `create`, and redirect to what it made; or show the page
    again with field messages (400) or the reason it was refused."""
    lab = _lab_or_404(lab_slug)
    form = SweepForm(request.POST, lab=lab)
    if not form.is_valid():
        return _lab_page(request, lab, form, status=400)
    try:
        created = create(lab, form)
    except ParamError as exc:
        form.add_param_errors(exc.errors)
        return _lab_page(request, lab, form, status=400)
    except submission.RunRefused as exc:
        # The command that starts a worker is for staff; a learner cannot act on it.
        hint = exc.operator_hint if request.user.is_staff else ""
        refusal = f"{exc.reason} {hint}".strip()
        return _lab_page(request, lab, form, status=REFUSAL_STATUS[exc.kind], refusal=refusal)
    return redirect(created)


@require_POST
@login_required
def run_create(request: HttpRequest, lab: str) -> HttpResponse:
    return _submit(
        request,
        lab,
        lambda the_lab, form: submission.run_request(
            owner=request.user,
            lab=the_lab.slug,
            backend=form.cleaned_data["backend"] or "sim",
            data=form.settings_data(),
            preset=request.POST.get("preset", ""),
        ),
    )


@require_POST
@login_required
def sweep_create(request: HttpRequest, lab: str) -> HttpResponse:
    return _submit(
        request,
        lab,
        lambda the_lab, form: submission.sweep_request(
            owner=request.user,
            lab=the_lab.slug,
            backend=form.cleaned_data["backend"] or "sim",
            data=form.settings_data(),
            field=form.cleaned_data["sweep_field"] or the_lab.sweep_field,
            raw_values=form.cleaned_data["sweep_values"],
            shown=form.shown_names(),
        ),
    )


def _run_context(run: Any) -> dict[str, Any]:
    lab = LABS.get(run.lab) or LABS["sandbox"]
    rows = results.compare(run.result, run.predicted, run.params)
    breakdown = (run.result or {}).get("breakdown")
    expected = results.derived_predictions(run.predicted, run.params) if run.result else {}
    return {
        "run": run,
        "lab": lab,
        # A row written before presets were checked may hold anything: link only real ones.
        "preset": load_presets().get(run.preset),
        "where": selectors.where_badge(run),  # short; the long form is shown once, on demand
        "where_long": selectors.where_label(run),
        "phase_note": selectors.phase_note(run),
        "served_note": selectors.served_note(run),
        "calibrating_note": "" if run.is_terminal else _run_calibrating_note(run),
        "rows": rows,
        "load": results.load_label(run.params),
        "headline": results.headline(rows, breakdown),
        "breakdown": results.breakdown_bars(breakdown, expected.get("breakdown")),
        "breakdown_source": (breakdown or {}).get("source"),
        "waterfalls": run_waterfalls(run.result, run.predicted, run.params, rows),
        "prediction_panel": question_selectors.prediction_panel(run),
        "charts": selectors.run_charts(run) if run.result else None,
        "shown_params": [(name, run.params.get(name)) for name in lab.fields],
        **_run_errors(run),
        "definitions": _definitions(run),
        "next_url": reverse("labs:lab-detail", args=[lab.slug])
        + "?"
        + urlencode({k: _text(v) for k, v in rerun_values(lab, run.params).items()}),
    }


def _run_errors(run: Any) -> dict[str, Any]:
    """The error lines beside a finished run's columns (labs.explanation.accuracy): the simulation's
    expected error beside a run simulated with the published constants, the formulas' own gap
    beside the predicted column."""
    if not run.result:
        return {}
    try:
        params = parse_lab_params(run.params or {}, ignore_unknown=True)
    except ParamError:
        return {}
    predicted = [m.predicted for m in results.METRICS if m.predicted]
    # A device's own calibration ("calibrated on <worker>, ...") priced it, not published runs.
    published = "calibrated on " not in (run.where or "")
    return {
        "expected_error": expected_errors(params.hardware, predicted),
        "simulated_published": is_simulated(run.backend)
        and params.engine.sim_profile == "realistic"
        and published,
    }


def _definitions(run: Any) -> list[tuple[str, str]]:
    """How the run's numbers were measured, and for a real engine what priced its prediction
    (its device's calibration, when and how well, or the probe)."""
    said = definitions.shown(run.backend, run.params or {}, run.result)
    priced = selectors.pricing_line(run)
    return [*said, ("Predicted with", priced)] if priced else said


def _run_calibrating_note(run: Any) -> str:
    if is_simulated(run.backend):
        return ""
    try:
        return _calibrating_note(parse_lab_params(run.params or {}))
    except ParamError:
        return ""


def _status_response(
    request: HttpRequest, template: str, context: dict, terminal: bool
) -> HttpResponse:
    html = render_to_string(template, context, request=request)
    # 286 tells htmx to stop polling; the final state is swapped in with it.
    return HttpResponseStopPolling(html) if terminal else HttpResponse(html)


@require_GET
@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = selectors.run_get_for_owner(user=request.user, pk=pk)
    # A page watching a run must see a dead worker's run fail even if no worker is left to
    # reap it; the check is a conditional update on this one run.
    if not run.is_terminal and reaping.run_reap_stale(run_ids=[run.pk]):
        run.refresh_from_db()
    context = _run_context(run)
    if request.htmx:
        return _status_response(
            request, "labs/run_detail.html#run-status", context, run.is_terminal
        )
    return render(request, "labs/run_detail.html", context)


@require_POST
@login_required
def run_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    run = selectors.run_get_for_owner(user=request.user, pk=pk)
    submission.run_cancel(run=run)
    run.refresh_from_db()
    if request.htmx:
        return _status_response(
            request, "labs/run_detail.html#run-status", _run_context(run), run.is_terminal
        )
    return redirect(run)


@require_GET
@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    context = {
        "runs": selectors.run_list_for_owner(user=request.user),
        "sweeps": selectors.sweep_list_for_owner(user=request.user),
        "labs": LABS,
    }
    return render(request, "labs/run_list.html", context)


@require_GET
@login_required
def run_compare(request: HttpRequest) -> HttpResponse:
    try:
        a_pk, b_pk = int(request.GET["a"]), int(request.GET["b"])
    except (KeyError, ValueError):
        return redirect("labs:run-list")
    a = selectors.run_get_for_owner(user=request.user, pk=a_pk)
    b = selectors.run_get_for_owner(user=request.user, pk=b_pk)
    context = {
        "a": a,
        "b": b,
        "where_a": selectors.where_label(a),
        "where_b": selectors.where_label(b),
        **selectors.run_compare(a, b),
    }
    return render(request, "labs/run_compare.html", context)


@require_GET
@login_required
def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = selectors.sweep_get_for_owner(user=request.user, pk=pk)
    detail = selectors.sweep_detail(sweep)
    if not detail["terminal"]:
        active = [r.pk for r in detail["runs"] if not r.is_terminal]
        if reaping.run_reap_stale(run_ids=active):
            detail = selectors.sweep_detail(sweep)
    context = {"sweep": sweep, **detail}
    if request.htmx:
        return _status_response(
            request, "labs/sweep_detail.html#sweep-status", context, detail["terminal"]
        )
    return render(request, "labs/sweep_detail.html", context)


@require_POST
@login_required
def sweep_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = selectors.sweep_get_for_owner(user=request.user, pk=pk)
    submission.sweep_cancel(sweep=sweep)
    return redirect(sweep)


# -- staff: calibrate a device -------------------------------------------------------------------

CALIBRATION_REFUSAL_STATUS = {"no-device": 503, "busy": 409, "queue-down": 503}


def _staff_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A visitor is sent to log in; a learner who is not staff gets 403."""

    @wraps(view)
    def staff_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("Staff only.")
        return view(request, *args, **kwargs)

    return login_required(staff_view)


def _devices_page(request: HttpRequest, *, status: int = 200, refusal: str = "") -> HttpResponse:
    rows = calibration_jobs.devices_page()
    active = any(row.job is not None and not row.job.is_terminal for row in rows)
    context = {
        "rows": rows,
        "active": active,
        "refusal": refusal,
        "start_commands": calibration_jobs.worker_start_commands(),
    }
    if request.htmx:
        return _status_response(request, "labs/devices.html#devices-status", context, not active)
    return render(request, "labs/devices.html", context, status=status)


@require_GET
@_staff_only
def devices(request: HttpRequest) -> HttpResponse:
    # A page watching a job must see a dead worker's job fail even if no worker reaps it.
    calibration_jobs.calibration_reap_stale()
    return _devices_page(request)


@require_POST
@_staff_only
def device_calibrate(request: HttpRequest) -> HttpResponse:
    try:
        job = calibration_jobs.calibration_request(
            device=request.POST.get("device", ""), user=request.user
        )
    except calibration_jobs.CalibrationRefused as exc:
        status = CALIBRATION_REFUSAL_STATUS[exc.kind]
        return _devices_page(request, status=status, refusal=exc.reason)
    messages.success(request, f"Calibration of {job.device} queued for its worker ({job.queue}).")
    return redirect("labs:devices")
