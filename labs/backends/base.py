"""The run record every lab backend returns (docs/run-record.md), and the Backend interface.

Times are seconds from the start of the run: virtual time for the simulator, `time.monotonic()`
for vLLM. `to_dict()` / `from_dict()` give plain JSON-safe dicts for the `LabRun` row.

Pure Python: no Django, so the simulator and a GPU worker can build records anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from labs.params import LabParams


class BackendError(RuntimeError):
    """A backend could not run the lab (its engine is missing, died or never got healthy). The
    message says why in a sentence a learner can act on; the run is marked failed with it."""


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    req_id: str
    prompt_tokens: int
    max_tokens: int  # output tokens asked for (ignore_eos, so normally all produced)
    arrival_s: float  # when the request was issued (client side) / arrived (sim)
    chunks: list[
        tuple[float, int]
    ]  # every streamed chunk: (time_s, tokens in that chunk), in order
    finish_s: float | None  # last chunk / completion; None if it failed before finishing
    error: str | None = None  # why it failed ("HTTP 500: ...", "stream cut after 37 tokens")
    cached_prompt_tokens: int = 0  # prefix-cache hit, where the backend knows it
    preemptions: int = 0  # where the backend knows it

    @property
    def first_token_s(self) -> float | None:
        return self.chunks[0][0] if self.chunks else None

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass
class EngineSample:
    """Engine state at one moment (sim: every step or every N ms; vLLM: /metrics polls)."""

    t_s: float
    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV pool in use
    kv_blocks_used: int | None = None


@dataclass
class EngineCounters:
    """Totals over the run (vLLM: /metrics after minus before). None = not reported: the server
    did not expose that counter (no /metrics, or not vLLM's), which is not the same as 0."""

    preemptions: int | None = 0
    prefix_cache_queries: int | None = 0  # tokens looked up
    prefix_cache_hits: int | None = 0  # tokens found
    spec_drafts: int | None = 0
    spec_draft_tokens: int | None = 0
    spec_accepted_tokens: int | None = 0
    num_gpu_blocks: int | None = None
    block_size: int | None = None


@dataclass
class RunRecord:
    """Everything one backend run produced; `labs.metrics.summarize` turns it into numbers."""

    backend: str  # "sim" | "vllm"
    where: str  # "simulated on CPU" | "vLLM 0.33.0 on NVIDIA H100 80GB HBM3"
    simulated: bool
    requests: list[RequestRecord]
    samples: list[EngineSample]
    counters: EngineCounters
    duration_s: float  # what throughput divides by: bench's duration (docs/run-record.md)
    wall_s: float  # real seconds the backend took
    meta: dict[str, Any] = field(default_factory=dict)  # engine args, versions, seed, GPU, ...

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (chunks become [time_s, tokens] lists)."""
        data = asdict(self)
        for req in data["requests"]:
            req["chunks"] = [[t, n] for t, n in req["chunks"]]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """The inverse of `to_dict()`."""
        requests = [
            RequestRecord(**{**req, "chunks": [(float(t), int(n)) for t, n in req["chunks"]]})
            for req in data["requests"]
        ]
        return cls(
            backend=data["backend"],
            where=data["where"],
            simulated=bool(data["simulated"]),
            requests=requests,
            samples=[EngineSample(**s) for s in data["samples"]],
            counters=EngineCounters(**data["counters"]),
            duration_s=float(data["duration_s"]),
            wall_s=float(data["wall_s"]),
            meta=dict(data.get("meta") or {}),
        )


ProgressCallback = Callable[[float], None]


class Backend(Protocol):
    """A way to run a lab. `on_progress(fraction)` gets 0..1 as requests finish (at most a few
    times a second). A backend never touches the database."""

    name: str  # "sim" | "vllm"

    def run(self, params: LabParams, on_progress: ProgressCallback) -> RunRecord: ...
