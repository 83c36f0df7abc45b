"""The lab form, generated from `labs.parameters.params.PARAM_FIELDS`.

Every field is a plain optional CharField: the widgets offer the allowed values (selects, number
inputs with min/max as hints), but the only rules are in `parse_lab_params`, which `clean()`
calls. Its messages land on the fields they name, so the form and the `lab` command can never
disagree about what is valid.
"""

from __future__ import annotations

import copy
from typing import Any

from django import forms
from django.conf import settings

from labs.backends import is_simulated
from labs.parameters.catalog import CPU_KIND
from labs.parameters.params import (
    FIELDS_BY_NAME,
    FOLLOWS,
    PARAM_FIELDS,
    LabParams,
    ParamError,
    ParamField,
    align_run_batch,
    follow_unshown,
    parse_lab_params,
)
from labs.parameters.presets import Lab

BACKEND_LABELS = {"sim": "Simulator (CPU)", "vllm": "vLLM (GPU)"}
# The page's <form id>; the run panel's controls sit outside it and name it (form="...").
FORM_ID = "lab-form"


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _widget(f: ParamField) -> forms.Widget:
    if f.kind == "bool":
        return forms.Select(choices=[("true", "on"), ("false", "off")])
    if f.kind == "choice":
        unset = [("", "default")] if f.default is None else []
        return forms.Select(choices=unset + [(c, c) for c in f.choices])
    if f.power_of_two:
        low, high = int(f.minimum or 1), int(f.maximum or 1)
        powers = [2**i for i in range(high.bit_length()) if low <= 2**i <= high]
        return forms.Select(choices=[(str(p), str(p)) for p in powers])
    attrs = {
        "min": _number(f.minimum),
        "max": _number(f.maximum),
        "step": "1" if f.kind == "int" else "any",
        "inputmode": "numeric" if f.kind == "int" else "decimal",
    }
    if f.default is None:
        attrs["placeholder"] = "default"
    return forms.NumberInput(attrs={k: v for k, v in attrs.items() if v})


def _help(f: ParamField) -> str:
    unit = f" ({f.unit})" if f.unit else ""
    return f"{f.help}{unit}"


def _field(f: ParamField) -> forms.CharField:
    # strip=True: " 16 " is 16. No max_length: parse_lab_params refuses long text itself.
    return forms.CharField(required=False, label=f.name, help_text=_help(f), widget=_widget(f))


_PARAM_FORM_FIELDS: dict[str, forms.CharField] = {f.name: _field(f) for f in PARAM_FIELDS}
_PARAM_FORM_FIELDS["max_concurrency"].help_text = (
    "most requests in flight at once (empty: the same as concurrency, the batch the "
    "prediction assumes)"
)
_PARAM_FORM_FIELDS["max_concurrency"].widget.attrs["placeholder"] = "= concurrency"


def _initial_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# Settings every lab shows in its run bar rather than among its own fields.
RUN_BAR_FIELDS = ("sim_profile",)


class LabParamsForm(forms.Form):
    """All lab parameters plus the backend. `params` holds the validated LabParams."""

    backend = forms.CharField(required=False, initial="sim")

    def __init__(self, *args: Any, lab: Lab, **kwargs: Any) -> None:
        initial = {k: _initial_text(v) for k, v in (kwargs.pop("initial", None) or {}).items()}
        super().__init__(*args, initial=initial, **kwargs)
        self.lab = lab
        self.fields.update(copy.deepcopy(_PARAM_FORM_FIELDS))
        backends = list(settings.LABS_BACKEND_QUEUES)
        self.fields["backend"].widget = forms.Select(
            choices=[(b, BACKEND_LABELS.get(b, b)) for b in backends], attrs={"form": FORM_ID}
        )
        # Shown beside "Run on" in every lab (outside the settings form, so it names it).
        self.fields["sim_profile"].widget.attrs["form"] = FORM_ID
        self.params: LabParams | None = None

    def offer_gpus(
        self, vllm_online: bool, offer: dict[str, int], *, elsewhere: bool = False
    ) -> None:
        """Offer vLLM only while a GPU worker is online, and mark the GPU kinds and tp values
        no online worker can run as simulator-only (the simulator runs them all).

        Args:
            vllm_online: some vLLM worker is online.
            offer: GPU kind -> the most GPUs one online worker of that kind has.
            elsewhere: a worker measuring a server elsewhere (base_url) is online; it
                announces no GPUs and takes any catalog kind, so none is simulator-only.
        """
        backend = self.fields["backend"].widget
        if not vllm_online:
            backend.choices = [(b, label) for b, label in backend.choices if is_simulated(b)]
            return
        if not offer or elsewhere:
            return
        kinds = ", ".join(
            "this CPU" if k == CPU_KIND else f"{k} \u00d7{n}" for k, n in sorted(offer.items())
        )
        # Only a CPU worker online: it is still vLLM, but not on a GPU.
        vllm_label = "vLLM" if set(offer) == {CPU_KIND} else BACKEND_LABELS["vllm"]
        backend.choices = [
            (b, label if is_simulated(b) else f"{vllm_label}: {kinds}")
            for b, label in backend.choices
        ]
        largest = max(offer.values(), default=0)
        for name, runnable in (
            ("gpu", lambda value: value in offer),
            ("tp", lambda value: value.isascii() and value.isdigit() and int(value) <= largest),
        ):
            widget = self.fields[name].widget
            widget.choices = [
                (v, label if runnable(v) else f"{label} (simulator only)")
                for v, label in widget.choices
            ]

    def param_data(self) -> dict[str, object]:
        """The parameters given (cleaned text; empty ones mean the default), with one batch
        for prediction and run (`labs.parameters.params.align_run_batch`)."""
        data = self.cleaned_data if hasattr(self, "cleaned_data") else {}
        given = {k: v for k, v in data.items() if k in FIELDS_BY_NAME and v not in ("", None)}
        if given.get("gpu") == CPU_KIND:
            # The CPU's figures are what the online CPU worker measured, not the learner's.
            from labs.runs.workers import cpu_figures

            given.update(cpu_figures())
        return align_run_batch(given)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        try:
            self.params = parse_lab_params(self.settings_data())
        except ParamError as exc:
            self.add_param_errors(exc.errors)
        return cleaned

    def add_param_errors(self, errors: dict[str, str]) -> None:
        """Each message on its field; one for a setting this lab does not show goes to the
        shown setting it follows, where the learner can act on it."""
        shown = self.shown_names()
        for name, message in errors.items():
            leader = next((n for n in FOLLOWS.get(name, ()) if n in shown), None)
            if name not in shown and leader is not None:
                message = f"{message} ({name} is not shown here; it follows {leader})"
                name = leader
            self.add_error(name if name in self.fields else None, message)

    def shown_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.lab.fields]

    def shown_names(self) -> set[str]:
        return {*self.lab.fields, *RUN_BAR_FIELDS}

    def settings_data(self) -> dict[str, object]:
        """What the prediction and the run use: `param_data` with the settings this lab does not
        show following the ones it does (`labs.parameters.params.follow_unshown`)."""
        return follow_unshown(self.param_data(), self.shown_names())

    def unshown_errors(self) -> list[str]:
        """Errors of no field, or of a setting this lab carries hidden (gpu and tp on most
        labs, refused when no vLLM worker can run them): the run panel shows them, or such a
        refusal would come back with nothing to read."""
        shown = {*self.lab.fields, "backend", "sim_profile", "sweep_field", "sweep_values"}
        return [e for name, errs in self.errors.items() if name not in shown for e in errs]

    def carried_fields(self) -> list[tuple[str, str]]:
        """Values of the settings this lab does not show, sent along as hidden inputs."""
        shown = self.shown_names()
        carried = []
        for f in PARAM_FIELDS:
            if f.name in shown:
                continue
            value = self[f.name].value()
            if value not in (None, ""):
                carried.append((f.name, str(value)))
        return carried


class SweepForm(LabParamsForm):
    sweep_field = forms.CharField(required=False, label="setting to vary")
    sweep_values = forms.CharField(
        required=False,
        label="values",
        help_text="comma-separated, e.g. 1, 8, 64",
    )

    def __init__(self, *args: Any, lab: Lab, **kwargs: Any) -> None:
        super().__init__(*args, lab=lab, **kwargs)
        names = list(dict.fromkeys((lab.sweep_field, *lab.fields)))
        self.fields["sweep_field"].widget = forms.Select(
            choices=[(n, n) for n in names], attrs={"form": FORM_ID}
        )
        self.fields["sweep_values"].widget.attrs["form"] = FORM_ID
        self.fields["sweep_field"].initial = lab.sweep_field
        self.fields["sweep_values"].initial = lab.sweep_values
