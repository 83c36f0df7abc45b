"""The front end belongs to the host, not the GPU (labs/sim/engine_model.Host, calibration.yaml
`hosts`): a lab run meets the default API server whatever its GPU, a published run its own
source's host, and a worker calibrated on its own host that host's measured front end."""

from __future__ import annotations

import statistics
from dataclasses import replace
from datetime import date

import pytest

from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import parse_lab_params
from labs.sim.engine_model import load_calibration
from labs.sim.lab import build_simulator, frontend_s


def _params(**values: object):
    base = {"model": "llama-3-8b", "prompt_tokens": 64, "output_tokens": 8, "num_prompts": 4}
    return parse_lab_params({**base, **values})


def test_every_gpu_meets_the_default_api_server_the_median_of_the_published_hosts():
    cal = load_calibration()
    published = cal.published_hosts()
    assert len(published) >= 3
    default = (
        statistics.median(h.latency_s for h in published),
        statistics.median(h.per_stream_s for h in published),
    )
    assert cal.frontend() == pytest.approx(default)
    for gpu in ("h100-sxm", "h200", "l4", "b200", "l40s"):
        assert frontend_s(_params(gpu=gpu), None) == cal.frontend(), gpu
    # The ideal engine, the formulas' own, has none.
    assert frontend_s(_params(sim_profile="ideal"), None) == (0.0, 0.0)


def test_a_published_host_or_an_in_process_engine_is_named_not_inferred_from_the_gpu():
    cal = load_calibration()
    assert cal.frontend("inference-bench-l4") != cal.frontend("yobitel-h100")
    assert cal.host("in_process").kind == "in_process"
    assert cal.frontend("in_process")[0] < cal.frontend()[0]  # no HTTP server
    # A host a calibration does not hold (its source left out) is the default API server.
    assert cal.frontend("no-such-host") == cal.frontend()
    params = _params(gpu="h100-sxm", concurrency=4, max_concurrency=4)
    alone = build_simulator(params, host="in_process").run()
    served = build_simulator(params, host="inference-bench-l4").run()
    assert (
        alone.meta["breakdown"]["ttft_s"]["parts"]["frontend"]
        < (served.meta["breakdown"]["ttft_s"]["parts"]["frontend"])
    )


def test_a_worker_calibrated_on_its_own_host_uses_the_front_end_it_measured():
    device = DeviceConstants(
        device="h100-sxm",
        bandwidth_efficiency=0.9,
        kv_bandwidth_efficiency=0.7,
        gemm_efficiency=0.7,
        decode_step_overhead_s=0.001,
        mixed_step_overhead_s=0.002,
        fitted_on=date(2026, 1, 1),
        fit_error=0.02,
        held_out_error=0.05,
        frontend_latency_s=0.003,
        frontend_per_stream_s=0.0004,
    )
    assert frontend_s(_params(gpu="h100-sxm"), device) == (0.003, 0.0004)
    assert frontend_s(_params(gpu="h100-sxm"), replace(device, frontend_latency_s=None)) == (
        0.0,
        0.0004,
    )
