"""Definitions shown: how TTFT is stamped (and bench's TTFT beside it) and which sampling a run
used, in the run record, `lab run` and the run page; temperature as a speculative lab setting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from labs.backends.base import RunRecord
from labs.backends.sim import SimBackend
from labs.backends.vllm.loadgen import PlannedRequest, request_body
from labs.explanation import definitions
from labs.measurement.metrics import summarize
from labs.models import RunState
from labs.parameters.params import ParamError, parse_lab_params
from labs.parameters.presets import LABS
from tests.labs.factories import make_run

SMALL = {"num_prompts": 6, "prompt_tokens": 64, "output_tokens": 8, "max_tokens": 16}
NGRAM = {"spec_method": "ngram", "spec_tokens": 3}


def errors_of(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ParamError) as caught:
        parse_lab_params(data)
    return caught.value.errors


def test_temperature_defaults_to_greedy_and_is_a_setting_of_speculative_runs() -> None:
    assert parse_lab_params({}).workload.temperature == 0.0
    assert parse_lab_params({**NGRAM, "temperature": "0.7"}).workload.temperature == 0.7
    message = errors_of({"temperature": 0.7})["temperature"]
    assert message.startswith("temperature must be 0 (greedy) when spec_method is none")
    assert "got 0.7" in message
    assert errors_of({**NGRAM, "temperature": "3"})["temperature"] == (
        "temperature must be a number between 0 and 2, got 3"
    )
    # The speculative lab offers it; its preset default is greedy, what ngram acceptance needs.
    assert "temperature" in LABS["speculative"].fields


def test_the_requests_carry_the_labs_temperature() -> None:
    planned = PlannedRequest(req_id="0", prompt=[5, 6], output_tokens=4, send_at_s=0.0)
    assert json.loads(request_body("lab", planned, None))["temperature"] == 0.0
    assert json.loads(request_body("lab", planned, None, 0.7))["temperature"] == 0.7


def test_a_simulated_run_says_its_ttft_is_simulated_and_has_no_bench_stamp() -> None:
    record = SimBackend().run(parse_lab_params(SMALL))
    assert record.meta["definitions"] == {
        "ttft": definitions.TTFT_SIM,
        "e2e": definitions.E2E_SIM,
        "sampling": definitions.SAMPLING_SIM,
    }
    assert summarize(record)["ttft_bench_s"] is None
    # A record stored before issued_s existed reads back without it.
    data = record.to_dict()
    for request in data["requests"]:
        del request["issued_s"]
    assert summarize(RunRecord.from_dict(data))["ttft_bench_s"] is None


@pytest.mark.django_db
def test_the_run_page_shows_how_ttft_was_stamped_both_means_and_the_sampling(
    alice: Any, alice_client: Any
) -> None:
    from labs.runs import execution

    done = make_run(alice, lab="speculative")
    assert execution.run_execute(run_id=done.pk, hostname="sim@test") == RunState.DONE
    done.refresh_from_db()
    result = {**done.result}
    result["ttft_s"] = {**result["ttft_s"], "mean": 0.0123}
    result["ttft_bench_s"] = {**result["ttft_s"], "mean": 0.0171}
    # As a real engine's run recorded before E2E was timed from bench's start: no word of it.
    older = {k: v for k, v in definitions.definitions("vllm", 0.5).items() if k != "e2e"}
    result["meta"] = {**result["meta"], "definitions": older}
    params = parse_lab_params({**SMALL, **NGRAM, "temperature": 0.5}).as_dict()
    run = make_run(
        alice, lab="speculative", backend="vllm", state=RunState.DONE, params=params, result=result
    )
    html = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    section = html.split('id="run-definitions"', 1)[1].split("</section>", 1)[0]
    assert "stamped at the socket" in section and "12.30 ms" in section
    assert "as vllm bench serve stamps it" in section and "17.10 ms" in section
    assert "sampled at temperature 0.5" in section
    # E2E says where it started: at the socket, for that older record.
    assert "<strong>E2E</strong>: stamped at the socket, as TTFT" in section
    result["meta"] = {**result["meta"], "definitions": definitions.definitions("vllm", 0.5)}
    run.result = result
    run.save()
    html = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    section = html.split('id="run-definitions"', 1)[1].split("</section>", 1)[0]
    assert "<strong>E2E</strong>: as vllm bench serve times it: from just before the POST" in (
        section
    )
    assert "Warm-up" not in section  # this record sent none
    result["meta"] = {**result["meta"], "warmup_s": 0.9312, "warmup_error": None}
    run.result = result
    run.save()
    html = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    section = html.split('id="run-definitions"', 1)[1].split("</section>", 1)[0]
    assert "<strong>Warm-up</strong>: one request before the run, not measured" in section
    assert "it took 931.20 ms" in section

    sim_html = alice_client.get(reverse("labs:run-detail", args=[done.pk])).content.decode()
    sim_section = sim_html.split('id="run-definitions"', 1)[1].split("</section>", 1)[0]
    assert "simulated: from the request" in sim_section
    assert "vllm bench serve stamps" not in sim_section
