"""The run record every lab backend returns (docs/run-record.md), and the Backend interface.

Times are seconds from the start of the run: virtual time for the simulator, `time.monotonic()`
for vLLM. `to_dict()` / `from_dict()` give plain JSON-safe dicts for the `LabRun` row.

Pure Python: no Django, so the simulator and a GPU worker can build records anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np

if TYPE_CHECKING:
    from labs.parameters.params import LabParams


@dataclass(frozen=True)
class Device:
    """What a worker runs labs on: `count` devices of one `kind` (a catalog GPU such as
    "h100-sxm", "cpu", or a slug of a name the catalog does not know), `memory_bytes` each
    (None when unknown). Each backend's `check_can_start(params, devices)` judges a lab against
    the devices of the online workers (at submit) or its own (on the worker, before a start)."""

    kind: str
    count: int
    memory_bytes: int | None = None
    # What a new engine can have now: the memory less what the machine's other processes hold
    # (a CPU worker's RAM is shared with them; a GPU's memory is its own). None: not known.
    available_bytes: int | None = None
    # The engine's own processes, besides its weights and KV cache, as the worker measured
    # them at its engine's last start. None: not measured.
    engine_bytes: int | None = None

    @classmethod
    def from_announced(cls, gpus: Mapping[str, Any] | None) -> Device | None:
        """The device a heartbeat row's inventory describes (labs.runs.workers), or None if it
        announced none."""
        gpus = gpus or {}
        kind, count = gpus.get("kind") or gpus.get("name"), gpus.get("count")
        if not kind or not isinstance(count, int) or count < 1:
            return None

        def size(key: str) -> int | None:
            value = gpus.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            str(kind),
            count,
            size("memory_bytes"),
            available_bytes=size("available_bytes"),
            engine_bytes=size("engine_bytes"),
        )


@dataclass(frozen=True)
class Placement:
    """Where a run goes: `count` devices of `kind` (labs.runs.workers routes it to a queue that only
    workers with at least that many consume)."""

    kind: str
    count: int


class BackendError(RuntimeError):
    """A backend could not run the lab (its engine is missing, died or never got healthy). The
    message says why in a sentence a learner can act on; the run is marked failed with it."""


class Chunks:
    """A request's streamed chunks: two numpy columns, `times_s` (float64) and `tokens` (int32).

    It behaves like the list of (time_s, tokens) pairs it replaces (len, iteration, indexing,
    `append`, equality with a list), so a load generator can append as chunks arrive; but a run
    of 10^5 requests x 10^3 tokens stays 12 bytes a chunk instead of a Python tuple each, and the
    metrics read the columns directly.
    """

    __slots__ = ("_times", "_tokens", "_pending")

    def __init__(
        self,
        pairs: Iterable[tuple[float, int]] | None = None,
        *,
        times_s: np.ndarray | None = None,
        tokens: np.ndarray | None = None,
    ) -> None:
        if times_s is None:
            items = list(pairs or [])
            times_s = np.array([float(t) for t, _ in items], dtype=np.float64)
            tokens = np.array([int(n) for _, n in items], dtype=np.int32)
        elif tokens is None or len(tokens) != len(times_s):
            raise ValueError("times_s and tokens need one value per chunk")
        self._times: np.ndarray = times_s
        self._tokens: np.ndarray = tokens
        self._pending: list[tuple[float, int]] = []

    @classmethod
    def of_columns(cls, times_s: np.ndarray, tokens: np.ndarray) -> Chunks:
        """Wrap two equally long columns without copying or checking them (hot path)."""
        self = cls.__new__(cls)
        self._times, self._tokens, self._pending = times_s, tokens, []
        return self

    def _flush(self) -> None:
        if self._pending:
            times, tokens = zip(*self._pending, strict=True)
            self._times = np.concatenate([self._times, np.array(times, dtype=np.float64)])
            self._tokens = np.concatenate([self._tokens, np.array(tokens, dtype=np.int32)])
            self._pending = []

    @property
    def times_s(self) -> np.ndarray:
        self._flush()
        return self._times

    @property
    def tokens(self) -> np.ndarray:
        self._flush()
        return self._tokens

    def append(self, chunk: tuple[float, int]) -> None:
        self._pending.append((float(chunk[0]), int(chunk[1])))

    def __len__(self) -> int:
        return len(self._times) + len(self._pending)

    def __iter__(self) -> Iterator[tuple[float, int]]:
        return iter(zip(self.times_s.tolist(), self.tokens.tolist(), strict=True))

    @overload
    def __getitem__(self, i: int) -> tuple[float, int]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[float, int]]: ...

    def __getitem__(self, i: int | slice) -> tuple[float, int] | list[tuple[float, int]]:
        if isinstance(i, slice):  # a list of pairs, as slicing the old list gave
            times, tokens = self.times_s[i].tolist(), self.tokens[i].tolist()
            return list(zip(times, tokens, strict=True))
        return float(self.times_s[i]), int(self.tokens[i])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chunks):
            return bool(
                np.array_equal(self.times_s, other.times_s)
                and np.array_equal(self.tokens, other.tokens)
            )
        if isinstance(other, list | tuple):
            return list(self) == [(float(t), int(n)) for t, n in other]
        return NotImplemented

    def __repr__(self) -> str:
        return f"Chunks({list(self)!r})"

    def to_list(self) -> list[list[float | int]]:
        """[[time_s, tokens], ...] for JSON."""
        return [[t, n] for t, n in self]


@dataclass(eq=True)
class RequestRecord:
    """One request as the client saw it. `chunks` may be given as a list of (time_s, tokens)
    pairs; it is kept as `Chunks` (numpy columns)."""

    req_id: str
    prompt_tokens: int
    max_tokens: int  # output tokens asked for (ignore_eos, so normally all produced)
    arrival_s: float  # when the request was issued (client side) / arrived (sim)
    chunks: Chunks  # every streamed chunk: (time_s, tokens in that chunk), in order
    finish_s: float | None  # last chunk / completion; None if it failed before finishing
    error: str | None = None  # why it failed ("HTTP 500: ...", "stream cut after 37 tokens")
    cached_prompt_tokens: int = 0  # prefix-cache hit, where the backend knows it
    preemptions: int = 0  # where the backend knows it
    # vLLM: just before the POST, as `vllm bench serve` stamps its start (arrival_s is the
    # socket's first byte); bench's TTFT is measured from here. None for the simulator.
    issued_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chunks, Chunks):
            self.chunks = Chunks(self.chunks)

    @property
    def first_token_s(self) -> float | None:
        return float(self.chunks.times_s[0]) if len(self.chunks) else None

    @property
    def output_tokens(self) -> int:
        return int(self.chunks.tokens.sum())


@dataclass
class EngineSample:
    """Engine state at one moment (sim: every step or every N ms; vLLM: /metrics polls)."""

    t_s: float
    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV pool in use
    kv_blocks_used: int | None = None
    # Tokens the step computed (prompt chunks, decodes, drafts): what the step's token budget
    # caps. The simulator knows it; vLLM's gauges do not say it (None).
    scheduled_tokens: int | None = None


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
    # The engine's own time from queueing each request to its first token (vLLM's queue-time
    # and prefill-time histograms), summed over the requests it finished in the run, and their
    # count: a client's TTFT less this is the API server's time (labs.calibration.sweep).
    engine_first_token_s: float | None = None
    engine_requests: int | None = None


@dataclass
class RunRecord:
    """Everything one backend run produced; `labs.measurement.metrics.summarize` turns it into
    numbers."""

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
        requests = self.requests
        self.requests = []
        try:
            data = asdict(self)
        finally:
            self.requests = requests
        data["requests"] = [
            {
                "req_id": r.req_id,
                "prompt_tokens": r.prompt_tokens,
                "max_tokens": r.max_tokens,
                "arrival_s": r.arrival_s,
                "chunks": r.chunks.to_list(),
                "finish_s": r.finish_s,
                "error": r.error,
                "cached_prompt_tokens": r.cached_prompt_tokens,
                "preemptions": r.preemptions,
                "issued_s": r.issued_s,
            }
            for r in requests
        ]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """The inverse of `to_dict()`."""
        requests = [
            RequestRecord(**{**req, "chunks": Chunks((t, n) for t, n in req["chunks"])})
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


@dataclass(frozen=True)
class Phase:
    """What a run is doing besides serving its requests, for the run page. A backend that starts
    an engine says so while it waits (step "starting", with the seconds so far), then how it got
    one (step "ready": started, or a running one reused). The simulator never reports one."""

    step: str  # "starting" | "ready"
    engine: str  # "vLLM"
    why: str = ""  # why it starts: "first run on this worker", "engine arguments changed", ...
    elapsed_s: float | None = None  # starting: seconds so far; ready: how long the start took
    last_start_s: float | None = None  # starting: how long this worker's previous start took
    reused: bool = False  # ready: a running engine was reused

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "", False)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Phase | None:
        """The phase a stored dict describes, or None (empty, or not one: a stale row)."""
        if not data or data.get("step") not in ("starting", "ready"):
            return None
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        try:
            return cls(**{"engine": "the engine", **known})
        except TypeError:
            return None

    def note(self) -> str:
        """One sentence for the run page."""
        why = f" ({self.why})" if self.why else ""
        if self.step == "starting":
            text = f"Starting {self.engine}{why}"
            if self.elapsed_s is not None:
                text += f": {self.elapsed_s:.0f} s so far"
            if self.last_start_s is not None:
                text += f"; the last start on this worker took {self.last_start_s:.0f} s"
            return text + "."
        if self.reused:
            return f"{self.engine} ready: reused the running server{why}."
        if self.elapsed_s is not None:
            return f"{self.engine} ready: started in {self.elapsed_s:.0f} s{why}."
        return f"{self.engine} ready{why}."


class ProgressCallback(Protocol):
    """`on_progress(fraction)` as requests finish; `on_progress(fraction, phase)` while the
    backend does something else first (starts its engine)."""

    def __call__(self, fraction: float, phase: Phase | None = None) -> None: ...


class ServedInstead(Protocol):
    """A run on a server that served another model than the one submitted: the settings to
    expect its numbers for (the lab's, with the served model), or why there are none."""

    @property
    def params(self) -> LabParams | None: ...

    @property
    def no_prediction(self) -> str | None: ...


class Backend(Protocol):
    """A way to run a lab. `on_progress(fraction)` gets 0..1 as requests finish (at most a few
    times a second), and a `Phase` while the backend gets its engine ready. A backend never
    touches the database."""

    name: str  # "sim" | "vllm"

    def run(self, params: LabParams, on_progress: ProgressCallback | None = None) -> RunRecord: ...
