"""The scheduling rules, stated once: every decision a step makes about a request.

What a running request asks of the step's token budget and what it gets, the blocks that takes,
whether the step preempts, whether it admits from the waiting queue and how much of a prompt,
when a request samples a token and when it finishes. Three ways of taking steps apply them:

- the scheduler (scheduler.py), one step at a time, over arrays of the running requests;
- runs of plain decode steps (decode_run.py), over a grid of steps x requests at once;
- steady steps (steady.py), with the decoding requests kept as sums.

The two fast ways take a step only where these same functions show its outcome is the one the
scheduler would reach: a run of decode steps is one in which `is_decoding` holds for every
running request, `budget_shares` gives each its whole want, `admission_open` is false (or
nobody waits), `blocks_fit` at every step and nobody `finishes` before the last; a steady
step is one in which the decoders come first in the running order and fit the budget and
`blocks_fit` holds (so nobody is preempted), with admissions decided here as the scheduler
decides them. So a rule changed here changes all three at once; a rule written into one of them
only shows as a difference between the fast path and `Simulator(step_by_step=True)`, which
tests/labs/sim/test_equivalence.py looks for on random lab forms.

The functions take Python ints (steady steps, one request at a time) or numpy arrays (the
scheduler and decode runs, element-wise) alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, overload

import numpy as np

from labs.prediction.predict import blocks_for_tokens

Tokens = TypeVar("Tokens", int, np.ndarray)

# Like vLLM, nothing new is admitted in a step that had to preempt.
ADMITS_AFTER_PREEMPTION = False


@overload
def is_decoding(prompt: int, output: int, computed: int) -> bool: ...


@overload
def is_decoding(prompt: np.ndarray, output: np.ndarray, computed: np.ndarray) -> np.ndarray: ...


def is_decoding(
    prompt: int | np.ndarray, output: int | np.ndarray, computed: int | np.ndarray
) -> bool | np.ndarray:
    """Whether a running request decodes: it has sampled a token and every known token but the
    last is computed (so it wants one token, plus drafts). Otherwise it prefills: its prompt in
    chunks, or its prompt and output again after a preemption."""
    return (prompt + output - computed == 1) & (output > 0)


@overload
def samples(computed_after: int, known_tokens: int) -> bool: ...


@overload
def samples(computed_after: np.ndarray, known_tokens: np.ndarray) -> np.ndarray: ...


def samples(computed_after: int | np.ndarray, known_tokens: int | np.ndarray) -> bool | np.ndarray:
    """Whether a step samples a request's next token: once all its known tokens (prompt +
    output so far) are computed; a prefill chunk that stops short samples nothing."""
    return computed_after >= known_tokens


@overload
def finishes(output: int, target: int) -> bool: ...


@overload
def finishes(output: np.ndarray, target: np.ndarray) -> np.ndarray: ...


def finishes(output: int | np.ndarray, target: int | np.ndarray) -> bool | np.ndarray:
    """Whether a request that sampled is done: its output reached its target."""
    return output >= target


def decode_steps_to_finish(output: Tokens, target: Tokens) -> Tokens:
    """The step (0 = the next one) whose token finishes a request decoding one token a step
    (`finishes` on output + step + 1)."""
    return target - output - 1


def budget_shares(wants: np.ndarray, budget: int) -> np.ndarray:
    """The step's token budget handed to running requests oldest first: each gets its want or
    what is left (`budget_share` in turn), and once the budget is spent the rest sit the step
    out. Each wants at least one token, so those that get any are a prefix."""
    before = np.cumsum(wants) - wants
    return np.clip(budget - before, 0, wants)


def budget_share(want: int, budget_left: int) -> int:
    """One running request's tokens this step, given what earlier ones left of the budget."""
    return max(0, min(want, budget_left))


@overload
def blocks_fit(needed: int, free_blocks: int) -> bool: ...


@overload
def blocks_fit(needed: np.ndarray, free_blocks: int) -> np.ndarray: ...


def blocks_fit(needed: int | np.ndarray, free_blocks: int) -> bool | np.ndarray:
    """Whether the blocks needed are free. If a step's running requests need more, the
    scheduler preempts (Scheduler._allocate_running) and the fast ways stop before the step;
    if an admission needs more, the request waits, and everyone behind it."""
    return needed <= free_blocks


@dataclass(frozen=True, slots=True)
class Rules:
    """The rules that read the engine's settings (SchedulerConfig.rules() builds them)."""

    block_size: int
    token_budget: int  # max_num_batched_tokens
    max_num_seqs: int
    chunked_prefill: bool
    paged: bool
    num_spec_tokens: int
    spec_draft_share: float

    # -- running requests -------------------------------------------------------------------------

    def blocks_for(self, tokens: Tokens) -> Tokens:
        """Blocks `tokens` KV slots take."""
        return blocks_for_tokens(tokens, self.block_size)

    def blocks_to_grow(self, tokens_after: Tokens, held: Tokens) -> Tokens:
        """New blocks a request holding `held` takes to hold `tokens_after` computed tokens
        (zero or less when it has them: a contiguous reservation always does)."""
        return blocks_for_tokens(tokens_after, self.block_size) - held

    def draft_tokens(self, output: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Drafts a decoding request proposes: k, but never past its last token."""
        return np.minimum(self.num_spec_tokens, target - output - 1)

    @property
    def draws_who_drafts(self) -> bool:
        """Whether each step draws which decoding requests propose drafts (a calibrated draft
        share below 1); else every decoding request drafts at every step."""
        return self.num_spec_tokens > 0 and self.spec_draft_share < 1

    # -- waiting requests -------------------------------------------------------------------------

    def admission_open(self, num_running: int, budget_left: int) -> bool:
        """Whether the step may admit the head of the waiting queue: budget is left and the
        batch has a free sequence slot."""
        return budget_left > 0 and num_running < self.max_num_seqs

    def admission_chunk(self, num_new: int, budget_left: int, recompute: bool) -> int:
        """Tokens the step computes of an admitted request with `num_new` tokens to compute
        (beyond its prefix-cache hits); 0: it waits, and FCFS keeps everyone behind it waiting.

        Without chunked prefill a prompt runs whole or waits; a preempted request's recompute
        (prompt + output) can outgrow the budget, so it is chunked either way."""
        if num_new <= budget_left:
            return num_new
        if not self.chunked_prefill and not recompute:
            return 0
        return budget_left

    def admission_need(
        self, num_tokens: int, num_hit: int, num_evictable_hits: int, reservation: int
    ) -> int:
        """Free blocks an admission needs. Paged: the whole prompt's (all its tokens', when it
        is recomputed) beyond its prefix-cache hits, as vLLM's scheduler_reserve_full_isl
        asks, so a chunked prefill does not start only to be preempted halfway; hit blocks
        sitting in the free queue stop being free. Contiguous: its `reservation`
        (prompt + max_tokens)."""
        if not self.paged:
            return reservation
        return blocks_for_tokens(num_tokens, self.block_size) - num_hit + num_evictable_hits
