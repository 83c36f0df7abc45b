"""The event loop: one engine replica in virtual time.

Two kinds of event drive it: a request is issued (at its intended time, or, in a closed loop,
when a slot frees up), and a step ends. The engine is busy whenever it has requests; a step's
tokens all appear at the step's end, and a request issued during a step waits for the next.

    t ->  |step 1 ...|step 2 ....|  idle  |step 3 ..|
    issue  r0 r1 r2      r3                r4

The clock only moves forward by step times (from the cost model) or by jumping over idle gaps
to the next issue time. Nothing here reads the wall clock except `wall_s` and the throttle of
the progress callback, so a seed fixes the result.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from labs.backends.base import EngineSample, RequestRecord, RunRecord
from labs.predict import blocks_for_tokens
from labs.sim.breakdown import BreakdownAccumulator
from labs.sim.cost_model import CostModel, step_parts_s
from labs.sim.entities import RequestTable, SimRequest
from labs.sim.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, StepResult
from labs.sim.workload import GeneratedWorkload

WHERE = "simulated on CPU"


class SimConfigError(ValueError):
    """The run cannot be simulated as configured. `field` names the lab parameter to change."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass
class StepInfo:
    """One step, for observers (tests check invariants on every step with it)."""

    start_s: float
    end_s: float
    output: SchedulerOutput
    result: StepResult
    num_blocks_used: int  # during the step, before finished requests freed theirs
    scheduler: Scheduler


class _SampleRecorder:
    """Engine samples, one per step until `max_samples`; then neighbours are merged pairwise and
    each sample stands for twice as many steps.

    NOTE: a merged sample holds the earlier time and the maxima of running, waiting and KV
    usage over the steps it stands for (like an oscilloscope's peak detect), so the peaks that
    `max_running_seqs` and `kv_usage_peak` read survive thinning exactly.
    """

    def __init__(self, max_samples: int) -> None:
        self.samples: list[EngineSample] = []
        self.max_samples = max(2, max_samples + max_samples % 2)  # even: merged in pairs
        self._stride = 1
        self._pending: EngineSample | None = None
        self._pending_steps = 0

    @staticmethod
    def _peak(a: EngineSample, b: EngineSample) -> EngineSample:
        return EngineSample(
            t_s=a.t_s,
            running=max(a.running, b.running),
            waiting=max(a.waiting, b.waiting),
            kv_usage=max(a.kv_usage, b.kv_usage),
            kv_blocks_used=max(a.kv_blocks_used or 0, b.kv_blocks_used or 0),
        )

    def add(self, sample: EngineSample) -> None:
        self._pending = sample if self._pending is None else self._peak(self._pending, sample)
        self._pending_steps += 1
        if self._pending_steps < self._stride:
            return
        self.samples.append(self._pending)
        self._pending, self._pending_steps = None, 0
        if len(self.samples) >= self.max_samples:
            pairs = zip(self.samples[0::2], self.samples[1::2], strict=False)
            self.samples = [self._peak(a, b) for a, b in pairs]
            self._stride *= 2

    def finish(self) -> list[EngineSample]:
        if self._pending is not None:
            self.samples.append(self._pending)
            self._pending = None
        return self.samples


class _ChunkLog:
    """Every step's streamed chunks, kept as arrays per step and turned into each request's list
    of (time_s, tokens) at the end."""

    def __init__(self, num_requests: int) -> None:
        self._num_chunks = np.zeros(num_requests, dtype=np.int64)
        self._idx: list[np.ndarray] = []
        self._rank: list[np.ndarray] = []  # each chunk's position in its request's list
        self._tokens: list[np.ndarray] = []
        self._times: list[float] = []

    def add(self, t_s: float, idx: np.ndarray, tokens: np.ndarray) -> None:
        self._idx.append(idx)
        self._rank.append(self._num_chunks[idx])
        self._num_chunks[idx] += 1
        self._tokens.append(tokens)
        self._times.append(t_s)

    def chunk_lists(self) -> list[list[tuple[float, int]]]:
        counts = self._num_chunks
        starts = np.cumsum(counts) - counts
        # Scatter every chunk to its place: request by request, in time order within each.
        place = starts[np.concatenate(self._idx)] + np.concatenate(self._rank)
        times = np.empty(int(counts.sum()))
        times[place] = np.repeat(self._times, [len(a) for a in self._idx])
        tokens = np.empty(len(times), dtype=np.int64)
        tokens[place] = np.concatenate(self._tokens)
        pairs = list(zip(times.tolist(), tokens.tolist(), strict=True))
        return [pairs[a : a + n] for a, n in zip(starts.tolist(), counts.tolist(), strict=True)]


class Simulator:
    """Runs a workload through a Scheduler, pricing each step with a cost model.

    Args:
        config: the scheduler's settings and KV pool.
        workload: the requests (lengths and intended arrival times).
        cost_model: seconds per step.
        rng: the randomness of the run itself (draft acceptance).
        on_step: called after every step (tests use it to check invariants).
        on_progress: called with the fraction of requests finished, at most every
            `progress_interval_s` of wall time, and with 1.0 at the end.
        max_samples: engine samples kept at most.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        workload: GeneratedWorkload,
        cost_model: CostModel,
        rng: np.random.Generator,
        *,
        on_step: Callable[[StepInfo], None] | None = None,
        on_progress: Callable[[float], None] | None = None,
        progress_interval_s: float = 0.25,
        max_samples: int = 4096,
    ) -> None:
        self.config = config
        self.workload = workload
        self.cost_model = cost_model
        self.table = RequestTable(
            workload.prompt_tokens,
            workload.output_tokens,
            workload.max_tokens,
            num_shared_prefix_tokens=workload.shared_prefix_tokens,
        )
        self._check_fits()
        self.scheduler = Scheduler(config, self.table, rng)
        self.breakdown = BreakdownAccumulator(self.table)
        self.on_step = on_step
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        self.max_samples = max_samples
        self.num_steps = 0

    def _check_fits(self) -> None:
        """Every request must fit the pool on its own, or the engine could never finish it."""
        cfg, t = self.config, self.table
        if cfg.kv_allocation == "contiguous":
            longest = int((t.num_prompt_tokens + t.max_tokens).max())
            what = "prompt + max_tokens"
        else:
            longest = int((t.num_prompt_tokens + t.num_output_tokens_target).max())
            what = "prompt + output"
        if blocks_for_tokens(longest, cfg.block_size) > cfg.num_gpu_blocks:
            raise SimConfigError(
                "kv_capacity_tokens",
                f"kv_capacity_tokens must hold the longest request ({what} = {longest:,} tokens),"
                f" got {cfg.num_gpu_blocks * cfg.block_size:,}",
            )

    def request(self, idx: int) -> SimRequest:
        return SimRequest(self.table, idx, f"sim-{idx}")

    def run(self) -> RunRecord:
        """Simulate until every request has finished.

        Returns:
            The run record: per-request chunks at step ends, engine samples, counters.
        """
        # NOTE: a run allocates some 10^5-10^6 small objects (arrays per step, a tuple per
        # chunk), none of which can form a reference cycle; the cyclic collector would only
        # rescan them over and over (about 15% of the run), so it is paused until the end.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if was_enabled:
                gc.enable()

    def _run(self) -> RunRecord:
        wall_start = time.perf_counter()
        sched, table, wl = self.scheduler, self.table, self.workload
        n = wl.num_requests
        intended = wl.intended_arrival_s.tolist()
        # Closed loop: the times at which each of the client's slots became free.
        slots: list[float] | None = None
        if wl.max_concurrency is not None:
            slots = [0.0] * min(wl.max_concurrency, n)
        recorder = _SampleRecorder(self.max_samples)
        chunks = _ChunkLog(n)
        now, next_req, num_finished = 0.0, 0, 0
        last_progress = wall_start
        while num_finished < n:
            while next_req < n and intended[next_req] <= now and (slots is None or slots):
                slot_s = heapq.heappop(slots) if slots is not None else 0.0
                sched.add_request(next_req, max(intended[next_req], slot_s))
                next_req += 1
            if not sched.has_unfinished_requests():
                now = max(now, intended[next_req])  # idle until the next request is issued
                continue
            out = sched.schedule()
            if out.req_indices.size == 0:
                raise RuntimeError("the scheduler found nothing to run: the simulation is stuck")
            blocks_used = sched.pool.num_used_blocks
            recorder.add(
                EngineSample(
                    t_s=now,
                    running=sched.num_running,
                    waiting=sched.num_waiting,
                    kv_usage=blocks_used / sched.pool.num_blocks,
                    kv_blocks_used=blocks_used,
                )
            )
            start = now
            parts, prefill_share = step_parts_s(self.cost_model, out)
            self.breakdown.add_step(out, parts, prefill_share, start)
            now += float(parts.sum())
            result = sched.update_from_output(out, now)
            self.num_steps += 1
            if result.emitted.size:
                chunks.add(now, result.emitted, result.num_emitted_tokens)
            if result.finished.size:
                num_finished += int(result.finished.size)
                if slots is not None:
                    for _ in range(int(result.finished.size)):
                        heapq.heappush(slots, now)
                if self.on_progress is not None:
                    wall = time.perf_counter()
                    if wall - last_progress >= self.progress_interval_s:
                        self.on_progress(num_finished / n)
                        last_progress = wall
            if self.on_step is not None:
                self.on_step(StepInfo(start, now, out, result, blocks_used, sched))
        if self.on_progress is not None:
            self.on_progress(1.0)
        requests = self._request_records(chunks.chunk_lists())
        arrival_start = float(np.nanmin(table.arrival_s))
        breakdown = self.breakdown.summary(requests, "simulated")
        return RunRecord(
            backend="sim",
            where=WHERE,
            simulated=True,
            requests=requests,
            samples=recorder.finish(),
            counters=sched.counters,
            duration_s=float(np.nanmax(table.finish_s)) - arrival_start,
            wall_s=time.perf_counter() - wall_start,
            meta={"steps": self.num_steps, "breakdown": breakdown},
        )

    def _request_records(self, chunks: list[list[tuple[float, int]]]) -> list[RequestRecord]:
        t = self.table
        return [
            RequestRecord(
                req_id=f"sim-{i}",
                prompt_tokens=int(t.num_prompt_tokens[i]),
                max_tokens=int(t.num_output_tokens_target[i]),
                arrival_s=float(t.arrival_s[i]),
                chunks=chunks[i],
                finish_s=float(t.finish_s[i]),
                cached_prompt_tokens=max(0, int(t.num_cached_tokens[i])),
                preemptions=int(t.num_preemptions[i]),
            )
            for i in range(len(t))
        ]
