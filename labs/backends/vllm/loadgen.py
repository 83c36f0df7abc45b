"""The load generator: a lab's workload as streaming `/v1/completions` requests, timed per chunk.

Measured with `vllm bench serve`'s definitions (vllm-notes.md section 3), client side, except where
said below (TTFT is stamped at the socket; bench's TTFT is kept beside it):

- A request is sent with its prompt as token ids (the server runs with --skip-tokenizer-init),
  `max_tokens` = its output length, `ignore_eos`, the lab's temperature (0, greedy, unless a
  speculative lab sets it), `stream` with usage.
- Its arrival is when its first byte went to the socket; each chunk's time is when its last byte
  reached this machine (see netstream.py). Times are seconds from the start of the run. TTFT is
  therefore stamped at the socket; `issued_s`, taken just before the POST as bench takes its
  start, gives bench's TTFT beside it (connecting and the client's own wait included).
- The body is JSON and says so (`Content-Type: application/json`): vLLM's FastAPI refuses a body
  without that header before vLLM sees it.
- Tokens per chunk are counted from ONE source per request, chosen at its first content chunk:
  that chunk's `token_ids`, else the growth of the running `usage.completion_tokens`
  (continuous_usage_stats, which vLLM sends on every chunk), else 1 per chunk with text. A usage
  that only comes at the end (llama.cpp's server puts it on its last text chunk) is never added on
  top: text chunks counted 1 each take its completion_tokens as the request's total (a text chunk
  may hold several tokens), the tokens they did not show going on the last chunk, so every chunk
  keeps its time and the total is the server's, as bench takes it. With --skip-tokenizer-init
  every chunk's text is empty, so counting text chunks (as bench does) would see nothing; and a
  speculative step sends several tokens in one chunk. `return_token_ids` is not asked for: vLLM
  would echo the whole prompt in the first event, inside TTFT.
- Arrivals and duration follow `vllm bench serve`: the clock starts before the send loop; with a
  finite rate the first request waits its own gap and the gaps are scaled so the last request is
  sent at n / rate; the run lasts until every request has returned, failed ones included.
- A request that fails (HTTP error, a stream cut off, a timeout, an error event) is recorded with
  the reason and the tokens it got; the others carry on.
- Before the run, one unmeasured request (the first planned, under its own cache salt), as
  bench sends its initial test prompt: a fresh server's first request pays one-time costs.

labs/explanation/definitions.py (stored in every run's meta) says so to the learner.

The workload is drawn exactly as the simulator draws it (labs.sim.workload, same seed streams),
so a lab compares the two backends on the same requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from labs.backends.base import Chunks, RequestRecord
from labs.backends.vllm.netstream import timed_client
from labs.parameters.params import Workload
from labs.sim.workload import lab_workload

# Token ids are drawn from this range (capped by the model's vocabulary): clear of the low ids
# some tokenizers reserve for control tokens. With random weights the ids mean nothing anyway.
_TOKEN_LOW, _TOKEN_HIGH = 1000, 32000
_ERROR_SNIPPET = 200


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the workload, before it is sent."""

    req_id: str
    prompt: list[int]
    output_tokens: int
    send_at_s: float  # when the client means to send it, from the start of the run


def plan_requests(work: Workload, *, vocab_size: int | None) -> list[PlannedRequest]:
    """The workload's requests: lengths and arrival times exactly as the simulator draws them
    (lab_workload), and token ids (one shared prefix, then random tokens) from the seed's third
    stream."""
    drawn = lab_workload(work)
    # The first three streams are the simulator's (spawn keys 0-2); the fourth is ours.
    _, _, token_seed, gap_seed = np.random.SeedSequence(work.seed).spawn(4)
    rng = np.random.default_rng(token_seed)
    send_at = bench_arrivals(
        drawn.intended_arrival_s, work.request_rate, np.random.default_rng(gap_seed)
    )
    high = min(_TOKEN_HIGH, vocab_size or _TOKEN_HIGH)
    low = min(_TOKEN_LOW, high // 2)
    prefix = rng.integers(low, high, size=work.shared_prefix_tokens).tolist()
    return [
        PlannedRequest(
            req_id=str(i),
            prompt=prefix + rng.integers(low, high, size=int(length) - len(prefix)).tolist(),
            output_tokens=int(drawn.output_tokens[i]),
            send_at_s=float(send_at[i]),
        )
        for i, length in enumerate(drawn.prompt_tokens)
    ]


def bench_arrivals(
    sim_arrivals: np.ndarray, rate: float | None, rng: np.random.Generator
) -> np.ndarray:
    """When `vllm bench serve` would send each request (vllm/benchmarks/serve.py get_request).

    bench sleeps through a gap before its first request too, adds the gaps up, and scales them
    so the last request goes at exactly n / rate. The simulator's arrivals start at 0 with n - 1
    gaps; those same gaps are kept, after a first one drawn from the fourth seed stream, so the
    two backends still see the same bursts. No rate: everything at 0, as bench's default.
    """
    n = len(sim_arrivals)
    if rate is None or n == 0:
        return np.zeros(n)
    gaps = np.concatenate([[rng.exponential(1.0 / rate)], np.diff(sim_arrivals)])
    cumulative = np.cumsum(gaps)
    if cumulative[-1] <= 0:
        return cumulative
    return cumulative * ((n / rate) / cumulative[-1])


@dataclass(frozen=True)
class LoadOptions:
    max_concurrency: int | None = None  # closed loop: most requests in flight (None: no limit)
    read_timeout_s: float = 300.0  # longest silence within one response
    connect_timeout_s: float = 10.0
    metrics_poll_s: float = 0.5  # 0: no /metrics at all
    # Blocks cached by an earlier run on the same server must not count as hits for this one.
    cache_salt: str | None = None
    temperature: float = 0.0  # 0: greedy (the lab's `temperature`)
    # One request before the run, not measured, as `vllm bench serve` sends its initial test
    # prompt (the first planned request, under a cache salt of its own): a fresh server's
    # first request pays one-time costs (on a CPU worker, the ngram proposer's compilation:
    # about a second) that would otherwise land in one request of the run.
    warmup: bool = True


@dataclass
class Progress:
    """Finished requests so far; written by the event loop, read from any thread."""

    total: int
    done: int = 0

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


@dataclass
class LoadResult:
    t0: float  # time.monotonic() at the start of the run; every *_s below counts from it
    requests: list[RequestRecord]
    metrics_before: str | None = None
    metrics_after: str | None = None
    metrics_polls: list[tuple[float, str]] = field(default_factory=list)
    count_sources: Counter[str] = field(default_factory=Counter)  # how chunks were counted
    warmup_s: float | None = None  # the unmeasured first request's E2E (None: none sent)
    warmup_error: str | None = None  # why it failed, if it did
    usage_mismatches: int = 0  # requests whose token count disagrees with the final usage
    # bench's duration: from before the send loop until every request returned (failed too).
    duration_s: float = 0.0
    wall_s: float = 0.0


def _raise_open_files(wanted: int) -> int:
    """Raise this process's open-file limit towards `wanted`; the connections it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return wanted if soft == resource.RLIM_INFINITY else max(1, min(wanted, soft - 64))


class _Stream:
    """Reads one server-sent-event response into a RequestRecord."""

    def __init__(self, record: RequestRecord, t0: float) -> None:
        self.record = record
        self.t0 = t0
        self.buffer = b""
        self.done = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.usage_seen = 0  # the last running usage.completion_tokens
        self.final_usage: dict[str, Any] | None = None
        self.sources: Counter[str] = Counter()
        self.source: str | None = None  # how this stream's tokens are counted, once chosen

    def feed(self, data: bytes, arrival: float) -> None:
        self.buffer = (self.buffer + data).replace(b"\r\n", b"\n")
        while not self.done:
            end = self.buffer.find(b"\n\n")
            if end < 0:
                return
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            lines = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                self.event(b"\n".join(lines), arrival)

    def event(self, data: bytes, arrival: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            body = json.loads(data)
        except ValueError:
            self.error = f"bad event after {self.record.output_tokens} tokens: {data[:80]!r}"
            self.done = True
            return
        if not isinstance(body, dict):
            return
        if "error" in body and not body.get("choices"):
            message = body["error"].get("message") if isinstance(body["error"], dict) else None
            got = self.record.output_tokens
            self.error = f"server error after {got} tokens: {message or body['error']}"
            return
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        choices = body.get("choices") or []
        if not choices:
            if usage is not None:
                self.final_usage = usage
            return
        choice = choices[0]
        tokens, source = self._count(choice, usage)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        if tokens > 0:
            self.record.chunks.append((arrival - self.t0, tokens))
            self.sources[source] += 1

    def _count(self, choice: dict[str, Any], usage: dict[str, Any] | None) -> tuple[int, str]:
        """Tokens in this chunk, from the one source the stream counts by (never two: a server
        that puts the total usage on its last text chunk would otherwise count it twice)."""
        running = usage.get("completion_tokens") if usage is not None else None
        if not isinstance(running, int):
            running = None
        ids = choice.get("token_ids")
        if self.source is None and (
            isinstance(ids, list) or running is not None or choice.get("text")
        ):
            if isinstance(ids, list):
                self.source = "token_ids"
            elif running is not None:
                self.source = "usage"
            else:
                self.source = "text"
        if self.source == "token_ids":
            return (len(ids) if isinstance(ids, list) else 0), "token_ids"
        if self.source == "usage":
            if running is None:
                return 0, "usage"  # the next running total covers this chunk's tokens
            seen, self.usage_seen = self.usage_seen, max(self.usage_seen, running)
            return self.usage_seen - seen, "usage"
        if running is not None:
            self.final_usage = usage  # the total, given once at the end: see settle_count
        return (1 if choice.get("text") else 0), "text"

    def settle_count(self) -> None:
        """A stream counted one token per text chunk takes the server's final completion_tokens
        as its total; the tokens no chunk showed go on the last chunk (which chunks held them is
        not known), so TTFT, ITL and E2E keep their measured times."""
        total = (self.final_usage or {}).get("completion_tokens")
        counted = self.record.output_tokens
        if self.source != "text" or not isinstance(total, int) or total <= counted:
            return
        chunks = list(self.record.chunks)
        at_s, tokens = chunks[-1]
        chunks[-1] = (at_s, tokens + total - counted)
        self.record.chunks = Chunks(chunks)

    def outcome(self) -> str | None:
        """Why the request failed, or None when it finished."""
        got = self.record.output_tokens
        if self.error:
            return self.error
        if not self.done:
            return f"stream cut after {got} tokens"
        if self.finish_reason == "abort":
            return f"aborted by the server after {got} tokens"
        if self.finish_reason is None and got < self.record.max_tokens:
            return f"stream ended after {got} of {self.record.max_tokens} tokens"
        if self.finish_reason == "length" and got < self.record.max_tokens:
            # With ignore_eos, vLLM stops short of max_tokens only when it lowered it to what
            # its max_model_len left: fewer tokens than the workload asks for is no success.
            return f'ended on "length" after {got} of {self.record.max_tokens} tokens'
        if got == 0:
            # Nothing to time: bench fails it too ("Never received a valid chunk").
            return f"finished ({self.finish_reason or 'no reason given'}) with no output tokens"
        return None


async def _send(
    client: httpx.AsyncClient,
    planned: PlannedRequest,
    body: bytes,
    headers: dict[str, str],
    t0: float,
) -> tuple[RequestRecord, _Stream]:
    issued = time.monotonic()
    record = RequestRecord(
        req_id=planned.req_id,
        prompt_tokens=len(planned.prompt),
        max_tokens=planned.output_tokens,
        arrival_s=issued - t0,
        chunks=Chunks(),
        finish_s=None,
        issued_s=issued - t0,
    )
    stream = _Stream(record, t0)
    try:
        async with client.stream("POST", "/v1/completions", content=body, headers=headers) as resp:
            network = resp.extensions.get("network_stream")
            sent = getattr(network, "request_sent_s", None)
            if isinstance(sent, float) and sent >= issued:
                record.arrival_s = sent - t0
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                record.error = f"HTTP {resp.status_code}: {_error_message(text)}"
                return record, stream
            async for piece in resp.aiter_raw():
                arrival = getattr(network, "last_arrival_s", None)
                stream.feed(piece, arrival if isinstance(arrival, float) else time.monotonic())
                if stream.done:
                    break
    except httpx.TimeoutException as exc:
        kind = type(exc).__name__.replace("Timeout", "").lower() or "read"
        stream.error = f"timed out after {record.output_tokens} tokens ({kind} timeout)"
    except (httpx.RemoteProtocolError, httpx.ReadError):
        pass  # the connection ended mid-stream: outcome() says "stream cut after N tokens"
    except httpx.ConnectError as exc:
        stream.error = f"could not connect: {exc}"
    except httpx.HTTPError as exc:
        stream.error = f"{type(exc).__name__} after {record.output_tokens} tokens: {exc}"
    if stream.done and stream.error is None and record.chunks:
        stream.settle_count()  # before outcome(), which compares the count with max_tokens
    record.error = stream.outcome()
    if record.error is None and record.chunks:
        record.finish_s = record.chunks[-1][0]
    details = (stream.final_usage or {}).get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        record.cached_prompt_tokens = details["cached_tokens"]
    return record, stream


async def _warm_up(
    client: httpx.AsyncClient,
    model: str,
    first: PlannedRequest,
    options: LoadOptions,
    result: LoadResult,
) -> None:
    """Send the run's first request once, unmeasured, before the /metrics page the run's
    counters start from; its cache salt is its own, so the run finds none of its blocks."""
    salt = f"warmup-{uuid.uuid4().hex}"
    body = request_body(model, first, salt, options.temperature)
    headers = {**JSON_HEADERS, "x-request-id": f"lab-{uuid.uuid4().hex[:12]}-warmup"}
    began = time.monotonic()
    record, _ = await _send(client, first, body, headers, began)
    result.warmup_s = time.monotonic() - began
    result.warmup_error = record.error


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
        message = body.get("error", {}).get("message") or body.get("message") or text
    except (ValueError, AttributeError):
        message = text
    message = " ".join(str(message).split())
    return message[:_ERROR_SNIPPET] or "(empty body)"


JSON_HEADERS = {"content-type": "application/json"}


def request_body(
    model: str, planned: PlannedRequest, cache_salt: str | None, temperature: float = 0.0
) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "prompt": planned.prompt,
        "max_tokens": planned.output_tokens,
        "ignore_eos": True,
        # Greedy by default, so a rerun on the same server yields the same tokens; bench
        # samples at temperature 1 (docs/run-record.md). With ignore_eos the token count does
        # not depend on it; with ngram speculation the acceptance does.
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if cache_salt:
        body["cache_salt"] = cache_salt
    return json.dumps(body, separators=(",", ":")).encode()


async def _poll_metrics(
    client: httpx.AsyncClient, every_s: float, t0: float, out: list[tuple[float, str]]
) -> None:
    while True:
        await asyncio.sleep(every_s)
        text = await scrape(client)
        if text is not None:
            # NOTE: parsed after the run, so a big page never holds up the timed streams.
            out.append((time.monotonic() - t0, text))


async def scrape(client: httpx.AsyncClient) -> str | None:
    """The /metrics page, or None if the server does not answer it."""
    try:
        resp = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


async def run_load(
    base_url: str,
    model: str,
    planned: Sequence[PlannedRequest],
    options: LoadOptions | None = None,
    progress: Progress | None = None,
) -> LoadResult:
    """Send the planned requests to a vLLM-compatible server and time every streamed chunk.

    Args:
        base_url: the server, e.g. "http://127.0.0.1:8000".
        model: the served model name.
        planned: the requests, in send order (`plan_requests`).
        options: concurrency limit, timeouts, /metrics polling, cache salt.
        progress: updated as requests finish, for a caller on another thread.

    Returns:
        One RequestRecord per planned request (failed ones carry `error`), and the /metrics pages
        scraped before, during and after.
    """
    options = options or LoadOptions()
    limit = options.max_concurrency or len(planned)
    connections = _raise_open_files(min(limit, len(planned)) + 64)
    timeout = httpx.Timeout(
        connect=options.connect_timeout_s,
        read=options.read_timeout_s,
        write=options.connect_timeout_s,
        pool=None,  # a request may wait for a free connection; its clock starts at the socket
    )
    run_tag = uuid.uuid4().hex[:12]
    bodies = [request_body(model, p, options.cache_salt, options.temperature) for p in planned]
    result = LoadResult(t0=0.0, requests=[])
    gate = asyncio.Semaphore(limit)
    async with (
        timed_client(base_url, max_connections=connections, timeout=timeout) as client,
        httpx.AsyncClient(base_url=base_url, timeout=10.0, trust_env=False) as side,
    ):
        if options.warmup and planned:
            await _warm_up(client, model, planned[0], options, result)
        if options.metrics_poll_s > 0:
            result.metrics_before = await scrape(side)
        records: list[RequestRecord | None] = [None] * len(planned)
        streams: list[_Stream | None] = [None] * len(planned)

        async def one(i: int) -> None:
            async with gate:
                headers = {**JSON_HEADERS, "x-request-id": f"lab-{run_tag}-{i}"}
                records[i], streams[i] = await _send(client, planned[i], bodies[i], headers, t0)
            if progress is not None:
                progress.done += 1

        started = time.monotonic()
        t0 = result.t0 = started
        poller = None
        if options.metrics_poll_s > 0:
            poller = asyncio.create_task(
                _poll_metrics(side, options.metrics_poll_s, t0, result.metrics_polls)
            )
        tasks = []
        try:
            for i, p in enumerate(planned):
                delay = t0 + p.send_at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
            result.duration_s = time.monotonic() - t0
        finally:
            for task in tasks:
                task.cancel()
            if poller is not None:
                poller.cancel()
            await asyncio.gather(*tasks, *([poller] if poller else []), return_exceptions=True)
        if options.metrics_poll_s > 0:
            result.metrics_after = await scrape(side)
    result.wall_s = time.monotonic() - started
    result.requests = [r for r in records if r is not None]
    for stream in streams:
        if stream is None:
            continue
        result.count_sources.update(stream.sources)
        final = (stream.final_usage or {}).get("completion_tokens")
        if isinstance(final, int) and final != stream.record.output_tokens:
            result.usage_mismatches += 1
    return result
