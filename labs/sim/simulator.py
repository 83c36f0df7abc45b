"""The event loop: one engine replica in virtual time.

Two kinds of event drive it: a request is issued (at its intended time, or, in a closed loop,
when a slot frees up) and reaches the engine after the front end's latency (0 unless a device's
own calibration measured it), and a step ends. The engine is busy whenever it has requests; a
step's tokens all appear at the step's end, and a request arriving during a step waits for the
next.

    t ->  |step 1 ...|step 2 ....|  idle  |step 3 ..|
    issue  r0 r1 r2      r3                r4

The clock only moves forward by step times (from the cost model) or by jumping over idle gaps
to the next issue time. Nothing here reads the wall clock except `wall_s` and the throttle of
the progress callback, so a seed fixes the result.

A step is taken one of three ways, all by the same scheduling rules (labs/sim/rules.py) and
giving the same record (tests/labs/sim/test_equivalence.py, test_fast_path.py):

- a run of plain decode steps at once (labs/sim/decode_run.py): nothing changes but the KV, so
  the steps are priced in one vectorised call and their tokens written with numpy;
- a steady step (labs/sim/steady.py): decodes kept as sums, only changing requests touched;
- one step through the scheduler, for everything else, and always with `step_by_step=True`.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from labs.backends.base import RequestRecord, RunRecord
from labs.prediction.predict import blocks_for_tokens
from labs.sim.breakdown import BreakdownAccumulator
from labs.sim.cost_model import CostModel, step_parts_s
from labs.sim.decode_run import advance_decode_run
from labs.sim.engine_model import OVERHEAD
from labs.sim.entities import RequestTable, SimRequest
from labs.sim.recording import ChunkStore, SampleRecorder
from labs.sim.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, StepResult
from labs.sim.steady import LoopState, advance_steady
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
        step_by_step: schedule every step on its own instead of advancing runs of plain decode
            steps at once (the same record either way; tests compare the two). `on_step` sees
            only the steps taken one at a time.
        frontend_latency_s: the API server's time per request, off the engine: the engine sees
            each request this long after its client sent it (`LoopState.next_arrival_s`).
        frontend_per_stream_s: what each other request in the engine adds to that time.
        frontend_cpu_s: the front end's CPU time per request that a busy engine loses: where
            the API server and the client share the cores of the engine's scheduler (a CPU
            worker), a request handed to an engine that is running others lengthens its next
            step by this much; a lone request's front end runs while the engine idles, and
            costs it nothing. 0 where the front end has cores of its own (a GPU worker).
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
        step_by_step: bool = False,
        frontend_latency_s: float = 0.0,
        frontend_per_stream_s: float = 0.0,
        frontend_cpu_s: float = 0.0,
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
        self.frontend_latency_s = frontend_latency_s
        self.frontend_per_stream_s = frontend_per_stream_s
        self.frontend_cpu_s = frontend_cpu_s
        self.breakdown = BreakdownAccumulator(self.table, frontend_latency_s)
        self.on_step = on_step
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        self.max_samples = max_samples
        self.step_by_step = step_by_step
        self.num_steps = 0
        self.num_skipped_steps = 0  # steps advanced in runs, without scheduling each
        self.num_steady_steps = 0  # steps taken by labs/sim/steady.py

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
        loop = LoopState(
            now=0.0,
            next_req=0,
            num_finished=0,
            slots=slots,
            last_progress=wall_start,
            frontend_latency_s=self.frontend_latency_s,
            frontend_per_stream_s=self.frontend_per_stream_s,
            frontend_s=self.breakdown.frontend_s,
            frontend_cpu_s=self.frontend_cpu_s,
        )
        recorder = SampleRecorder(self.max_samples, sched.pool.num_blocks)
        chunks = ChunkStore(table.num_output_tokens_target)
        fast = not self.step_by_step
        cost = self.cost_model
        while loop.num_finished < n:
            loop.admit_arrivals(sched, intended)
            if not sched.has_unfinished_requests():
                due = loop.next_arrival_s(intended)
                assert due is not None  # nothing in the engine: every slot is free
                loop.now = max(loop.now, due)  # idle until the next request reaches it
                continue
            # A step that owes the front end's CPU time is taken on its own, which charges it.
            if fast and not loop.contention_due_s:
                # An arrival can only come in before a step if there is a slot for it.
                next_arrival = loop.next_arrival_s(intended)
                before = loop.now
                loop.now = advance_decode_run(self, loop.now, next_arrival, recorder, chunks)
                if loop.now != before:
                    continue
                steady = advance_steady(self, loop, recorder, chunks)
                if steady:
                    self.num_steady_steps += steady
                    continue
            out = sched.schedule()
            if out.req_indices.size == 0:
                raise RuntimeError("the scheduler found nothing to run: the simulation is stuck")
            blocks_used = sched.pool.num_used_blocks
            recorder.add(
                loop.now,
                sched.num_running,
                sched.num_waiting,
                blocks_used,
                out.total_num_scheduled_tokens,
            )
            start = loop.now
            parts, prefill_share = step_parts_s(cost, out)
            if loop.contention_due_s:
                parts[OVERHEAD] += loop.take_contention_s()
            self.breakdown.add_step(out, parts, prefill_share, start)
            loop.now += float(parts.sum())
            now = loop.now
            result = sched.update_from_output(out, now)
            self.num_steps += 1
            if result.emitted.size:
                chunks.add(now, result.emitted, result.num_emitted_tokens)
            if result.finished.size:
                loop.num_finished += int(result.finished.size)
                if slots is not None:
                    for _ in range(int(result.finished.size)):
                        heapq.heappush(slots, now)
                if self.on_progress is not None:
                    wall = time.perf_counter()
                    if wall - loop.last_progress >= self.progress_interval_s:
                        self.on_progress(loop.num_finished / n)
                        loop.last_progress = wall
            if self.on_step is not None:
                self.on_step(StepInfo(start, now, out, result, blocks_used, sched))
        if self.on_progress is not None:
            self.on_progress(1.0)
        requests = self._request_records(chunks)
        arrival_start = float(np.nanmin(table.arrival_s))
        breakdown = self.breakdown.summary(requests, "simulated")
        return RunRecord(
            backend="sim",
            where=WHERE,
            simulated=True,
            requests=requests,
            samples=recorder.finish(),
            counters=sched.counters.engine_counters(),
            duration_s=float(np.nanmax(table.finish_s)) - arrival_start,
            wall_s=time.perf_counter() - wall_start,
            meta={
                "steps": self.num_steps,
                "skipped_steps": self.num_skipped_steps,
                "steady_steps": self.num_steady_steps,
                "breakdown": breakdown,
            },
        )

    def _request_records(self, chunks: ChunkStore) -> list[RequestRecord]:
        t = self.table
        columns = zip(
            t.num_prompt_tokens.tolist(),
            t.num_output_tokens_target.tolist(),
            t.arrival_s.tolist(),
            chunks.all_chunks(),
            t.finish_s.tolist(),
            np.maximum(t.num_cached_tokens, 0).tolist(),
            t.num_preemptions.tolist(),
            strict=True,
        )
        return [
            RequestRecord(f"sim-{i}", prompt, target, arrival, c, finish, None, cached, preempted)
            for i, (prompt, target, arrival, c, finish, cached, preempted) in enumerate(columns)
        ]
