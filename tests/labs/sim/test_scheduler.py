"""Golden scenarios: tiny pools and 2-3 requests, every step's schedule worked out by hand.

Each step costs 1 s (LinearCost), so a token sampled in step n appears at t = n.
"""

from __future__ import annotations

import numpy as np
import pytest

from labs.sim.scheduler import SchedulerConfig
from labs.sim.simulator import SimConfigError
from tests.labs.sim.helpers import make_sim, make_workload, record_steps


def chunks(record, i):
    return record.requests[i].chunks


def test_it_chunks_a_prompt_to_the_budget_then_fills_the_rest_with_the_next_prompt():
    # budget 8: A's 10-token prompt takes 8, then its last 2 ride with B's whole 5-token prompt.
    steps: list[dict[int, int]] = []
    sim = make_sim(
        make_workload([10, 5], [3, 2]), max_num_batched_tokens=8, on_step=record_steps(steps)
    )
    record = sim.run()
    assert steps == [{0: 8}, {0: 2, 1: 5}, {0: 1, 1: 1}, {0: 1}]
    assert chunks(record, 0) == [(2.0, 1), (3.0, 1), (4.0, 1)]
    assert chunks(record, 1) == [(2.0, 1), (3.0, 1)]
    assert [r.finish_s for r in record.requests] == [4.0, 3.0]
    assert record.duration_s == 4.0


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits_for_the_next_step():
    steps: list[dict[int, int]] = []
    sim = make_sim(
        make_workload([6, 6], [2, 1]),
        max_num_batched_tokens=8,
        chunked_prefill=False,
        on_step=record_steps(steps),
    )
    sim.run()
    assert steps == [{0: 6}, {0: 1, 1: 6}]

    steps_chunked: list[dict[int, int]] = []
    make_sim(
        make_workload([6, 6], [2, 1]), max_num_batched_tokens=8, on_step=record_steps(steps_chunked)
    ).run()
    assert steps_chunked == [{0: 6, 1: 2}, {0: 1, 1: 4}]


def test_max_num_seqs_caps_the_running_set():
    steps: list[dict[int, int]] = []
    make_sim(make_workload([2, 2, 2], [2, 2, 2]), max_num_seqs=2, on_step=record_steps(steps)).run()
    # The third request is admitted only after one of the first two finishes (end of step 2).
    assert steps == [{0: 2, 1: 2}, {0: 1, 1: 1}, {2: 2}, {2: 1}]


def test_the_newest_running_request_is_preempted_and_recomputed_later():
    # 4 blocks of 4 tokens. A and B (prompt 4, 6 output tokens) each hold 2 blocks after step 2;
    # in step 6 both need a third: A (older) takes B's, B is preempted, A finishes, and in step
    # 7 B recomputes its 4 prompt + 5 output tokens in one go and samples its last token.
    steps: list[dict[int, int]] = []
    sim = make_sim(make_workload([4, 4], [6, 6]), num_gpu_blocks=4, on_step=record_steps(steps))
    record = sim.run()
    assert steps == [{0: 4, 1: 4}, *[{0: 1, 1: 1}] * 4, {0: 1}, {1: 9}]
    assert [r.preemptions for r in record.requests] == [0, 1]
    assert record.counters.preemptions == 1
    assert chunks(record, 1) == [(1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1), (5.0, 1), (7.0, 1)]
    assert sim.scheduler.pool.num_used_blocks == 0


def test_a_recompute_finds_its_own_blocks_not_yet_evicted_in_the_prefix_cache():
    # As above, with prefix caching. B held blocks [b0, b1] (2 full blocks, 8 computed tokens);
    # freed tail first, b1 is evicted first, to A. B's recompute hits b0 (4 tokens) only.
    steps: list[dict[int, int]] = []
    sim = make_sim(
        make_workload([4, 4], [6, 6]),
        num_gpu_blocks=4,
        prefix_caching=True,
        on_step=record_steps(steps),
    )
    record = sim.run()
    assert steps[-1] == {1: 9 - 4}
    c = record.counters
    # Queries: A 4 + B 4 at first admission, B 9 at readmission; hits: B's 4.
    assert (c.prefix_cache_queries, c.prefix_cache_hits) == (17, 4)
    assert record.requests[1].cached_prompt_tokens == 0  # the first admission's hit


def test_a_shared_prefix_is_computed_once_and_then_hit():
    # Prefix 8 tokens = 2 blocks. B arrives after A has computed them (A's prompt in step 1).
    steps: list[dict[int, int]] = []
    sim = make_sim(
        make_workload([10, 10], [3, 3], [0.0, 1.0], shared_prefix_tokens=8),
        prefix_caching=True,
        on_step=record_steps(steps),
    )
    record = sim.run()
    assert steps[:2] == [{0: 10}, {0: 1, 1: 2}]
    assert [r.cached_prompt_tokens for r in record.requests] == [0, 8]


def test_prompts_arriving_together_share_the_prefix_the_first_one_is_computing():
    # vLLM V1 registers a request's full blocks when it schedules them (allocate_slots), so B,
    # admitted in the same step as A, already hits the 2 prefix blocks A computes in it: whether
    # prompts arrive together or apart (a front end spacing them) does not change who computes
    # the prefix.
    for arrivals in ([0.0, 0.0], [0.0, 1.0]):
        steps: list[dict[int, int]] = []
        sim = make_sim(
            make_workload([10, 10], [3, 3], arrivals, shared_prefix_tokens=8),
            prefix_caching=True,
            max_num_batched_tokens=32,
            on_step=record_steps(steps),
        )
        record = sim.run()
        assert [r.cached_prompt_tokens for r in record.requests] == [0, 8], arrivals
        assert record.counters.prefix_cache_hits == 8
    assert steps[0] == {0: 10}


def test_prefix_hits_leave_at_least_the_last_prompt_token_to_compute():
    # The prompt is exactly the 8-token shared prefix: only 1 block (not 2) may be hit.
    steps: list[dict[int, int]] = []
    sim = make_sim(
        make_workload([8, 8], [1, 1], [0.0, 5.0], shared_prefix_tokens=8),
        prefix_caching=True,
        on_step=record_steps(steps),
    )
    record = sim.run()
    assert steps == [{0: 8}, {1: 4}]
    assert record.requests[1].cached_prompt_tokens == 4


def test_contiguous_allocation_reserves_prompt_plus_max_tokens_at_admission():
    # Reservation = 4 + 12 = 16 tokens = 4 blocks; a 10-block pool holds two at a time, though
    # each request only ever uses 4 + 2 tokens. Paged, all three run at once.
    work = make_workload([4, 4, 4], [2, 2, 2], max_tokens=[12, 12, 12])
    steps: list[dict[int, int]] = []
    make_sim(work, num_gpu_blocks=10, kv_allocation="contiguous", on_step=record_steps(steps)).run()
    assert steps == [{0: 4, 1: 4}, {0: 1, 1: 1}, {2: 4}, {2: 1}]

    paged: list[dict[int, int]] = []
    make_sim(work, num_gpu_blocks=10, on_step=record_steps(paged)).run()
    assert paged == [{0: 4, 1: 4, 2: 4}, {0: 1, 1: 1, 2: 1}]


def test_drafts_count_against_the_budget_and_stop_at_the_last_token():
    # k = 2, alpha = 0: every draft is rejected, so each step yields 1 token. Drafts shrink to
    # fit the output left (4 tokens): 2, then 1, then 0.
    steps: list[dict[int, int]] = []
    sim = make_sim(
        make_workload([4, 4], [4, 4]),
        num_spec_tokens=2,
        spec_acceptance=0.0,
        on_step=record_steps(steps),
    )
    record = sim.run()
    assert steps == [{0: 4, 1: 4}, {0: 3, 1: 3}, {0: 2, 1: 2}, {0: 1, 1: 1}]
    c = record.counters
    assert (c.spec_drafts, c.spec_draft_tokens, c.spec_accepted_tokens) == (4, 6, 0)
    assert all(n == 1 for r in record.requests for _, n in r.chunks)

    # A budget of 4 leaves B one token (no drafts) in step 2.
    tight: list[dict[int, int]] = []
    make_sim(
        make_workload([2, 2], [4, 4]),
        max_num_batched_tokens=4,
        num_spec_tokens=2,
        spec_acceptance=0.0,
        on_step=record_steps(tight),
    ).run()
    assert tight[:2] == [{0: 2, 1: 2}, {0: 3, 1: 1}]


def test_accepted_drafts_arrive_as_one_chunk():
    # alpha close to 1: all k = 3 drafts accepted (chance 0.999999^3) plus the bonus token.
    sim = make_sim(make_workload([4], [9]), num_spec_tokens=3, spec_acceptance=0.999999)
    record = sim.run()
    assert chunks(record, 0) == [(1.0, 1), (2.0, 4), (3.0, 4)]


def test_below_a_draft_share_of_1_a_sequence_drafts_at_that_share_of_its_steps():
    # Like vLLM's ngram proposer, which drafts only where the context repeats: at share 0.3,
    # about 3 in 10 sequence-steps verify k drafts, the rest one token. Every step of a
    # sequence is a decode here (1-token prompts aside), so the share reads off the counters.
    workload = make_workload([1] * 8, [400] * 8)
    config = {"num_spec_tokens": 3, "spec_acceptance": 0.5, "num_gpu_blocks": 1000,
              "max_num_batched_tokens": 64}  # fmt: skip
    steps: list[dict[int, int]] = []
    record = make_sim(workload, spec_draft_share=0.3, on_step=record_steps(steps), **config).run()
    c = record.counters
    seq_steps = sum(len(s) for s in steps) - 8  # less each request's prefill step
    assert c.spec_drafts / seq_steps == pytest.approx(0.3, abs=0.03)
    # A drafting sequence drafts all k but near its last token; the others verify nothing.
    assert 2.9 < c.spec_draft_tokens / c.spec_drafts <= 3
    assert sum(n == 1 for s in steps[1:] for n in s.values()) > 0.6 * seq_steps
    # At share 1 every decode step drafts, and the run draws what it drew before the share.
    every = make_sim(workload, **config).run()
    again = make_sim(workload, spec_draft_share=1.0, **config).run()
    assert [r.chunks for r in every.requests] == [r.chunks for r in again.requests]
    assert every.counters.spec_drafts > 2 * c.spec_drafts
    with pytest.raises(ValueError, match="spec_draft_share must be in"):
        SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, num_gpu_blocks=4,
                        spec_draft_share=0.0)  # fmt: skip


def test_requests_issue_at_their_arrival_and_the_engine_idles_between():
    # B arrives at 10 s, long after A (2 steps) finished: the clock jumps, TTFT is one step.
    record = make_sim(make_workload([4, 4], [2, 2], [0.0, 10.0])).run()
    assert chunks(record, 1) == [(11.0, 1), (12.0, 1)]
    assert record.requests[1].arrival_s == 10.0


def test_a_closed_loop_issues_the_next_request_when_one_finishes():
    record = make_sim(make_workload([4, 4, 4], [2, 2, 2], max_concurrency=1)).run()
    assert [r.arrival_s for r in record.requests] == [0.0, 2.0, 4.0]
    assert [r.finish_s for r in record.requests] == [2.0, 4.0, 6.0]


def test_a_request_bigger_than_the_pool_is_refused_naming_the_capacity():
    with pytest.raises(SimConfigError, match="kv_capacity_tokens") as error:
        make_sim(make_workload([30], [10]), num_gpu_blocks=8)
    assert error.value.field == "kv_capacity_tokens"
    with pytest.raises(SimConfigError, match="prompt \\+ max_tokens"):
        make_sim(
            make_workload([4], [2], max_tokens=[64]), num_gpu_blocks=8, kv_allocation="contiguous"
        )


@pytest.mark.parametrize(
    "bad",
    [{"max_num_seqs": 0}, {"kv_allocation": "ring"}, {"spec_acceptance": 1.0}],
)
def test_bad_scheduler_settings_are_refused(bad):
    settings = {"max_num_seqs": 4, "max_num_batched_tokens": 16, "num_gpu_blocks": 4, **bad}
    with pytest.raises(ValueError):
        SchedulerConfig(**settings)


def test_step_times_come_from_the_cost_model():
    # 1 ms per step + 1 ms per token: step 1 = 1 + 10 ms, step 2 = 1 + 1 ms.
    from tests.labs.sim.helpers import LinearCost

    record = make_sim(make_workload([10], [2]), cost=LinearCost(0.001, 0.001)).run()
    times = [t for t, _ in chunks(record, 0)]
    assert np.allclose(times, [0.011, 0.013])
