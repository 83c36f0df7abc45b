"""The event loop's reporting (progress, engine samples) and the workload generator."""

from __future__ import annotations

import numpy as np
import pytest

from labs.parameters.params import parse_lab_params
from labs.sim.breakdown import BREAKDOWN_PARTS
from labs.sim.scheduler import SchedulerConfig
from labs.sim.simulator import Simulator
from labs.sim.workload import WorkloadSpec, generate_workload, lab_workload
from tests.labs.sim.helpers import LinearCost, make_sim, make_workload


def test_progress_rises_to_one():
    fractions: list[float] = []
    work = make_workload([4] * 6, [1, 2, 3, 4, 5, 6])
    sim = Simulator(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=64),
        work,
        LinearCost(),
        np.random.default_rng(0),
        on_progress=fractions.append,
        progress_interval_s=0.0,
    )
    sim.run()
    # One request finishes per step; the last call is the final 1.0.
    assert fractions == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0, 1.0])


def test_thinned_samples_keep_the_peaks():
    # 40 requests arriving one per 2 s, each 8 steps long: running rises and falls many times.
    work = make_workload([4] * 40, list(range(1, 41)), [2.0 * i for i in range(40)])
    full = make_sim(work).run()
    sim = make_sim(work)
    sim.max_samples = 16
    thin = sim.run()
    assert len(full.samples) == sim.num_steps > 16 >= len(thin.samples)
    assert max(s.running for s in thin.samples) == max(s.running for s in full.samples)
    assert max(s.kv_usage for s in thin.samples) == max(s.kv_usage for s in full.samples)
    times = [s.t_s for s in thin.samples]
    assert times == sorted(times)


def test_lengths_fall_in_the_range_and_arrivals_are_poisson():
    spec = WorkloadSpec(
        num_prompts=4000,
        prompt_tokens=1000,
        output_tokens=100,
        input_range_ratio=0.5,
        output_range_ratio=0.2,
        request_rate=10.0,
    )
    work = generate_workload(spec, np.random.default_rng(0))
    assert (work.prompt_tokens.min(), work.prompt_tokens.max()) == (500, 1500)
    assert (work.output_tokens.min(), work.output_tokens.max()) == (80, 120)
    assert work.prompt_tokens.mean() == pytest.approx(1000, rel=0.02)
    gaps = np.diff(work.intended_arrival_s)
    assert work.intended_arrival_s[0] == 0.0
    # Exponential gaps: mean = standard deviation = 1 / rate.
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() == pytest.approx(0.1, rel=0.05)
    assert (work.max_tokens == work.output_tokens).all()


def test_without_a_rate_everything_arrives_at_once_with_fixed_lengths():
    work = generate_workload(
        WorkloadSpec(num_prompts=5, prompt_tokens=64, output_tokens=8, max_tokens=32),
        np.random.default_rng(1),
    )
    assert work.intended_arrival_s.tolist() == [0.0] * 5
    assert work.prompt_tokens.tolist() == [64] * 5
    assert work.max_tokens.tolist() == [32] * 5


def test_a_shared_prefix_longer_than_a_prompt_is_refused():
    with pytest.raises(ValueError, match="shared_prefix_tokens"):
        generate_workload(
            WorkloadSpec(num_prompts=3, prompt_tokens=10, output_tokens=1, shared_prefix_tokens=11),
            np.random.default_rng(0),
        )


def test_a_lab_workload_depends_only_on_its_seed():
    params = {"num_prompts": 50, "prompt_tokens": 300, "input_range_ratio": 0.5, "request_rate": 4}
    first = lab_workload(parse_lab_params({**params, "seed": 3}).workload)
    again = lab_workload(parse_lab_params({**params, "seed": 3, "spec_tokens": 2}).workload)
    other = lab_workload(parse_lab_params({**params, "seed": 4}).workload)
    assert first.prompt_tokens.tolist() == again.prompt_tokens.tolist()
    assert first.intended_arrival_s.tolist() == again.intended_arrival_s.tolist()
    assert first.prompt_tokens.tolist() != other.prompt_tokens.tolist()


def _ttfts(record) -> list[float]:
    return [r.first_token_s - r.arrival_s for r in record.requests]


def _closed_loop(
    max_num_seqs: int, frontend_latency_s: float, max_concurrency: int = 3, **frontend: float
):
    # Three requests, 1 s a step: a prefill step gives the first token, two decode steps the
    # rest (3 s a request in the engine); the client keeps all three in flight (by default).
    work = make_workload([4] * 3, [3] * 3, max_concurrency=max_concurrency)
    sim = Simulator(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=16, num_gpu_blocks=64),
        work,
        LinearCost(),
        np.random.default_rng(0),
        frontend_latency_s=frontend_latency_s,
        **frontend,
    )
    return sim, sim.run()


def test_a_lone_client_waits_out_the_front_ends_latency_at_every_request():
    work = make_workload([4] * 3, [3] * 3, max_concurrency=1)
    runs = {
        latency: Simulator(
            SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, num_gpu_blocks=64),
            work,
            LinearCost(),
            np.random.default_rng(0),
            frontend_latency_s=latency,
        ).run()
        for latency in (0.0, 0.5)
    }
    assert _ttfts(runs[0.0]) == [1.0] * 3
    assert _ttfts(runs[0.5]) == [1.5] * 3
    assert [r.finish_s - r.arrival_s for r in runs[0.5].requests] == [3.5] * 3
    # The engine idles through each request's latency: 3 x 3.5 s.
    assert (runs[0.0].duration_s, runs[0.5].duration_s) == (9.0, 10.5)


def test_the_front_ends_time_grows_with_the_requests_already_in_the_engine():
    # Three requests sent at once, 1 s a step, room for all three: the front end takes 0.5 s
    # for a request alone and 0.25 s more for each request handed to the engine before it and
    # not finished, so the engine sees them at 0.5, 0.75 and 1.0 s.
    sim, record = _closed_loop(3, 0.5, frontend_per_stream_s=0.25)
    # The first is prefilled alone (0.5-1.5 s); the other two arrived while it ran and are
    # prefilled together in the next step (1.5-2.5 s), two decode steps after each first token.
    assert _ttfts(record) == [1.5, 2.5, 2.5]
    assert [r.finish_s for r in record.requests] == [3.5, 4.5, 4.5]
    ttft = sim.breakdown.summary(record.requests, "simulated")["ttft_s"]["parts"]
    assert ttft["frontend"] == pytest.approx((0.5 + 0.75 + 1.0) / 3)
    assert ttft["queueing"] == pytest.approx((0 + (1.5 - 0.75) + (1.5 - 1.0)) / 3)
    # A flat front end hands all three over at 0.5 s and prefills them in one step.
    (_, flat) = _closed_loop(3, 0.5)
    assert _ttfts(flat) == [1.5] * 3
    assert flat.duration_s == 3.5


def test_a_busy_engine_loses_the_front_ends_cpu_time_and_an_idle_one_does_not():
    # One sequence at a time, 1 s a step, 3 s a request, all three sent at 0 to a front end
    # that takes 0.5 s alone and 0.25 s more per request in the engine: the first reaches an
    # idle engine at 0.5 s; the second and third reach it at 0.75 and 1.0 s, while it
    # prefills the first (0.5-1.5 s), and each takes 0.25 s of CPU from its next step.
    def run(max_concurrency: int, frontend_cpu_s: float):
        return _closed_loop(
            1, 0.5, max_concurrency, frontend_per_stream_s=0.25, frontend_cpu_s=frontend_cpu_s
        )

    plain_sim, plain = run(3, 0.0)
    sim, busy = run(3, 0.25)
    assert [r.finish_s for r in plain.requests] == [3.5, 6.5, 9.5]
    # The engine's next step after they are handed to it (the first one's first decode, 1.5-3.0
    # s; they wait for room) pays for both.
    assert [r.finish_s for r in busy.requests] == pytest.approx([4.0, 7.0, 10.0])
    e2e = (
        sim.breakdown.per_request(busy.requests)[0]
        - plain_sim.breakdown.per_request(plain.requests)[0]
    )
    col = {name: i for i, name in enumerate(BREAKDOWN_PARTS)}
    # The first one's overhead (its step), the others' queueing (they wait for it).
    expected = np.zeros_like(e2e)
    expected[0, col["overhead"]] = 0.5
    expected[1:, col["queueing"]] = 0.5
    np.testing.assert_allclose(e2e, expected, atol=1e-9)
    # One client: every request reaches an idle engine, whose steps lose nothing.
    assert run(1, 0.25)[1].duration_s == run(1, 0.0)[1].duration_s == 3 * 3.5


def test_a_busy_engine_does_not_wait_for_the_front_end():
    # One sequence at a time: the second and third requests reach the engine while it is busy
    # with the first, so only the first one's latency adds to the run.
    (_, plain), (sim, late) = _closed_loop(1, 0.0), _closed_loop(1, 0.5)
    assert (plain.duration_s, late.duration_s) == (9.0, 9.5)
    assert _ttfts(plain) == [1.0, 4.0, 7.0]
    assert _ttfts(late) == [1.5, 4.5, 7.5]
    # The latency is the front end's overhead in each TTFT, not queueing for the engine.
    ttft = sim.breakdown.summary(late.requests, "simulated")["ttft_s"]["parts"]
    assert ttft["queueing"] == pytest.approx((0 + 3 + 6) / 3)
    assert ttft["frontend"] == pytest.approx(0.5)
