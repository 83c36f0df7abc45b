"""A stand-in for `vllm serve` in the tests: an OpenAI-compatible streaming server on loopback.

Run it as its own process (`python fake_vllm.py --port N --config JSON`). It speaks just enough
HTTP/1.1 (keep-alive, chunked server-sent events) and mimics what the vllm backend relies on:

- `POST /v1/completions` with `prompt` as token ids, `stream`, `stream_options` (include_usage,
  continuous_usage_stats), `return_token_ids`, `max_tokens`: streams `max_tokens` tokens on a
  programmed schedule (first chunk `ttft_ms` after admission, then one chunk every `itl_ms`,
  cycling through `itl_ms` and `chunk_tokens`), like vLLM with --skip-tokenizer-init (empty text);
- answers as vLLM 0.33 does when a request does not fit `max_model_len`: 400 (param
  "max_tokens") when max_tokens alone exceeds it, 400 when the prompt alone reaches it (param
  "input_tokens" above it; "max_tokens" when it leaves no room for one token); otherwise it
  serves it with max_tokens lowered to what is left (renderers/params.py, get_max_tokens in
  entrypoints/serve/utils/api_utils.py);
- refuses a `cache_salt` that breaks vLLM 0.33's rules (a non-empty string of at most 128
  characters, without '@', '/', a backslash or NUL), and keeps prefix-cache blocks apart per salt;
- takes what vLLM takes and fails it where vLLM does: an empty prompt list with 400, a
  temperature below 0 or above 2 with 400 naming it (vllm/sampling_params.py); a token id
  outside `vocab_size` (when set) kills its engine, as vLLM with --skip-tokenizer-init checks
  no id and its embedding lookup fails (`die`); a non-streamed request gets one JSON response;
- as vLLM's API server with a dead engine (`Engine.die`): error events on every open stream,
  503 on /health, 500 on new requests;
- shows the speculative-decoding counters only when it speculates, as vLLM registers them;
- `GET /health`, `GET /version`, `GET /v1/models` (with `root` and `max_model_len`, as vLLM's
  model card has them), and `GET /metrics` in vLLM's Prometheus format, with counters that
  follow what it served (prefix-cache hits at block granularity, speculative drafts from
  multi-token chunks, preemptions, running and waiting requests, KV usage) and the queue-time
  and prefill-time histograms of finished requests (the engine's part of `ttft_ms`: less
  `frontend_ms`);
- `POST /fake/reset` with a config: starts over with that config, as a new process would (the
  tests keep a pool of fake servers and reset one for each test rather than start another);
- `GET /fake/log`: what it really did, per request: when the request arrived (the kernel's
  receive stamp) and, for each chunk, monotonic readings just before and just after writing it,
  with its token count. The tests compare the load generator's numbers with these,
  not with the programmed delays, because on a busy machine the fake's own timers run late.

Per-request behaviour is keyed by the number after the last "-" of the X-Request-Id header
(`requests: {"3": {"status": 500}}`): `status`, `cut_after_tokens` (close the connection
mid-stream), `stall_after_tokens` (stop sending, keep the connection), `error_after_tokens` (an
error event, as vLLM sends), `preemptions`, and its own schedule (`ttft_ms`, `itl_ms`,
`chunk_tokens`), so tests can tell requests apart by their timing.

Strict as vLLM 0.33 at the door: every `POST /v1/completions` first goes through a FastAPI app
(the version range vLLM 0.33 requires) whose route is declared as vLLM declares it: a pydantic
`CompletionRequest` body (extra fields allowed and ignored, as vLLM's OpenAIBaseModel does),
vLLM's `validate_json_request` dependency, and FastAPI's own strict content-type check. Whatever
fails there (a body posted without `Content-Type: application/json` too) is refused before anything
streams with 400 and vLLM's error JSON, `{"error": {"message", "type": "Bad Request", "param",
"code": 400}}`: vLLM's app turns every RequestValidationError into that, never FastAPI's 422
(vllm/entrypoints/serve/utils/server_utils.py, validation_exception_handler). What vLLM refuses
later, while serving, gets its `create_error_response` JSON: type "BadRequestError" (400) or
"NotFoundError" (404, an unknown model). The streaming itself stays on the raw socket below, for
its exact timing truth.

`server_style: "llamacpp"` answers as llama.cpp's `llama-server` does: text on every chunk, no
token ids, no running usage, and the usage only on the last text chunk.

`spec: {"k": K, "rates": [...]}` (what standin_vllm.py reads from `--speculative-config`) makes
each decode step accept drafts as vLLM 0.33's synthetic rejection sampler does: the rates are
unconditional (rates[i] = chance the first i+1 drafts are all accepted); position i accepts
when a uniform draw is below rates[i] / rates[i-1], and the step stops at the first rejection;
all k accepted adds the bonus token. A step's chunk carries 1 + accepted tokens.

The transport is standard library only, so its own overhead is small and predictable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from http import HTTPStatus
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

SO_TIMESTAMPNS = 35  # Linux; not exported by the socket module

DEFAULTS: dict[str, Any] = {
    "model": "lab",
    "version": "0.33.0",
    "ttft_ms": 50.0,
    # The part of ttft_ms that is the API server's, not the engine's: the engine's prefill-time
    # histogram observes ttft_ms less this, as vLLM's engine core times its own part.
    "frontend_ms": 0.0,
    "itl_ms": [20.0],
    "chunk_tokens": [1],
    "spec_k": 0,
    "block_size": 16,
    "num_gpu_blocks": 4096,
    # vLLM always has one (--max-model-len, else config.json's max_position_embeddings); a
    # request longer than it is lowered or refused (_check_serving); the stand-in passes it on.
    "max_model_len": 32768,
    # The model card's root (vLLM: the path the model was loaded from; None: the model name).
    # A test points it at a folder with a config.json, as a server on the same machine has.
    "root": None,
    # The model's vocabulary: a token id at or above it is refused as vLLM's renderer refuses
    # it (validate_token_ids). None: any id is served.
    "vocab_size": None,
    "max_num_seqs": 100_000,
    "healthy_after_s": 0.0,
    "never_healthy": False,
    # Honour return_token_ids / continuous_usage_stats; off to test the other ways of counting.
    "send_token_ids": True,
    "send_usage": True,
    # "vllm", or "llamacpp": text chunks, usage only on the last text chunk.
    "server_style": "vllm",
    # Synthetic speculation as vLLM runs it: {"k": 3, "rates": [...], "seed": 0}.
    "spec": None,
    # Started with a --speculative-config of another kind (ngram): its counters are shown.
    "speculative": False,
    # Started with --enable-prompt-tokens-details (as every lab server is): the final usage
    # says how many prompt tokens the prefix cache held, 0 included.
    "prompt_tokens_details": True,
    # Counter values before the first request, so the tests see that the backend subtracts them.
    "counters_start": {},
    "requests": {},
}

COUNTERS = (
    "num_preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "prompt_tokens",
    "generation_tokens",
    "request_success",
)


def wall_offset() -> float:
    """time.time() - time.monotonic(), from the tightest of five paired readings."""
    pairs = []
    for _ in range(5):
        first = time.monotonic()
        wall = time.time()
        pairs.append((time.monotonic() - first, wall - first))
    return min(pairs)[1]


WALL_OFFSET = wall_offset()


def kernel_time(ancdata: list[tuple[int, int, bytes]]) -> float:
    """When the kernel received these bytes, on the monotonic clock (now, if it did not say)."""
    stamps = [
        p for level, kind, p in ancdata if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS)
    ]
    if stamps and len(stamps[0]) >= 16:
        seconds, nanos = struct.unpack("@qq", stamps[0][:16])
        arrived = seconds + nanos * 1e-9 - WALL_OFFSET
        if time.monotonic() - 5 < arrived <= time.monotonic() + 0.001:
            return arrived
    return time.monotonic()


class Engine:
    """The fake engine's state: admitted and waiting requests, counters, the truth log."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.started = time.monotonic()
        self.counters = {name: 0 for name in COUNTERS}
        self.start_values = {name: int(config["counters_start"].get(name, 0)) for name in COUNTERS}
        self.cached_blocks: set[int] = set()
        self.running: dict[str, Stream] = {}
        self.waiting: list[Stream] = []
        self.log: dict[str, dict[str, Any]] = {}
        self.arrivals = 0
        self.dead = False  # its engine process died (die())
        spec = config.get("spec") or {}
        self.spec_k = int(spec.get("k", 0))
        # vLLM's conversion (v1/spec_decode/utils.py): conditional c_i = p_i / p_(i-1).
        rates = [float(r) for r in spec.get("rates", [])]
        previous = [1.0, *rates][: len(rates)]
        self.spec_conditional = [
            p / q if q > 0 else 0.0 for p, q in zip(rates, previous, strict=True)
        ]
        self.spec_rng = np.random.default_rng(int(spec.get("seed", 0)))
        self.accepted_per_pos = [0] * self.spec_k
        # vLLM's per-request histograms, observed as a request finishes: [sum, count].
        self.histograms = {
            "request_queue_time_seconds": [0.0, 0],
            "request_prefill_time_seconds": [0.0, 0],
        }

    def spec_step(self) -> int:
        """Drafts accepted in one verification step (vLLM's synthetic rule)."""
        draws = self.spec_rng.random(self.spec_k)
        accepted = 0
        for pos in range(self.spec_k):
            if not draws[pos] < self.spec_conditional[pos]:
                break
            accepted += 1
            self.accepted_per_pos[pos] += 1
        self.counters["spec_decode_num_drafts"] += 1
        self.counters["spec_decode_num_draft_tokens"] += self.spec_k
        self.counters["spec_decode_num_accepted_tokens"] += accepted
        return accepted

    def die(self) -> None:
        """What vLLM's API server does once its engine process died: every request in flight
        or waiting ends on an error event (EngineDeadError), /health answers 503 and new
        requests 500, until its watchdog shuts it down."""
        self.dead = True
        streams = [*self.running.values(), *self.waiting]
        self.running.clear()
        self.waiting.clear()
        for stream in streams:
            stream.engine_dead()

    def speculates(self) -> bool:
        config = self.config
        return bool(config["spec"] or int(config["spec_k"]) > 0 or config["speculative"])

    def healthy(self) -> bool:
        if self.dead or self.config["never_healthy"]:
            return False
        return time.monotonic() - self.started >= float(self.config["healthy_after_s"])

    def submit(self, stream: Stream) -> None:
        stream.log["queued_s"] = time.monotonic()
        # What vLLM fails only once the request is in the engine, after the 200 of a stream.
        vocab = self.config["vocab_size"]
        if vocab is not None and max(stream.prompt) >= vocab:
            # With --skip-tokenizer-init vLLM checks no token id (renderers/base.py
            # validate_token_ids): the embedding lookup fails in the engine, which dies.
            lines = [
                vllm_log(
                    "EngineCore_DP0",
                    "ERROR",
                    "core.py:1512",
                    "EngineCore encountered a fatal error.",
                ),
                "IndexError: index out of range in self",
            ]
            print("\n".join(lines), flush=True)
            self.running[stream.xid] = stream
            self.die()
            return
        if len(self.running) < int(self.config["max_num_seqs"]):
            self.admit(stream)
        else:
            self.waiting.append(stream)

    def admit(self, stream: Stream) -> None:
        self.running[stream.xid] = stream
        self.counters["prompt_tokens"] += len(stream.prompt)
        self.counters["prefix_cache_queries"] += len(stream.prompt)
        hit = self.prefix_hit(stream.prompt, stream.cache_salt)
        self.counters["prefix_cache_hits"] += hit
        self.counters["num_preemptions"] += int(stream.behaviour.get("preemptions", 0))
        stream.log["cached_tokens"] = hit
        stream.start()

    def prefix_hit(self, prompt: list[int], salt: str | None = None) -> int:
        """Tokens of `prompt` found in the cache, in whole blocks; caches its full blocks.

        As in vLLM (v1/core/kv_cache_utils.py), the cache salt is among the first block's extra
        keys, so every block of a salted prompt hashes apart from the same tokens under
        another salt, or none: requests with different salts never share a block.
        """
        size = int(self.config["block_size"])
        # The last token is always recomputed, so at most (len - 1) tokens can hit.
        usable = (len(prompt) - 1) // size
        hit, parent, hitting = 0, 0, True
        for i in range(len(prompt) // size):
            extra = (salt,) if i == 0 and salt else ()
            parent = hash((parent, tuple(prompt[i * size : (i + 1) * size]), *extra))
            if hitting and i < usable and parent in self.cached_blocks:
                hit += size
            else:
                hitting = False
            self.cached_blocks.add(parent)
        return hit

    def observe_finished(self, stream: Stream) -> None:
        """vLLM's queue-time (queued to scheduled) and prefill-time (scheduled to the first
        token) histograms take a finished request's engine-side times."""
        queued = stream.log["admit_s"] - stream.log["queued_s"]
        engine_ms = float(stream.schedule["ttft_ms"]) - float(self.config["frontend_ms"])
        for name, value in (
            ("request_queue_time_seconds", queued),
            ("request_prefill_time_seconds", max(engine_ms, 0.0) / 1000),
        ):
            self.histograms[name][0] += value
            self.histograms[name][1] += 1

    def finish(self, stream: Stream) -> None:
        self.running.pop(stream.xid, None)
        while self.waiting and len(self.running) < int(self.config["max_num_seqs"]):
            self.admit(self.waiting.pop(0))

    def kv_usage(self) -> float:
        size = int(self.config["block_size"])
        used = sum(math.ceil((len(s.prompt) + s.sent) / size) for s in self.running.values())
        return min(1.0, used / max(1, int(self.config["num_gpu_blocks"]) - 1))

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.config["model"]}"'
        out: list[str] = []

        def emit(name: str, kind: str, value: float, extra: str = "") -> None:
            out.append(f"# HELP vllm:{name} {name.replace('_', ' ')}.")
            out.append(f"# TYPE vllm:{name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            out.append(f"vllm:{name}{suffix}{{{extra}{labels}}} {float(value)!r}")
            if kind == "counter":
                out.append(f"vllm:{name}_created{{{extra}{labels}}} {self.started!r}")

        emit("num_requests_running", "gauge", len(self.running))
        emit("num_requests_waiting", "gauge", len(self.waiting))
        emit("kv_cache_usage_perc", "gauge", self.kv_usage())
        for name in COUNTERS:
            if name.startswith("spec_decode") and not self.speculates():
                continue  # vLLM registers them only with a speculative config
            extra = 'finished_reason="length",' if name == "request_success" else ""
            emit(name, "counter", self.start_values[name] + self.counters[name], extra)
        for pos, count in enumerate(self.accepted_per_pos):
            extra = f'position="{pos}",'
            emit("spec_decode_num_accepted_tokens_per_pos", "counter", count, extra)
        # A histogram and an info gauge, as vLLM exposes them, so the parser meets both.
        out.append("# TYPE vllm:time_to_first_token_seconds histogram")
        for le in ("0.001", "0.01", "0.1", "1.0", "+Inf"):
            out.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} 0.0')
        out.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} 0.0")
        out.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} 0.0")
        for name, (total, count) in self.histograms.items():
            out.append(f"# TYPE vllm:{name} histogram")
            out.append(f'vllm:{name}_bucket{{{labels},le="+Inf"}} {float(count)!r}')
            out.append(f"vllm:{name}_count{{{labels}}} {float(count)!r}")
            out.append(f"vllm:{name}_sum{{{labels}}} {total!r}")
        out.append("# TYPE vllm:cache_config_info gauge")
        info = (
            f'block_size="{self.config["block_size"]}",cache_dtype="auto",'
            f'enable_prefix_caching="True",gpu_memory_utilization="0.9",'
            f'num_cpu_blocks="None",num_gpu_blocks="{self.config["num_gpu_blocks"]}"'
        )
        out.append(f"vllm:cache_config_info{{{info},{labels}}} 1.0")
        return "\n".join(out) + "\n"


class Stream:
    """One streamed completion: its schedule, and what was really sent when."""

    def __init__(self, conn: Conn, xid: str, body: dict[str, Any], behaviour: dict) -> None:
        self.conn, self.xid, self.behaviour = conn, xid, behaviour
        self.engine = conn.engine
        self.prompt: list[int] = list(body["prompt"])
        self.cache_salt: str | None = body.get("cache_salt")
        self.max_tokens = int(body["max_tokens"])
        self.streaming = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        config = self.engine.config
        self.continuous = bool(options.get("continuous_usage_stats")) and config["send_usage"]
        self.token_ids = bool(body.get("return_token_ids")) and config["send_token_ids"]
        self.llamacpp = config["server_style"] == "llamacpp"
        if self.llamacpp:
            self.continuous = self.token_ids = False
        self.sent = 0
        self.chunk_no = 0
        self.log: dict[str, Any] = {"recv_s": conn.arrived, "sends": [], "status": 200}
        self.engine.log[xid] = self.log
        self.first_at = 0.0
        self.next_at = 0.0
        # The request's own schedule where it has one, else the server's.
        self.schedule: dict[str, Any] = {
            "ttft_ms": behaviour.get("ttft_ms", config["ttft_ms"]),
            "itl_ms": _as_list(behaviour.get("itl_ms", config["itl_ms"])),
            "chunk_tokens": _as_list(behaviour.get("chunk_tokens", config["chunk_tokens"])),
        }

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.log["admit_s"] = now = time.monotonic()
        self.first_at = now + float(self.schedule["ttft_ms"]) / 1000
        self.next_at = self.first_at
        # Absolute deadlines (not "sleep after the last send"), so late timers do not add up.
        loop.call_at(self._loop_time(self.next_at), self.send_next)

    def _loop_time(self, mono: float) -> float:
        loop = asyncio.get_running_loop()
        return loop.time() + (mono - time.monotonic())

    def event(self, payload: dict[str, Any]) -> bytes:
        data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    def send_next(self) -> None:
        if self.engine.dead:
            return  # engine_dead() has answered it
        if self.conn.closed:
            self.engine.finish(self)
            return
        config = self.engine.config
        sizes = self.schedule["chunk_tokens"]
        spec_step = self.chunk_no > 0 and self.engine.spec_k > 0
        if spec_step:
            n = 1 + self.engine.spec_step()
        else:
            n = 1 if self.chunk_no == 0 else int(sizes[(self.chunk_no - 1) % len(sizes)])
        n = min(n, self.max_tokens - self.sent)
        for key, action in (
            ("cut_after_tokens", self.cut),
            ("stall_after_tokens", self.stall),
            ("error_after_tokens", self.error),
        ):
            limit = self.behaviour.get(key)
            if limit is not None and self.sent >= int(limit):
                action()
                return
        first = self.chunk_no == 0
        last = self.sent + n >= self.max_tokens
        text = " tok" * n if self.llamacpp else ""
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = "length" if last else None
        if self.token_ids:
            choice["token_ids"] = [7] * n
            if first:
                choice["prompt_token_ids"] = self.prompt
        if not self.llamacpp:
            # Keys vLLM's chunks always carry, null when not asked for (the contract test in
            # test_real_cpu.py compares the fake's stream with the real server's).
            choice.setdefault("token_ids", None)
            choice.setdefault("prompt_token_ids", None)
            choice["stop_reason"] = None
        payload: dict[str, Any] = {
            "id": f"cmpl-{self.xid}",
            "object": "text_completion",
            "model": config["model"],
            "choices": [choice],
        }
        if self.continuous or (self.llamacpp and last and self.include_usage):
            # llama.cpp: the whole usage rides on the last text chunk, no usage-only chunk.
            done = self.sent + n
            payload["usage"] = {
                "prompt_tokens": len(self.prompt),
                "completion_tokens": done,
                "total_tokens": len(self.prompt) + done,
            }
        data = self.event(payload)
        if not first and not spec_step and int(config["spec_k"]) > 0:
            self.engine.counters["spec_decode_num_drafts"] += 1
            self.engine.counters["spec_decode_num_draft_tokens"] += int(config["spec_k"])
            self.engine.counters["spec_decode_num_accepted_tokens"] += n - 1
        self.engine.counters["generation_tokens"] += n
        self.sent += n
        self.chunk_no += 1
        # The chunk left at some moment between these two readings (the send call delivers it
        # on loopback; if this process is descheduled inside the call, the interval says so).
        before = time.monotonic()
        if self.streaming:
            self.conn.write(data)
        self.log["sends"].append([before, time.monotonic(), n])
        if self.sent >= self.max_tokens:
            self.end()
            return
        itls = self.schedule["itl_ms"]
        self.next_at += float(itls[(self.chunk_no - 1) % len(itls)]) / 1000
        asyncio.get_running_loop().call_at(self._loop_time(self.next_at), self.send_next)

    def end(self) -> None:
        if not self.streaming:
            self.end_whole()
            return
        tail = b""
        if self.include_usage and not self.llamacpp:
            usage = {
                "prompt_tokens": len(self.prompt),
                "completion_tokens": self.sent,
                "total_tokens": len(self.prompt) + self.sent,
                **self.prompt_details(),
            }
            closing = {"id": f"cmpl-{self.xid}", "object": "text_completion"}
            closing["model"] = self.engine.config["model"]  # as vLLM's usage-only chunk has it
            tail += self.event({**closing, "choices": [], "usage": usage})
        tail += b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        self.conn.write(tail)
        self.engine.counters["request_success"] += 1
        self.engine.observe_finished(self)
        self.engine.finish(self)
        self.conn.response_done()

    def prompt_details(self, *, whole: bool = False) -> dict[str, Any]:
        """vLLM's usage.prompt_tokens_details with --enable-prompt-tokens-details: the prompt
        tokens its prefix cache held, set for every request (0 when none), as
        entrypoints/openai/completion/serving.py builds it. A stream's usage chunk leaves the
        empty fields out (exclude_none); a whole response has them as null."""
        if not self.engine.config["prompt_tokens_details"]:
            return {}
        details: dict[str, Any] = {"cached_tokens": int(self.log.get("cached_tokens", 0))}
        if whole:
            details.update(created_cache_tokens=None, multimodal_tokens=None)
        return {"prompt_tokens_details": details}

    def end_whole(self) -> None:
        """A non-streamed request's one response, as vLLM's CompletionResponse."""
        usage = {
            "prompt_tokens": len(self.prompt),
            "total_tokens": len(self.prompt) + self.sent,
            "completion_tokens": self.sent,
            "prompt_tokens_details": None,
            **self.prompt_details(whole=True),
        }
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
        choice.update(stop_reason=None, token_ids=None, prompt_token_ids=None)
        response = {
            "id": f"cmpl-{self.xid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.engine.config["model"],
            "choices": [choice],
            "usage": usage,
        }
        self.engine.counters["request_success"] += 1
        self.engine.observe_finished(self)
        self.engine.finish(self)
        self.conn.reply("200 OK", json.dumps(response).encode())

    def cut(self) -> None:
        self.log["cut"] = True
        self.engine.finish(self)
        self.conn.close()

    def stall(self) -> None:
        self.log["stalled"] = True
        self.engine.finish(self)

    def engine_dead(self) -> None:
        self.log["engine_dead"] = True
        self.fail(500, error_json(ENGINE_DEAD, "InternalServerError", 500))

    def fail(self, status: int, answer: bytes) -> None:
        """An error once the request was taken: a stream's error event, as vLLM sends it after
        its 200, or the whole (non-streamed) response."""
        if self.streaming:
            event = self.event(json.loads(answer))
            self.conn.write(event + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            self.conn.response_done()
        else:
            self.log["status"] = status
            self.conn.reply(f"{status} {HTTPStatus(status).phrase}", answer)

    def error(self) -> None:
        err = {"error": {"message": "fake engine failure", "type": "InternalServerError"}}
        self.conn.write(self.event(err) + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        self.engine.finish(self)
        self.conn.response_done()


class Conn:
    """One HTTP/1.1 connection; requests are handled one at a time (no pipelining).

    Raw non-blocking socket rather than an asyncio transport, to read the kernel's receive
    timestamp of each request (SO_TIMESTAMPNS): the fake's truth for "when the request arrived"
    must not include its own event loop's lag when 256 requests land together.
    """

    def __init__(self, current: dict[str, Engine], sock: socket.socket) -> None:
        # The engine in force when the connection opened serves all its requests; a reset
        # (`POST /fake/reset`) gives the connections opened after it a new one.
        self.current = current
        self.engine = current["engine"]
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.buf = b""
        self.out = bytearray()
        self.busy = False
        self.closed = False
        self.arrived = 0.0  # monotonic arrival of the bytes that completed the buffer
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.loop.add_reader(sock.fileno(), self.readable)

    def readable(self) -> None:
        try:
            data, ancdata, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancdata = b"", []
        if not data:
            self.close()
            return
        self.arrived = kernel_time(ancdata)
        self.buf += data
        self.parse()

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.out:
            try:
                data = data[self.sock.send(data) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.close()
                return
            if data:
                self.loop.add_writer(self.sock.fileno(), self.writable)
        self.out += data

    def writable(self) -> None:
        try:
            del self.out[: self.sock.send(self.out)]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not self.out:
            self.loop.remove_writer(self.sock.fileno())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
            self.sock.close()

    def response_done(self) -> None:
        self.busy = False
        self.parse()

    def parse(self) -> None:
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, path = head[0].split(" ")[:2]
            self.busy = True
            self.handle(method, path, headers, body)

    def reply(self, status: str, body: bytes, content_type: str = "application/json") -> None:
        head = (
            f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        self.write(head.encode() + body)
        self.response_done()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        engine = self.engine
        if path == "/health":
            self.reply("200 OK" if engine.healthy() else "503 Service Unavailable", b"")
        elif path == "/version":
            self.reply("200 OK", json.dumps({"version": engine.config["version"]}).encode())
        elif path == "/v1/models":
            # As vLLM's model card says it, max_model_len included.
            card = {
                "id": engine.config["model"],
                "object": "model",
                "owned_by": "vllm",
                "root": engine.config["root"] or engine.config["model"],
                "max_model_len": int(engine.config["max_model_len"]),
            }
            models = {"object": "list", "data": [card]}
            self.reply("200 OK", json.dumps(models).encode())
        elif path == "/metrics":
            self.reply("200 OK", engine.metrics().encode(), "text/plain; version=0.0.4")
        elif path == "/fake/log":
            self.reply("200 OK", json.dumps(engine.log).encode())
        elif path == "/fake/reset" and method == "POST":
            # The tests' pool of fake servers: a new engine (state, counters, log) with this
            # config, as a freshly started server would have.
            self.current["engine"] = Engine(load_config(body.decode() or None))
            self.reply("200 OK", b"{}")
        elif path == "/fake/state":
            state = {"counters": engine.counters, "start_values": engine.start_values}
            self.reply("200 OK", json.dumps(state).encode())
        elif path == "/v1/completions" and method == "POST":
            self.completion(headers, body)
        else:
            self.reply("404 Not Found", b'{"error": "not found"}')

    def completion(self, headers: dict[str, str], raw: bytes) -> None:
        engine = self.engine
        engine.arrivals += 1
        xid = headers.get("x-request-id") or f"anon-{engine.arrivals}"
        arrived = self.arrived
        asyncio.ensure_future(self._complete(xid, headers, raw, arrived))

    def refuse(self, xid: str, arrived: float, status: int, answer: bytes) -> None:
        self.engine.log[xid] = {"recv_s": arrived, "sends": [], "status": status}
        self.reply(f"{status} {HTTPStatus(status).phrase}", answer)

    async def _complete(
        self, xid: str, headers: dict[str, str], raw: bytes, arrived: float
    ) -> None:
        engine = self.engine
        suffix = xid.rsplit("-", 1)[-1]
        behaviour = dict(engine.config["requests"].get(suffix, {}))
        status, answer, request = await validate(headers, raw)
        if request is None:
            self.refuse(xid, arrived, status, answer)
            return
        if engine.dead:
            self.refuse(xid, arrived, 500, error_json(ENGINE_DEAD, "InternalServerError", 500))
            return
        body = request.model_dump()
        refusal = _refusal(body, engine.config)
        if refusal is not None:
            self.refuse(xid, arrived, *refusal)
            return
        # What vLLM generates at most: max_tokens, lowered to the context the prompt leaves.
        body["max_tokens"] = min(
            body["max_tokens"], int(engine.config["max_model_len"]) - len(body["prompt"])
        )
        status = int(behaviour.get("status", 200))
        if status != 200:
            message = {"error": {"message": "fake internal error", "code": status}}
            self.refuse(xid, arrived, status, json.dumps(message).encode())
            return
        if body.get("stream"):
            self.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
        stream = Stream(self, xid, body, behaviour)
        stream.log["recv_s"] = arrived
        stream.log["ignored_fields"] = sorted(getattr(request, "model_extra", None) or {})
        stream.log["temperature"] = body.get("temperature")
        engine.submit(stream)


# -- the door: vLLM 0.33's request model and route, in FastAPI ------------------------------------


class RequestError(Exception):
    """A refusal that names the request field it is about, as vLLM's VLLMValidationError does:
    its text ends with "(parameter=..., value=...)" and the error JSON's `param` is the field.
    Not a ValueError, as vLLM 0.32's is not: raised in a validator, pydantic does not wrap it,
    so it reaches the app's handler as itself (400 "BadRequestError"), not as a validation
    error ("Bad Request")."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value

    def __str__(self) -> str:
        if self.parameter is None:  # a plain ValueError in vLLM: its text alone, no param
            return super().__str__()
        extras = [f"parameter={self.parameter}"]
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{super().__str__()} ({', '.join(extras)})"


# vLLM's EngineDeadError (v1/engine/exceptions.py), a 500 (VLLMServerError).
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# vLLM's API server checks its engine every 5 s and shuts down once it is dead
# (entrypoints/launchers/launcher.py, watchdog_loop).
WATCHDOG_S = 5.0


def vllm_log(process: str, level: str, where: str, message: str) -> str:
    """A line as vLLM's logger writes it (vllm/logger.py _FORMAT)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"({process} pid={os.getpid()}) {level} {stamp} [{where}] {message}"


def error_json(message: str, err_type: str, code: int, param: str | None = None) -> bytes:
    """vLLM's ErrorResponse body."""
    error = {"message": message, "type": err_type, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


# vLLM 0.33's cache salt rules (entrypoints/generate/base/protocol.py, validate_cache_salt).
CACHE_SALT_MAX_CHARS = 128
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


class _VLLMModel(BaseModel):
    # vLLM's OpenAIBaseModel: extra fields are allowed (and logged as ignored).
    model_config = ConfigDict(extra="allow")


class StreamOptions(_VLLMModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


TokenId = Annotated[int, Field(ge=0)]


class CompletionRequest(_VLLMModel):
    """The fields of vLLM 0.33's CompletionRequest (entrypoints/openai/completion/protocol.py)
    that a lab request can touch, with vLLM's types, bounds and before-validators."""

    model: str | None = None
    # Ids at least 0, and no upper bound: with --skip-tokenizer-init vLLM checks none against
    # the vocabulary (Engine.submit).
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    return_token_ids: bool | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens_is_the_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_tokens") is None:
            data = {**data, "max_tokens": cls.model_fields["max_tokens"].default}
        return data

    @model_validator(mode="before")
    @classmethod
    def _a_prompt_is_needed(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("prompt") in (None, ""):
            raise RequestError(
                "Either prompt or prompt_embeds must be provided and non-empty.",
                parameter="prompt",
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise RequestError(
                "Stream options can only be defined when `stream=True`.",
                parameter="stream_options",
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _cache_salt_rules(cls, data: Any) -> Any:
        salt = data.get("cache_salt") if isinstance(data, dict) else None
        if salt is None:
            return data
        if not isinstance(salt, str) or not salt:
            raise RequestError(
                "Parameter 'cache_salt' must be a non-empty string if provided.",
                parameter="cache_salt",
            )
        if len(salt) > CACHE_SALT_MAX_CHARS or CACHE_SALT_FORBIDDEN & set(salt):
            raise RequestError(
                f"Parameter 'cache_salt' must be at most {CACHE_SALT_MAX_CHARS} characters and "
                "must not contain '@', '/', '\\\\', or NUL.",
                parameter="cache_salt",
            )
        return data


async def validate_json_request(raw_request: Request) -> None:
    """vLLM's own dependency on the route (entrypoints/serve/utils/api_utils.py)."""
    content_type = raw_request.headers.get("content-type", "").lower()
    if content_type.split(";", maxsplit=1)[0] != "application/json":
        raise RequestValidationError(
            errors=["Unsupported Media Type: Only 'application/json' is allowed"]
        )


DOOR = FastAPI()


@DOOR.exception_handler(RequestError)
async def _refused(_: Request, exc: RequestError) -> Response:
    return Response(
        error_json(str(exc), "BadRequestError", 400, exc.parameter),
        status_code=400,
        media_type="application/json",
    )


@DOOR.exception_handler(RequestValidationError)
async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """vLLM's handler: 400 whatever failed, `param` from the error that names its field, else from
    the first error's location ("body.max_tokens"); the message lists every error."""
    errors = list(exc.errors())
    named = [
        e["ctx"]["error"]
        for e in errors
        if isinstance(e, dict) and isinstance(e.get("ctx", {}).get("error"), RequestError)
    ]
    param = named[0].parameter if named else None
    if param is None and errors and isinstance(errors[0], dict) and errors[0].get("loc"):
        param = ".".join(str(part) for part in errors[0]["loc"] if _is_field(part))
    message = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:\n"
    message += "\n".join(f"  {e}" for e in errors)
    error = {"message": message, "type": "Bad Request", "param": param, "code": 400}
    return JSONResponse({"error": error}, status_code=400)


def _is_field(part: object) -> bool:
    # pydantic puts its union branches and validator wrappers ("list[int]",
    # "function-before[...]") in the location; vLLM leaves them out of `param`.
    return isinstance(part, int) or not any(c in str(part) for c in "[](){}")


@DOOR.post("/v1/completions", dependencies=[Depends(validate_json_request)])
async def _create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    raw_request.scope["fake_request"] = request
    return Response(status_code=200)


async def validate(
    headers: dict[str, str], body: bytes
) -> tuple[int, bytes, CompletionRequest | None]:
    """Run one request through DOOR: (status, body of a refusal, the validated request)."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status, parts = 500, []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await DOOR(scope, receive, send)
    return status, b"".join(parts), scope.get("fake_request") if status == 200 else None


def _refusal(body: dict[str, Any], config: dict[str, Any]) -> tuple[int, bytes] | None:
    """What vLLM refuses after validation, while serving with --skip-tokenizer-init, as (status,
    error JSON); None if it would serve the request."""
    model = config["model"]
    if body.get("model") != model:
        message = f"The model `{body.get('model')}` does not exist."
        return 404, error_json(message, "NotFoundError", 404, "model")
    try:
        _check_serving(body, int(config["max_model_len"]))
    except RequestError as exc:
        return 400, error_json(str(exc), "BadRequestError", 400, exc.parameter)
    return None


def _check_serving(body: dict[str, Any], max_model_len: int) -> None:
    """Raises RequestError for a body vLLM would not serve."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        raise RequestError(
            "prompt must be a list of token ids when the tokenizer is skipped", parameter="prompt"
        )
    if not prompt:  # v1/engine/input_processor.py, before the stream starts; names no param
        raise RequestError("The decoder prompt cannot be empty")
    max_tokens = int(body["max_tokens"])  # an int: the door sets vLLM's default for null
    temperature = body.get("temperature")
    # SamplingParams._verify_args (vllm/sampling_params.py): a VLLMValidationError naming it.
    if temperature is not None and temperature < 0:
        raise RequestError(
            f"temperature must be non-negative, got {float(temperature)}.",
            parameter="temperature",
            value=float(temperature),
        )
    if temperature is not None and temperature > 2:
        raise RequestError(
            f"temperature must be in [0, 2], got {float(temperature)}.",
            parameter="temperature",
            value=float(temperature),
        )
    if max_tokens < 1:
        raise RequestError(
            f"max_tokens must be at least 1, got {max_tokens}.", parameter="max_tokens"
        )
    # vLLM's renderer (renderers/params.py): max_tokens must fit the context on its own, and
    # the prompt too, without any output; then get_max_tokens lowers max_tokens to what the
    # prompt leaves, and a prompt that leaves nothing asks for 0 tokens, which is refused.
    if max_tokens > max_model_len:
        raise RequestError(
            f"max_tokens={max_tokens} cannot be greater than "
            f"max_model_len=max_total_tokens={max_model_len}. Please request fewer output tokens.",
            parameter="max_tokens",
            value=max_tokens,
        )
    if len(prompt) > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {len(prompt)} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.",
            parameter="input_tokens",
            value=len(prompt),
        )
    if len(prompt) == max_model_len:
        raise RequestError("max_tokens must be at least 1, got 0.", parameter="max_tokens")


def load_config(text: str | None) -> dict[str, Any]:
    config = dict(DEFAULTS)
    if text:
        config.update(json.loads(text))
    for key in ("itl_ms", "chunk_tokens"):
        config[key] = _as_list(config[key])
    return config


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


async def _watch_engine(
    process: subprocess.Popen[bytes], current: dict[str, Engine], stop: asyncio.Event
) -> None:
    """Serve until the engine process dies, then answer as vLLM's API server does (Engine.die)
    and log what it logs, and shut down after its watchdog's period."""
    while process.poll() is None:
        await asyncio.sleep(0.05)
    running = len(current["engine"].running) + len(current["engine"].waiting)
    lines = [
        vllm_log(
            "APIServer",
            "WARNING",
            "core_client.py:818",
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        )
    ]
    for _ in range(running):
        failed = "Error in completion stream generator."
        lines.append(vllm_log("APIServer", "ERROR", "serving.py:500", failed))
        lines.append("Traceback (most recent call last):")
        lines.append(f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}")
    print("\n".join(lines), flush=True)
    current["engine"].die()
    await asyncio.sleep(WATCHDOG_S)
    stop.set()


async def serve(
    host: str,
    port: int,
    config: dict[str, Any],
    handle_term: bool = True,
    engine_process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Serve until SIGTERM; with `engine_process` (the stand-in's engine core), until its death
    has been answered as vLLM answers it (_watch_engine)."""
    loop = asyncio.get_running_loop()
    current = {"engine": Engine(config)}
    listener = socket.create_server((host, port), backlog=1024)
    listener.setblocking(False)

    def accept() -> None:
        for _ in range(64):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            Conn(current, sock)

    loop.add_reader(listener.fileno(), accept)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT) if handle_term else ():
        loop.add_signal_handler(sig, stop.set)
    print(f"fake vLLM {config['version']} serving on http://{host}:{port}", flush=True)
    watcher = None
    if engine_process is not None:
        watcher = asyncio.ensure_future(_watch_engine(engine_process, current, stop))
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    loop.remove_reader(listener.fileno())
    listener.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", default=None, help="JSON object overriding DEFAULTS")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, load_config(args.config)))


if __name__ == "__main__":
    sys.exit(main())
