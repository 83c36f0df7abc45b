"""Where the time went: each request's end-to-end latency split into additive parts.

The engine model splits every step into parts (labs/sim/engine_model.PARTS: ideal roofline time,
efficiency loss, fixed overheads, communication, speculation). A request's latency is the time
from its issue to its last token, and every moment of it falls in one place:

    issue        first step            first token                        finish
      |--queueing--|==steps it ran in, or waited inside the engine==|=== ... ===|
                    '-------------- TTFT ----------------'---- (n - 1) x TPOT ---'

- queueing: issue to the first step that schedules it (waiting for a slot or a free block);
- a step that schedules it: the step's parts, except that a decoding request whose step also
  carried other requests' prompt tokens counts that extra time as prefill interference;
- a step that recomputes it after a preemption: preemption;
- a step it sat out while running (the token budget went to others): prefill interference, or
  preemption once it has been preempted.

The last kind is found by difference (the request's time in the engine minus the steps that
scheduled it), so the parts add up to each request's E2E exactly. TPOT's parts are the parts after
the first token divided by (output tokens - 1), as labs.measurement.metrics defines TPOT.

`add_step` is called once per step by the simulator; a fast path that advances many decode-only
steps at once calls `add_steps` with the parts of each step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from labs.backends.base import RequestRecord

# The breakdown's parts, in the order a stacked bar shows them (the predictor's parts too).
from labs.prediction.predict import BREAKDOWN_PARTS
from labs.sim.engine_model import PARTS
from labs.sim.entities import RequestTable
from labs.sim.scheduler import SchedulerOutput

PART_LABELS = {
    "ideal": "ideal compute/memory",
    "efficiency": "efficiency loss",
    "overhead": "per-step overhead",
    "frontend": "API server (front end)",
    "communication": "tensor-parallel communication",
    "queueing": "queueing before the first step",
    "prefill_interference": "prefill sharing steps with decodes",
    "preemption": "preemption and recompute",
    "speculation": "speculation (drafts)",
    "unexplained": "unexplained",
}
_STEP = {name: i for i, name in enumerate(PARTS)}


class BreakdownAccumulator:
    """Per-request sums of step parts, before and after each request's first token.

    Args:
        table: the run's requests (read before each step's update).
    """

    def __init__(self, table: RequestTable, frontend_latency_s: float = 0.0) -> None:
        n, p = len(table), len(PARTS)
        self.table = table
        # Charged to each request's TTFT as its own part: the API server's time, not queueing.
        # `frontend_latency_s` for every request unless the event loop writes its own
        # (LoopState.frontend_s, which grows with the requests in flight).
        self.frontend_s = np.full(n, float(frontend_latency_s))
        self.first_start_s = np.full(n, np.nan)
        # [0] before the first token, [1] after it.
        self.steps = np.zeros((2, n, p))
        self.interference = np.zeros((2, n))
        self.preemption = np.zeros((2, n))

    def add_step(
        self, out: SchedulerOutput, parts: np.ndarray, prefill_share_s: float, start_s: float
    ) -> None:
        """Charge one step (its `parts`, summing to its time) to the requests it scheduled.

        Call before `Scheduler.update_from_output`, which this reads the state before.
        """
        idx, t = out.req_indices, self.table
        if idx.size == 0:
            return
        fresh = np.isnan(self.first_start_s[idx])
        self.first_start_s[idx[fresh]] = start_s
        after = (t.num_output_tokens[idx] > 0).astype(np.intp)
        gap = t.num_prompt_tokens[idx] + t.num_output_tokens[idx] - out.num_computed_before
        decoding = (after == 1) & (gap == 1)
        recompute = (t.num_preemptions[idx] > 0) & ~decoding
        own = ~decoding & ~recompute
        step_s = float(parts.sum())
        share = min(prefill_share_s, step_s)
        if decoding.any():
            scale = (step_s - share) / step_s if step_s > 0 else 0.0
            rows = idx[decoding]
            self.steps[1, rows] += parts * scale
            self.interference[1, rows] += share
        if own.any():
            self.steps[after[own], idx[own]] += parts
        if recompute.any():
            self.preemption[after[recompute], idx[recompute]] += step_s

    def add_steps(self, req_indices: np.ndarray, parts: np.ndarray) -> None:
        """Charge a run of decode-only steps (rows of `parts`) to the requests decoding in all
        of them, every one past its first token."""
        self.steps[1, req_indices] += np.asarray(parts).sum(axis=0)

    def per_request(
        self, requests: Sequence[RequestRecord], *, clamp: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """(E2E parts, TPOT parts) per request, columns BREAKDOWN_PARTS; NaN rows for requests
        that did not finish (E2E) or made one token (TPOT).
        """
        e2e, _, tpot = self._per_request(requests, clamp=clamp)
        return e2e, tpot

    def _per_request(
        self, requests: Sequence[RequestRecord], *, clamp: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(E2E parts, TTFT parts, TPOT parts) per request; TTFT's are the parts up to the
        first token, queueing included.

        Parts are clamped at 0, which only hides float rounding (a difference of sums a few ulps
        below zero); `clamp=False` gives them as computed, for the test that checks that.
        """
        floor = 0.0 if clamp else -np.inf
        n = len(requests)
        e2e = np.full((n, len(BREAKDOWN_PARTS)), np.nan)
        ttft = np.full((n, len(BREAKDOWN_PARTS)), np.nan)
        tpot = np.full((n, len(BREAKDOWN_PARTS)), np.nan)
        col = {name: i for i, name in enumerate(BREAKDOWN_PARTS)}
        nan = float("nan")
        arrival = np.array([r.arrival_s for r in requests], dtype=np.float64)
        first = np.array(
            [nan if (f := r.first_token_s) is None else f for r in requests], dtype=np.float64
        )
        finish = np.array(
            [nan if r.finish_s is None else r.finish_s for r in requests], dtype=np.float64
        )
        outputs = np.array([r.output_tokens for r in requests], dtype=np.int64)
        preempted = np.array([bool(r.preemptions) for r in requests], dtype=bool)
        start = self.first_start_s[:n]
        done = ~(np.isnan(finish) | np.isnan(first) | np.isnan(start))
        # NOTE: whole columns at once, each operation the one a per-request loop would do, so
        # every value is the same float (an (n, 8) row sum adds like a row's own sum).
        frontend = self.frontend_s[:n][done]
        queue = start[done] - arrival[done] - frontend
        spans = (first[done] - arrival[done] - queue, finish[done] - first[done])
        rows = []
        for k in (0, 1):
            row = np.zeros((int(done.sum()), len(BREAKDOWN_PARTS)))
            for name, j in _STEP.items():
                row[:, col[name]] = self.steps[k, :n, j][done]
            row[:, col["prefill_interference"]] = self.interference[k, :n][done]
            row[:, col["preemption"]] = self.preemption[k, :n][done]
            if k == 0:
                row[:, col["frontend"]] += frontend
            # Time in the engine when no step scheduled it (budget went to others, or it
            # waited again after a preemption).
            unscheduled = spans[k] - row.sum(axis=1)
            waited = np.where(preempted[done], col["preemption"], col["prefill_interference"])
            row[np.arange(len(row)), waited] += unscheduled
            rows.append(np.maximum(row, floor))
        both = rows[0] + rows[1]
        both[:, col["queueing"]] = np.maximum(queue, floor)
        e2e[done] = both
        before = rows[0].copy()
        before[:, col["queueing"]] = np.maximum(queue, floor)
        ttft[done] = before
        many = outputs[done] > 1
        tpot_rows = np.flatnonzero(done)[many]
        tpot[tpot_rows] = rows[1][many] / (outputs[done][many] - 1)[:, None]
        return e2e, ttft, tpot

    def summary(self, requests: Sequence[RequestRecord], source: str) -> dict[str, Any]:
        """The run's breakdown: mean E2E, mean TTFT and mean TPOT split into BREAKDOWN_PARTS."""
        e2e, ttft, tpot = self._per_request(requests)
        return breakdown_summary(e2e, tpot, source, ttft=ttft)


def breakdown_summary(
    e2e: np.ndarray, tpot: np.ndarray, source: str, *, ttft: np.ndarray | None = None
) -> dict[str, Any]:
    """Means over requests of per-request parts (rows), as stored in the run record."""
    result: dict[str, Any] = {"source": source, "parts": list(BREAKDOWN_PARTS)}
    sections = [("e2e_s", e2e), ("tpot_s", tpot)]
    if ttft is not None:
        sections.append(("ttft_s", ttft))
    for key, rows in sections:
        done = rows[~np.isnan(rows).any(axis=1)]
        if len(done) == 0:
            result[key] = None
            continue
        means = done.mean(axis=0)
        result[key] = {
            "total": float(means.sum()),
            "parts": {name: float(v) for name, v in zip(BREAKDOWN_PARTS, means, strict=True)},
        }
    return result


def largest_part(breakdown: Mapping[str, Any] | None, key: str = "e2e_s") -> tuple[str, float]:
    """(name, share of the total) of the biggest part of `key`, or ("", 0.0)."""
    section = (breakdown or {}).get(key)
    if not section or not section.get("total"):
        return "", 0.0
    name, value = max(section["parts"].items(), key=lambda kv: kv[1])
    return name, value / section["total"]
