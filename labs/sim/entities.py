"""Requests of one simulated run.

The scheduler updates a whole batch per step, so the per-request counters live in numpy columns
of a `RequestTable` (row i = request i); a `SimRequest` is a named view of one row, for tests and
for building the run record.

Token accounting follows vLLM's V1 scheduler: a request holds `num_tokens` = prompt + output
tokens so far, of which `num_computed_tokens` have their KV in the cache. Each step closes part
of that gap; a step that closes it samples one new token (plus any accepted drafts).

    prompt (num_prompt_tokens)        output (num_output_tokens)
    |p p p p p p p p p p p p p p p p p|o o o o|
    |<------- num_computed_tokens ------->|      <- computed so far (a decode: all but the last)
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class RequestStatus(IntEnum):
    PENDING = 0  # the client has not issued it yet
    WAITING = 1  # in the waiting queue: new, or preempted and waiting to be recomputed
    RUNNING = 2
    FINISHED = 3


class RequestTable:
    """Per-request counters of one run, as numpy columns indexed by request index.

    Args:
        num_prompt_tokens: prompt length of each request.
        num_output_tokens_target: tokens each request generates before it stops.
        max_tokens: each request's cap on output tokens (what a contiguous allocator reserves).
        num_shared_prefix_tokens: leading prompt tokens identical in every request.
    """

    def __init__(
        self,
        num_prompt_tokens: np.ndarray,
        num_output_tokens_target: np.ndarray,
        max_tokens: np.ndarray,
        num_shared_prefix_tokens: int = 0,
    ) -> None:
        n = len(num_prompt_tokens)
        self.num_prompt_tokens = np.asarray(num_prompt_tokens, dtype=np.int64)
        self.num_output_tokens_target = np.asarray(num_output_tokens_target, dtype=np.int64)
        self.max_tokens = np.asarray(max_tokens, dtype=np.int64)
        if not (len(self.num_output_tokens_target) == len(self.max_tokens) == n):
            raise ValueError("every column needs one value per request")
        if n and (self.num_prompt_tokens.min() < 1 or self.num_output_tokens_target.min() < 1):
            raise ValueError("prompts and outputs need at least one token")
        if n and (self.max_tokens < self.num_output_tokens_target).any():
            raise ValueError("max_tokens must cover each request's output")
        self.num_shared_prefix_tokens = num_shared_prefix_tokens
        self.status = np.zeros(n, dtype=np.int8)
        self.arrival_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.num_computed_tokens = np.zeros(n, dtype=np.int64)
        self.num_output_tokens = np.zeros(n, dtype=np.int64)
        # Blocks in the request's block table, and how many of them (from the start) are full
        # and registered in the prefix cache.
        self.num_blocks = np.zeros(n, dtype=np.int64)
        self.num_cached_blocks = np.zeros(n, dtype=np.int64)
        # Prompt tokens found in the prefix cache at first admission (-1: not admitted yet).
        self.num_cached_tokens = np.full(n, -1, dtype=np.int64)
        self.num_preemptions = np.zeros(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.num_prompt_tokens)

    def num_tokens(self, idx: int | np.ndarray) -> int | np.ndarray:
        """Prompt plus output tokens so far."""
        return self.num_prompt_tokens[idx] + self.num_output_tokens[idx]


class SimRequest:
    """A read-only view of request `index` in a RequestTable."""

    __slots__ = ("index", "req_id", "_table")

    def __init__(self, table: RequestTable, index: int, req_id: str) -> None:
        self._table = table
        self.index = index
        self.req_id = req_id

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.req_id}, {self.status.name}, prompt={self.num_prompt_tokens}, "
            f"computed={self.num_computed_tokens}, output={self.num_output_tokens})"
        )

    @property
    def status(self) -> RequestStatus:
        return RequestStatus(int(self._table.status[self.index]))

    @property
    def arrival_s(self) -> float:
        return float(self._table.arrival_s[self.index])

    @property
    def finish_s(self) -> float | None:
        value = float(self._table.finish_s[self.index])
        return None if np.isnan(value) else value

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._table.num_prompt_tokens[self.index])

    @property
    def num_output_tokens_target(self) -> int:
        return int(self._table.num_output_tokens_target[self.index])

    @property
    def max_tokens(self) -> int:
        return int(self._table.max_tokens[self.index])

    @property
    def num_computed_tokens(self) -> int:
        return int(self._table.num_computed_tokens[self.index])

    @property
    def num_output_tokens(self) -> int:
        return int(self._table.num_output_tokens[self.index])

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_cached_tokens(self) -> int:
        return max(0, int(self._table.num_cached_tokens[self.index]))

    @property
    def num_preemptions(self) -> int:
        return int(self._table.num_preemptions[self.index])
