"""Steady steps, taken with a few Python scalars instead of arrays over the whole batch.

Most steps of a busy run look alike: a few hundred sequences decode one token each, a prompt or
two is prefilled beside them, a request finishes and the next one is admitted. The scheduler
(scheduler.py) redoes its numpy work over the whole batch for each such step. Here the decoding
sequences are a sum instead (`_Decoders`): each reads one more KV token per step, needs a new
block every block_size steps (counted per phase, `by_phase`), and finishes at a step known when
it starts decoding. A step then costs a few operations per request that changes (the prefilling
ones, admissions, finishes), not per request in the batch; token times are written per request
as one slice of step end times when it stops decoding. The engine model prices each
step from its totals in plain floats (`EngineModel.composition_parts_s`, the same floats as a
single step).

The time breakdown (labs/sim/breakdown.py) is fed as single steps feed it: each step's parts and
prefill share are logged, a decoder gets the difference of their running sums between its first
and last decoding step (so O(changes) work per step, not O(batch)), and the few requests that are
prefilling get their own steps' parts at write-back. The per-request breakdown matches
step-by-step mode within 1e-9 relative (the sums are added in another order).

Each step is scheduled by the scheduler's own rules (labs/sim/rules.py): the budget share of
each prefill, the admission gate, chunk and block need of each newcomer, when a prefill samples
and when a request finishes. It holds while (checked on entry, and left before a step that
would break it):

- no speculation (a fixed token per decode) and paged KV;
- no block carries a prefix-cache key (caching off, or no shared prefix and nothing cached yet),
  so which block a request gets cannot change anything: blocks are only counted here, and the
  ids are handed out when the run of steady steps ends;
- every decoding request is ahead of every prefilling one and fits the token budget, and no
  step needs more blocks than are free (so nobody is preempted).

Anything else (speculation, a shared prefix, preemption, a budget smaller than the batch) goes
through the scheduler one step at a time. `Simulator(step_by_step=True)` never comes here, and
tests/labs/sim/test_equivalence.py and test_fast_path.py check both give the same record.

Why one module: the steady steps are one derivation from the scheduler's rules (labs/sim/rules.py)
kept beside each other so a reader checks them against the rules in one place; the equivalence test
covers them as a whole.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeGuard

import numpy as np

from labs.sim.engine_model import OVERHEAD, PARTS, parts_total
from labs.sim.entities import RequestStatus
from labs.sim.recording import ChunkStore, SampleRecorder
from labs.sim.rules import (
    blocks_fit,
    budget_share,
    decode_steps_to_finish,
    finishes,
    is_decoding,
    samples,
)

if TYPE_CHECKING:
    from labs.sim.breakdown import BreakdownAccumulator
    from labs.sim.cost_model import CompositionCostModel, CostModel
    from labs.sim.entities import RequestTable
    from labs.sim.rules import Rules
    from labs.sim.scheduler import Scheduler
    from labs.sim.workload import GeneratedWorkload


class Simulator(Protocol):
    """What steady steps read and advance of the simulator that takes them
    (labs.sim.simulator.Simulator): its scheduler (and the rules it applies), requests and
    workload, its cost model and breakdown, its progress callback and its step count."""

    scheduler: Scheduler
    table: RequestTable
    workload: GeneratedWorkload
    cost_model: CostModel
    breakdown: BreakdownAccumulator
    on_progress: Callable[[float], None] | None
    progress_interval_s: float
    num_steps: int


# A decode-only stretch at least this long is left to labs/sim/decode_run.py.
_SKIP_AT_LEAST = 8
# Steady steps taken before writing them back, so the logs and temporaries stay small.
_MAX_STEPS = 4096
_RUNNING = int(RequestStatus.RUNNING)
# How a non-decoding request scheduled in a steady step is charged (+1: after its first token).
_OWN, _RECOMPUTE, _DECODING = 0, 2, 4
_FINISHED = int(RequestStatus.FINISHED)


@dataclass
class LoopState:
    """The event loop's clock and cursors, shared by the ways of taking steps."""

    now: float
    next_req: int
    num_finished: int
    slots: list[float] | None  # closed loop: when each free client slot became free
    last_progress: float
    # The time between a client sending a request and the engine seeing it (the API server's
    # handling, both ways, counted on the way in): a request's TTFT carries it, a busy engine
    # does not wait for it. 0 in every published calibration (their step overheads hold it).
    frontend_latency_s: float = 0.0
    # What each other request in the engine adds to that time: one API server process relays
    # every stream, so a request beside 7 others waits on it longer than one alone.
    frontend_per_stream_s: float = 0.0
    # Each request's front-end time, written as it reaches the engine (the breakdown's).
    frontend_s: np.ndarray | None = None
    # The front end's CPU time per request that a busy engine loses (`Simulator`'s
    # frontend_cpu_s), and what the requests handed to it since its last step have cost it.
    frontend_cpu_s: float = 0.0
    contention_due_s: float = 0.0

    def frontend_time_s(self) -> float:
        """The front end's time for the next request: `frontend_latency_s`, plus
        `frontend_per_stream_s` for each request handed to the engine and not finished."""
        others = self.next_req - self.num_finished
        return self.frontend_latency_s + self.frontend_per_stream_s * others

    def next_arrival_s(self, intended: Sequence[float] | np.ndarray) -> float | None:
        """When the next request reaches the engine: its client sends it at its intended time
        or when a client slot frees, whichever is later, and the engine sees it
        `frontend_time_s` on. None while all are sent or every slot is busy."""
        if self.next_req >= len(intended) or self.slots == []:
            return None
        sent = float(intended[self.next_req])
        if self.slots:
            sent = max(sent, self.slots[0])
        return sent + self.frontend_time_s()

    def admit_arrivals(self, sched: Scheduler, intended: Sequence[float] | np.ndarray) -> None:
        """Hand the scheduler every request that has reached the engine by `now`, each with
        the time its client sent it (so its TTFT includes the front end's latency). One handed
        to an engine that holds others owes that engine the front end's CPU time: the API server
        and the client handled it, while the engine stepped the others, on the core the engine's
        scheduler shares (`contention_due_s`; counted from the loop, not from the scheduler,
        whose queues steady steps update late). One reaching an idle engine costs it nothing."""
        while (due := self.next_arrival_s(intended)) is not None and due <= self.now:
            if self.frontend_s is not None:
                self.frontend_s[self.next_req] = self.frontend_time_s()
            if self.frontend_cpu_s and self.next_req > self.num_finished:
                self.contention_due_s += self.frontend_cpu_s
            slot_s = heapq.heappop(self.slots) if self.slots is not None else 0.0
            sched.add_request(self.next_req, max(float(intended[self.next_req]), slot_s))
            self.next_req += 1

    def take_contention_s(self) -> float:
        """What the requests handed to a busy engine since its last step cost it
        (`admit_arrivals`): its next step, which admits them where there is room, is this much
        longer (the step's overhead part). Reset to 0."""
        due, self.contention_due_s = self.contention_due_s, 0.0
        return due


class _Prefill:
    """A running request that is not decoding yet (a prompt in chunks, or a recompute)."""

    __slots__ = ("req", "computed", "tokens", "output", "target", "held")

    def __init__(self, req: int, computed: int, tokens: int, output: int, target: int, held: int):
        self.req = req
        self.computed = computed
        self.tokens = tokens  # prompt + output so far
        self.output = output
        self.target = target
        self.held = held  # blocks


def prices_totals(cost: CostModel) -> TypeGuard[CompositionCostModel]:
    """Whether `cost` prices a step from its totals (what steady steps need)."""
    return hasattr(cost, "composition_parts_s")


def steady_applies(sim: Simulator) -> bool:
    """Whether the run's settings allow steady steps at all (see the module docstring).

    NOTE: steady steps know each step's totals (tokens, sequences, KV read, attention pairs), not
    the per-sequence arrays a SchedulerOutput carries, so they need a cost model that prices from
    totals (`composition_parts_s` and `composition_share_s`, as the engine model does); with any
    other, every step goes through the scheduler.
    """
    rules, kv = sim.scheduler.rules, sim.scheduler.kv
    if rules.num_spec_tokens or not rules.paged:
        return False
    if not prices_totals(sim.cost_model):
        return False
    return not (kv.caching and (kv.num_shared_blocks or kv.pool.has_cached_blocks))


def advance_steady(
    sim: Simulator, loop: LoopState, recorder: SampleRecorder, chunks: ChunkStore
) -> int:
    """Take steady steps from `loop.now` for as long as they stay steady.

    Each step hands the scheduler the requests that have arrived (when arrivals depend on the
    clock), is scheduled (`_SteadyRun.schedule_step`: the run ends before a step that would not
    be steady), priced and logged (`price_and_log_step`), and completed (`complete_step`). The
    run is written back into the simulator's state once, at the end (`write_back`).

    Returns:
        The number of steps taken (0: the next step must go through the scheduler).
    """
    run = _SteadyRun.start(sim, loop)
    if run is None:
        return 0
    while loop.num_finished < run.num_requests and run.step < _MAX_STEPS:
        if run.clocked:
            loop.admit_arrivals(run.scheduler, run.intended_arrival_s)
        scheduled = run.schedule_step()
        if scheduled is None:
            break
        run.price_and_log_step(scheduled)
        run.complete_step(scheduled)
    if run.step == 0:
        return 0
    run.write_back(recorder, chunks)
    return run.step


@dataclass(slots=True)
class _Decoders:
    """The decoding requests of a run of steady steps, kept as sums rather than one by one.

    Each reads one more KV token and outputs one more token per step, so a decoder is known by
    its tokens before step 0 of the run (`bases`: computed and output tokens, as if it had
    decoded since step 0; a request that starts decoding later gets a base shifted back to
    match). From those, each step's totals are O(1): the KV read is `kv_base_total` plus one
    token per decoder per step, and the new blocks are the decoders whose computed tokens reach
    a multiple of the block size at that step (`by_phase`). Each decoder's finishing step is
    known when it starts decoding: those decoding on entry sit in one sorted list (walked with
    `next_entry`), those who join later in a map by step plus a heap (for the earliest).
    """

    block_size: int
    count: int
    # Request -> (computed tokens, output tokens) it would have had before step 0.
    bases: dict[int, tuple[int, int]]
    kv_base_total: int  # the sum of the computed-token bases
    # by_phase[i]: decoders that need a new block at each step s with s % block_size == i.
    # NOTE: a decoder with c tokens computed before step 0 computes token c + s + 1 at step s,
    # which grows its blocks (Rules.blocks_to_grow) just when (c + s) % block_size == 0.
    by_phase: list[int]
    entry_finish_steps: list[int]  # sorted: when each decoder present on entry finishes
    entry_finish_requests: list[int]  # ... and which one it is
    next_entry: int  # the first of those not finished yet
    joiner_finishing: defaultdict[int, list[int]]  # step -> joiners that finish at it
    joiner_finish_heap: list[int]  # the joiners' finishing steps (stale ones popped lazily)
    # For joiners only (0 for those present on entry): the step of their first token in this
    # run (sampled when their prompt completed) and their first decoding step.
    first_token_step: dict[int, int]
    first_decode_step: dict[int, int]

    @classmethod
    def on_entry(
        cls,
        block_size: int,
        requests: np.ndarray,
        computed: np.ndarray,
        output: np.ndarray,
        target: np.ndarray,
    ) -> _Decoders:
        """The decoders running when the run starts (step 0 is their next step): their request
        ids, computed and output tokens, and every request's output target (by request id)."""
        computed_output = zip(computed.tolist(), output.tolist(), strict=True)
        bases = dict(zip(requests.tolist(), computed_output, strict=True))
        finish_step = decode_steps_to_finish(output, target[requests])
        by_finish = np.argsort(finish_step, kind="stable")
        return cls(
            block_size=block_size,
            count=len(requests),
            bases=bases,
            kv_base_total=int(computed.sum()),
            by_phase=np.bincount(-computed % block_size, minlength=block_size).tolist(),
            entry_finish_steps=finish_step[by_finish].tolist(),
            entry_finish_requests=requests[by_finish].tolist(),
            next_entry=0,
            joiner_finishing=defaultdict(list),
            joiner_finish_heap=[],
            first_token_step={},
            first_decode_step={},
        )

    def kv_read(self, step: int) -> int:
        """The KV tokens all decoders read at `step` (each has computed one more per step)."""
        return self.kv_base_total + self.count * step

    def blocks_needed(self, step: int) -> int:
        """The new blocks the decoders take at `step`: one each for those whose computed tokens
        fill their last block exactly before it."""
        return self.by_phase[step % self.block_size] if self.count else 0

    def next_finish_step(self, step: int) -> int:
        """The first step from `step` on at which a decoder finishes (a huge number if none)."""
        heap = self.joiner_finish_heap
        while heap and heap[0] < step:
            heapq.heappop(heap)
        next_finish = (
            self.entry_finish_steps[self.next_entry]
            if self.next_entry < len(self.entry_finish_steps)
            else 1 << 62
        )
        if heap:
            next_finish = min(next_finish, heap[0])
        return next_finish

    def join(self, req: int, computed: int, output: int, target: int, step: int) -> None:
        """Add a request that sampled its first token at `step` (its prompt or recompute just
        completed) and decodes from `step + 1` on, with `computed` and `output` tokens after
        `step`; it finishes when its output reaches `target`."""
        computed_base, output_base = computed - (step + 1), output - (step + 1)
        self.bases[req] = (computed_base, output_base)
        self.first_token_step[req] = step
        self.first_decode_step[req] = step + 1
        finish_step = decode_steps_to_finish(output_base, target)
        self.joiner_finishing[finish_step].append(req)
        heapq.heappush(self.joiner_finish_heap, finish_step)
        self.by_phase[-computed_base % self.block_size] += 1
        self.kv_base_total += computed_base
        self.count += 1

    def finish(self, step: int) -> list[tuple[int, int, int, int]]:
        """Remove the decoders whose last token is output at `step`: the joiners due then, then
        those present on entry, in finishing order.

        Returns:
            Each one's request, its computed tokens after the step, the step of its first token
            in this run and its first decoding step (both 0 for those present on entry).
        """
        ending = self.joiner_finishing.pop(step, [])
        steps, requests, next_entry = (
            self.entry_finish_steps,
            self.entry_finish_requests,
            self.next_entry,
        )
        while next_entry < len(steps) and steps[next_entry] == step:
            ending.append(requests[next_entry])
            next_entry += 1
        if not ending:
            return []  # most steps: nobody finishes
        self.next_entry = next_entry
        finished = []
        for req in ending:
            computed_base, _ = self.bases.pop(req)
            self.kv_base_total -= computed_base
            self.by_phase[-computed_base % self.block_size] -= 1
            first_token = self.first_token_step.pop(req, 0)
            first_decode = self.first_decode_step.pop(req, 0)
            finished.append((req, computed_base + step + 1, first_token, first_decode))
        self.count -= len(ending)
        return finished


@dataclass(slots=True)
class _StepLog:
    """What a run of steady steps records, to write back when it ends."""

    # Per step, in order.
    end_s: list[float] = field(default_factory=list)  # only when the run is clocked
    seconds: list[float] = field(default_factory=list)
    parts: list[tuple[float, ...]] = field(default_factory=list)  # parts, then prefill share
    num_running: list[int] = field(default_factory=list)
    num_waiting: list[int] = field(default_factory=list)
    blocks_used: list[int] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    # Per request.
    finished: list[tuple[int, int, int]] = field(default_factory=list)  # req, step, computed
    token_runs: list[tuple[int, int, int]] = field(default_factory=list)  # req, first, last step
    charges: list[tuple[int, int, int]] = field(default_factory=list)  # req, step, how (_OWN...)
    admitted: list[tuple[int, int]] = field(default_factory=list)  # req, its first step here
    decode_spans: list[tuple[int, int, int]] = field(default_factory=list)  # req, first, last


@dataclass(slots=True)
class _SteadyRun:
    """One run of steady steps: the scheduling rules it applies, the decoders (as sums) and the
    requests still prefilling, the free block count, the step number and the log of what
    happened. Blocks are only counted while the run lasts (`free_blocks`)."""

    sim: Simulator
    loop: LoopState
    scheduler: Scheduler
    waiting: deque[int]  # the scheduler's queue, admitted from here
    table: RequestTable
    cost: CompositionCostModel
    intended_arrival_s: np.ndarray
    rules: Rules
    num_blocks: int  # in the pool
    num_requests: int
    clocked: bool  # whether an arrival or a client slot depends on each step's end time
    start_s: float
    decoders: _Decoders
    prefills: list[_Prefill]
    free_blocks: int
    order: list[int]  # the running requests in scheduling order, admitted ones appended
    log: _StepLog
    step: int = 0

    @classmethod
    def start(cls, sim: Simulator, loop: LoopState) -> _SteadyRun | None:
        """The run from the scheduler's current batch, or None when it is not steady: the
        settings don't allow steady steps, the decoders are not all ahead of the prefilling
        requests, they exceed the token budget, or some request holds more or fewer blocks than
        its computed tokens need."""
        if not steady_applies(sim):
            return None
        table, sched = sim.table, sim.scheduler
        rules = sched.rules
        block_size = rules.block_size
        running = sched.running
        computed = table.num_computed_tokens[running]
        output = table.num_output_tokens[running]
        decoding = is_decoding(table.num_prompt_tokens[running], output, computed)
        num_decoding = int(decoding.sum())
        # The decoders lead the running order and each wants one token: the budget must give
        # them all theirs (budget_shares), or the step is not steady.
        if num_decoding > rules.token_budget or not decoding[:num_decoding].all():
            return None
        if rules.blocks_to_grow(computed, table.num_blocks[running]).any():
            return None
        target = table.num_output_tokens_target
        decoders = _Decoders.on_entry(
            block_size,
            running[:num_decoding],
            computed[:num_decoding],
            output[:num_decoding],
            target,
        )
        prefills = [
            _Prefill(
                req,
                req_computed,
                int(table.num_prompt_tokens[req]) + req_output,
                req_output,
                int(target[req]),
                rules.blocks_for(req_computed),
            )
            for req, req_computed, req_output in zip(
                running[num_decoding:].tolist(),
                computed[num_decoding:].tolist(),
                output[num_decoding:].tolist(),
                strict=True,
            )
        ]
        cost = sim.cost_model
        assert prices_totals(cost)  # steady_applies checked it
        num_requests = len(table)
        return cls(
            sim=sim,
            loop=loop,
            scheduler=sched,
            waiting=sched.waiting,
            table=table,
            cost=cost,
            intended_arrival_s=sim.workload.intended_arrival_s,
            rules=rules,
            num_blocks=sched.pool.num_blocks,
            num_requests=num_requests,
            clocked=loop.slots is not None or loop.next_req < num_requests,
            start_s=loop.now,
            decoders=decoders,
            prefills=prefills,
            free_blocks=sched.pool.num_free_blocks,
            order=running.tolist(),
            log=_StepLog(),
        )

    # -- one step -----------------------------------------------------------------------------

    def schedule_step(self) -> list[tuple[_Prefill, int]] | None:
        """Schedule the next step as the scheduler would: every decoder one token, then a chunk
        of each prefilling request in order, then new requests from the waiting queue while
        budget, sequences and blocks allow. Returns the non-decoders scheduled, each with its
        chunk of tokens, or None if the step is not a steady one (the run ends before it)."""
        decoders = self.decoders
        # Each decoder's one token first (they lead the running order).
        tokens_left = self.rules.token_budget - decoders.count
        if tokens_left < 0 or not (decoders.count or self.prefills or self.waiting):
            return None
        if self._plain_decode_stretch_ahead(tokens_left):
            return None
        scheduled, tokens_left, prefill_blocks = self._schedule_prefill_chunks(tokens_left)
        blocks_needed = decoders.blocks_needed(self.step) + prefill_blocks
        if not blocks_fit(blocks_needed, self.free_blocks):
            return None  # the scheduler would preempt: let it
        self.free_blocks -= blocks_needed
        self._admit_waiting(scheduled, tokens_left)
        return scheduled

    def _plain_decode_stretch_ahead(self, tokens_left: int) -> bool:
        """Whether the next steps only decode (nothing prefilling, nobody waiting who could be
        admitted) for at least _SKIP_AT_LEAST steps before a decoder finishes: such a stretch
        is left to labs/sim/decode_run.py, which takes it whole."""
        decoders = self.decoders
        if not decoders.count or self.prefills:
            return False
        if self.waiting and self.rules.admission_open(decoders.count, tokens_left):
            return False
        return decoders.next_finish_step(self.step) - self.step >= _SKIP_AT_LEAST

    def _schedule_prefill_chunks(
        self, tokens_left: int
    ) -> tuple[list[tuple[_Prefill, int]], int, int]:
        """Give each prefilling request, in order, its next chunk (what is left of its prompt
        or recompute, cut to the budget left). Returns the (request, chunk) pairs, the token
        budget left after them and the new blocks they need."""
        rules = self.rules
        scheduled: list[tuple[_Prefill, int]] = []
        blocks_needed = 0
        for prefill in self.prefills:
            chunk = budget_share(prefill.tokens - prefill.computed, tokens_left)
            if not chunk:
                break
            tokens_left -= chunk
            blocks_needed += rules.blocks_to_grow(prefill.computed + chunk, prefill.held)
            scheduled.append((prefill, chunk))
        return scheduled, tokens_left, blocks_needed

    def _admit_waiting(self, scheduled: list[tuple[_Prefill, int]], tokens_left: int) -> None:
        """Admit requests from the head of the waiting queue by the scheduler's rules
        (Rules.admission_open, admission_chunk and admission_need; nothing is cached, so there
        are no hits), taking blocks for the chunk only. Each admitted request is added to
        `scheduled` with its chunk."""
        waiting, rules = self.waiting, self.rules
        num_running = self.decoders.count + len(self.prefills)
        while waiting and rules.admission_open(num_running, tokens_left):
            req = waiting[0]
            req_output = self.table.num_output_tokens.item(req)
            tokens = self.table.num_prompt_tokens.item(req) + req_output
            chunk = rules.admission_chunk(tokens, tokens_left, req_output > 0)
            if not chunk:
                break
            if not blocks_fit(rules.admission_need(tokens, 0, 0, 0), self.free_blocks):
                break
            self.free_blocks -= rules.blocks_to_grow(chunk, 0)
            scheduled.append((self._admit(req, tokens, req_output), chunk))
            tokens_left -= chunk
            num_running += 1

    def _admit(self, req: int, tokens: int, output: int) -> _Prefill:
        """Move the request at the head of the waiting queue into the batch, with `tokens` to
        compute (its prompt, plus its `output` so far if it was preempted), as the scheduler
        admits one: counted as a prefix-cache query when caching is on, its cached tokens set
        to 0 if unknown, marked running. Returns it as a new prefill."""
        table = self.table
        self.waiting.popleft()
        self.scheduler.note_admitted(req, tokens, 0)
        prefill = _Prefill(req, 0, tokens, output, table.num_output_tokens_target.item(req), 0)
        self.log.admitted.append((req, self.step))
        self.prefills.append(prefill)
        self.order.append(req)
        return prefill

    def price_and_log_step(self, scheduled: list[tuple[_Prefill, int]]) -> None:
        """Price the step from its totals (`composition_parts_s`), add any front-end CPU time
        it owes to its overhead part, advance the clock if the run is clocked, and log the
        step: its parts and prefill share, seconds, batch, queue, blocks and tokens."""
        num_prefill, num_decode, kv_read, pairs, kv_alone, num_alone = self._step_totals(scheduled)
        cost, loop, log, num_decoding = self.cost, self.loop, self.log, self.decoders.count
        num_seqs = num_decoding + len(scheduled)
        parts = cost.composition_parts_s(
            num_prefill + num_decode, num_prefill, num_seqs, kv_read, pairs
        )
        step_s = parts_total(parts)
        share = 0.0
        if num_prefill and num_decode:
            share = cost.composition_share_s(step_s, num_decode, num_alone, kv_alone)
        if loop.contention_due_s:
            # As the single step adds it: to the overhead part, after the prefill share.
            due = loop.take_contention_s()
            parts = (*parts[:OVERHEAD], parts[OVERHEAD] + due, *parts[OVERHEAD + 1 :])
            step_s = parts_total(parts)
        log.parts.append((*parts, share))
        log.seconds.append(step_s)
        if self.clocked:
            loop.now += step_s
            log.end_s.append(loop.now)
        log.num_running.append(num_decoding + len(self.prefills))
        log.num_waiting.append(len(self.waiting))
        log.blocks_used.append(self.num_blocks - self.free_blocks)
        log.num_tokens.append(num_prefill + num_decode)

    def _step_totals(
        self, scheduled: list[tuple[_Prefill, int]]
    ) -> tuple[int, int, int, int, int, int]:
        """The step's totals as the cost model takes them, and how each scheduled non-decoder
        is charged in the breakdown (logged in `charges`).

        Returns:
            Prefill tokens, decode tokens, KV tokens read, attention pairs, and the KV read and
            count of the sequences that `composition_share_s` keeps (those scheduling one
            token after some computed ones).
        """
        decoders, step, log = self.decoders, self.step, self.log
        kv_read, num_decoding = decoders.kv_read(step), decoders.count
        num_prefill, num_decode = 0, num_decoding
        # Attention pairs: a decoder's token attends to its KV and itself; a chunk of n after c
        # computed tokens makes n c + n (n + 1) / 2 (engine_model.token_pairs, exact in ints).
        pairs = kv_read + num_decoding
        kv_alone, num_alone = kv_read, num_decoding
        for prefill, chunk in scheduled:
            computed = prefill.computed
            kv_read += computed
            pairs += chunk * computed + chunk * (chunk + 1) // 2
            if chunk == 1 and computed > 0:
                kv_alone += computed
                num_alone += 1
            if is_decoding(prefill.tokens - prefill.output, prefill.output, computed):
                num_decode += chunk
                log.charges.append((prefill.req, step, _DECODING))
            else:
                num_prefill += chunk
                after_first_token = 1 if prefill.output > 0 else 0
                how = _RECOMPUTE if self.table.num_preemptions.item(prefill.req) > 0 else _OWN
                log.charges.append((prefill.req, step, how + after_first_token))
        return num_prefill, num_decode, kv_read, pairs, kv_alone, num_alone

    def complete_step(self, scheduled: list[tuple[_Prefill, int]]) -> None:
        """The step's outcome: the scheduled chunks are computed, prefills that caught up
        sample a token (and finish or become decoders), decoders due to finish finish. Then
        the step count advances and the finished are reported to the loop."""
        for prefill, chunk in scheduled:
            prefill.computed += chunk
            prefill.held = self.rules.blocks_for(prefill.computed)
        num_done = self._sample_caught_up_prefills()
        num_done += self._finish_decoders()
        self.step += 1
        if num_done:
            self._report_finished(num_done)

    def _sample_caught_up_prefills(self) -> int:
        """Each prefilling request whose tokens are all computed samples a token: it finishes
        if that was its last (its blocks are freed), else it decodes from the next step on (it
        is ahead of every prefill still running). Returns how many finished."""
        step, log, decoders = self.step, self.log, self.decoders
        num_done = 0
        still_prefilling: list[_Prefill] = []
        for prefill in self.prefills:
            if not samples(prefill.computed, prefill.tokens):
                still_prefilling.append(prefill)
                continue
            prefill.output += 1
            prefill.tokens += 1
            req = prefill.req
            if finishes(prefill.output, prefill.target):
                self.free_blocks += prefill.held
                log.finished.append((req, step, prefill.computed))
                log.token_runs.append((req, step, step))
                num_done += 1
                continue
            decoders.join(req, prefill.computed, prefill.output, prefill.target, step)
        self.prefills = still_prefilling
        return num_done

    def _finish_decoders(self) -> int:
        """The decoders whose last token was this step's leave, freeing their blocks. Returns
        how many finished."""
        step, log, rules = self.step, self.log, self.rules
        finished = self.decoders.finish(step)
        for req, computed, first_token, first_decode in finished:
            self.free_blocks += rules.blocks_for(computed)
            log.finished.append((req, step, computed))
            log.token_runs.append((req, first_token, step))
            log.decode_spans.append((req, first_decode, step))
        return len(finished)

    def _report_finished(self, num_done: int) -> None:
        """Count requests that finished at the step just taken: their client slots free at the
        loop's clock, and progress is reported if it is due."""
        loop, sim = self.loop, self.sim
        loop.num_finished += num_done
        if loop.slots is not None:
            for _ in range(num_done):
                heapq.heappush(loop.slots, loop.now)
        if sim.on_progress is not None:
            wall = time.perf_counter()
            if wall - loop.last_progress >= sim.progress_interval_s:
                sim.on_progress(loop.num_finished / self.num_requests)
                loop.last_progress = wall

    # -- write back ---------------------------------------------------------------------------

    def write_back(self, recorder: SampleRecorder, chunks: ChunkStore) -> None:
        """Write the run into the simulator's state: the clock, the time breakdown, each
        request's tokens, finishes and blocks, the token times and engine samples, the running
        batch and the step count."""
        end_s, start_s = self._step_times()
        self._charge_breakdown(start_s)
        self._write_back_tokens()
        self._write_back_finished(end_s)
        self._place_owed_blocks()
        log = self.log
        token_runs = np.array(log.token_runs, dtype=np.int64).reshape(-1, 3)
        chunks.add_runs(token_runs[:, 0], end_s, token_runs[:, 1], token_runs[:, 2])
        recorder.add_many(
            start_s,
            np.array(log.num_running),
            np.array(log.num_waiting),
            np.array(log.blocks_used),
            np.array(log.num_tokens),
        )
        in_order = np.array(self.order, dtype=np.int64)
        self.scheduler.running = in_order[self.table.status[in_order] == _RUNNING]
        self.sim.num_steps += self.step

    def _step_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Each step's end and start time. An unclocked run sums its step seconds here (and
        sets the loop's clock to the last end); a clocked one logged its ends as it went."""
        log = self.log
        if self.clocked:
            end_s = np.array(log.end_s)
        else:
            end_s = np.cumsum(np.concatenate([[self.start_s], log.seconds]))[1:]
            self.loop.now = float(end_s[-1])
        start_s = np.concatenate([[self.start_s], end_s[:-1]])
        return end_s, start_s

    def _charge_breakdown(self, start_s: np.ndarray) -> None:
        """Close the decode spans of those still decoding (to the last step) and charge the
        steps to their requests (`_feed_breakdown`)."""
        log, decoders, last_step = self.log, self.decoders, self.step - 1
        for req, first in decoders.first_decode_step.items():
            log.decode_spans.append((req, first, last_step))
        log.decode_spans.extend(
            (req, 0, last_step) for req in decoders.bases if req not in decoders.first_decode_step
        )
        parts_table = np.array(log.parts).reshape(-1, len(PARTS) + 1)
        _feed_breakdown(self.sim, parts_table, start_s, log.charges, log.admitted, log.decode_spans)

    def _write_back_tokens(self) -> None:
        """Set the computed and output tokens of the requests still running (decoders from
        their bases, prefills as they stand), and log the token runs of the decoders."""
        table, decoders, steps = self.table, self.decoders, self.step
        bases = decoders.bases
        if bases:
            still_decoding = np.fromiter(bases, dtype=np.int64, count=len(bases))
            base_tokens = np.array(list(bases.values()), dtype=np.int64)
            table.num_computed_tokens[still_decoding] = base_tokens[:, 0] + steps
            table.num_output_tokens[still_decoding] = base_tokens[:, 1] + steps
            self.log.token_runs.extend(
                zip(
                    still_decoding.tolist(),
                    [decoders.first_token_step.get(req, 0) for req in bases],
                    [steps - 1] * len(bases),
                    strict=True,
                )
            )
        for prefill in self.prefills:
            table.num_computed_tokens[prefill.req] = prefill.computed
            table.num_output_tokens[prefill.req] = prefill.output

    def _write_back_finished(self, end_s: np.ndarray) -> None:
        """Mark the requests that finished as such (tokens, status, finish time) and free the
        blocks each held on entry; the blocks counted since were never handed out."""
        if not self.log.finished:
            return
        table = self.table
        done = np.array(self.log.finished, dtype=np.int64)
        req = done[:, 0]
        table.num_computed_tokens[req] = done[:, 2]
        table.num_output_tokens[req] = table.num_output_tokens_target[req]
        table.status[req] = _FINISHED
        table.finish_s[req] = end_s[done[:, 1]]
        self.scheduler.kv.free_finished(req.tolist())

    def _place_owed_blocks(self) -> None:
        """Hand out the blocks that the requests still running were counted to take (decoders
        first, then prefills), and check the pool agrees with the free count kept."""
        table, pool = self.table, self.scheduler.pool
        owners = np.array(
            [*self.decoders.bases, *(prefill.req for prefill in self.prefills)], dtype=np.int64
        )
        if len(owners):
            owed = self.rules.blocks_to_grow(
                table.num_computed_tokens[owners], table.num_blocks[owners]
            )
            total = int(owed.sum())
            if total:
                blocks = pool.allocate(total)
                assert blocks is not None
                self.scheduler.kv.place(np.repeat(owners, owed), blocks)
        assert pool.num_free_blocks == self.free_blocks, (
            "steady steps lost count of the free blocks"
        )


def _feed_breakdown(
    sim: Simulator,
    table: np.ndarray,
    start_s: np.ndarray,
    charges: list[tuple[int, int, int]],
    admitted: list[tuple[int, int]],
    dec_spans: list[tuple[int, int, int]],
) -> None:
    """Charge the steady steps (rows of `table`: parts, then the prefill share) to their requests,
    as `BreakdownAccumulator.add_step` charges single steps."""
    acc = sim.breakdown
    parts, share = table[:, : len(PARTS)], table[:, len(PARTS)]
    step_s = parts.sum(axis=1)
    share = np.minimum(share, step_s)
    positive = step_s > 0
    scale = np.zeros_like(step_s)
    scale[positive] = (step_s[positive] - share[positive]) / step_s[positive]
    # A decoder's parts over a span of steps: the difference of running sums over the steps.
    decoding = np.empty((len(step_s) + 1, len(PARTS) + 1))
    decoding[0] = 0.0
    decoding[1:, : len(PARTS)] = parts * scale[:, None]
    decoding[1:, len(PARTS)] = share
    np.cumsum(decoding, axis=0, out=decoding)
    if dec_spans:
        spans = np.array(dec_spans, dtype=np.int64).reshape(-1, 3)
        spans = spans[spans[:, 1] <= spans[:, 2]]
        req, first, last = spans[:, 0], spans[:, 1], spans[:, 2]
        summed = decoding[last + 1] - decoding[first]
        acc.steps[1, req] += summed[:, : len(PARTS)]
        acc.interference[1, req] += summed[:, len(PARTS)]
    if admitted:
        rows = np.array(admitted, dtype=np.int64).reshape(-1, 2)
        fresh = np.isnan(acc.first_start_s[rows[:, 0]])
        acc.first_start_s[rows[fresh, 0]] = start_s[rows[fresh, 1]]
    if charges:
        log = np.array(charges, dtype=np.int64).reshape(-1, 3)
        req, step, how = log[:, 0], log[:, 1], log[:, 2]
        for code, after in ((_OWN, 0), (_OWN + 1, 1)):
            pick = how == code
            np.add.at(acc.steps[after], req[pick], parts[step[pick]])
        for code, after in ((_RECOMPUTE, 0), (_RECOMPUTE + 1, 1)):
            pick = how == code
            np.add.at(acc.preemption[after], req[pick], step_s[step[pick]])
        pick = how == _DECODING
        step = step[pick]
        np.add.at(acc.steps[1], req[pick], parts[step] * scale[step, None])
        np.add.at(acc.interference[1], req[pick], share[step])
