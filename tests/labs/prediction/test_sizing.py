"""Run size: the O(1) estimate at submit, its limits per field, and the worker's own cap."""

from __future__ import annotations

import gc
import tracemalloc
from unittest import mock

import pytest
from django.urls import reverse

from labs.backends.sim import SimBackend
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState
from labs.parameters.params import ParamError, parse_lab_params
from labs.prediction.sizing import (
    BASE_BYTES,
    MB,
    RunTooLarge,
    address_space_limit,
    sim_precheck,
    sim_run_size,
)
from labs.runs import execution
from tests.labs.factories import SMALL, make_heartbeat, make_run

HOSTILE = [
    {"kv_capacity_tokens": "30000000", "block_size": "1"},
    {"kv_capacity_tokens": str(10**10), "block_size": "1"},
    {"kv_capacity_tokens": str(10**10), "block_size": "256"},
]


@pytest.mark.django_db
@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_pool_is_refused_at_submit_without_allocating_it(alice_client, hostile):
    make_heartbeat("sim")
    url = reverse("labs:run-create", args=["paged-kv"])
    gc.collect()
    tracemalloc.start()
    # Without the O(1) check the page builds the pool: cap this process so that fails cleanly.
    with address_space_limit(512 * MB):
        response = alice_client.post(url, {**hostile, "backend": "sim"})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert response.status_code == 400
    assert "kv_capacity_tokens is too large to simulate" in response.content.decode()
    # Rendering the lab page again costs a few MB; a pool of 3*10^7 blocks would be ~4 GB.
    assert peak < 20 * MB, f"peak {peak / MB:.1f} MB"
    assert not LabRun.objects.exists()


def test_the_estimate_costs_the_same_whatever_the_numbers():
    small = parse_lab_params(SMALL)
    huge = parse_lab_params({"kv_capacity_tokens": 10**10, "block_size": 1, "num_prompts": 10**6})
    for params in (small, huge):
        tracemalloc.start()
        sim_run_size(params)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 64 * 1024
    assert sim_run_size(huge).pool_blocks == 10**10


def test_a_million_prompts_is_refused_naming_num_prompts_and_its_limit():
    params = parse_lab_params({"num_prompts": 10**6})
    with pytest.raises(RunTooLarge) as info:
        sim_precheck(params, max_run_mb=512)
    message = info.value.errors["num_prompts"]
    assert "too large to simulate" in message and "512 MB" in message
    most = int(message.split("use at most ")[1].split(" prompts")[0].replace(",", ""))
    assert 100 <= most < 10**6
    # The limit it names is one that passes, and one more does not.
    sim_precheck(parse_lab_params({"num_prompts": most}), max_run_mb=512)
    assert sim_run_size(parse_lab_params({"num_prompts": most * 2})).mb > 512


def test_the_pool_limit_named_for_kv_capacity_tokens_passes():
    params = parse_lab_params({"kv_capacity_tokens": 30_000_000, "block_size": 1})
    with pytest.raises(RunTooLarge) as info:
        sim_precheck(params, max_run_mb=512)
    message = info.value.errors["kv_capacity_tokens"]
    most = int(message.split("Use at most ")[1].split(" tokens")[0].replace(",", ""))
    sim_precheck(parse_lab_params({"kv_capacity_tokens": most, "block_size": 1}), max_run_mb=512)


def test_a_pool_that_cannot_hold_the_longest_request_is_refused_in_o1():
    params = parse_lab_params({**SMALL, "kv_capacity_tokens": 64, "block_size": 16})
    with pytest.raises(ParamError) as info:
        sim_precheck(params, max_run_mb=512)
    assert "must hold the longest request" in info.value.errors["kv_capacity_tokens"]


@pytest.mark.parametrize(
    "shape",
    [
        # One request decoding at a time: every step stores its own small arrays.
        {"num_prompts": 300, "output_tokens": 100, "max_concurrency": 1},
        # A batch: many chunks per step.
        {"num_prompts": 1000, "output_tokens": 100, "max_concurrency": 64},
        # Poisson arrivals and a pool of single-token blocks.
        {"num_prompts": 200, "output_tokens": 50, "request_rate": 5, "block_size": 1},
        # Long prompts in single-token blocks: every request's block table is allocated at the
        # start (it was left out of the estimate); with prefix caching and a shared prefix the
        # lookups return thousands of blocks.
        *(
            {
                "num_prompts": 1000,
                "prompt_tokens": 4000,
                "output_tokens": 4,
                "max_tokens": 16,
                "block_size": 1,
                "kv_capacity_tokens": 50_000,
                "max_concurrency": 256,
                **caching,
            }
            for caching in (
                {"prefix_caching": "false"},
                {"prefix_caching": "true"},
                {"prefix_caching": "true", "shared_prefix_tokens": 3900},
            )
        ),
    ],
)
def test_the_estimate_is_an_upper_bound_on_what_the_simulator_holds(shape):
    params = parse_lab_params(
        {"prompt_tokens": 64, "max_tokens": 512, "kv_capacity_tokens": 100_000, **shape}
    )
    size = sim_run_size(params)
    gc.collect()
    tracemalloc.start()
    summarize(SimBackend().run(params))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The estimate's fixed part covers the interpreter's own noise; the rest must cover the run.
    assert peak <= size.bytes - BASE_BYTES + 4 * MB, (peak / MB, size.mb)


def test_the_address_space_cap_turns_overgrowth_into_a_memory_error_and_lifts_after():
    with address_space_limit(64 * MB) as limited:
        if not limited:
            pytest.skip("this platform cannot read its own address space")
        with pytest.raises(MemoryError):
            bytearray(256 * MB)
    assert len(bytearray(256 * MB)) == 256 * MB


@pytest.mark.django_db
def test_the_worker_refuses_a_too_large_run_that_skipped_the_submit_check(alice, settings):
    settings.LABS_SIM_MAX_RUN_MB = 512
    params = {**parse_lab_params(SMALL).as_dict(), "num_prompts": 10**6}
    run = make_run(alice, params=params)
    with mock.patch("labs.backends.sim.build_simulator") as build:
        assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.FAILED
    build.assert_not_called()
    run.refresh_from_db()
    assert run.error.startswith("Too large for one simulated run: num_prompts")


@pytest.mark.django_db
def test_a_run_that_outgrows_its_cap_fails_with_a_clear_reason(alice, settings):
    run = make_run(alice)
    with mock.patch.object(SimBackend, "_run", side_effect=MemoryError):
        assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.FAILED
    run.refresh_from_db()
    assert run.error.startswith("Too large: the run needed more memory")
