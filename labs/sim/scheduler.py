"""A token-budget scheduler in the manner of vLLM's V1 scheduler, one step at a time.

There are no prefill and decode phases: each request has `num_computed_tokens` and
`num_tokens` (prompt + output so far), and each step hands out a token budget so the two meet.
A step that meets them samples the next token. Every decision below is a rule of
labs/sim/rules.py, which the fast path (decode_run.py, steady.py) applies too; this module
applies them one step at a time, over arrays of the running requests. Order of work in
`schedule()`:

1. `_schedule_running`: running requests, oldest first. A decode wants 1 token (1 + k with k
   speculative drafts), a prefill chunk or a recompute the rest of its tokens, each capped by
   what is left of the budget. A request that cannot get a block preempts the newest running
   request (`_preempt`: blocks freed, computed tokens reset, recomputed later), itself last.
2. `_schedule_waiting`: unless something was preempted, waiting requests in FCFS order while
   budget and `max_num_seqs` allow: a prefix-cache lookup, then the prompt (chunked to fit the
   budget when chunked prefill is on; whole or not at all when it is off).

`update_from_output()` then advances the counters, samples draft acceptance, frees finished
requests and registers newly full blocks in the prefix cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from labs.backends.base import EngineCounters
from labs.parameters.params import DRAFT_SHARE_EVERY_STEP, param_default
from labs.sim.block_pool import BlockPool
from labs.sim.entities import RequestStatus, RequestTable
from labs.sim.kv_cache import KVCacheManager
from labs.sim.rules import (
    ADMITS_AFTER_PREEMPTION,
    Rules,
    blocks_fit,
    budget_shares,
    finishes,
    is_decoding,
    samples,
)

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class SchedulerConfig:
    """The engine settings the scheduler obeys, named as in vLLM; defaults are the lab's
    (labs/parameters/params.py declares each once)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int = param_default("block_size")
    chunked_prefill: bool = param_default("chunked_prefill")
    prefix_caching: bool = param_default("prefix_caching")
    kv_allocation: str = param_default("kv_allocation")  # "paged" | "contiguous"
    num_spec_tokens: int = param_default("spec_tokens")  # k drafts per decode step
    spec_acceptance: float = param_default("acceptance")  # alpha: chance each draft is accepted
    # Chance a decoding sequence proposes its k drafts at a step. vLLM's ngram proposer drafts
    # only where the last tokens repeat earlier context (5 of them by default), so many of its
    # steps verify nothing; a calibration sets the share its engine drafted at.
    spec_draft_share: float = DRAFT_SHARE_EVERY_STEP

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.kv_allocation not in ("paged", "contiguous"):
            raise ValueError(f"kv_allocation must be paged or contiguous, got {self.kv_allocation}")
        if self.num_spec_tokens < 0 or not 0 <= self.spec_acceptance < 1:
            raise ValueError("num_spec_tokens must be >= 0 and spec_acceptance in [0, 1)")
        if not 0 < self.spec_draft_share <= 1:
            raise ValueError(f"spec_draft_share must be in (0, 1], got {self.spec_draft_share}")

    def rules(self) -> Rules:
        """The scheduling rules these settings give (labs/sim/rules.py)."""
        return Rules(
            block_size=self.block_size,
            token_budget=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            chunked_prefill=self.chunked_prefill,
            paged=self.kv_allocation == "paged",
            num_spec_tokens=self.num_spec_tokens,
            spec_draft_share=self.spec_draft_share,
        )


@dataclass
class SchedulerOutput:
    """What one step computes: running requests first, then the newly admitted ones.

    `num_scheduled_tokens` counts drafts too. The totals are what the cost model prices.
    """

    req_indices: np.ndarray
    num_scheduled_tokens: np.ndarray
    num_draft_tokens: np.ndarray
    num_computed_before: np.ndarray  # KV tokens each sequence held before the step
    num_prefill_tokens: int = 0  # prompt and recompute tokens
    num_decode_tokens: int = 0  # decode tokens, drafts included
    kv_tokens_read: int = 0  # KV the step's attention reads, summed over sequences
    num_spec_seqs: int = 0  # sequences verifying drafts
    spec_kv_tokens_read: int = 0  # KV those sequences hold
    max_num_draft_tokens: int = 0
    preempted: list[int] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    def as_dict(self) -> dict[int, int]:
        """{request index: tokens scheduled}, in schedule order."""
        return dict(zip(self.req_indices.tolist(), self.num_scheduled_tokens.tolist(), strict=True))


@dataclass
class StepResult:
    """What a step produced: tokens per request that sampled, and the requests that finished."""

    emitted: np.ndarray
    num_emitted_tokens: np.ndarray
    finished: np.ndarray


@dataclass
class SimCounters:
    """The run's totals as the scheduler counts them: every one known (EngineCounters allows
    None for a counter a vLLM server did not report)."""

    num_gpu_blocks: int
    block_size: int
    preemptions: int = 0
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    def engine_counters(self) -> EngineCounters:
        """The totals for the run record."""
        return EngineCounters(**asdict(self))


class Scheduler:
    """FCFS token-budget scheduler over one replica's KV pool.

    Args:
        config: budget, caps, KV pool and feature switches.
        table: the run's requests (the scheduler updates their counters).
        rng: draws draft acceptance (and, below a draft share of 1, which sequences draft);
            the only randomness in a step.
    """

    def __init__(self, config: SchedulerConfig, table: RequestTable, rng: np.random.Generator):
        self.config = config
        self.rules = config.rules()
        self.table = table
        self.rng = rng
        contiguous = config.kv_allocation == "contiguous"
        self.pool = BlockPool(config.num_gpu_blocks, enable_caching=config.prefix_caching)
        self.kv = KVCacheManager(self.pool, table, config.block_size, contiguous=contiguous)
        self.waiting: deque[int] = deque()
        self.running: np.ndarray = _EMPTY  # request indices, oldest admission first
        self.counters = SimCounters(
            num_gpu_blocks=config.num_gpu_blocks, block_size=config.block_size
        )

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or len(self.running) > 0

    def add_request(self, idx: int, arrival_s: float) -> None:
        """A request arrives and joins the back of the waiting queue."""
        self.table.arrival_s[idx] = arrival_s
        self.table.status[idx] = RequestStatus.WAITING
        self.waiting.append(idx)

    def schedule(self) -> SchedulerOutput:
        """Decide the next step's batch and take the KV blocks it needs."""
        budget = self.config.max_num_batched_tokens
        out = self._schedule_running(budget)
        if ADMITS_AFTER_PREEMPTION or not out.preempted:
            self._schedule_waiting(out, budget - out.total_num_scheduled_tokens)
        return out

    def _schedule_running(self, budget: int) -> SchedulerOutput:
        run, t, rules = self.running, self.table, self.rules
        computed = t.num_computed_tokens[run]
        output = t.num_output_tokens[run]
        prompt = t.num_prompt_tokens[run]
        gap = prompt + output - computed
        decoding = is_decoding(prompt, output, computed)
        want = gap
        if rules.num_spec_tokens:
            proposes = decoding
            if rules.draws_who_drafts:
                # NOTE: drawn only then, so that a run drafting every step draws what it did.
                proposes = decoding & (self.rng.random(len(run)) < rules.spec_draft_share)
            drafts = rules.draft_tokens(output, t.num_output_tokens_target[run])
            want = gap + np.where(proposes, drafts, 0)
        num_new = budget_shares(want, budget)
        m = int(np.count_nonzero(num_new))
        need = rules.blocks_to_grow(computed[:m] + num_new[:m], t.num_blocks[run[:m]])
        preempted = self._allocate_running(run, need)
        m = min(m, len(self.running))
        num_new, computed, decoding = num_new[:m], computed[:m], decoding[:m]
        drafts = np.maximum(num_new - gap[:m], 0)
        decode_tokens = int(num_new[decoding].sum())
        spec = drafts > 0
        return SchedulerOutput(
            req_indices=run[:m],
            num_scheduled_tokens=num_new,
            num_draft_tokens=drafts,
            num_computed_before=computed,
            num_prefill_tokens=int(num_new.sum()) - decode_tokens,
            num_decode_tokens=decode_tokens,
            kv_tokens_read=int(computed.sum()),
            num_spec_seqs=int(np.count_nonzero(spec)),
            spec_kv_tokens_read=int(computed[spec].sum()),
            max_num_draft_tokens=int(drafts.max(initial=0)),
            preempted=preempted,
        )

    def _allocate_running(self, run: np.ndarray, need: np.ndarray) -> list[int]:
        """Give the scheduled running requests (a prefix of `run`) the blocks they `need`,
        preempting from the newest end of `run` when the pool runs out.

        Returns:
            The preempted requests, newest first; `self.running` loses them.
        """
        needy = np.flatnonzero(need > 0)
        if not needy.size:
            return []
        if blocks_fit(int(need[needy].sum()), self.pool.num_free_blocks):
            self.kv.allocate(run[needy], need[needy])
            return []  # everyone's blocks fitted at once: nothing to preempt
        tail, preempted = len(run), []
        for i in needy.tolist():
            if i >= tail:
                break
            while not blocks_fit(int(need[i]), self.pool.num_free_blocks):
                # NOTE: victims come from the tail, which has not been given blocks this step;
                # a request that finds itself at the tail preempts itself.
                tail -= 1
                preempted.append(int(run[tail]))
                self._preempt(int(run[tail]))
                if tail == i:
                    break
            else:
                self.kv.allocate(run[i : i + 1], need[i : i + 1])
        self.running = run[:tail]
        return preempted

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        rules, t, kv = self.rules, self.table, self.kv
        num_running = len(self.running)
        admitted: list[int] = []
        num_new_list: list[int] = []
        cached_list: list[int] = []
        while self.waiting and rules.admission_open(num_running, budget):
            idx = self.waiting[0]
            num_tokens = int(t.num_tokens(idx))
            hits = kv.get_computed_blocks(idx)
            num_cached = len(hits) * rules.block_size
            recompute = bool(t.num_output_tokens[idx] > 0)
            num_new = rules.admission_chunk(num_tokens - num_cached, budget, recompute)
            if not num_new:
                break
            need = rules.admission_need(
                num_tokens, len(hits), kv.num_evictable(hits), kv.blocks_to_reserve(idx)
            )
            if not blocks_fit(need, self.pool.num_free_blocks):
                break
            kv.admit(idx, hits, num_new)
            self.waiting.popleft()
            self.note_admitted(idx, num_tokens, num_cached)
            admitted.append(idx)
            num_new_list.append(num_new)
            cached_list.append(num_cached)
            budget -= num_new
            num_running += 1
        if not admitted:
            return
        new_idx = np.array(admitted, dtype=np.int64)
        new_tokens = np.array(num_new_list, dtype=np.int64)
        new_cached = np.array(cached_list, dtype=np.int64)
        self.running = np.concatenate([self.running, new_idx])
        out.req_indices = np.concatenate([out.req_indices, new_idx])
        out.num_scheduled_tokens = np.concatenate([out.num_scheduled_tokens, new_tokens])
        out.num_draft_tokens = np.concatenate([out.num_draft_tokens, np.zeros_like(new_idx)])
        out.num_computed_before = np.concatenate([out.num_computed_before, new_cached])
        out.num_prefill_tokens += int(new_tokens.sum())
        out.kv_tokens_read += int(new_cached.sum())

    def note_admitted(self, idx: int, num_tokens: int, num_cached: int) -> None:
        """Count an admission of request `idx` with `num_tokens` known tokens, `num_cached` of
        them prefix-cache hits, and mark it running (steady steps admit through this too)."""
        if self.kv.caching:
            # Counted once per admission: the hit rate is the share of looked-up tokens served
            # from the cache.
            self.counters.prefix_cache_queries += num_tokens
            self.counters.prefix_cache_hits += num_cached
        if self.table.num_cached_tokens.item(idx) < 0:
            self.table.num_cached_tokens[idx] = num_cached
        self.table.status[idx] = RequestStatus.RUNNING

    def _preempt(self, idx: int) -> None:
        """Free a running request's blocks and put it at the front of the waiting queue; it
        keeps its output so far and recomputes prompt + output when readmitted."""
        self.kv.free(idx, preempted=True)
        t = self.table
        t.num_computed_tokens[idx] = 0
        t.num_preemptions[idx] += 1
        t.status[idx] = RequestStatus.WAITING
        self.counters.preemptions += 1
        self.waiting.appendleft(idx)

    def update_from_output(self, out: SchedulerOutput, now_s: float) -> StepResult:
        """Apply a finished step at virtual time `now_s`.

        Returns:
            The requests that sampled tokens (and how many each), and those that finished.
        """
        idx, t = out.req_indices, self.table
        if idx.size == 0:
            return StepResult(_EMPTY, _EMPTY, _EMPTY)
        computed = t.num_computed_tokens[idx] + out.num_scheduled_tokens
        sampled = samples(computed, t.num_prompt_tokens[idx] + t.num_output_tokens[idx])
        new_tokens = sampled.astype(np.int64)
        if out.max_num_draft_tokens:
            spec = out.num_draft_tokens > 0
            drafts = out.num_draft_tokens[spec]
            # Each draft is accepted with chance alpha until the first rejection.
            p_reject = 1.0 - self.config.spec_acceptance
            accepted = np.minimum(self.rng.geometric(p_reject, size=drafts.size) - 1, drafts)
            computed[spec] -= drafts - accepted  # rejected drafts' KV slots are dropped
            new_tokens[spec] += accepted
            self.counters.spec_drafts += int(drafts.size)
            self.counters.spec_draft_tokens += int(drafts.sum())
            self.counters.spec_accepted_tokens += int(accepted.sum())
        t.num_computed_tokens[idx] = computed
        t.num_output_tokens[idx] += new_tokens
        self.kv.cache_full_blocks(idx)
        done = sampled & finishes(t.num_output_tokens[idx], t.num_output_tokens_target[idx])
        finished = idx[done]
        if finished.size:
            for r in finished.tolist():
                self.kv.free(r)
            t.status[finished] = RequestStatus.FINISHED
            t.finish_s[finished] = now_s
            self.running = self.running[t.status[self.running] == RequestStatus.RUNNING]
        return StepResult(idx[sampled], new_tokens[sampled], finished)
