"""Speculation as a CPU worker's engine runs it (labs/prediction/device_speculation.py,
labs/calibration/sweep.py ngram_drafting): its calibration measures how its ngram
proposer drafts (acceptance where it drafted, share of steps that did) and the CPU time drafting
adds to every step; an ngram run on that device is predicted from those, not from the lab's
alpha, which the CPU build (no synthetic sampler) never uses."""

from __future__ import annotations

from dataclasses import replace
from datetime import date

import pytest

from labs.calibration.sweep import SWEEP, Measured, ngram_drafting, point_params
from labs.parameters.device_calibration import DeviceConstants, check_constants
from labs.parameters.params import parse_lab_params
from labs.prediction.device_speculation import (
    draft_acceptance_rate,
    lab_prediction_on,
    priced_params,
)
from labs.prediction.predict import decode_step_time, spec_tokens_per_step

CPU = {"gpu": "cpu", "hbm_gb": 25, "bandwidth_tbs": 0.016, "tflops": 0.16}
RUN = {
    **CPU,
    "model": "lab-llama-20m",
    "block_size": 128,
    "kv_capacity_tokens": 8192,
    "num_prompts": 8,
    "concurrency": 1,
    "prompt_tokens": 64,
    "output_tokens": 128,
    "max_tokens": 160,
}
DEVICE = DeviceConstants(
    device="cpu:AMD EPYC:2",
    bandwidth_efficiency=0.5,
    kv_bandwidth_efficiency=0.5,
    gemm_efficiency=1.0,
    decode_step_overhead_s=0.004,
    mixed_step_overhead_s=0.005,
    fitted_on=date(2026, 12, 7),
    fit_error=0.1,
    held_out_error=0.12,
    spec_step_overhead_s=0.0015,
    per_seq_overhead_s=0.0003,
    # As the self-calibration measured on this machine kind: 87.5% of drafts accepted where
    # the proposer found a match, which it did in 38% of the sequence-steps.
    ngram_acceptance=0.875,
    ngram_draft_share=0.38,
)


def test_an_ngram_run_on_a_calibrated_cpu_is_predicted_as_its_engine_drafts():
    params = parse_lab_params({**RUN, "spec_method": "ngram", "spec_tokens": 3, "acceptance": 0.7})
    priced = priced_params(params, DEVICE)
    engine = priced.engine
    # The tokens per step its engine made: 38% of steps drafting 3 at 87.5%, the rest one.
    made = 0.38 * spec_tokens_per_step(3, 0.875) + 0.62
    assert spec_tokens_per_step(3, engine.acceptance) == pytest.approx(made, rel=1e-9)
    assert made == pytest.approx(1.878, abs=0.001)  # not the lab alpha's 2.53
    # The proposer's CPU time on every step, as the draft cost that takes as long.
    plain = decode_step_time(
        priced.hardware, priced.model, DEVICE.predictor_engine(params.engine), 1, 64
    )
    assert 3 * engine.draft_cost * plain == pytest.approx(0.0015, rel=1e-9)
    # The change it predicts: TPOT with ngram against without, on the same device.
    plain_run = parse_lab_params(RUN)
    on = lab_prediction_on(params, DEVICE)["tpot_s"]
    off = lab_prediction_on(plain_run, DEVICE)["tpot_s"]
    lab_alpha = lab_prediction_on(params, replace(DEVICE, ngram_acceptance=None))["tpot_s"]
    assert off > on > lab_alpha  # a smaller gain than the lab's alpha promised
    # Of the drafts it made (where it drafted), as vLLM counts them: 2.31 of 3 at 87.5%.
    expected = (spec_tokens_per_step(3, 0.875) - 1) / 3
    assert draft_acceptance_rate(params, DEVICE) == pytest.approx(expected)
    assert expected == pytest.approx(0.7702, abs=1e-4)
    assert draft_acceptance_rate(plain_run, DEVICE) is None


def test_a_gpu_or_an_older_calibration_keeps_the_labs_alpha():
    gpu = parse_lab_params(
        {"model": "qwen2.5-0.5b", "gpu": "l4", "spec_method": "ngram", "spec_tokens": 3}
    )
    assert priced_params(gpu, DEVICE).engine.acceptance == gpu.engine.acceptance
    cpu = parse_lab_params({**RUN, "spec_method": "ngram", "spec_tokens": 3, "acceptance": 0.7})
    older = replace(DEVICE, ngram_acceptance=None, ngram_draft_share=None)
    assert priced_params(cpu, older).engine.acceptance == 0.7
    # A stored row without them reads back without them (the lab's alpha applies).
    constants = {
        k: getattr(DEVICE, k)
        for k in ("bandwidth_efficiency", "kv_bandwidth_efficiency", "gemm_efficiency")
    }
    constants.update(decode_step_overhead_s=0.004, mixed_step_overhead_s=0.005)
    assert "ngram_acceptance" not in check_constants(constants)


def test_the_sweep_keeps_how_the_engine_drafted_measured_never_fitted():
    base = {**CPU, "model": "lab-llama-20m", "block_size": 128, "kv_capacity_tokens": 8192}
    measured = []
    for point, (alpha, share) in zip(
        [p for p in SWEEP if p.changes.get("spec_method") == "ngram"],
        [(0.875, 0.38), (0.868, 0.34)],
        strict=True,
    ):
        params = point_params(base, point)
        engine = replace(params.engine, acceptance=alpha, draft_share=share)
        measured.append(Measured(point, replace(params, engine=engine), 1.0))
    plain = [p for p in SWEEP if not p.changes.get("spec_method")][0]
    measured.append(Measured(plain, point_params(base, plain), 1.0))
    found = ngram_drafting(measured)
    assert found == {
        "ngram_acceptance": pytest.approx(0.8715),
        "ngram_draft_share": pytest.approx(0.36),
    }
    gpu = [replace(m, params=replace(m.params, hardware=parse_lab_params({}).hardware))
           for m in measured]  # fmt: skip
    assert ngram_drafting(gpu) == {}
