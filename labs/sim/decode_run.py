"""Runs of plain decode steps, advanced at once.

A run starts where the scheduling rules (labs/sim/rules.py) show that the next steps all give
every running request its decode and nothing else: every running request `is_decoding`, their
wants (one token plus k drafts each) fit the budget, so `budget_shares` gives each its whole
want, and nobody waiting can be admitted (`Rules.admission_open` is false, or nobody waits). It
lasts while, step after step, nobody `finishes` (the step that makes a request's last token
frees its blocks; with drafts, one with fewer than k + 1 tokens left drafts fewer: those steps
are taken singly), the step's new blocks fit what is free (`blocks_fit`: nobody is preempted)
and the next arrival is not yet due. In such a run the batch is fixed and only each sequence's
KV grows, so the steps are priced in one call (`steps_time_s`) and the token times written with
numpy; the blocks are taken in the order the single steps would take them (step by step, oldest
request first), so the pool ends up the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from labs.sim.cost_model import PartsCostModel
from labs.sim.engine_model import PARTS
from labs.sim.recording import ChunkStore, SampleRecorder
from labs.sim.rules import blocks_fit, decode_steps_to_finish, finishes, is_decoding
from labs.sim.scheduler import SchedulerOutput

if TYPE_CHECKING:
    from labs.sim.breakdown import BreakdownAccumulator
    from labs.sim.cost_model import CostModel
    from labs.sim.entities import RequestTable
    from labs.sim.scheduler import Scheduler

# Most steps x sequences advanced in one go (bounds the arrays a run needs).
MAX_CELLS = 1 << 20


class Simulator(Protocol):
    """What a decode run reads and advances of the simulator that takes it
    (labs.sim.simulator.Simulator)."""

    scheduler: Scheduler
    table: RequestTable
    cost_model: CostModel
    breakdown: BreakdownAccumulator
    num_steps: int
    num_skipped_steps: int


@dataclass
class _Batch:
    """The running requests of a decode run and what they hold before it."""

    run: np.ndarray  # request indices, in scheduling order
    computed: np.ndarray
    output: np.ndarray
    target: np.ndarray
    held: np.ndarray  # blocks
    k: int  # drafts each proposes per step
    want: int  # tokens the batch schedules per step: 1 + k each


@dataclass
class _Plan:
    """The steps of a decode run, cut to those that are plain."""

    num_steps: int
    accepted: np.ndarray | None  # (steps, m) drafts accepted, with speculation
    new_blocks: np.ndarray  # (steps, m) blocks each request takes at each step
    blocks_taken: np.ndarray  # (steps,) blocks the run has taken after each step
    parts: np.ndarray  # (steps, len(PARTS)) each step's time, in parts
    ends: np.ndarray  # (steps,) each step's end time


def advance_decode_run(
    sim: Simulator,
    now: float,
    next_arrival: float | None,
    recorder: SampleRecorder,
    chunks: ChunkStore,
) -> float:
    """Take a run of plain decode steps from `now`, at least two, if one starts here.

    NOTE: with speculation each step draws one acceptance per sequence from the run's
    generator, `rng.geometric(1 - alpha, size=m)`. Generator.geometric fills its output one
    value after another from the same stream, so drawing (steps, m) at once gives exactly the
    values of `steps` single draws of m. The run is cut where a draw makes something happen;
    the generator is then rewound and the kept steps redrawn, so the next single step draws
    what it would have drawn anyway.

    Returns:
        The time after the run (`now` if none was taken).
    """
    batch = _plain_decode_batch(sim.scheduler, sim.table)
    if batch is None:
        return now
    rng = sim.scheduler.rng
    state = rng.bit_generator.state if batch.k else None
    plan = _plan(sim, batch, now, next_arrival)
    if state is not None:
        rng.bit_generator.state = state  # as if nothing had been drawn
    if plan is None:
        return now
    _take_steps(sim, batch, plan, now, recorder, chunks)
    return float(plan.ends[-1])


def _plan(sim: Simulator, batch: _Batch, now: float, next_arrival: float | None) -> _Plan | None:
    """The run's steps from `now`: as many as stay plain (nobody finishes, drafts all k),
    whose blocks fit and that start before `next_arrival`; None if fewer than two."""
    sched, k, m = sim.scheduler, batch.k, len(batch.run)
    # With one token a step (no draft accepted), the step before anyone's last token, less k
    # so that everyone still has k + 1 tokens to make, bounds the run.
    num_steps = int(decode_steps_to_finish(batch.output, batch.target).min()) - k
    num_steps = min(num_steps, max(2, MAX_CELLS // m))
    if num_steps < 2:
        return None
    accepted = None
    if k:
        p_reject = 1.0 - sched.config.spec_acceptance
        accepted = np.minimum(sched.rng.geometric(p_reject, size=(num_steps, m)) - 1, k)
        made = np.cumsum(1 + accepted, axis=0)  # tokens after each step
        grown = np.vstack([np.zeros((1, m), dtype=np.int64), made])  # before each step
        # Step j is plain if even with all its drafts accepted nobody finishes at it (so
        # everyone drafts all k: draft_tokens stays k).
        plain = ~finishes(batch.output + grown[:num_steps] + 1 + k, batch.target).any(axis=1)
        num_steps = min(num_steps, int(np.argmin(plain)) if not plain.all() else num_steps)
    else:
        grown = np.arange(num_steps + 1)[:, None]
    if num_steps < 2:
        return None
    num_steps, new_blocks, blocks_taken = _blocks_per_step(sched, batch, grown, num_steps)
    if num_steps < 2:
        return None
    parts, ends = _price_steps(sim.cost_model, batch, grown, num_steps, now)
    if next_arrival is not None:
        # A step may start only before the next arrival is due.
        num_steps = min(num_steps, int(np.searchsorted(ends[:-1], next_arrival, side="left")))
    if num_steps < 2:
        return None
    return _Plan(
        num_steps,
        None if accepted is None else accepted[:num_steps],
        new_blocks[:num_steps],
        blocks_taken[:num_steps],
        parts[:num_steps],
        ends[1 : num_steps + 1],
    )


def _take_steps(
    sim: Simulator,
    batch: _Batch,
    plan: _Plan,
    now: float,
    recorder: SampleRecorder,
    chunks: ChunkStore,
) -> None:
    """Apply the planned steps: the drafts accepted (redrawn from the rewound generator), the
    breakdown, the blocks, the engine samples, the token times and the request counters."""
    sched, k, m, num_steps = sim.scheduler, batch.k, len(batch.run), plan.num_steps
    tokens = None
    if k:
        p_reject = 1.0 - sched.config.spec_acceptance
        again = np.minimum(sched.rng.geometric(p_reject, size=(num_steps, m)) - 1, k)
        assert plan.accepted is not None and np.array_equal(again, plan.accepted)
        tokens = 1 + again
        c = sched.counters
        c.spec_drafts += num_steps * m
        c.spec_draft_tokens += num_steps * m * k
        c.spec_accepted_tokens += int(again.sum())
    # Decode-only steps share no prefill time: each decoding request takes the whole step.
    sim.breakdown.add_steps(batch.run, plan.parts)
    total_new = int(plan.blocks_taken[-1])
    _take_blocks(sched, batch, plan.new_blocks, total_new)
    blocks_used = sched.pool.num_used_blocks - total_new
    recorder.add_many(
        np.concatenate([[now], plan.ends[:-1]]),
        m,
        sched.num_waiting,
        blocks_used + plan.blocks_taken,
        batch.want,
    )
    chunks.add_steps(plan.ends, batch.run, tokens)
    total = num_steps if tokens is None else tokens.sum(axis=0)
    sim.table.num_computed_tokens[batch.run] += total
    sim.table.num_output_tokens[batch.run] += total
    sim.num_steps += num_steps
    sim.num_skipped_steps += num_steps


def _plain_decode_batch(sched: Scheduler, t: RequestTable) -> _Batch | None:
    """The running requests, if the next step is a plain decode step by the rules: all decode,
    each gets its whole want of the budget, everyone drafts at every step (no draft share to
    draw), and nobody waiting can be admitted beside them. None otherwise."""
    rules, run = sched.rules, sched.running
    m, k = len(run), rules.num_spec_tokens
    if m == 0 or rules.draws_who_drafts:
        return None
    want = m * (1 + k)
    if want > rules.token_budget:  # budget_shares would leave someone short
        return None
    if sched.waiting and rules.admission_open(m, rules.token_budget - want):
        return None  # the waiting queue's head might be admitted
    computed = t.num_computed_tokens[run]
    output = t.num_output_tokens[run]
    if not is_decoding(t.num_prompt_tokens[run], output, computed).all():
        return None  # someone is still prefilling
    target = t.num_output_tokens_target[run]
    return _Batch(run, computed, output, target, t.num_blocks[run], k, want)


def _blocks_per_step(
    sched: Scheduler, batch: _Batch, grown: np.ndarray, num_steps: int
) -> tuple[int, np.ndarray, np.ndarray]:
    """The new blocks each request takes at each step, and the running total per step; the run
    is cut to the steps whose blocks fit what is free.

    Returns:
        The steps kept, the (steps, m) new blocks, and the cumulative blocks taken per step.
    """
    rules = sched.rules
    # Step j computes KV up to computed + grown[j] + 1 + k tokens.
    tokens_after = batch.computed + grown[:num_steps] + 1 + rules.num_spec_tokens
    # NOTE: that only grows step by step, so the blocks held after step j are the most of the
    # blocks held now and what step j needs (rejected drafts give back KV slots, not blocks).
    need = rules.blocks_to_grow(tokens_after, batch.held)
    held = np.vstack([batch.held, batch.held + np.maximum(need, 0)])
    new = np.diff(held, axis=0)  # (steps, m) new blocks per step and request
    used_per_step = np.cumsum(new.sum(axis=1))
    fits = blocks_fit(used_per_step, sched.pool.num_free_blocks)
    return min(num_steps, int(np.argmin(fits)) if not fits.all() else num_steps), new, used_per_step


def _price_steps(
    cost: CostModel, batch: _Batch, grown: np.ndarray, num_steps: int, now: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's parts (one call for the run) and the step end times from `now`.

    Returns:
        (steps, len(PARTS)) parts and the steps + 1 times: `now`, then each step's end.
    """
    m, k = len(batch.run), batch.k
    growth = grown[:num_steps].sum(axis=1) if k else m * grown[:num_steps, 0]
    kv = int(batch.computed.sum()) + growth
    out = SchedulerOutput(
        req_indices=batch.run,
        num_scheduled_tokens=np.full(m, 1 + k, dtype=np.int64),
        num_draft_tokens=np.full(m, k, dtype=np.int64),
        num_computed_before=batch.computed,
        num_decode_tokens=batch.want,
        kv_tokens_read=int(kv[0]),
        num_spec_seqs=m if k else 0,
        spec_kv_tokens_read=int(kv[0]) if k else 0,
        max_num_draft_tokens=k,
    )
    spec_kv = kv if k else np.zeros_like(kv)
    if isinstance(cost, PartsCostModel):
        parts = cost.steps_parts_s(out, kv, spec_kv)
        seconds = parts.sum(axis=1)  # each row summed as a single step's parts are
    else:
        seconds = cost.steps_time_s(out, kv, spec_kv)
        parts = np.zeros((len(seconds), len(PARTS)))
        parts[:, 0] = seconds  # as step_parts_s puts a plain model's step
    # NOTE: accumulated left to right from `now`, as the single steps add up, so every
    # timestamp is the same float.
    return parts, np.cumsum(np.concatenate([[now], seconds]))


def _take_blocks(sched: Scheduler, batch: _Batch, new: np.ndarray, total: int) -> None:
    """Hand out the run's new blocks as the single steps would: step by step, oldest request
    first, a request's new blocks together."""
    if not total:
        return
    m = len(batch.run)
    owners = np.repeat(np.tile(np.arange(m), len(new)), new.ravel())
    blocks = sched.pool.allocate(total)
    assert blocks is not None  # the run was cut to what fits
    sched.kv.place(batch.run[owners], blocks)
