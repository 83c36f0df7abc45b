"""Steady steps, taken with a few Python scalars instead of arrays over the whole batch.

Most steps of a busy run look alike: a few hundred sequences decode one token each, a prompt or
two is prefilled beside them, a request finishes and the next one is admitted. The scheduler
(scheduler.py) redoes its numpy work over the whole batch for each such step. Here the decoding
sequences are a sum instead: each reads one more KV token per step, needs a new block every
block_size steps (counted per phase, `by_phase`), and finishes at a step known when it starts
decoding (`finishing`). A step then costs a few operations per request that changes (the
prefilling ones, admissions, finishes), not per request in the batch; token times are written
per request as one slice of step end times when it stops decoding. The engine model prices each
step from its totals in plain floats (`EngineModel.composition_parts_s`, the same floats as a
single step).

The time breakdown (labs/sim/breakdown.py) is fed as single steps feed it: each step's parts and
prefill share are logged, a decoder gets the difference of their running sums between its first
and last decoding step (so O(changes) work per step, not O(batch)), and the few requests that are
prefilling get their own steps' parts at write-back. The per-request breakdown matches
step-by-step mode within 1e-9 relative (the sums are added in another order).

It holds while (checked on entry, and left before a step that would break it):

- no speculation (a fixed token per decode) and paged KV;
- no block carries a prefix-cache key (caching off, or no shared prefix and nothing cached yet),
  so which block a request gets cannot change anything: blocks are only counted here, and the
  ids are handed out when the run of steady steps ends;
- every decoding request is ahead of every prefilling one and fits the token budget, and no
  step needs more blocks than are free (so nobody is preempted).

Anything else (speculation, a shared prefix, preemption, a budget smaller than the batch) goes
through the scheduler one step at a time. `Simulator(step_by_step=True)` never comes here, and
tests/labs/sim/test_fast_path.py checks both give the same record.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeGuard

import numpy as np

from labs.sim.engine_model import OVERHEAD, PARTS, parts_total
from labs.sim.entities import RequestStatus
from labs.sim.recording import ChunkStore, SampleRecorder

if TYPE_CHECKING:
    from labs.sim.breakdown import BreakdownAccumulator
    from labs.sim.cost_model import CompositionCostModel, CostModel
    from labs.sim.entities import RequestTable
    from labs.sim.scheduler import Scheduler, SchedulerConfig
    from labs.sim.workload import GeneratedWorkload


class Simulator(Protocol):
    """What steady steps read and advance of the simulator that takes them
    (labs.sim.simulator.Simulator): its settings, scheduler, requests and workload, its cost
    model and breakdown, its progress callback and its step count."""

    config: SchedulerConfig
    scheduler: Scheduler
    table: RequestTable
    workload: GeneratedWorkload
    cost_model: CostModel
    breakdown: BreakdownAccumulator
    on_progress: Callable[[float], None] | None
    progress_interval_s: float
    num_steps: int


# A decode-only stretch at least this long is left to Simulator._skip_decode_steps.
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
    cfg, kv = sim.config, sim.scheduler.kv
    if cfg.num_spec_tokens or cfg.kv_allocation != "paged":
        return False
    if not prices_totals(sim.cost_model):
        return False
    return not (kv.caching and (kv.num_shared_blocks or kv.pool.has_cached_blocks))


def advance_steady(
    sim: Simulator, loop: LoopState, recorder: SampleRecorder, chunks: ChunkStore
) -> int:
    """Take steady steps from `loop.now` for as long as they stay steady.

    Returns:
        The number of steps taken (0: the next step must go through the scheduler).
    """
    if not steady_applies(sim):
        return 0
    sched, t, cfg = sim.scheduler, sim.table, sim.config
    run = sched.running
    bs, budget, max_seqs = cfg.block_size, cfg.max_num_batched_tokens, cfg.max_num_seqs
    computed = t.num_computed_tokens[run]
    output = t.num_output_tokens[run]
    decoding = (t.num_prompt_tokens[run] + output - computed == 1) & (output > 0)
    d = int(decoding.sum())
    if d > budget or not decoding[:d].all():
        return 0
    if (t.num_blocks[run] != -(-computed // bs)).any():
        return 0

    # Decoders: before step s, request r has computed base[r] + s tokens and output obase[r] + s.
    dec, c, o = run[:d], computed[:d], output[:d]
    computed_output = zip(c.tolist(), o.tolist(), strict=True)
    dec_base: dict[int, tuple[int, int]] = dict(zip(dec.tolist(), computed_output, strict=True))
    seg_first: dict[int, int] = {}  # the step of a joiner's first token (0 for the others)
    target = t.num_output_tokens_target
    # The step at which each decoder finishes: those decoding on entry in one sorted array, those
    # who join later in a map and a heap.
    fin = target[dec] - o - 1
    by_fin = np.argsort(fin, kind="stable")
    entry_fin, entry_fin_req = fin[by_fin].tolist(), dec[by_fin].tolist()
    num_entry_fin, k = len(entry_fin), 0
    finishing: defaultdict[int, list[int]] = defaultdict(list)
    finish_heap: list[int] = []
    by_phase = np.bincount(-c % bs, minlength=bs).tolist()  # decoders by step mod bs of a new block
    base_sum = int(c.sum())
    prefills = [
        _Prefill(r, c, int(t.num_prompt_tokens[r]) + o, o, int(target[r]), -(-c // bs))
        for r, c, o in zip(
            run[d:].tolist(), computed[d:].tolist(), output[d:].tolist(), strict=True
        )
    ]

    n = len(t)
    wl = sim.workload
    intended = wl.intended_arrival_s
    waiting, counters, caching = sched.waiting, sched.counters, sched.kv.caching
    chunked = cfg.chunked_prefill
    num_blocks = sched.pool.num_blocks
    free = sched.pool.num_free_blocks
    order = run.tolist()
    # The clock is needed step by step only if an arrival or a client slot depends on it.
    clocked = loop.slots is not None or loop.next_req < n
    now0 = loop.now
    ends: list[float] = []
    running_log: list[int] = []
    waiting_log: list[int] = []
    used_log: list[int] = []
    tokens_log: list[int] = []
    finished: list[tuple[int, int, int]] = []  # request, step, computed tokens at the end
    segments: list[tuple[int, int, int]] = []  # request, first step, last step of its tokens
    cost = sim.cost_model
    assert prices_totals(cost)  # steady_applies checked it
    # The time breakdown (labs/sim/breakdown.py), fed as BreakdownAccumulator.add_step would be:
    # decoders get each step's parts x scale and its prefill share, summed over their span of
    # steps at write-back as a difference of running sums (O(changes), not O(batch) per step);
    # the few requests that are not decoding get their own steps' parts from a log.
    parts_log: list[tuple[float, ...]] = []  # per step: parts, then the prefill share
    seconds_log: list[float] = []
    charges: list[tuple[int, int, int]] = []  # request, step, how (_OWN_BEFORE ...)
    admitted: list[tuple[int, int]] = []  # request, step it was first scheduled here
    dec_first: dict[int, int] = {}  # first decoding step of those who start decoding here
    dec_spans: list[tuple[int, int, int]] = []  # request, first and last step it decoded in
    preempted = t.num_preemptions
    prompt_col, output_col, cached_col = (
        t.num_prompt_tokens,
        t.num_output_tokens,
        t.num_cached_tokens,
    )
    status_col = t.status
    s = 0
    while loop.num_finished < n and s < _MAX_STEPS:
        if clocked:
            loop.admit_arrivals(sched, intended)
        left = budget - d
        if left < 0 or not (d or prefills or waiting):
            break
        if d and not prefills and (not waiting or d >= max_seqs or left == 0):
            while finish_heap and finish_heap[0] < s:
                heapq.heappop(finish_heap)
            next_fin = entry_fin[k] if k < num_entry_fin else 1 << 62
            if finish_heap:
                next_fin = min(next_fin, finish_heap[0])
            if next_fin - s >= _SKIP_AT_LEAST:
                break  # a plain decode stretch: Simulator._skip_decode_steps takes it whole
        need = by_phase[s % bs] if d else 0
        scheduled: list[tuple[_Prefill, int]] = []
        for p in prefills:
            if left <= 0:
                break
            chunk = min(p.tokens - p.computed, left)
            left -= chunk
            need += -(-(p.computed + chunk) // bs) - p.held
            scheduled.append((p, chunk))
        if need > free:
            break  # the scheduler would preempt: let it
        free -= need
        num_running = d + len(prefills)
        while waiting and left > 0 and num_running < max_seqs:
            h = waiting[0]
            out_h = output_col.item(h)
            tokens = prompt_col.item(h) + out_h
            num_new = tokens
            if num_new > left:
                if not chunked and out_h == 0:
                    break
                num_new = left
            if -(-tokens // bs) > free:
                break  # the whole prompt must fit (KVCacheManager.admit)
            free -= -(-num_new // bs)
            waiting.popleft()
            if caching:
                counters.prefix_cache_queries += tokens
            if cached_col.item(h) < 0:
                cached_col[h] = 0
            status_col[h] = _RUNNING
            p = _Prefill(h, 0, tokens, out_h, target.item(h), 0)
            admitted.append((h, s))
            prefills.append(p)
            scheduled.append((p, num_new))
            order.append(h)
            left -= num_new
            num_running += 1

        kv_read = base_sum + d * s
        num_prefill, num_decode = 0, d
        # Attention pairs: a decoder's token attends to its KV and itself; a chunk of n after c
        # computed tokens makes n c + n (n + 1) / 2 (engine_model.token_pairs, exact in ints).
        pairs = kv_read + d
        kv_alone, num_alone = kv_read, d  # the sequences prefill_share_s keeps
        for p, chunk in scheduled:
            c = p.computed
            kv_read += c
            pairs += chunk * c + chunk * (chunk + 1) // 2
            if chunk == 1 and c > 0:
                kv_alone += c
                num_alone += 1
            if p.tokens - c == 1 and p.output > 0:
                num_decode += chunk
                charges.append((p.req, s, _DECODING))
            else:
                num_prefill += chunk
                after = 1 if p.output > 0 else 0
                how = _RECOMPUTE if preempted.item(p.req) > 0 else _OWN
                charges.append((p.req, s, how + after))
        num_seqs = d + len(scheduled)
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
        parts_log.append((*parts, share))
        seconds_log.append(step_s)
        if clocked:
            loop.now += step_s
            ends.append(loop.now)
        running_log.append(num_running)
        waiting_log.append(len(waiting))
        used_log.append(num_blocks - free)
        tokens_log.append(num_prefill + num_decode)

        # The step's outcome: prefills advance (and sample once they catch up), decoders finish.
        num_done = 0
        for p, chunk in scheduled:
            p.computed += chunk
            p.held = -(-p.computed // bs)
        still: list[_Prefill] = []
        for p in prefills:
            if p.computed < p.tokens:
                still.append(p)
                continue
            p.output += 1
            p.tokens += 1
            r = p.req
            if p.output >= p.target:
                free += p.held
                finished.append((r, s, p.computed))
                segments.append((r, s, s))
                num_done += 1
                continue
            # A decoder from the next step on (it is ahead of every prefill still running).
            base, obase = p.computed - (s + 1), p.output - (s + 1)
            dec_base[r] = (base, obase)
            seg_first[r] = s
            dec_first[r] = s + 1
            fin = p.target - obase - 1
            finishing[fin].append(r)
            heapq.heappush(finish_heap, fin)
            by_phase[-base % bs] += 1
            base_sum += base
            d += 1
        prefills = still
        ending = finishing.pop(s, [])
        while k < num_entry_fin and entry_fin[k] == s:
            ending.append(entry_fin_req[k])
            k += 1
        for r in ending:
            base, _ = dec_base.pop(r)
            d -= 1
            base_sum -= base
            by_phase[-base % bs] -= 1
            free += -(-(base + s + 1) // bs)
            finished.append((r, s, base + s + 1))
            segments.append((r, seg_first.pop(r, 0), s))
            dec_spans.append((r, dec_first.pop(r, 0), s))
            num_done += 1
        s += 1
        if num_done:
            loop.num_finished += num_done
            if loop.slots is not None:
                for _ in range(num_done):
                    heapq.heappush(loop.slots, loop.now)
            if sim.on_progress is not None:
                wall = time.perf_counter()
                if wall - loop.last_progress >= sim.progress_interval_s:
                    sim.on_progress(loop.num_finished / n)
                    loop.last_progress = wall
    if s == 0:
        return 0

    # -- write back: times, counters, blocks, tokens, samples ---------------------------------
    if clocked:
        end_s = np.array(ends)
    else:
        end_s = np.cumsum(np.concatenate([[now0], seconds_log]))[1:]
        loop.now = float(end_s[-1])
    start_s = np.concatenate([[now0], end_s[:-1]])
    table = np.array(parts_log).reshape(-1, len(PARTS) + 1)
    for r, first in dec_first.items():
        dec_spans.append((r, first, s - 1))
    dec_spans.extend((r, 0, s - 1) for r in dec_base if r not in dec_first)
    _feed_breakdown(sim, table, start_s, charges, admitted, dec_spans)
    if dec_base:
        still_decoding = np.fromiter(dec_base, dtype=np.int64, count=len(dec_base))
        bases = np.array(list(dec_base.values()), dtype=np.int64)
        t.num_computed_tokens[still_decoding] = bases[:, 0] + s
        t.num_output_tokens[still_decoding] = bases[:, 1] + s
        segments.extend(
            zip(
                still_decoding.tolist(),
                [seg_first.get(r, 0) for r in dec_base],
                [s - 1] * len(dec_base),
                strict=True,
            )
        )
    for p in prefills:
        t.num_computed_tokens[p.req] = p.computed
        t.num_output_tokens[p.req] = p.output
    kv, pool = sched.kv, sched.pool
    if finished:
        done = np.array(finished, dtype=np.int64)
        req = done[:, 0]
        t.num_computed_tokens[req] = done[:, 2]
        t.num_output_tokens[req] = target[req]
        t.status[req] = _FINISHED
        t.finish_s[req] = end_s[done[:, 1]]
        # The blocks each held on entry; the rest were only counted.
        kv.free_finished(req.tolist())
    owners = np.array([*dec_base, *(p.req for p in prefills)], dtype=np.int64)
    if len(owners):
        owed = -(-t.num_computed_tokens[owners] // bs) - t.num_blocks[owners]
        total = int(owed.sum())
        if total:
            blocks = pool.allocate(total)
            assert blocks is not None
            kv.place(np.repeat(owners, owed), blocks)
    assert pool.num_free_blocks == free, "steady steps lost count of the free blocks"
    seg = np.array(segments, dtype=np.int64).reshape(-1, 3)
    chunks.add_runs(seg[:, 0], end_s, seg[:, 1], seg[:, 2])
    recorder.add_many(
        start_s,
        np.array(running_log),
        np.array(waiting_log),
        np.array(used_log),
        np.array(tokens_log),
    )
    in_order = np.array(order, dtype=np.int64)
    sched.running = in_order[t.status[in_order] == _RUNNING]
    sim.num_steps += s
    return s


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
