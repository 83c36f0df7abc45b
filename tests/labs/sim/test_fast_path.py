"""The fast path (runs of decode steps advanced at once, steady steps kept as sums) gives the same
run record as scheduling every step on its own (`step_by_step=True`): token times within 1e-9 s,
identical token counts, counters, engine samples and step count, on random workloads with
preemption, chunked prefill, prefix caching and speculation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.backends.base import RunRecord
from labs.parameters.params import parse_lab_params
from labs.prediction.predict import blocks_for_tokens
from labs.sim.cost_model import build_cost_model
from labs.sim.scheduler import SchedulerConfig
from labs.sim.simulator import Simulator
from tests.budget import examples
from tests.labs.sim.helpers import (
    LinearCost,
    assert_same_breakdown,
    assert_same_record,
    composition,
    make_workload,
)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 40))
    prompts = draw(st.lists(st.integers(1, 96), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    arrivals_kind = draw(st.sampled_from(["at-once", "poisson", "closed-loop"]))
    arrivals, max_concurrency = None, None
    if arrivals_kind == "poisson":
        gaps = draw(st.lists(st.floats(0, 0.5), min_size=n, max_size=n))
        arrivals = np.cumsum(gaps).tolist()
    elif arrivals_kind == "closed-loop":
        max_concurrency = draw(st.integers(1, 12))
    chunked = draw(st.booleans())
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    spec = draw(st.sampled_from([0, 0, 1, 3]))
    needed = blocks_for_tokens(
        max(p + o for p, o in zip(prompts, outputs, strict=True)), block_size
    )
    min_budget = 1 if chunked else max(prompts)
    config = {
        "max_num_seqs": draw(st.integers(1, 24)),
        "max_num_batched_tokens": draw(st.integers(min_budget, max(min_budget, 160))),
        # Tight pools often, so preemption is exercised.
        "num_gpu_blocks": draw(st.integers(needed, needed * 6)),
        "block_size": block_size,
        "chunked_prefill": chunked,
        "prefix_caching": draw(st.booleans()),
        "kv_allocation": draw(st.sampled_from(["paged", "paged", "paged", "contiguous"])),
        "num_spec_tokens": spec,
        "spec_acceptance": draw(st.sampled_from([0.0, 0.5, 0.9])),
    }
    shared = draw(st.sampled_from([0, 0, min(prompts)]))
    workload = make_workload(
        prompts,
        outputs,
        arrivals,
        shared_prefix_tokens=shared,
        max_concurrency=max_concurrency,
    )
    pricing = draw(st.sampled_from(["linear", "linear", "realistic", "ideal"]))
    if pricing == "linear":
        cost = LinearCost(
            draw(st.sampled_from([0.01, 0.013])),
            draw(st.sampled_from([0.0, 1e-4])),
            draw(st.sampled_from([0.0, 3e-6])),
        )
    else:
        # The engine model prices from totals in steady steps and feeds the breakdown there.
        params = parse_lab_params({"sim_profile": pricing, "tp": draw(st.sampled_from([1, 2]))})
        cost = build_cost_model(params.hardware, params.model, params.engine)
    # The API server's time before the engine sees a request: a slot's next request then
    # arrives while the engine steps, between any two steps of a fast run.
    # It grows with the requests in the engine, so arrivals also depend on when they finish.
    # A CPU worker's front end also takes its CPU time from a busy engine's next step.
    frontend = (
        draw(st.sampled_from([0.0, 0.0, 0.004, 0.03])),
        draw(st.sampled_from([0.0, 0.0, 0.001, 0.02])),
        draw(st.sampled_from([0.0, 0.0, 0.003, 0.05])),
    )
    return workload, config, cost, draw(st.integers(0, 2**16)), frontend


def run_both(
    workload, config, cost, seed: int, frontend: tuple[float, float, float] = (0.0, 0.0, 0.0)
) -> tuple[Simulator, RunRecord, Simulator, RunRecord]:
    sims = [
        Simulator(
            SchedulerConfig(**config),
            workload,
            cost,
            np.random.default_rng(seed),
            step_by_step=step_by_step,
            max_samples=64,
            frontend_latency_s=frontend[0],
            frontend_per_stream_s=frontend[1],
            frontend_cpu_s=frontend[2],
        )
        for step_by_step in (False, True)
    ]
    return sims[0], sims[0].run(), sims[1], sims[1].run()


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_it_gives_the_step_by_step_record_on_random_workloads(scenario):
    workload, config, cost, seed, frontend = scenario
    fast_sim, fast, slow_sim, slow = run_both(workload, config, cost, seed, frontend)
    assert slow_sim.num_skipped_steps == slow_sim.num_steady_steps == 0
    assert_same_record(fast, slow)
    assert_same_breakdown(fast_sim, fast, slow_sim, slow)
    # Both end with every block back in the pool.
    assert fast_sim.scheduler.pool.num_used_blocks == slow_sim.scheduler.pool.num_used_blocks == 0


def test_it_takes_most_steps_of_a_busy_run_without_the_scheduler():
    # A small copy of the benchmark case: everything at once, batch-limited, prefills beside
    # decodes, a pool that holds the batch.
    workload = make_workload([200] * 120, [60] * 120)
    config = {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 256,
        "num_gpu_blocks": 800,
        "block_size": 16,
        "prefix_caching": True,
    }
    fast_sim, fast, slow_sim, slow = run_both(workload, config, LinearCost(0.01, 1e-5), 0)
    assert_same_record(fast, slow)
    steps = fast_sim.num_steps
    assert fast_sim.num_skipped_steps + fast_sim.num_steady_steps > 0.8 * steps
    assert fast_sim.num_skipped_steps > 0 and fast_sim.num_steady_steps > 0


def test_it_prices_the_lab_model_the_same_to_the_bit():
    # The real cost model (not the linear one above), on the lab default with Poisson arrivals.
    params = parse_lab_params(
        {"num_prompts": 150, "prompt_tokens": 300, "output_tokens": 90, "request_rate": 40}
    )
    from labs.sim.lab import build_simulator

    records = []
    for step_by_step in (False, True):
        sim = build_simulator(params)
        sim.step_by_step = step_by_step
        records.append(sim.run())
    fast, slow = records
    assert_same_record(fast, slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert np.array_equal(a.chunks.times_s, b.chunks.times_s)
    # The skipped decode runs feed the time breakdown as the single steps do.
    assert fast.meta["skipped_steps"] > 0
    for key in ("e2e_s", "tpot_s"):
        got, want = fast.meta["breakdown"][key], slow.meta["breakdown"][key]
        assert got["total"] == pytest.approx(want["total"], rel=1e-9)
        for name, value in want["parts"].items():
            assert got["parts"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_the_cost_models_price_a_run_of_steps_as_single_steps():
    from labs.sim.cost_model import build_cost_model

    rng = np.random.default_rng(1)
    kv = rng.integers(0, 400_000, 50)
    for profile in ("ideal", "realistic"):
        params = parse_lab_params(
            {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tp": 2, "sim_profile": profile}
        )
        cost = build_cost_model(params.hardware, params.model, params.engine)
        out = composition(8, 0, 8, int(kv[0]))
        run = cost.steps_time_s(out, kv, np.zeros_like(kv))
        parts = cost.steps_parts_s(out, kv, np.zeros_like(kv))
        assert run[0] == cost.step_time_s(out)
        assert parts.sum(axis=1).tolist() == [
            cost.step_time_s(composition(8, 0, 8, int(k))) for k in kv
        ]


def test_it_draws_speculation_for_many_steps_from_the_same_stream():
    # Generator.geometric fills (steps, m) value by value: the same numbers as steps draws of m.
    many = np.random.default_rng(7).geometric(0.3, size=(50, 6))
    one_by_one = np.random.default_rng(7)
    assert np.array_equal(many, np.stack([one_by_one.geometric(0.3, size=6) for _ in range(50)]))
    # And the fast path advances speculating decode runs with it, to the same record.
    workload = make_workload([40] * 12, [200] * 12)
    config = {
        "max_num_seqs": 16,
        "max_num_batched_tokens": 128,
        "num_gpu_blocks": 1000,
        "block_size": 4,
        "num_spec_tokens": 3,
        "spec_acceptance": 0.7,
    }
    fast_sim, fast, _, slow = run_both(workload, config, LinearCost(0.01, 1e-4, 1e-6), 3)
    assert_same_record(fast, slow)
    assert fast_sim.num_skipped_steps > 0.5 * fast_sim.num_steps
    assert 0 < fast.counters.spec_accepted_tokens < fast.counters.spec_draft_tokens


@pytest.mark.parametrize("profile", ["realistic", "ideal"])
def test_steady_steps_feed_the_breakdown_as_single_steps_do(profile):
    # A small copy of the benchmark case on the engine model: most steps are steady (a prompt
    # beside the decodes), and their parts reach every request as the single steps' do.
    params = parse_lab_params(
        {
            "num_prompts": 120,
            "prompt_tokens": 1024,
            "output_tokens": 64,
            "max_num_seqs": 32,
            "sim_profile": profile,
        }
    )
    from labs.sim.lab import build_simulator

    sims, records = [], []
    for step_by_step in (False, True):
        sim = build_simulator(params)
        sim.step_by_step = step_by_step
        sims.append(sim)
        records.append(sim.run())
    fast, slow = records
    assert fast.meta["steady_steps"] > 0.25 * fast.meta["steps"]
    assert_same_record(fast, slow)
    assert_same_breakdown(sims[0], fast, sims[1], slow)
    for key in ("e2e_s", "tpot_s"):
        got, want = fast.meta["breakdown"][key], slow.meta["breakdown"][key]
        assert got["total"] == pytest.approx(want["total"], rel=1e-9)
        for name, value in want["parts"].items():
            assert got["parts"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    # Prompts share steps with decodes here, so the interference part is exercised.
    assert fast.meta["breakdown"]["e2e_s"]["parts"]["prefill_interference"] > 0
