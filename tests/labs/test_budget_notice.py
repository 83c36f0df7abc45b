"""The lab page says, before the learner presses Run, when the step's token budget
(max_num_batched_tokens) serialises the engine or caps its batch
(labs.prediction.predict.budget_notice)."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from labs.parameters.params import align_run_batch, parse_lab_params
from labs.parameters.presets import LABS
from labs.prediction.predict import budget_notice, lab_prediction

HTMX = {"HTTP_HX_REQUEST": "true"}
# The Chunked prefill lab with chunked prefill off and the budget its refusal asks for: the
# budget of the 4,096-token prompt.
ONE_AT_A_TIME = {
    **LABS["chunked-prefill"].defaults,
    "chunked_prefill": "false",
    "max_num_batched_tokens": 4096,
}


def _notice(**values: object) -> str:
    params = parse_lab_params(align_run_batch(values))
    return budget_notice(params, lab_prediction(params))


def test_a_prompt_that_needs_the_whole_budget_runs_requests_one_at_a_time():
    notice = _notice(**{**ONE_AT_A_TIME, "chunked_prefill": False})
    assert notice.startswith(
        "max_num_batched_tokens (4,096) serialises the engine: with chunked prefill off, a "
        "4,096-token prompt needs the whole step's budget, so it never joins a step that carries "
        "a decode and requests run one at a time, not 16 together."
    )
    # The ideal simulator: 184 tok/s, TTFT 8.8 s (tests/labs/test_prediction_matches_ideal_sim).
    assert "Predicted under this load: 184 output tokens/s, time to first token 8.8 s." in notice


def test_a_full_chunked_budget_names_the_batch_it_allows():
    notice = _notice(
        prompt_tokens=4096, output_tokens=128, max_tokens=512, concurrency=128, num_prompts=256
    )
    # 64 is also the most the ideal simulator runs at once here.
    assert notice.startswith(
        "max_num_batched_tokens (2,048) lets only about 64 sequences run at once, not the 101 "
        "that max_num_seqs, the KV pool and the load allow: every step is full"
    )


@pytest.mark.parametrize("lab", ["batching", "chunked-prefill"])
def test_a_budget_that_caps_nothing_says_nothing(lab):
    assert _notice(**LABS[lab].defaults) == ""


def _shown(response) -> str:
    found = re.search(r"<p [^>]*data-budget-notice>([^<]*)</p>", response.content.decode())
    return html.unescape(found.group(1)) if found else ""


@pytest.mark.django_db
def test_the_live_prediction_and_the_lab_page_show_it_before_a_run(alice_client):
    url = reverse("labs:lab-predict", args=["chunked-prefill"])
    serial = alice_client.get(url, ONE_AT_A_TIME, **HTMX)
    plain = alice_client.get(url, LABS["chunked-prefill"].defaults, **HTMX)
    assert serial.status_code == plain.status_code == 200
    assert "one at a time, not 16 together" in _shown(serial)
    assert _shown(plain) == ""
    # Opened with those settings, the page says it in the prediction, above the Run button.
    page = alice_client.get(
        reverse("labs:lab-detail", args=["chunked-prefill"]),
        {"chunked_prefill": "false", "max_num_batched_tokens": "4096"},
    )
    text = page.content.decode()
    assert "serialises the engine" in _shown(page)
    assert text.index("data-budget-notice") < text.index(">Run</button>")
