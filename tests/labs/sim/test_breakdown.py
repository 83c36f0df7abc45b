"""Where the time went: the breakdown adds up to what was measured, on random workloads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.backends.sim import SimBackend
from labs.measurement.metrics import summarize
from labs.parameters.params import parse_lab_params
from labs.prediction.predict import predict
from labs.sim.breakdown import BREAKDOWN_PARTS
from labs.sim.lab import build_simulator
from tests.budget import examples

MODELS = [
    {"model": "llama-3-8b"},
    {"model": "mixtral-8x7b", "tp": 2},
    {"model": "llama-3-70b", "tp": 4, "gpu": "a100-80gb"},
    {"model": "qwen2.5-7b", "gpu": "l40s", "tp": 2},
]


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, object]:
    prompt = draw(st.integers(16, 700))
    output = draw(st.integers(1, 90))
    values: dict[str, object] = {
        **draw(st.sampled_from(MODELS)),
        "sim_profile": draw(st.sampled_from(["realistic", "ideal"])),
        "num_prompts": draw(st.integers(1, 24)),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "max_tokens": output,
        "max_num_seqs": draw(st.integers(1, 16)),
        "max_num_batched_tokens": draw(st.sampled_from([256, 1024, 4096])),
        "chunked_prefill": True,
        "prefix_caching": draw(st.booleans()),
        "shared_prefix_tokens": draw(st.integers(0, prompt)),
        "seed": draw(st.integers(0, 1000)),
    }
    # Small pools preempt; None keeps the GPU's pool.
    values["kv_capacity_tokens"] = draw(st.sampled_from([None, 2 * (prompt + output) + 64, 6000]))
    if draw(st.booleans()):
        values["request_rate"] = draw(st.floats(0.5, 80))
    if draw(st.booleans()):
        values["max_concurrency"] = draw(st.integers(1, 24))
    if draw(st.booleans()):
        values["spec_tokens"] = draw(st.integers(1, 4))
        values["acceptance"] = draw(st.floats(0.0, 0.95))
    return values


def _run(values: dict[str, object]) -> tuple[dict, dict, np.ndarray]:
    """(measured, breakdown, every request's parts before clamping at 0, each over its finish
    time: E2E rows then TPOT rows)."""
    sim = build_simulator(parse_lab_params(values))
    record = sim.run()
    finish = np.array([np.nan if r.finish_s is None else r.finish_s for r in record.requests])
    raw = (
        np.concatenate(sim.breakdown.per_request(record.requests, clamp=False))
        / np.tile(finish, 2)[:, None]
    )
    return summarize(record), record.meta["breakdown"], raw


@settings(
    max_examples=examples(40),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(workloads())
def test_it_adds_up_to_the_measured_means_with_no_negative_part(values):
    measured, breakdown, raw = _run(values)
    # Before the clamp: a part found by difference (time in the engine minus the steps charged)
    # may only be a few ulps of the clock below 0; a step charged twice would be a whole step.
    assert not (raw[~np.isnan(raw)] < -1e-12).any(), np.nanmin(raw, axis=0)
    for key in ("e2e_s", "tpot_s"):
        mean = measured[key]["mean"]
        section = breakdown[key]
        if mean is None:
            assert section is None
            continue
        assert section["total"] == pytest.approx(mean, rel=0.01)
        assert sum(section["parts"].values()) == pytest.approx(mean, rel=0.01)
        assert all(v >= 0 for v in section["parts"].values())
        assert set(section["parts"]) == set(BREAKDOWN_PARTS)
    if values["sim_profile"] == "ideal":
        for name in ("efficiency", "overhead", "communication"):
            assert breakdown["e2e_s"]["parts"][name] == 0
    if not values.get("spec_tokens"):
        assert breakdown["e2e_s"]["parts"]["speculation"] == 0


@settings(max_examples=examples(25), deadline=None, derandomize=True)
@given(
    prompt=st.integers(8, 3000),
    output=st.integers(2, 200),
    setting=st.sampled_from(MODELS),
)
def test_on_ideal_hardware_one_request_at_a_time_is_the_predictor(prompt, output, setting):
    params = parse_lab_params(
        {
            **setting,
            "sim_profile": "ideal",
            "num_prompts": 2,
            "max_concurrency": 1,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "max_tokens": output,
        }
    )
    record = SimBackend().run(params)
    m = summarize(record)
    predicted = predict(params)
    assert m["ttft_s"]["mean"] == pytest.approx(predicted.ttft_s, rel=0.01)
    assert m["e2e_s"]["mean"] == pytest.approx(predicted.e2e_s, rel=0.02)
    parts = record.meta["breakdown"]["e2e_s"]["parts"]
    assert parts["ideal"] == pytest.approx(m["e2e_s"]["mean"], rel=1e-9)


def test_it_names_queueing_when_requests_wait_for_slots():
    params = parse_lab_params(
        {
            "num_prompts": 64,
            "max_concurrency": 64,
            "max_num_seqs": 4,
            "prompt_tokens": 256,
            "output_tokens": 64,
            "max_tokens": 64,
        }
    )
    parts = SimBackend().run(params).meta["breakdown"]["e2e_s"]["parts"]
    assert max(parts, key=parts.get) == "queueing"


def test_it_charges_preemption_when_the_pool_is_too_small():
    params = parse_lab_params(
        {
            "num_prompts": 16,
            "max_num_seqs": 16,
            "prompt_tokens": 200,
            "output_tokens": 200,
            "max_tokens": 200,
            "kv_capacity_tokens": 1600,
        }
    )
    record = SimBackend().run(params)
    assert record.counters.preemptions > 0
    assert record.meta["breakdown"]["e2e_s"]["parts"]["preemption"] > 0


def test_tensor_parallel_runs_pay_communication_and_one_gpu_does_not():
    common = {"num_prompts": 4, "max_concurrency": 1, "prompt_tokens": 256, "output_tokens": 32}
    for tp, paid in ((1, False), (4, True)):
        params = parse_lab_params(
            {**common, "model": "llama-3-70b", "tp": tp, "gpu": "h200", "weight_dtype": "fp8"}
        )
        comm = SimBackend().run(params).meta["breakdown"]["tpot_s"]["parts"]["communication"]
        assert (comm > 0) is paid


def test_the_fast_path_entry_charges_decode_steps_to_their_requests():
    params = parse_lab_params({"num_prompts": 3, "prompt_tokens": 32, "output_tokens": 4})
    sim = build_simulator(params)
    parts = np.array([[1.0, 0.5, 0.25, 0.0, 0.0], [1.0, 0.5, 0.25, 0.0, 0.0]])
    sim.breakdown.add_steps(np.array([0, 2]), parts)
    after = sim.breakdown.steps[1]
    assert after[0].tolist() == [2.0, 1.0, 0.5, 0.0, 0.0]
    assert after[1].sum() == 0


def test_a_real_gpu_run_gets_the_expected_parts_and_an_honest_unexplained_remainder():
    from labs.sim.lab import run_breakdown
    from tests.labs.factories import gpu_record_slower_than_the_model

    params = parse_lab_params(
        {"num_prompts": 8, "max_concurrency": 2, "prompt_tokens": 128, "output_tokens": 16}
    )
    # The same requests, as if a GPU had taken 25% longer than the engine model expects.
    record = gpu_record_slower_than_the_model(params, 1.25)
    measured = summarize(record)
    breakdown = run_breakdown(params, record, measured)
    assert breakdown["source"] == "expected"
    e2e = breakdown["e2e_s"]
    assert e2e["total"] == measured["e2e_s"]["mean"]
    assert sum(e2e["parts"].values()) == pytest.approx(e2e["total"], rel=1e-9)
    assert e2e["parts"]["unexplained"] == pytest.approx(0.2 * e2e["total"], rel=0.05)
    ttft = breakdown["ttft_s"]
    assert ttft["total"] == measured["ttft_s"]["mean"]
    assert sum(ttft["parts"].values()) == pytest.approx(ttft["total"], rel=1e-9)


def test_the_ttft_parts_add_up_to_the_measured_mean_ttft_and_e2e_adds_the_rest():
    params = parse_lab_params(
        {"num_prompts": 24, "max_concurrency": 8, "max_num_seqs": 4, "prompt_tokens": 700}
    )
    record = SimBackend().run(params)
    measured = summarize(record)
    breakdown = record.meta["breakdown"]
    ttft, e2e = breakdown["ttft_s"], breakdown["e2e_s"]
    assert ttft["total"] == pytest.approx(measured["ttft_s"]["mean"], rel=1e-6)
    # Queueing happens before the first token only, so both sections carry all of it.
    assert ttft["parts"]["queueing"] == pytest.approx(e2e["parts"]["queueing"], rel=1e-12)
    assert ttft["parts"]["queueing"] > 0
    for name, value in ttft["parts"].items():
        assert 0 <= value <= e2e["parts"][name] + 1e-12
