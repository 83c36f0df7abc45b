"""The load generator against the fake vLLM: token counting, attribution, and failures.

Times are checked against what the fake reports it did (the kernel's stamp of each request's
arrival, and monotonic readings either side of each chunk it wrote), not against the delays it was
asked for, and only with bounds a busy CPU cannot break: causality (nothing is stamped before it
was sent; a request leaves the client before the fake receives it) and the fake's programmed delays
as lower bounds. How close the client's times come to the truth (within 2 ms on a quiet machine)
is a benchmark: tests/benchmarks/bench_loadgen.py, run by `make bench`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest

from labs.backends.base import EngineCounters, RunRecord
from labs.backends.vllm import loadgen
from labs.backends.vllm.loadgen import (
    LoadOptions,
    PlannedRequest,
    bench_arrivals,
    plan_requests,
    run_load,
)
from labs.measurement.metrics import summarize
from labs.parameters.params import parse_lab_params
from labs.sim.workload import lab_workload
from tests.labs.vllm.timing import (
    CHUNKS,
    CLOCK_SLACK_S,
    OUTPUT_TOKENS,
    TIMING,
    by_index,
    check_causal,
    planned,
)

# Three requests the fake serves on schedules of their own (fast, slow, in between), with chunk
# sizes of their own, among others on the common schedule: a TTFT, gap or chunk credited to the
# wrong request breaks a lower bound or a chunk count.
OWN = {
    "0": {"ttft_ms": 5, "itl_ms": [5], "chunk_tokens": [1]},
    "1": {"ttft_ms": 300, "itl_ms": [40, 80], "chunk_tokens": [3, 1]},
    "2": {"ttft_ms": 150, "itl_ms": [15], "chunk_tokens": [2, 5]},
}
TIMER_SLACK_S = 0.001  # the fake's timers never fire early; this covers rounding


def schedule(index: str) -> dict[str, Any]:
    return {**TIMING, **OWN.get(index, {})}


def test_it_counts_chunks_and_credits_ttft_and_gaps_to_their_own_request(fake_server: Any) -> None:
    server = fake_server({**TIMING, "requests": OWN})
    result = asyncio.run(
        run_load(server.base_url, "lab", planned(16), LoadOptions(metrics_poll_s=0))
    )
    ended = time.monotonic()
    truth = by_index(server.get("/fake/log"))
    assert sorted(int(r.req_id) for r in result.requests) == list(range(16))
    for record in result.requests:
        entry = truth[record.req_id]
        check_causal(record, result.t0, entry)
        assert record.output_tokens == OUTPUT_TOKENS
        assert record.finish_s == record.chunks[-1][0]
        assert result.t0 + record.finish_s <= ended
        # The fake sends chunk j no earlier than its TTFT plus the first j gaps after admission,
        # which follows the request's arrival: so the request's own measured times can only be
        # at least that. Another request's (the fast one's) would be earlier.
        plan = schedule(record.req_id)
        due_s = plan["ttft_ms"] / 1000
        for j, (at_s, _) in enumerate(record.chunks):
            if j:
                due_s += plan["itl_ms"][(j - 1) % len(plan["itl_ms"])] / 1000
            assert at_s - record.arrival_s >= due_s - TIMER_SLACK_S, (record.req_id, j)
    sizes = {r.req_id: [n for _, n in r.chunks] for r in result.requests}
    assert sizes["0"] == [1] * OUTPUT_TOKENS
    assert sizes["1"][:5] == [1, 3, 1, 3, 1] and sizes["2"][:4] == [1, 2, 5, 2]
    assert sizes["3"] == [1, 1, 3, 2, 4, 1, 3, 2, 4, 1, 2] and len(sizes["3"]) == CHUNKS
    assert result.count_sources == {"usage": sum(len(v) for v in sizes.values())}


def test_a_chunk_is_stamped_when_it_arrives_not_when_the_client_parses_it(
    fake_server: Any,
) -> None:
    # The client's event loop is blocked (as when the worker thread holding the GIL writes
    # progress) until the fake has sent the first chunk; the client can only parse it after the
    # stall. Its stamp must still come from before the stall ended: the kernel's, not the
    # parser's. The fake then sends nothing more, so no later chunk can share the stamp.
    server = fake_server(
        {"ttft_ms": 200, "itl_ms": [5], "requests": {"0": {"stall_after_tokens": 1}}}
    )

    def sent_first_chunk() -> list[Any]:
        entry = by_index(server.get("/fake/log")).get("0")
        return entry["sends"] if entry else []

    async def stalled() -> tuple[Any, float, float]:
        options = LoadOptions(metrics_poll_s=0, read_timeout_s=0.5)
        load = asyncio.create_task(run_load(server.base_url, "lab", planned(1, 4), options))
        while not by_index(server.get("/fake/log")).get("0"):
            await asyncio.sleep(0.005)  # until the request has reached the fake
        began = time.monotonic()
        while not sent_first_chunk():
            time.sleep(0.005)  # blocks the loop: nothing is read or parsed
        ended = time.monotonic()
        return await load, began, ended

    for _ in range(5):
        result, began, ended = asyncio.run(stalled())
        (record,) = result.requests
        sends = by_index(server.get("/fake/log"))["0"]["sends"]
        if sends[0][0] > began:  # else the chunk may have been read before the stall
            break
        server = fake_server(
            {"ttft_ms": 200, "itl_ms": [5], "requests": {"0": {"stall_after_tokens": 1}}}
        )
    assert sends[0][0] > began, "the fake never sent its chunk after the client's loop stalled"
    assert record.error == "timed out after 1 tokens (read timeout)"
    ((at_s, tokens),) = record.chunks
    assert tokens == 1
    assert sends[0][0] - CLOCK_SLACK_S <= result.t0 + at_s < ended


def test_it_counts_tokens_from_usage_when_chunks_carry_no_token_ids(fake_server: Any) -> None:
    server = fake_server({**TIMING, "ttft_ms": 5, "itl_ms": [2], "send_token_ids": False})
    result = asyncio.run(
        run_load(server.base_url, "lab", planned(3), LoadOptions(metrics_poll_s=0))
    )
    truth = by_index(server.get("/fake/log"))
    for record in result.requests:
        assert [n for _, n in record.chunks] == [n for _, _, n in truth[record.req_id]["sends"]]
        assert record.output_tokens == OUTPUT_TOKENS
        assert record.finish_s == record.chunks[-1][0]
    assert set(result.count_sources) == {"usage"}
    assert result.usage_mismatches == 0


def test_it_sends_what_vllm_needs_with_skip_tokenizer_init(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    request = PlannedRequest("0", [5, 6, 7], 4, 0.0)
    options = LoadOptions(metrics_poll_s=0, cache_salt="salt-1")
    result = asyncio.run(run_load(server.base_url, "lab", [request], options))
    assert result.requests[0].error is None
    from labs.backends.vllm.loadgen import request_body

    body = json.loads(request_body("lab", request, "salt-1"))
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 4
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    # Not return_token_ids: vLLM would echo the whole prompt's ids in the first event.
    assert "return_token_ids" not in body and body["cache_salt"] == "salt-1"
    assert truth_fields(server) == [[]]  # vLLM's CompletionRequest knows every field sent


def truth_fields(server: Any) -> list[list[str]]:
    return [entry.get("ignored_fields") for entry in server.measured_log().values()]


def test_every_request_says_it_is_json_or_vllm_refuses_it(
    fake_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    # The strict fake refuses a JSON body without the header, as vLLM 0.33's FastAPI does; and
    # vLLM's app answers that (any RequestValidationError) with 400, not FastAPI's 422.
    bare = httpx.post(
        server.base_url + "/v1/completions",
        content=json.dumps({"model": "lab", "prompt": [1], "max_tokens": 1, "stream": True}),
        headers={"content-type": ""},
        trust_env=False,
    )
    assert bare.status_code == 400
    assert bare.json() == {
        "error": {
            "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' "
            "is allowed",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
    }
    result = asyncio.run(
        run_load(server.base_url, "lab", planned(3, 4), LoadOptions(metrics_poll_s=0))
    )
    assert [r.error for r in result.requests] == [None, None, None]
    assert [r.output_tokens for r in result.requests] == [4, 4, 4]
    # Without the header the same run fails every request (the bug this guards against).
    monkeypatch.setattr(loadgen, "JSON_HEADERS", {})
    result = asyncio.run(
        run_load(server.base_url, "lab", planned(2, 4), LoadOptions(metrics_poll_s=0))
    )
    assert [r.error for r in result.requests] == [
        "HTTP 400: 1 validation error: Unsupported Media Type: Only 'application/json' is allowed"
    ] * 2


GOOD = {"model": "lab", "prompt": [1000, 1001, 1002], "max_tokens": 2, "stream": True}


REFUSED = [  # what changes GOOD into a body vLLM refuses: status, error type, param
    ({"max_tokens": "many"}, 400, "Bad Request", "body.max_tokens"),
    ({"prompt": [1000, -1]}, 400, "Bad Request", "body.prompt.1"),
    ({"stream": False, "stream_options": {"include_usage": True}}, 400, "BadRequestError",
     "stream_options"),
    ({"max_tokens": 0}, 400, "BadRequestError", "max_tokens"),
    # vllm/sampling_params.py _verify_args: temperature within [0, 2], named.
    ({"temperature": -1}, 400, "BadRequestError", "temperature"),
    ({"temperature": 2.5}, 400, "BadRequestError", "temperature"),
    ({"model": "other"}, 404, "NotFoundError", "model"),
]  # fmt: skip


def test_a_body_vllm_refuses_gets_vllms_status_and_error_naming_the_field(
    fake_server: Any,
) -> None:
    # vLLM: 400 "Bad Request" for what fails validation (its RequestValidationError handler),
    # 400 "BadRequestError" or 404 "NotFoundError" for what it refuses while serving.
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    url = server.base_url + "/v1/completions"
    assert httpx.post(url, json=GOOD, trust_env=False).status_code == 200
    for change, status, kind, param in REFUSED:
        refused = httpx.post(url, json={**GOOD, **change}, trust_env=False)
        error = refused.json()["error"]
        got = (refused.status_code, error["type"], error["param"], error["code"])
        assert got == (status, kind, param, status), change
        assert error["message"]


def events(response: httpx.Response) -> list[Any]:
    return [
        json.loads(line[len("data: ") :]) if line != "data: [DONE]" else "[DONE]"
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]


def test_the_fake_takes_and_fails_what_vllm_takes_and_fails(fake_server: Any) -> None:
    # The cases of the contract test (test_real_cpu.py), on the fake alone.
    server = fake_server({"ttft_ms": 1, "itl_ms": [1], "vocab_size": 32000})
    url = server.base_url + "/v1/completions"

    def post(**change: Any) -> httpx.Response:
        return httpx.post(url, json={**GOOD, **change}, trust_env=False)

    # vLLM's own validators' refusals are "BadRequestError", not pydantic's "Bad Request".
    empty = post(prompt=[])
    assert (empty.status_code, empty.json()["error"]["type"]) == (400, "BadRequestError")
    assert empty.json()["error"]["param"] is None  # vLLM's plain ValueError names no field
    missing = post(prompt=None).json()["error"]
    assert (missing["type"], missing["param"]) == ("BadRequestError", "prompt")
    # A null max_tokens is vLLM's default (16); a request need not stream.
    assert events(post(max_tokens=None))[-2]["choices"][0]["finish_reason"] == "length"
    whole = post(stream=False)
    assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 2
    # --enable-prompt-tokens-details: the cached prompt tokens, 0 included, in the final usage.
    assert whole.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    usage = events(post(stream_options={"include_usage": True}))[-2]["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    refused = post(temperature=-1).json()["error"]
    assert refused["message"] == (
        "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"
    )
    # No speculation, no speculation counters (vLLM registers them with a speculative config).
    assert "spec_decode" not in httpx.get(server.base_url + "/metrics", trust_env=False).text
    # An id beyond the vocabulary passes (no tokenizer to check it) and kills the engine.
    assert httpx.get(server.base_url + "/health", trust_env=False).status_code == 200
    beyond = post(prompt=[1000, 32000])
    assert beyond.status_code == 200
    assert events(beyond)[0]["error"]["type"] == "InternalServerError"
    assert httpx.get(server.base_url + "/health", trust_env=False).status_code == 503
    assert post().status_code == 500


def test_the_learner_sees_what_vllm_refused_and_the_field(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    bad = [PlannedRequest("0", [1000, -1], 4, 0.0), PlannedRequest("1", [1000, 1001], 0, 0.0)]
    result = asyncio.run(run_load(server.base_url, "lab", bad, LoadOptions(metrics_poll_s=0)))
    by_id = {r.req_id: r.error or "" for r in result.requests}
    assert by_id["0"].startswith("HTTP 400: 6 validation errors: {'type': 'greater_than_equal'")
    assert "'loc': ('body', 'prompt'," in by_id["0"]
    assert by_id["1"] == "HTTP 400: max_tokens must be at least 1, got 0. (parameter=max_tokens)"


def test_a_cache_salt_vllm_refuses_is_refused(fake_server: Any) -> None:
    # vLLM 0.33 (validate_cache_salt): a non-empty string of at most 128 characters, without
    # '@', '/', a backslash or NUL.
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    url = server.base_url + "/v1/completions"
    assert httpx.post(url, json={**GOOD, "cache_salt": "x" * 128}, trust_env=False).is_success
    for salt in ["", "x" * 129, "a@b", "a/b", "a\\b", "a\x00b", 5]:
        refused = httpx.post(url, json={**GOOD, "cache_salt": salt}, trust_env=False)
        assert refused.status_code == 400, salt
        assert refused.json()["error"]["param"] == "cache_salt", salt


def test_the_learner_sees_a_refused_cache_salt_named(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})
    options = LoadOptions(metrics_poll_s=0, cache_salt="run/1")
    (record,) = asyncio.run(run_load(server.base_url, "lab", planned(1), options)).requests
    # vLLM's own validator's words, as its BadRequestError gives them (the contract test).
    assert record.error == (
        "HTTP 400: Parameter 'cache_salt' must be at most 128 characters and must not contain "
        "'@', '/', '\\\\', or NUL. (parameter=cache_salt)"
    )


def test_requests_with_different_cache_salts_never_share_cached_blocks(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 1, "itl_ms": [1]})

    def cached(salt: str | None) -> int:
        options = LoadOptions(metrics_poll_s=0, cache_salt=salt)
        (record,) = asyncio.run(run_load(server.base_url, "lab", planned(1, 2), options)).requests
        assert record.error is None
        hits = [entry["cached_tokens"] for entry in server.get("/fake/log").values()]
        return int(hits[-1])

    # 64 prompt tokens: 4 blocks of 16, of which 3 can hit (the last token is recomputed).
    assert [cached(s) for s in ("a", "a", "b", None, None, "b")] == [0, 48, 0, 0, 48, 48]


def test_usage_on_the_last_text_chunk_is_not_counted_twice(fake_server: Any) -> None:
    # llama.cpp's llama-server: a text chunk per step (here multi-token ones), no running usage,
    # and the whole usage on the last text chunk.
    server = fake_server(
        {"ttft_ms": 2, "itl_ms": [2], "chunk_tokens": [1, 3], "server_style": "llamacpp"}
    )
    result = asyncio.run(
        run_load(server.base_url, "lab", planned(2, 9), LoadOptions(metrics_poll_s=0))
    )
    truth = by_index(server.get("/fake/log"))
    for record in result.requests:
        sends = truth[record.req_id]["sends"]
        assert record.error is None
        # The tokens the server generated (its usage.completion_tokens, 9), counted once: not
        # one per text chunk, and not the chunks plus the usage on top.
        assert record.output_tokens == sum(n for _, _, n in sends) == 9
        # Each chunk keeps the time it came; there are fewer chunks than tokens.
        assert len(record.chunks) == len(sends) < 9
    assert set(result.count_sources) == {"text"}
    assert result.usage_mismatches == 0


def test_throughput_waits_for_a_request_that_hangs_as_bench_does(fake_server: Any) -> None:
    server = fake_server(
        {"ttft_ms": 2, "itl_ms": [2], "requests": {"3": {"stall_after_tokens": 2}}}
    )
    options = LoadOptions(metrics_poll_s=0, read_timeout_s=1.5)
    before = time.monotonic()
    result = asyncio.run(run_load(server.base_url, "lab", planned(4, 10), options))
    after = time.monotonic()
    hung = next(r for r in result.requests if r.req_id == "3")
    assert hung.error == "timed out after 2 tokens (read timeout)"
    done = [r for r in result.requests if r.error is None]
    # bench: from before the send loop until every request has returned, the failed one too,
    # which returns only after 1.5 s of silence following its last chunk.
    assert before <= result.t0
    assert hung.chunks[-1][0] + 1.5 <= result.duration_s <= after - result.t0
    assert max(r.finish_s for r in done) < 1.0 < result.duration_s
    record = RunRecord(
        backend="vllm",
        where="test",
        simulated=False,
        requests=result.requests,
        samples=[],
        counters=EngineCounters(),
        duration_s=result.duration_s,
        wall_s=result.wall_s,
    )
    summary = summarize(record)
    assert summary["output_tokens_per_s"] == pytest.approx(30 / result.duration_s)
    assert summary["requests_per_s"] == pytest.approx(3 / result.duration_s)


def test_each_failure_is_recorded_with_its_reason_and_the_run_continues(fake_server: Any) -> None:
    server = fake_server(
        {
            "ttft_ms": 5,
            "itl_ms": [5],
            "requests": {
                "1": {"cut_after_tokens": 5},
                "2": {"status": 500},
                "3": {"stall_after_tokens": 3},
                "4": {"error_after_tokens": 2},
            },
        }
    )
    options = LoadOptions(metrics_poll_s=0, read_timeout_s=1.0)
    result = asyncio.run(run_load(server.base_url, "lab", planned(6, 10), options))
    errors = {r.req_id: r.error for r in result.requests}
    assert errors == {
        "0": None,
        "1": "stream cut after 5 tokens",
        "2": "HTTP 500: fake internal error",
        "3": "timed out after 3 tokens (read timeout)",
        "4": "server error after 2 tokens: fake engine failure",
        "5": None,
    }
    by_id = {r.req_id: r for r in result.requests}
    assert by_id["1"].output_tokens == 5 and by_id["1"].finish_s is None
    assert by_id["2"].chunks == [] and by_id["5"].output_tokens == 10


def test_a_server_that_is_not_there_fails_every_request_quickly() -> None:
    from labs.backends.vllm.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    options = LoadOptions(metrics_poll_s=0, connect_timeout_s=2)
    result = asyncio.run(run_load(url, "lab", planned(2), options))
    assert all(r.error and r.error.startswith("could not connect") for r in result.requests)


def test_a_closed_loop_keeps_at_most_max_concurrency_in_flight(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 20, "itl_ms": [10]})
    options = LoadOptions(max_concurrency=2, metrics_poll_s=0)
    result = asyncio.run(run_load(server.base_url, "lab", planned(6, 3), options))
    spans = sorted((r.arrival_s, r.finish_s) for r in result.requests)
    for start, _ in spans:
        in_flight = sum(1 for s, f in spans if s <= start < f)
        assert in_flight <= 2


def test_the_plan_is_the_simulators_workload_with_a_shared_prefix() -> None:
    params = parse_lab_params(
        {
            "num_prompts": 20,
            "prompt_tokens": 100,
            "output_tokens": 30,
            "max_tokens": 64,
            "input_range_ratio": 0.5,
            "shared_prefix_tokens": 48,
            "request_rate": 10,
            "seed": 7,
        }
    )
    plan = plan_requests(params.workload, vocab_size=params.model.vocab_size)
    assert plan == plan_requests(params.workload, vocab_size=params.model.vocab_size)
    sim = lab_workload(params.workload)
    assert [len(p.prompt) for p in plan] == sim.prompt_tokens.tolist()
    assert [p.output_tokens for p in plan] == sim.output_tokens.tolist()
    # bench's arrivals: a first gap too, the simulator's gaps after it, all scaled so that the
    # last request is sent at n / rate (vllm/benchmarks/serve.py get_request).
    sends = np.array([p.send_at_s for p in plan])
    assert sends[0] > 0 and sends[-1] == pytest.approx(20 / 10)
    gaps = np.diff(sends)
    assert gaps == pytest.approx(
        np.diff(sim.intended_arrival_s) * (gaps[0] / np.diff(sim.intended_arrival_s)[0])
    )
    assert (
        bench_arrivals(sim.intended_arrival_s, None, np.random.default_rng(0)).tolist()
        == [0.0] * 20
    )
    assert len({tuple(p.prompt[:48]) for p in plan}) == 1
    assert len({tuple(p.prompt[48:56]) for p in plan}) == 20
    assert all(1000 <= t < 32000 for p in plan for t in p.prompt)


def test_a_completion_with_no_tokens_is_a_failure_that_says_so() -> None:
    from labs.backends.base import RequestRecord
    from labs.backends.vllm.loadgen import _Stream

    record = RequestRecord("0", 4, 8, 0.0, [], None)
    stream = _Stream(record, 0.0)
    stream.feed(
        b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
        0.01,
    )
    assert stream.done and record.chunks == []
    assert stream.outcome() == "finished (stop) with no output tokens"


def test_a_stream_that_ends_early_on_length_is_counted_as_such(fake_server: Any) -> None:
    # vLLM lowers max_tokens to what max_model_len leaves and ends on "length": 64 + 10 tokens
    # asked of a 70-token context gives 6.
    server = fake_server({"ttft_ms": 2, "itl_ms": [2], "max_model_len": 70})
    options = LoadOptions(metrics_poll_s=0)
    result = asyncio.run(run_load(server.base_url, "lab", planned(2, 10), options))
    assert [r.error for r in result.requests] == ['ended on "length" after 6 of 10 tokens'] * 2
    assert all(r.output_tokens == 6 and r.finish_s is None for r in result.requests)
