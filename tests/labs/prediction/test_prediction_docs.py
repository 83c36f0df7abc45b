"""docs/prediction.md's worked examples, each number recomputed by labs/prediction/predict.py: the
page derives the formulas, and a learner who follows its arithmetic gets what the lab predicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labs.parameters.params import align_run_batch, parse_lab_params
from labs.prediction.load import Pricer, cycle, first_wave, request_shape
from labs.prediction.predict import predict, prefill_time_s, spec_tokens_per_step

DOC = (Path(__file__).resolve().parents[3] / "docs" / "prediction.md").read_text()
H100_8B = {"model": "llama-3-8b", "gpu": "h100-sxm"}


def params(**values: object):
    return parse_lab_params(align_run_batch({**H100_8B, **{k: str(v) for k, v in values.items()}}))


def says(text: str) -> None:
    """The doc states `text` (bold or not)."""
    plain = " ".join(re.sub(r"\*\*", "", DOC).split())
    assert text in plain, f"docs/prediction.md no longer says {text!r}"


def test_mixed_steps_example():
    p = params(
        prompt_tokens=3000,
        output_tokens=64,
        max_tokens=128,
        max_num_batched_tokens=16384,
        chunked_prefill="false",
        concurrency=32,
        num_prompts=128,
    )
    shape = request_shape(p.engine, p.workload, 0)
    pricer = Pricer(p.hardware, p.model, p.engine, shape.verify)
    wave = first_wave(pricer, shape, p.engine, 32)
    assert wave.groups == 7
    steady = cycle(pricer, shape, 32, 32 / wave.groups, 16384, False)
    assert steady is not None and steady.heavy_steps == 7 and steady.light_steps == 57
    says(f"{steady.heavy_s * 1000:.0f} ms")
    says(f"{steady.light_s * 1000:.1f} ms")
    says(f"= {steady.seconds:.2f} s")
    says(f"= {steady.tpot_s(64) * 1000:.1f} ms")
    says(f"prediction is {predict(p).tpot_s * 1000:.1f} ms")


@pytest.mark.parametrize(
    ("rate", "ttft", "p50", "tpot", "tokens"),
    [
        (1, "18.48 ms", "18.48 ms", "4.955 ms", "255.6"),
        (8, None, None, "5.931 ms", "1,938.8"),
        (20, "4.97 s", "5.00 s", "6.137 ms", "2,383.3"),
    ],
)
def test_open_loop_example(rate, ttft, p50, tpot, tokens):
    p = predict(
        params(
            prompt_tokens=1024,
            output_tokens=256,
            max_tokens=512,
            num_prompts=200,
            max_num_seqs=16,
            request_rate=rate,
        )
    )
    says(f"capacity is {p.capacity_requests_per_s:.2f} requests/s")

    def shown(seconds: float, text: str) -> str:
        return (
            f"{seconds:.2f} s"
            if text.endswith(" s")
            else f"{seconds * 1000:.{len(text.split('.')[1]) - 3}f} ms"
        )

    if ttft is None:  # near capacity: the formulas say they do not cover TTFT
        assert p.loaded_ttft_s is None and p.loaded_ttft_p50_s is None
        assert "do not cover TTFT" in p.uncovered["loaded_ttft_s"]
        says(f"| {rate} req/s | {p.regime}, {rate / p.capacity_requests_per_s:.0%} of it")
    else:
        assert shown(p.loaded_ttft_s, ttft) == ttft
        assert shown(p.loaded_ttft_p50_s, p50) == p50
    assert shown(p.tpot_s, tpot) == tpot
    assert f"{p.output_tokens_per_s:,.1f}" == tokens
    says(f"| {rate} req/s | {p.regime}")
    if rate == 1:
        says(f"E2E of {p.loaded_e2e_s:.2f} s keeps {rate * p.loaded_e2e_s:.2f} sequences")
        says(f"the peak over 200 arrivals is {p.running_seqs}")
    if rate == 20:
        says(f"mean wait over 200 requests is {p.queue_wait_s:.2f} s")


def test_shared_prefix_example():
    common = {
        "prompt_tokens": 4096,
        "output_tokens": 256,
        "max_tokens": 512,
        "kv_capacity_tokens": 100000,
        "concurrency": 20,
        "num_prompts": 20,
    }
    alone = predict(params(**common))
    shared = predict(params(**common, shared_prefix_tokens=3072))
    says(f"without sharing {alone.max_concurrent_seqs} fit")
    says(f"= {shared.max_concurrent_seqs} fit")
    p = params(**common, shared_prefix_tokens=3072)
    cold = prefill_time_s(p.hardware, p.model, p.engine, 4096, 0)
    says(f"from {cold * 1000:.1f} ms to {shared.ttft_s * 1000:.1f} ms")


def test_a_pool_that_preempts_is_not_covered():
    p = predict(
        params(
            prompt_tokens=4096,
            output_tokens=256,
            max_tokens=512,
            kv_capacity_tokens=100000,
            concurrency=64,
            num_prompts=64,
        )
    )
    assert p.running_seqs is None and "preempted" in p.uncovered["running_seqs"]


def test_speculation_example():
    says(f"{spec_tokens_per_step(4, 0.7):.2f} tokens per pass")
    spec = {"spec_tokens": 4, "acceptance": 0.7, "prompt_tokens": 1024, "output_tokens": 256}
    one = predict(params(**spec, max_tokens=512, concurrency=1, num_prompts=1))
    many = predict(params(**spec, max_tokens=512, concurrency=128, num_prompts=128))
    says(f"{one.spec_speedup:.2f}x at batch 1")
    says(f"{one.spec_speedup_at_batch:.3f}x under the load of one request")
    says(f"the gain is {many.spec_speedup_at_batch:.3f}x")
    assert many.spec_speedup_at_batch < one.spec_speedup_at_batch
