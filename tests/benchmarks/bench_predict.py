"""How long one prediction takes: the lab page predicts on every slider change (target < 5 ms).

Not part of the default run (pytest collects test_*.py only). Run it with
    .venv/bin/pytest tests/benchmarks/bench_predict.py
and read the Median column (microseconds).
"""

from __future__ import annotations

from labs.parameters.params import parse_lab_params
from labs.prediction.predict import predict

# A busy lab: a 70B model on 4 GPUs, long prompts chunked, speculation, many sequences.
SLIDERS = {
    "model": "llama-3.1-70b",
    "gpu": "h100-sxm",
    "tp": "4",
    "prompt_tokens": "30000",
    "output_tokens": "500",
    "max_tokens": "1000",
    "concurrency": "200",
    "spec_tokens": "4",
    "acceptance": "0.7",
    "shared_prefix_tokens": "2000",
}


def test_predict_from_validated_params(benchmark):
    params = parse_lab_params(SLIDERS)
    result = benchmark(predict, params)
    assert result.fits


def test_parse_and_predict_from_form_strings(benchmark):
    result = benchmark(lambda: predict(parse_lab_params(SLIDERS)))
    assert result.fits
