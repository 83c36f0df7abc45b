"""Definitions on a real engine's run (against the fake vLLM): the lab's temperature in every
request, TTFT stamped at the socket with bench's TTFT beside it, both in the record and in
`lab run`'s output."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from labs.backends.base import RunRecord
from labs.backends.vllm.backend import VLLMBackend
from labs.explanation import definitions
from labs.measurement.metrics import summarize
from labs.parameters.params import parse_lab_params

SMALL = {"num_prompts": 6, "prompt_tokens": 64, "output_tokens": 8, "max_tokens": 16}
NGRAM = {"spec_method": "ngram", "spec_tokens": 3}


def test_a_vllm_run_sends_its_temperature_and_records_both_ttfts_and_its_sampling(
    fake_server: Any,
) -> None:
    server = fake_server({"ttft_ms": 20, "itl_ms": [2]})
    params = parse_lab_params({**SMALL, **NGRAM, "temperature": 0.7})
    record = VLLMBackend(base_url=server.base_url, metrics_poll_s=0).run(params)

    log = server.measured_log()
    assert len(log) == 6 and {entry["temperature"] for entry in log.values()} == {0.7}
    said = record.meta["definitions"]
    assert said["ttft"] == definitions.TTFT_SOCKET and said["ttft_bench"] == definitions.TTFT_BENCH
    assert said["temperature"] == 0.7
    assert said["sampling"].startswith("sampled at temperature 0.7")
    # bench's clock starts before the socket's, for every request, and survives storage.
    for request in record.requests:
        assert request.issued_s is not None and request.issued_s <= request.arrival_s
    again = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    measured = summarize(again)
    assert measured["ttft_bench_s"]["mean"] >= measured["ttft_s"]["mean"] > 0.015


@pytest.mark.django_db  # the prediction looks up the device's stored calibration
def test_lab_run_prints_both_ttfts_and_the_definitions(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 5, "itl_ms": [2]})
    options = ["--num-prompts", "4", "--prompt-tokens", "64", "--output-tokens", "8"]
    out = io.StringIO()
    call_command("lab", "run", "--backend", "vllm", "--base-url", server.base_url, *options,
                 "--max-tokens", "16", stdout=out)  # fmt: skip
    text = out.getvalue()
    assert "TTFT (bench's stamps)" in text
    assert f"TTFT: {definitions.TTFT_SOCKET}" in text
    assert f"sampling: {definitions.sampling(0.0)}" in text
    out = io.StringIO()
    call_command("lab", "run", *options, "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["definitions"]["ttft"] == definitions.TTFT_SIM
    assert result["measured"]["ttft_bench_s"] is None
