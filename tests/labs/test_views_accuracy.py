"""The error lines on the lab page and the run page (labs/explanation/accuracy.py), each beside the
figures it describes: the simulation's beside the run panel and the measured column of a simulated
run, the formulas' gap beside the predicted figures; a calibrated GPU names its own evidence, an
uncalibrated one the GPU it borrows from."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from labs.models import LabRun

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def _texts(block: str) -> list[str]:
    return [
        " ".join(html.unescape(re.sub(r"<[^>]+>", "", p)).split())
        for p in re.findall(r"<(?:p|li)(?: [^>]*)?>.*?</(?:p|li)>", block, re.S)
    ]


def _section(page: str, marker: str) -> str:
    """The element carrying `marker` and everything up to its closing tag."""
    (found,) = re.findall(rf"<(div|ul)[^>]*{marker}[^>]*>(.*?)</\1>", page, re.S)
    return found[1]


def _live(alice_client, gpu: str) -> str:
    url = reverse("labs:lab-predict", args=["chunked-prefill"])
    response = alice_client.get(url, {"gpu": gpu}, **HTMX)
    assert response.status_code == 200, response.content.decode()
    return response.content.decode()


def test_the_lab_pages_simulation_error_sits_in_the_run_panel_and_the_formulas_gap_by_them(
    alice_client,
):
    page = alice_client.get(reverse("labs:lab-detail", args=["chunked-prefill"])).content.decode()
    predicted = page[
        page.index('id="prediction"') : page.index("</section>", page.index('id="prediction"'))
    ]
    run_panel = page[page.index('aria-label="Run this lab"') :]
    assert "data-expected-error" not in predicted  # the simulation's error is not the formulas'
    assert "data-formula-gap" in predicted
    assert 'id="sim-error"' in run_panel and "data-expected-error" in run_panel


def test_a_calibrated_gpu_shows_its_evidence_and_each_figures_median_and_worst(alice_client):
    live = _live(alice_client, "h200")
    assert (
        'id="sim-error" class="muted small sim-error" aria-live="polite" hx-swap-oob="true"' in live
    )
    intro, *lines = _texts(_section(live, "data-expected-error"))
    assert intro.startswith("A simulated run on realistic hardware: H200 · calibrated to")
    ttft, tpot = lines[0], lines[1]
    assert re.fullmatch(
        r"TTFT: median error ±\d+%, worst [+-]\d+% \(\d+ runs from 1 source on this GPU\)", ttft
    ), ttft
    assert tpot.startswith("TPOT: median error ±") and "on this GPU" in tpot
    assert any(line.startswith("TTFT includes the host's front end") for line in lines)
    formula = _texts(_section(live, "data-formula-gap"))
    assert formula[0].startswith("These figures are the formulas' ideal engine")
    assert all("the formulas land a median" in line for line in formula[1:]) and formula[1:]


def test_an_uncalibrated_gpu_gets_every_gpus_figure_and_names_what_it_borrows(alice_client):
    intro, *lines = _texts(_section(_live(alice_client, "l40s"), "data-expected-error"))
    assert "L40S · not calibrated" in intro and "constants borrowed from A100 40GB SXM" in intro
    assert lines[0].startswith("TTFT: median error ±") and "on every GPU (V1 engines)" in lines[0]


def test_the_a100_80gb_page_counts_its_published_runs(alice_client):
    texts = _texts(_section(_live(alice_client, "a100-80gb"), "data-expected-error"))
    assert not any("no published run" in t and "no error estimate" in t for t in texts)
    older = "Its published runs of an older V0 engine (F8, H6) set no constant"
    assert any(t.startswith(older) for t in texts)


def _finished_run(alice, gpu: str, backend: str = "sim") -> LabRun:
    measured = {
        "ttft_s": {"mean": 0.05, "p50": 0.05, "p99": 0.09},
        "tpot_s": {"mean": 0.01, "p50": 0.01},
        "e2e_s": {"mean": 1.3},
        "output_tokens_per_s": 900.0,
        "completed": 8,
        "failed": 0,
    }
    return LabRun.objects.create(
        owner=alice,
        lab="batching",
        backend=backend,
        params={"gpu": gpu, "model": "llama-3-8b", "sim_profile": "realistic"},
        state="done",
        result=measured,
        predicted={"tpot_s": 0.008, "loaded_ttft_s": 0.03, "output_tokens_per_s": 1000.0},
        where=f"simulated on CPU as {gpu}",
    )


@pytest.mark.parametrize("gpu,evidence", [("h100-sxm", "calibrated to"), ("l40s", "borrowed from")])
def test_a_simulated_runs_page_shows_both_errors_beside_their_columns(
    alice, alice_client, gpu, evidence
):
    run = _finished_run(alice, gpu)
    page = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    block = _section(page, "data-expected-error")
    texts = _texts(block)
    assert texts[0].startswith("Measured column, simulated on realistic hardware")
    assert evidence in texts[0]
    assert any(t.startswith("TPOT: median error ±") for t in texts)
    assert any(t.startswith("Predicted column, the formulas' ideal engine") for t in texts)
    assert any("the formulas land a median" in t for t in texts)


def test_a_real_engines_run_page_quotes_only_the_formulas_gap(alice, alice_client):
    run = _finished_run(alice, "h100-sxm", backend="vllm")
    page = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    texts = _texts(_section(page, "data-expected-error"))
    assert not any(t.startswith("Measured column, simulated") for t in texts)
    assert any("the formulas land a median" in t for t in texts)
