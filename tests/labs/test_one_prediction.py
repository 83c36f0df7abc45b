"""One prediction everywhere: the lab page, the run page, `lab predict` and a personal card show
the same predicted figures for the same settings (labs.prediction.predict.lab_prediction)."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import call_command
from django.urls import reverse

from labs import api as labs_api
from labs.explanation.results import format_value
from labs.models import DeviceCalibration, LabRun, RunState
from labs.parameters.params import FIELDS_BY_NAME, parse_lab_params
from labs.parameters.presets import LABS, lab_initial
from labs.prediction.predict import lab_prediction
from labs.runs import execution
from quiz import personal
from tests.labs.calibration.test_device_calibration import SLOW
from tests.labs.factories import make_heartbeat
from tests.labs.test_views import no_broker  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

# The case: the lab page showed 3.7 s under load, the run page 4.93 s.
SETTINGS = {"max_num_seqs": "8", "concurrency": "64", "num_prompts": "96"}
# Lab page key -> (run page row, unit); the run page's row of sequences has no unit.
SHOWN = {
    "loaded_ttft_s": ("TTFT, mean", "s"),
    "tpot_s": ("TPOT, mean", "s"),
    "loaded_e2e_s": ("E2E latency, mean", "s"),
    "output_tokens_per_s": ("Output tokens/s", "tok/s"),
    "running_seqs": ("Running sequences, peak", ""),
}


def _cli_predict(params: dict) -> dict:
    options = []
    for name, value in params.items():
        field = FIELDS_BY_NAME.get(name)
        if field is None or value is None:
            continue
        if isinstance(value, bool):
            options.append(field.option if value else f"--no-{field.option[2:]}")
        else:
            options += [field.option, str(value)]
    out = io.StringIO()
    call_command("lab", "predict", "--json", *options, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("calibrated", [False, True], ids=["published", "device-calibrated"])
def test_lab_page_run_page_cli_and_card_show_the_same_prediction(
    alice,
    alice_client,
    no_broker,  # noqa: F811
    calibrated,
):
    make_heartbeat("sim")
    gpu = parse_lab_params(lab_initial(LABS["batching"], None, SETTINGS)).hardware.name
    if calibrated:  # the device's own calibration prices every one of them alike
        DeviceCalibration.objects.create(
            device=gpu, constants=SLOW, fit_error=0.02, held_out_error=0.05
        )
    lab_page = alice_client.get(reverse("labs:lab-detail", args=["batching"]), SETTINGS)
    on_lab_page = {item["key"]: item["value"] for item in lab_page.context["prediction"]}
    html = lab_page.content.decode().lower()
    assert "under this load: concurrency 64, max_num_seqs 8, 96 prompts" in html

    form = {k: v for k, v in lab_initial(LABS["batching"], None, SETTINGS).items()}
    response = alice_client.post(
        reverse("labs:run-create", args=["batching"]),
        {**{k: str(v) for k, v in form.items()}, "backend": "sim"},
    )
    run = LabRun.objects.get()
    assert response.status_code == 302
    assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    run.refresh_from_db()
    run_page = alice_client.get(run.get_absolute_url())
    on_run_page = {row.label: row.predicted for row in run_page.context["rows"]}
    assert "under this load: concurrency 64, max_num_seqs 8, 96 prompts" in (
        run_page.content.decode()
    )

    cli = _cli_predict(run.params)
    published = lab_prediction(parse_lab_params(run.params))
    assert (cli["tpot_s"] > 1.5 * published["tpot_s"]) if calibrated else cli == published
    for key, (row, unit) in SHOWN.items():
        shown = format_value(cli[key], unit)
        assert on_lab_page[key].removesuffix(" seqs") == shown, key
        assert on_run_page[row] == shown, key
    # The median differs from the mean, so the rows above would catch a run page showing the
    # median (a figure the lab page never shows).
    assert cli["loaded_ttft_p50_s"] != pytest.approx(cli["loaded_ttft_s"], rel=0.05)

    card = personal.card_from_run(user=alice, run=labs_api.run_data(run.pk))
    step = next(s for s in card.steps if s.startswith("Predicted output tokens/s"))
    before = re.search(r": ([\d,.]+) at ", step).group(1)
    assert float(before.replace(",", "")) == pytest.approx(cli["output_tokens_per_s"], rel=5e-3)
    assert f"{cli['output_tokens_per_s']:,.0f}" == before
