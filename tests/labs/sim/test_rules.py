"""The scheduling rules (labs/sim/rules.py) on hand-sized cases, and their scalar and array forms
agreeing: the scheduler applies them to arrays, steady steps to one request at a time."""

from __future__ import annotations

import numpy as np

from labs.sim.rules import Rules, budget_share, budget_shares, is_decoding
from labs.sim.scheduler import SchedulerConfig


def rules(**settings: object) -> Rules:
    base: dict[str, object] = {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "num_gpu_blocks": 64,
    }
    return SchedulerConfig(**{**base, **settings}).rules()  # type: ignore[arg-type]


def test_the_budget_goes_oldest_first_and_the_array_form_is_the_scalar_one_in_turn():
    assert budget_shares(np.array([5, 1, 20, 3]), 16).tolist() == [5, 1, 10, 0]
    rng = np.random.default_rng(3)
    for _ in range(200):
        wants = rng.integers(1, 40, rng.integers(1, 12))
        budget = int(rng.integers(1, 200))
        left, one_by_one = budget, []
        for want in wants.tolist():
            one_by_one.append(budget_share(want, left))
            left -= one_by_one[-1]
        assert budget_shares(wants, budget).tolist() == one_by_one


def test_a_request_decodes_once_it_has_sampled_and_only_its_last_token_is_left():
    prompt, output, computed = [10, 10, 10, 10], [0, 1, 1, 3], [9, 10, 4, 12]
    assert is_decoding(np.array(prompt), np.array(output), np.array(computed)).tolist() == [
        False,  # the prompt's last token is not a decode
        True,
        False,  # preempted: its prompt and output are computed again
        True,
    ]
    assert [is_decoding(*args) for args in zip(prompt, output, computed, strict=True)] == [
        False,
        True,
        False,
        True,
    ]


def test_admission_needs_a_slot_and_budget_and_chunks_only_with_chunked_prefill():
    chunked, whole = rules(chunked_prefill=True), rules(chunked_prefill=False)
    assert chunked.admission_open(3, 1) and not chunked.admission_open(4, 16)
    assert not chunked.admission_open(0, 0)
    assert chunked.admission_chunk(40, 16, recompute=False) == 16
    assert whole.admission_chunk(40, 16, recompute=False) == 0  # waits, and everyone behind it
    assert whole.admission_chunk(40, 16, recompute=True) == 16  # a recompute is chunked anyway
    assert whole.admission_chunk(12, 16, recompute=False) == 12


def test_an_admission_needs_the_whole_prompts_blocks_or_its_reservation():
    paged, contiguous = rules(block_size=4), rules(block_size=4, kv_allocation="contiguous")
    # 37 tokens take 10 blocks; 2 hit in the cache, one of them sitting in the free queue.
    assert paged.admission_need(37, 2, 1, reservation=99) == 10 - 2 + 1
    assert contiguous.admission_need(37, 0, 0, reservation=25) == 25
    assert paged.blocks_to_grow(17, 4) == 1 and paged.blocks_to_grow(16, 4) == 0
    assert paged.blocks_to_grow(np.array([0, 1, 8, 9]), np.array([0, 0, 2, 2])).tolist() == [
        0,
        1,
        0,
        1,
    ]


def test_drafts_stop_at_the_last_token():
    spec = rules(num_spec_tokens=3, spec_acceptance=0.5)
    assert spec.draft_tokens(np.array([0, 5, 8]), np.array([10, 8, 10])).tolist() == [3, 2, 1]
    assert (
        not spec.draws_who_drafts
        and rules(num_spec_tokens=3, spec_draft_share=0.5).draws_who_drafts
    )
