"""`lab predict --json` against `lab run --backend sim --sim-profile ideal --json`: the formulas
are the closed form of the ideal simulated engine, so where the step's token budget
(max_num_batched_tokens) decides what runs they must say what that engine does.

The issue's cases (llama-3-8b on one H100, the simulator's default):

- chunked prefill off, a 4,096-token budget = the 4,096-token prompt: a prompt needs the whole
  budget, never joins a step that carries a decode, and the engine runs one request at a time;
- 4,096-token prompts at a 2,048-token budget with chunked prefill: every step is full, so the
  budget, not the KV pool (101 sequences), caps the batch at about 64;
- a plain batch of 8 that no budget limits.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db

CASES = {
    "one-at-a-time": (
        "--no-chunked-prefill",
        "--max-num-batched-tokens=4096",
        "--prompt-tokens=4096",
        "--output-tokens=128",
        "--max-tokens=512",
        "--concurrency=16",
        "--num-prompts=48",
    ),
    "chunked-budget": (
        "--max-num-batched-tokens=2048",
        "--prompt-tokens=4096",
        "--output-tokens=128",
        "--max-tokens=512",
        "--concurrency=128",
        "--num-prompts=256",
    ),
    "plain-batch-of-8": ("--concurrency=8", "--num-prompts=8"),
}
# (measured key in `lab run`'s JSON, predicted key): what the run page compares.
FIGURES = (
    (("ttft_s", "mean"), "loaded_ttft_s"),
    (("output_tokens_per_s",), "output_tokens_per_s"),
    (("max_running_seqs",), "running_seqs"),
)


def _json(*argv: str) -> dict:
    out = StringIO()
    call_command(*argv, "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("case", CASES)
def test_the_prediction_is_within_25_percent_of_the_ideal_simulator(case):
    options = CASES[case]
    predicted = _json("lab", "predict", *options)
    measured = _json("lab", "run", "--backend=sim", "--sim-profile=ideal", *options)["measured"]
    misses = {}
    for path, key in FIGURES:
        value = measured
        for part in path:
            value = value[part]
        if predicted[key] != pytest.approx(value, rel=0.25):
            misses[key] = (predicted[key], value)
    assert not misses, misses
