"""The lab page's expected-error lines (labs/accuracy.py): a calibrated GPU names its own
evidence and the typical error of each figure shown; an uncalibrated one says it has none."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from labs.accuracy import NOT_CALIBRATED

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def _expected_error(alice_client, gpu: str) -> list[str]:
    url = reverse("labs:lab-predict", args=["chunked-prefill"])
    response = alice_client.get(url, {"gpu": gpu}, **HTMX)
    assert response.status_code == 200, response.content.decode()
    (block,) = re.findall(r"data-expected-error>(.*?)</div>", response.content.decode(), re.S)
    return [
        html.unescape(re.sub(r"<[^>]+>", "", p)).strip()
        for p in re.findall(r"<(?:p|li)>.*?</(?:p|li)>", block)
    ]


def test_a_calibrated_gpu_shows_its_evidence_and_the_error_of_ttft_and_tpot(alice_client):
    intro, *lines = _expected_error(alice_client, "h200")
    assert intro.startswith("H200 · calibrated to 3 published vLLM runs, checked against 2 more.")
    assert [line.split(":")[0] for line in lines] == ["TTFT", "TPOT"]
    for line in lines:  # its own TTFTs and TPOTs, each predicted without their source
        assert re.fullmatch(
            r"(TTFT|TPOT): within about ±\d+% on published runs like this \(.*on this GPU\)", line
        ), line


def test_an_uncalibrated_gpu_says_it_has_no_error_estimate(alice_client):
    intro, *lines = _expected_error(alice_client, "l40s")
    assert intro.startswith("L40S · constants borrowed from a calibrated GPU")
    assert lines == [NOT_CALIBRATED]
