"""Invariants on every step of random small runs (hypothesis): the token budget, max_num_seqs and
the KV pool are never exceeded, block reference counts match the block tables, no request is
scheduled before it arrives; at the end every request got exactly its output tokens and every
block is back in the pool."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.prediction.predict import blocks_for_tokens
from labs.sim.entities import RequestStatus
from labs.sim.simulator import StepInfo
from tests.budget import examples
from tests.labs.sim.helpers import LinearCost, make_sim, make_workload


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 10))
    prompts = draw(st.lists(st.integers(1, 48), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 24), min_size=n, max_size=n))
    extra = draw(st.lists(st.integers(0, 16), min_size=n, max_size=n))
    max_tokens = [o + e for o, e in zip(outputs, extra, strict=True)]
    arrivals_kind = draw(st.sampled_from(["at-once", "spread", "closed-loop"]))
    arrivals = None
    max_concurrency = None
    if arrivals_kind == "spread":
        arrivals = sorted(draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)))
    elif arrivals_kind == "closed-loop":
        max_concurrency = draw(st.integers(1, 4))
    contiguous = draw(st.booleans())
    chunked = draw(st.booleans())
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    longest = max(
        p + (m if contiguous else o) for p, o, m in zip(prompts, outputs, max_tokens, strict=True)
    )
    needed = blocks_for_tokens(longest, block_size)
    # NOTE: without chunked prefill the budget must hold the longest prompt, as vLLM requires.
    min_budget = 1 if chunked else max(prompts)
    config = {
        "max_num_seqs": draw(st.integers(1, 6)),
        "max_num_batched_tokens": draw(st.integers(min_budget, max(min_budget, 64))),
        # Tight pools often, so preemption is exercised.
        "num_gpu_blocks": draw(st.just(needed) | st.integers(needed, needed * 3)),
        "block_size": block_size,
        "chunked_prefill": chunked,
        "prefix_caching": draw(st.booleans()),
        "kv_allocation": "contiguous" if contiguous else "paged",
        "num_spec_tokens": draw(st.integers(0, 3)),
        "spec_acceptance": draw(st.sampled_from([0.0, 0.5, 0.9])),
    }
    workload = make_workload(
        prompts,
        outputs,
        arrivals,
        max_tokens=max_tokens,
        shared_prefix_tokens=draw(st.integers(0, min(prompts))),
        max_concurrency=max_concurrency,
    )
    return workload, config, draw(st.integers(0, 2**16))


def check_step(info: StepInfo) -> None:
    sched, out = info.scheduler, info.output
    cfg, t = sched.config, sched.table
    idx = out.req_indices
    assert out.total_num_scheduled_tokens == int(out.num_scheduled_tokens.sum())
    assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
    assert (out.num_scheduled_tokens > 0).all()
    assert len(set(idx.tolist())) == len(idx) <= cfg.max_num_seqs
    assert (t.arrival_s[idx] <= info.start_s).all()
    assert info.num_blocks_used <= cfg.num_gpu_blocks
    # Reference counts are exactly the number of block tables holding each block.
    held = Counter(b for table in sched.kv.block_tables for b in table)
    assert sched.pool.num_used_blocks == len(held)
    assert all(sched.pool.ref_cnt(b) == count for b, count in held.items())
    assert (t.num_computed_tokens <= t.num_prompt_tokens + t.num_output_tokens).all()
    assert (t.num_output_tokens <= t.num_output_tokens_target).all()
    running = sched.running
    assert (t.status[running] == RequestStatus.RUNNING).all()
    assert len(running) <= cfg.max_num_seqs


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_on_every_step(scenario):
    workload, config, seed = scenario
    steps: list[StepInfo] = []

    def observe(info: StepInfo) -> None:
        check_step(info)
        steps.append(info)

    sim = make_sim(workload, cost=LinearCost(0.01, 0.001), seed=seed, on_step=observe, **config)
    record = sim.run()

    assert steps, "at least one step ran"
    assert sim.scheduler.pool.num_used_blocks == 0
    assert not sim.scheduler.has_unfinished_requests()
    for req, target in zip(record.requests, workload.output_tokens.tolist(), strict=True):
        times = [t for t, _ in req.chunks]
        assert req.output_tokens == target
        assert times[0] > req.arrival_s
        assert all(a < b for a, b in zip(times, times[1:], strict=False))
        assert req.finish_s == times[-1]
    assert np.isclose(
        record.duration_s,
        max(r.finish_s for r in record.requests) - min(r.arrival_s for r in record.requests),
    )
    assert max(s.running for s in record.samples) <= config["max_num_seqs"]
    c = record.counters
    assert c.spec_accepted_tokens <= c.spec_draft_tokens
    assert c.prefix_cache_hits <= c.prefix_cache_queries
    if config["kv_allocation"] == "contiguous":
        assert c.preemptions == 0
