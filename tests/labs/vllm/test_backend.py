"""The vllm backend end to end against the fake: a RunRecord like the simulator's, with the
engine's counters read from /metrics; started through the server manager on the stand-in, or
against an already-running server (base_url)."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest

from labs.backends import get_backend
from labs.backends.base import BackendError, Phase, RunRecord
from labs.backends.vllm import backend as vllm_backend
from labs.backends.vllm.backend import VLLMBackend, where_label
from labs.backends.vllm.server import MODELS_DIR, ServerError
from labs.measurement.metrics import summarize
from labs.parameters.catalog import MODELS
from labs.parameters.params import ParamError, parse_lab_params
from tests.labs.vllm.conftest import StandIn, wait_gone

PARAMS = {
    "model": "qwen2.5-0.5b",
    "num_prompts": 12,
    "prompt_tokens": 128,
    "output_tokens": 12,
    "max_tokens": 64,
    "shared_prefix_tokens": 64,
    "seed": 3,
}
FAKE = {
    "ttft_ms": 30,
    "itl_ms": [20],
    "chunk_tokens": [1, 3, 4],  # a speculative engine's steps: 1 + accepted drafts
    "spec_k": 3,
    "max_num_seqs": 4,  # so some requests wait
    "counters_start": {
        "num_preemptions": 11,
        "prefix_cache_queries": 5000,
        "prefix_cache_hits": 2000,
        "spec_decode_num_drafts": 70,
        "spec_decode_num_draft_tokens": 210,
        "spec_decode_num_accepted_tokens": 100,
    },
    "requests": {"2": {"preemptions": 1}, "5": {"preemptions": 2}},
}


def test_a_run_against_a_running_server_reads_counters_right(fake_server: Any) -> None:
    server = fake_server(FAKE)
    progress: list[float] = []
    backend = get_backend("vllm", base_url=server.base_url)
    assert isinstance(backend, VLLMBackend)
    backend.metrics_poll_s = 0.05
    record = backend.run(parse_lab_params(PARAMS), lambda f, phase=None: progress.append(f))

    assert (record.backend, record.simulated) == ("vllm", False)
    assert record.where.startswith("vLLM 0.33.0 ")
    assert len(record.requests) == 12 and all(r.error is None for r in record.requests)
    assert all(r.output_tokens == 12 and r.prompt_tokens == 128 for r in record.requests)
    # Chunks of 1, then 1, 3, 4, 1, 3 tokens: multi-token chunks are counted as such.
    assert [n for _, n in record.requests[0].chunks] == [1, 1, 3, 4, 1, 2]
    counted = server.get("/fake/state")["counters"]
    c = record.counters
    # Each run's own counts: the page after the run minus the page before it, which came after
    # the unmeasured warm-up request (the first planned one, under a cache salt of its own).
    assert c.preemptions == counted["num_preemptions"] == 3
    assert c.prefix_cache_queries == 12 * 128 == counted["prefix_cache_queries"] - 128
    # 64 shared tokens = 4 blocks of 16, found by every request after the first; the warm-up's
    # salt kept its blocks apart.
    assert c.prefix_cache_hits == counted["prefix_cache_hits"] == 11 * 64
    assert c.spec_drafts == 12 * 5 == counted["spec_decode_num_drafts"] - 5
    assert record.meta["warmup_s"] > 0 and record.meta["warmup_error"] is None
    assert c.spec_draft_tokens == 12 * 5 * 3
    assert c.spec_accepted_tokens == 12 * (12 - 6)  # tokens minus chunks, per request
    # Each request's own hit, from its final usage (prompt_tokens_details): the first admitted
    # found nothing, every later one the shared 64 tokens.
    assert sorted(r.cached_prompt_tokens for r in record.requests) == [0] + [64] * 11
    assert (c.num_gpu_blocks, c.block_size) == (4096, 16)
    # Running and waiting over time, from the polls: never more than max_num_seqs running.
    assert len(record.samples) >= 3
    assert max(s.running for s in record.samples) <= 4
    assert any(s.waiting > 0 for s in record.samples)
    assert progress[-1] == 1.0
    assert record.duration_s > 0 and record.wall_s >= record.duration_s
    assert record.meta["token_counts_from"] == {"usage": 12 * 6}
    # The same record the simulator gives: metrics and storage work unchanged.
    assert RunRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    summary = summarize(record)
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["prefix_cache_hit_rate"] == pytest.approx(704 / 1536)
    assert summary["preemptions"] == 3


def test_a_run_never_counts_blocks_an_earlier_run_cached_as_hits(fake_server: Any) -> None:
    # The same requests twice on one server: each run salts its prefix cache with a salt vLLM
    # accepts (the fake enforces vLLM's rules), so each sees only its own shared prefix hit.
    server = fake_server({"ttft_ms": 2, "itl_ms": [2]})
    backend = VLLMBackend(base_url=server.base_url, metrics_poll_s=1.0)
    first, second = (backend.run(parse_lab_params(PARAMS)) for _ in range(2))
    assert all(r.error is None for r in first.requests + second.requests)
    assert first.counters.prefix_cache_hits == second.counters.prefix_cache_hits == 11 * 64


def test_failed_requests_are_in_the_record_and_the_run_goes_on(fake_server: Any) -> None:
    server = fake_server({"ttft_ms": 5, "itl_ms": [2], "requests": {"1": {"status": 500}}})
    backend = VLLMBackend(base_url=server.base_url, metrics_poll_s=0)
    record = backend.run(parse_lab_params({**PARAMS, "num_prompts": 3}))
    errors = [r.error for r in record.requests]
    assert errors[0] is None and errors[2] is None
    assert errors[1] == "HTTP 500: fake internal error"
    assert summarize(record)["failed"] == 1


def test_a_run_in_which_every_request_failed_fails_with_the_first_reasons(
    fake_server: Any,
) -> None:
    behaviour = {"0": {"status": 500}, "1": {"cut_after_tokens": 2}, "2": {"status": 500}}
    server = fake_server({"ttft_ms": 2, "itl_ms": [2], "requests": behaviour})
    backend = VLLMBackend(base_url=server.base_url, metrics_poll_s=0)
    with pytest.raises(BackendError) as info:
        backend.run(parse_lab_params({**PARAMS, "num_prompts": 3}))
    assert str(info.value) == (
        "every one of the 3 requests failed: HTTP 500: fake internal error; "
        "stream cut after 2 tokens"
    )


def test_counters_the_server_does_not_report_are_not_reported(fake_server: Any) -> None:
    # No /metrics scraped (as with a server that is not vLLM): no engine counter is known.
    server = fake_server({"ttft_ms": 2, "itl_ms": [2]})
    record = VLLMBackend(base_url=server.base_url, metrics_poll_s=0).run(
        parse_lab_params({**PARAMS, "num_prompts": 2})
    )
    assert record.counters.preemptions is None and record.counters.prefix_cache_hits is None
    summary = summarize(record)
    assert summary["preemptions"] is None and summary["prefix_cache_hit_rate"] is None
    assert summary["completed"] == 2
    stored = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert stored.counters.preemptions is None
    from labs.explanation import results
    from labs.prediction.predict import predict

    params = parse_lab_params({**PARAMS, "num_prompts": 2})
    rows = {
        r.label: r for r in results.compare(summary, predict(params).as_dict(), params.as_dict())
    }
    assert rows["Preemptions"].measured == "not reported"


def test_a_running_servers_max_model_len_is_checked_before_anything_is_sent(
    fake_server: Any,
) -> None:
    # PARAMS: every request is 128 prompt + 12 output tokens. vLLM would refuse each one with
    # 400 on a server started with --max-model-len 139; the learner is told why, at once.
    short = fake_server({"ttft_ms": 2, "itl_ms": [2], "max_model_len": 139})
    with pytest.raises(ParamError) as caught:
        VLLMBackend(base_url=short.base_url, metrics_poll_s=0).run(parse_lab_params(PARAMS))
    assert list(caught.value.errors) == ["prompt_tokens"]
    message = caught.value.errors["prompt_tokens"]
    assert "max_model_len of 139 tokens" in message and "128 + 12 = 140 tokens" in message
    assert short.get("/fake/log") == {}
    edge = fake_server({"ttft_ms": 2, "itl_ms": [2], "max_model_len": 140})
    record = VLLMBackend(base_url=edge.base_url, metrics_poll_s=0).run(parse_lab_params(PARAMS))
    assert len(record.requests) == 12 and all(r.error is None for r in record.requests)


@pytest.mark.django_db
def test_a_run_the_server_cannot_take_fails_with_the_reason_and_no_traceback(
    fake_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, alice
) -> None:
    from labs.models import RunState
    from labs.runs import execution
    from tests.labs.factories import make_run

    short = fake_server({"ttft_ms": 2, "itl_ms": [2], "max_model_len": 139})
    monkeypatch.setenv("LABS_VLLM_BASE_URL", short.base_url)
    run = make_run(alice, backend="vllm", params=parse_lab_params(PARAMS).as_dict())
    with caplog.at_level("INFO", logger="labs.runs.submission"):
        assert execution.run_execute(run_id=run.pk, hostname="gpu@test") == RunState.FAILED
    run.refresh_from_db()
    assert run.error.startswith("These settings cannot run: prompt_tokens + ")
    assert "max_model_len of 139 tokens" in run.error and "ParamError" not in run.error
    # A learner's setting, not a worker fault: logged as such, with no traceback.
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]
    assert any("refused on the worker" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("fresh_backend_manager")
def test_requests_as_long_as_the_lab_allows_are_served_by_the_server_it_starts(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1000 + 24 tokens: the server gets --max-model-len 1024 and every request is exactly that
    # long; the stand-in refuses, as vLLM does, anything longer.
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"ttft_ms": 2, "itl_ms": [1]}))
    values = {"prompt_tokens": 1000, "output_tokens": 24, "max_tokens": 24, "num_prompts": 4}
    record = VLLMBackend(metrics_poll_s=0).run(parse_lab_params({**PARAMS, **values}))
    assert record.meta["max_model_len"] == 1024
    # The run says how its TTFT was stamped and how it sampled (issue 23, item 8).
    assert record.meta["definitions"]["ttft"].startswith("stamped at the socket")
    assert record.meta["definitions"]["sampling"].startswith("greedy (temperature 0)")
    assert [(r.error, r.prompt_tokens + r.output_tokens) for r in record.requests] == [
        (None, 1024)
    ] * 4


def test_no_server_at_base_url_fails_the_run_clearly() -> None:
    from labs.backends.vllm.server import free_port

    backend = VLLMBackend(base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ServerError, match="no vLLM server answers"):
        backend.run(parse_lab_params(PARAMS))


def test_the_label_says_which_vllm_on_which_gpu() -> None:
    assert where_label("0.33.0", "NVIDIA H100 80GB HBM3", 1, None) == (
        "vLLM 0.33.0 on NVIDIA H100 80GB HBM3"
    )
    assert where_label("0.33.0", "NVIDIA H100 80GB HBM3", 4, None) == (
        "vLLM 0.33.0 on 4\u00d7 NVIDIA H100 80GB HBM3"
    )
    assert where_label("0.33.0", None, 1, None) == "vLLM 0.33.0 on an unknown GPU"
    assert where_label("0.33.0", "x", 1, "http://gpu-box:8000") == "vLLM 0.33.0 at gpu-box"


@pytest.mark.usefixtures("fresh_backend_manager")
def test_a_worker_starts_reuses_and_restarts_its_server(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"ttft_ms": 5, "itl_ms": [2]}))
    backend = VLLMBackend(metrics_poll_s=0.05)
    first = backend.run(parse_lab_params(PARAMS))
    second = backend.run(parse_lab_params({**PARAMS, "seed": 4}))  # new requests, same engine
    assert (first.meta["server_reused"], second.meta["server_reused"]) == (False, True)
    assert first.meta["server_pid"] == second.meta["server_pid"]
    assert first.meta["engine_args"][1:3] == ["serve", str(MODELS_DIR / "qwen2.5-0.5b")]
    assert all(r.error is None for r in first.requests + second.requests)
    third = backend.run(parse_lab_params({**PARAMS, "block_size": 32}))
    assert third.meta["server_reused"] is False
    old, new = standin.starts()
    assert wait_gone([old["pid"], old["grandchild"]]) == []
    vllm_backend.stop_server()
    assert wait_gone([new["pid"], new["grandchild"]]) == []


@pytest.mark.usefixtures("fresh_backend_manager")
def test_the_backend_says_it_is_starting_vllm_while_the_server_starts(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in answers /health only 1.5 s after it started, as vLLM does once loaded.
    fake = {"ttft_ms": 5, "itl_ms": [2], "healthy_after_s": 1.5}
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps(fake))
    backend = VLLMBackend(metrics_poll_s=0.05)

    def run(values: dict[str, Any]) -> tuple[RunRecord, list[tuple[float, Phase | None]]]:
        calls: list[tuple[float, Phase | None]] = []
        record = backend.run(
            parse_lab_params({**PARAMS, **values}),
            lambda fraction, phase=None: calls.append((fraction, phase)),
        )
        return record, calls

    first, calls = run({})
    steps = [phase.step if phase else None for _, phase in calls]
    # "starting" while ensure() waits, then "ready" once, then requests with no phase.
    ready = steps.index("ready")
    assert ready >= 1 and set(steps[:ready]) == {"starting"}, steps
    assert set(steps[ready + 1 :]) == {None} and calls[-1][0] == 1.0
    starting = [phase for _, phase in calls[:ready] if phase is not None]
    assert all(f == 0.0 for f, _ in calls[: ready + 1])
    assert {p.why for p in starting} == {"first run on this worker"}
    assert {p.last_start_s for p in starting} == {None}  # no earlier start on this worker
    waited = [p.elapsed_s for p in starting]
    assert None not in waited and waited == sorted(waited)  # the seconds so far, rising
    done = calls[ready][1]
    assert done is not None and (done.reused, done.why) == (False, "first run on this worker")
    # Ready after the stand-in's 1.5 s, and after the last "starting" said how long so far.
    assert done.elapsed_s == pytest.approx(first.meta["server_start_s"], abs=0.05)
    assert done.elapsed_s >= max(1.5, waited[-1])
    assert first.meta["server_start_why"] == "first run on this worker"
    assert done.note().startswith("vLLM ready: started in ")

    # Same engine arguments: the running server is reused, with no start phase at all.
    second, calls = run({"seed": 4})
    assert second.meta["server_reused"] is True
    phases = [phase for _, phase in calls if phase is not None]
    assert [(p.step, p.reused) for p in phases] == [("ready", True)]
    assert phases[0].note() == "vLLM ready: reused the running server (same engine arguments)."

    # Changed arguments: a restart, which knows how long the last start took.
    third, calls = run({"block_size": 32})
    starting = [phase for _, phase in calls if phase is not None and phase.step == "starting"]
    assert starting and {p.why for p in starting} == {"engine arguments changed"}
    last = [p.last_start_s for p in starting]
    assert last == [pytest.approx(first.meta["server_start_s"], abs=0.05)] * len(starting)
    assert "the last start on this worker took" in starting[-1].note()
    assert third.meta["server_reused"] is False


def serving(standin: StandIn) -> bool:
    """The stand-in server started and answers /health."""
    starts = standin.starts()
    if not starts:
        return False
    argv = starts[0]["argv"]
    port = argv[argv.index("--port") + 1]
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.usefixtures("fresh_backend_manager")
def test_a_server_that_dies_during_a_run_fails_it_with_its_log(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"ttft_ms": 5000}))

    def kill_server(fraction: float, phase: Phase | None = None) -> None:
        # Progress is reported while the server starts too; kill it once the manager has taken
        # it as ready (the load is on), not when /health first answers (still starting, for it).
        if vllm_backend.server_manager().current is not None and serving(standin):
            os.kill(standin.starts()[0]["pid"], 9)

    with pytest.raises(ServerError, match=r"was killed \(SIGKILL\), .* during the run"):
        VLLMBackend(metrics_poll_s=0).run(parse_lab_params(PARAMS), kill_server)
    (start,) = standin.starts()
    assert wait_gone([start["pid"], start["grandchild"]]) == []


@pytest.mark.usefixtures("fresh_backend_manager")
def test_a_killed_engine_fails_its_run_with_its_reason(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in's grandchild is its engine: killed once some requests have finished, its
    # server fails the rest at once and stays up (vLLM's watchdog takes 5 s), so the load ends
    # while the server still runs, with some requests done.
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"itl_ms": [100], "max_num_seqs": 4}))
    killed: list[int] = []

    def kill_engine(fraction: float, phase: Phase | None = None) -> None:
        if not killed and fraction > 0 and vllm_backend.server_manager().current is not None:
            killed.append(standin.starts()[0]["grandchild"])
            os.kill(killed[0], 9)

    with pytest.raises(ServerError) as caught:
        VLLMBackend(metrics_poll_s=0).run(parse_lab_params(PARAMS), kill_engine)
    message = str(caught.value)
    assert killed and message.startswith("vLLM's engine stopped during the run")
    # Its own first error line, not the start-up warning every server logs.
    said = message.split("\n")[0]
    assert said.endswith(
        "vLLM said: [shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    )
    assert vllm_backend.server_manager().current is None
    (start,) = standin.starts()
    assert wait_gone([start["pid"]]) == []


@pytest.mark.usefixtures("fresh_backend_manager")
def test_a_cancelled_run_stops_the_load_but_keeps_the_server(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"ttft_ms": 5000}))

    class Cancelled(Exception):
        pass

    calls = []

    def cancel(fraction: float, phase: Phase | None = None) -> None:
        # Not while the server is still starting (the manager takes it as ready first).
        if vllm_backend.server_manager().current is not None and serving(standin):
            calls.append(fraction)
        if len(calls) > 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        VLLMBackend(metrics_poll_s=0).run(parse_lab_params(PARAMS), cancel)
    (start,) = standin.starts()
    manager = vllm_backend.server_manager()
    assert manager.current is not None and manager.current.pid == start["pid"]


@pytest.mark.usefixtures("fresh_backend_manager")
def test_settings_vllm_cannot_run_fail_before_anything_starts(standin: StandIn) -> None:
    with pytest.raises(ParamError, match="kv_allocation"):
        VLLMBackend().run(parse_lab_params({**PARAMS, "kv_allocation": "contiguous"}))
    assert standin.starts() == []


def test_it_describes_the_worker_for_its_heartbeat(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA L4, 23034'\necho '1, NVIDIA L4, 23034'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("LABS_NVIDIA_SMI", str(smi))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    vllm_backend.gpu_inventory.cache_clear()
    vllm_backend.gpu_name.cache_clear()
    try:
        info = VLLMBackend().describe()
    finally:
        vllm_backend.gpu_inventory.cache_clear()
        vllm_backend.gpu_name.cache_clear()
    assert info["where"].startswith("vLLM ") and info["where"].endswith("on NVIDIA L4")
    assert set(info) == {"where", "gpu_name", "versions", "gpus"}
    assert info["gpus"] == {
        "count": 2,
        "name": "NVIDIA L4",
        "kind": "l4",
        "memory_bytes": 23034 * 1024 * 1024,
        "vllm": info["versions"]["vllm"],
    }


@pytest.mark.parametrize("slug", sorted(MODELS))
def test_every_catalog_model_has_a_config_that_matches_the_catalog(slug: str) -> None:
    config = json.loads((MODELS_DIR / slug / "config.json").read_text())
    model = MODELS[slug]
    assert config["num_hidden_layers"] == model.layers
    assert config["hidden_size"] == model.hidden_size
    assert config["num_attention_heads"] == model.heads
    assert config["num_key_value_heads"] == model.kv_heads
    assert config["head_dim"] == model.head_dim
    assert config["vocab_size"] == model.vocab_size
    assert config["max_position_embeddings"] == model.max_context
    assert config["architectures"] and config["torch_dtype"] == "bfloat16"
    assert config.get("num_local_experts", 1) == model.num_experts
    assert config.get("num_experts_per_tok", 1) == model.experts_per_token
    # Architecture facts only: no weights, no tokenizer files beside it.
    assert sorted(p.name for p in (MODELS_DIR / slug).iterdir()) == ["config.json"]


@pytest.mark.django_db  # `lab run` reads the device calibrations
def test_lab_run_measures_an_already_running_server(fake_server: Any) -> None:
    import io

    from django.core.management import call_command

    server = fake_server({"ttft_ms": 5, "itl_ms": [2]})
    out = io.StringIO()
    call_command(
        "lab", "run", "--backend", "vllm", "--base-url", server.base_url, "--json",
        "--model", "qwen2.5-0.5b", "--num-prompts", "4", "--prompt-tokens", "64",
        "--output-tokens", "8", "--max-tokens", "16", stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["backend"] == "vllm" and result["where"].startswith("vLLM 0.33.0")
    assert result["measured"]["completed"] == 4 and result["measured"]["failed"] == 0
    assert len(server.measured_log()) == 4


def iid_tokens_per_step(k: int, alpha: float) -> tuple[float, float]:
    """Mean and std of tokens per verification step when each of k drafts is accepted with
    chance alpha until the first rejection: j tokens with chance alpha^(j-1) (1 - alpha) for
    j <= k, and k + 1 (all drafts plus the bonus) with chance alpha^k."""
    probs = [alpha ** (j - 1) * (1 - alpha) for j in range(1, k + 1)] + [alpha**k]
    mean = sum(j * p for j, p in enumerate(probs, 1))
    var = sum((j - mean) ** 2 * p for j, p in enumerate(probs, 1))
    return mean, var**0.5


@pytest.mark.usefixtures("fresh_backend_manager")
def test_a_worker_measuring_a_server_elsewhere_receives_the_runs(db: Any) -> None:
    from labs.runs import submission
    from labs.runs.workers import served_queues
    from tests.labs.factories import make_heartbeat

    # LABS_VLLM_BASE_URL, no GPU: it announces no device and consumes the backend's queue only.
    make_heartbeat("vllm", hostname="remote@box", queue="labs.gpu", gpus={})
    queue = submission._precheck("vllm", parse_lab_params({**PARAMS, "gpu": "h100-sxm"}))
    assert queue in served_queues("vllm", "labs.gpu", {}) and queue == "labs.gpu"
    # Still held to the catalog: what no GPU of the kind could start is refused.
    with pytest.raises(ParamError, match="tp 2 would fit"):
        submission._precheck(
            "vllm", parse_lab_params({"model": "llama-3.1-70b", "gpu": "h100-sxm"})
        )


def test_a_gpu_worker_online_does_not_turn_away_runs_a_worker_elsewhere_takes(db: Any) -> None:
    """With an H100 worker and a base-URL worker online, an A100 run goes to the base-URL
    worker's queue, which the H100 worker does not consume; with the H100 worker alone it is
    refused, naming what is online."""
    from labs.runs import submission
    from labs.runs.workers import served_queues
    from tests.labs.factories import make_heartbeat

    h100 = {"count": 1, "name": "NVIDIA H100", "kind": "h100-sxm", "memory_bytes": 80 * 10**9}
    make_heartbeat("vllm", hostname="gpu@box", queue="labs.gpu.h100-sxm", gpus=h100)
    a100 = parse_lab_params({**PARAMS, "gpu": "a100-80gb"})
    with pytest.raises(ParamError, match=r"gpu must be a GPU kind an online vLLM worker has"):
        submission._precheck("vllm", a100)
    make_heartbeat("vllm", hostname="remote@box", queue="labs.gpu", gpus={})
    queue = submission._precheck("vllm", a100)
    assert queue == "labs.gpu"
    assert queue in served_queues("vllm", "labs.gpu", {})
    assert queue not in served_queues("vllm", "labs.gpu.h100-sxm", h100)
    # The H100's own runs still go to its kind's queue, and the catalog still decides the rest.
    assert submission._precheck("vllm", parse_lab_params({**PARAMS, "gpu": "h100-sxm"})) == (
        "labs.gpu.h100-sxm.x1"
    )
    with pytest.raises(ParamError, match="tp 2 would fit"):
        submission._precheck(
            "vllm", parse_lab_params({"model": "llama-3.1-70b", "gpu": "a100-80gb"})
        )


def test_a_worker_with_a_device_leaves_the_shared_gpu_queue_to_workers_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from config.celery import app
    from labs import worker_signals

    queues = app.amqp.Queues({})
    queues.select_add("labs.gpu")
    monkeypatch.setattr(
        worker_signals,
        "worker_inventory",
        lambda _: {"count": 2, "name": "NVIDIA L4", "kind": "l4", "memory_bytes": 24 * 10**9},
    )
    worker_signals._add_gpu_kind_queue(
        instance=SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=queues)))
    )
    assert "labs.gpu" not in queues.consume_from
    assert {"labs.gpu.l4.x1", "labs.gpu.l4.x2"} <= set(queues.consume_from)


@pytest.mark.usefixtures("fresh_backend_manager")
def test_speculation_on_the_stand_in_is_independent_acceptance_at_alpha(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The flags build_plan gives vLLM, read by the stand-in as vLLM 0.33 reads them; its fake
    # engine then accepts drafts with vLLM's synthetic rule (conditional rate per position).
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"ttft_ms": 2, "itl_ms": [1]}))
    params = parse_lab_params(
        {**PARAMS, "num_prompts": 16, "output_tokens": 1000, "max_tokens": 1000}
        | {"spec_method": "draft_model", "spec_tokens": 3, "acceptance": 0.7}
    )
    record = VLLMBackend(metrics_poll_s=1.0).run(params)
    # Every chunk after the first is one verification step; the last one may be cut short by
    # max_tokens, so it is left out.
    steps = [n for r in record.requests for _, n in r.chunks[1:-1]]
    assert len(steps) > 4000
    mean, std = iid_tokens_per_step(3, 0.7)
    assert (round(mean, 3), round(std, 3)) == (2.533, 1.239)
    got_mean = sum(steps) / len(steps)
    got_std = (sum((n - got_mean) ** 2 for n in steps) / len(steps)) ** 0.5
    assert got_mean == pytest.approx(mean, rel=0.05)
    assert got_std == pytest.approx(std, rel=0.05)
    # Every length from 1 to k + 1 occurs: not vLLM's length schedule (2 or 3 tokens only).
    assert set(steps) == {1, 2, 3, 4}
    c = record.counters
    assert c.spec_accepted_tokens / c.spec_draft_tokens == pytest.approx((mean - 1) / 3, rel=0.05)


@pytest.mark.usefixtures("fresh_backend_manager")
def test_the_acceptance_length_key_would_give_vllms_narrow_schedule(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old flag, for contrast: the same mean, but every step yields 2 or 3 tokens.
    monkeypatch.setenv("STANDIN_FAKE_CONFIG", json.dumps({"ttft_ms": 2, "itl_ms": [1]}))
    from labs.backends.vllm import server

    params = parse_lab_params(
        {**PARAMS, "num_prompts": 4, "output_tokens": 300, "max_tokens": 300}
        | {"spec_method": "draft_model", "spec_tokens": 3, "acceptance": 0.7}
    )
    plan = server.build_plan(params)
    spec = json.loads(plan.args[plan.args.index("--speculative-config") + 1])
    del spec["synthetic_acceptance_rates"]
    spec["synthetic_acceptance_length"] = 2.533
    args = list(plan.args)
    args[args.index("--speculative-config") + 1] = json.dumps(spec)
    patched = server.ServePlan(tuple(args), plan.files, plan.notes)
    monkeypatch.setattr(vllm_backend, "build_plan", lambda *a, **k: patched)
    record = VLLMBackend(metrics_poll_s=0).run(params)
    steps = {n for r in record.requests for _, n in r.chunks[1:-1]}
    assert steps == {2, 3}
