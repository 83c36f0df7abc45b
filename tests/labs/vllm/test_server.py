"""`vllm serve` arguments, and the server manager driving a stand-in `vllm` executable."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from labs.backends.vllm import server as srv
from labs.backends.vllm.loadgen import plan_requests
from labs.parameters.params import ParamError, parse_lab_params
from labs.prediction.predict import spec_tokens_per_step
from tests.labs.vllm.conftest import STANDIN, StandIn, alive, wait_gone

SMALL = {"model": "qwen2.5-0.5b", "prompt_tokens": 100, "output_tokens": 20, "max_tokens": 40}


def plan_for(tmp_path: Path, **values: Any) -> srv.ServePlan:
    return srv.build_plan(parse_lab_params({**SMALL, **values}), cache=tmp_path)


def test_the_arguments_for_a_lab_are_exactly_these(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, block_size=32, max_num_seqs=64, prefix_caching=False)
    model_dir = str(srv.MODELS_DIR / "qwen2.5-0.5b")
    assert plan.argv("vllm", port=8123) == [
        "vllm", "serve", model_dir,
        "--served-model-name", "lab",
        "--load-format", "dummy",
        "--skip-tokenizer-init",
        "--seed", "0",
        "--max-model-len", "1024",
        "--block-size", "32",
        "--max-num-seqs", "64",
        "--max-num-batched-tokens", "2048",
        "--enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--kv-cache-dtype", "auto",
        "--gpu-memory-utilization", "0.9",
        "--enable-prompt-tokens-details",
        "--host", "127.0.0.1", "--port", "8123",
    ]  # fmt: skip
    assert plan.files == {}


def test_speculation_accepts_at_the_learners_rate(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, spec_tokens=3, acceptance=0.7, draft_cost=0.25)
    spec = json.loads(plan.args[plan.args.index("--speculative-config") + 1])
    # Unconditional rates: the first i+1 drafts all accepted with chance 0.7^(i+1), so vLLM's
    # conditional rate at every position is 0.7 (independent acceptance at alpha).
    assert spec["synthetic_acceptance_rates"] == pytest.approx([0.7, 0.49, 0.343])
    assert "synthetic_acceptance_length" not in spec  # the two keys are exclusive in vLLM
    assert spec["rejection_sample_method"] == "synthetic"
    assert (spec["method"], spec["num_speculative_tokens"]) == ("draft_model", 3)
    ((path, text),) = plan.files.items()
    assert path == Path(spec["model"]) / "config.json"
    draft = json.loads(text)
    assert draft["num_hidden_layers"] == 6  # a quarter of the target's 24 layers
    assert draft["vocab_size"] == 151936  # vLLM needs the draft's vocabulary to match
    assert spec_tokens_per_step(4, 0.0) == 1.0
    ngram = plan_for(tmp_path, spec_method="ngram", spec_tokens=2, acceptance=0.5)
    spec = json.loads(ngram.args[ngram.args.index("--speculative-config") + 1])
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [0.5, 0.25],
    }


def _conditional(rates: list[float]) -> list[float]:
    """vLLM's conversion (docs/speculation-check.md): c_i = rates[i] / rates[i-1], 0 after a 0."""
    return [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]], strict=True)]


@given(k=st.integers(1, 16), alpha=st.floats(0.0, 1.0, exclude_max=True))
def test_the_rates_are_valid_for_vllm_for_every_k_and_alpha(k: int, alpha: float) -> None:
    rates = srv.synthetic_acceptance_rates(k, alpha)
    assert len(rates) == k and all(0.0 <= r <= 1.0 for r in rates)
    assert all(b <= a for a, b in zip(rates, rates[1:], strict=False))  # non-increasing
    assert json.loads(json.dumps(rates)) == rates


@pytest.mark.parametrize("alpha", [0.2, 0.37, 0.7])
def test_vllm_accepts_every_draft_at_alpha_even_far_down_a_long_run(alpha: float) -> None:
    # Rounded to 9 digits, 0.2^14 was 0 (so drafts 14 to 16 were never accepted), and the 16th
    # conditional rate was 0.3694 at alpha 0.37.
    conditional = _conditional(srv.synthetic_acceptance_rates(16, alpha))
    assert conditional == pytest.approx([alpha] * 16, rel=1e-12)


def test_a_kv_capacity_becomes_exact_kv_cache_bytes(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, kv_capacity_tokens=1000)
    # Qwen2.5-0.5B: 2 (K, V) x 24 layers x 2 KV heads x 64 x 2 bytes = 12,288 bytes a token;
    # ceil(1000 / 16) = 63 blocks, plus vLLM's null block.
    assert plan.args[plan.args.index("--kv-cache-memory-bytes") + 1] == str(64 * 16 * 12288)
    assert "--gpu-memory-utilization" not in plan.args
    spec = plan_for(tmp_path, kv_capacity_tokens=1000, spec_tokens=1, draft_cost=0.25)
    # The 6-layer draft's KV comes out of the same pool.
    assert spec.args[spec.args.index("--kv-cache-memory-bytes") + 1] == str(
        64 * 16 * 12288 * 30 // 24
    )


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"kv_allocation": "contiguous"}, "kv_allocation"),
        ({"weight_dtype": "int4"}, "weight_dtype"),
        ({"block_size": 8}, "block_size"),
        (
            {"chunked_prefill": False, "max_num_batched_tokens": 1024, "prompt_tokens": 1000,
             "output_tokens": 200, "max_tokens": 200, "max_num_seqs": 64},
            "max_num_batched_tokens",
        ),
    ],
)  # fmt: skip
def test_what_vllm_cannot_run_is_refused_naming_the_field(
    tmp_path: Path, values: dict[str, Any], field: str
) -> None:
    with pytest.raises(ParamError) as caught:
        plan_for(tmp_path, **values)
    assert list(caught.value.errors) == [field]


def test_a_worker_can_point_a_model_at_real_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = tmp_path / "llama"
    weights.mkdir()
    config = json.loads((srv.MODELS_DIR / "llama-3.1-8b" / "config.json").read_text())
    (weights / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("LABS_VLLM_MODEL_DIR_LLAMA_3_1_8B", str(weights))
    plan = plan_for(tmp_path, model="llama-3.1-8b")
    assert plan.args[1] == str(weights)
    assert plan.args[plan.args.index("--load-format") + 1] == "auto"
    with pytest.raises(ParamError, match="draft checkpoint"):
        plan_for(tmp_path, model="llama-3.1-8b", spec_tokens=2)
    (weights / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 80}))
    with pytest.raises(ParamError, match="is not llama-3.1-8b: its config.json has layers 80"):
        plan_for(tmp_path, model="llama-3.1-8b")


@pytest.mark.parametrize("size", ["8b", "70b"])
def test_a_llama_3_folder_is_not_taken_for_llama_3_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: str
) -> None:
    """Llama 3 and 3.1 share their shape: the worker's own check tells them apart by the
    context and its RoPE scaling, and by the MLP width where two models share the rest."""
    weights = tmp_path / "llama"
    weights.mkdir()
    llama3 = json.loads((srv.MODELS_DIR / f"llama-3-{size}" / "config.json").read_text())
    (weights / "config.json").write_text(json.dumps(llama3))
    monkeypatch.setenv(f"LABS_VLLM_MODEL_DIR_LLAMA_3_1_{size.upper()}", str(weights))
    with pytest.raises(ParamError) as caught:
        plan_for(tmp_path, model=f"llama-3.1-{size}")
    said = caught.value.errors["model"]
    assert f"is not llama-3.1-{size}: its config.json has context 8,192" in said
    assert "rope_scaling none (" in said and "llama3 x8)" in said
    monkeypatch.setenv(f"LABS_VLLM_MODEL_DIR_LLAMA_3_{size.upper()}", str(weights))
    assert plan_for(tmp_path, model=f"llama-3-{size}").args[1] == str(weights)
    (weights / "config.json").write_text(json.dumps({**llama3, "intermediate_size": 11008}))
    with pytest.raises(ParamError, match=r"mlp_size 11,008 \(llama-3-"):
        plan_for(tmp_path, model=f"llama-3-{size}")


def accepted(values: dict[str, Any]) -> Any:
    try:
        return parse_lab_params(values)
    except ParamError:
        return None


def test_no_request_of_a_lab_vllm_accepts_is_longer_than_its_max_model_len(
    tmp_path: Path,
) -> None:
    # vLLM refuses a request whose prompt + max_tokens exceed --max-model-len (the fake too).
    # What the load generator sends (prompt, max_tokens = its output length) always fits the
    # length build_plan gives the server, and that never exceeds the model's context, which
    # vLLM refuses at start.
    checked = 0
    for model, prompt, output, ratios, chunked in itertools.product(
        ("llama-3-8b", "qwen2.5-0.5b"),
        (100, 3000, 7000),
        (20, 1192),
        ((0.0, 0.0), (0.5, 0.3)),
        (True, False),
    ):
        output_max = math.floor(output * (1 + ratios[1]))
        params = accepted(
            {"model": model, "prompt_tokens": prompt, "output_tokens": output,
             "max_tokens": output_max, "input_range_ratio": ratios[0],
             "output_range_ratio": ratios[1], "chunked_prefill": chunked,
             "max_num_batched_tokens": 16384, "num_prompts": 20, "seed": checked}
        )  # fmt: skip
        if params is None:
            continue
        try:
            plan = srv.build_plan(params, cache=tmp_path)
        except ParamError:
            continue
        max_model_len = int(plan.args[plan.args.index("--max-model-len") + 1])
        sent = plan_requests(params.workload, vocab_size=params.model.vocab_size)
        longest = max(len(p.prompt) + p.output_tokens for p in sent)
        assert longest <= max_model_len <= params.model.max_context, (model, prompt, output)
        checked += 1
    assert checked >= 30  # most of the grid is a lab vLLM runs, the 8192-token edge included


# -- the manager and the stand-in ----------------------------------------------------------------


def test_it_starts_the_exact_arguments_in_its_own_group_and_reuses_the_server(
    tmp_path: Path, standin: StandIn, manager: srv.ServerManager
) -> None:
    plan = plan_for(tmp_path)
    server, reused = manager.ensure(plan)
    assert not reused
    (start,) = standin.starts()
    assert start["argv"] == server.argv[1:]
    assert server.argv == plan.argv(str(standin.executable), port=server.port)
    # Its own process group, which holds its child too, in the starter's session (so the
    # scheduler's per-session autogroup does not set the engine against the load generator).
    assert start["pid"] == server.pid == start["pgid"]
    assert start["sid"] == os.getsid(0) != server.pid
    assert os.getpgid(start["grandchild"]) == server.pid
    assert srv.group_members(server.pid) == sorted([server.pid, start["grandchild"]])
    again, reused = manager.ensure(plan_for(tmp_path))
    assert reused and again is server and len(standin.starts()) == 1
    manager.stop()
    assert wait_gone([start["pid"], start["grandchild"]]) == []
    assert srv.group_members(start["pgid"]) == []


def test_changed_arguments_restart_the_server_and_end_the_old_group(
    tmp_path: Path, standin: StandIn, manager: srv.ServerManager
) -> None:
    first, _ = manager.ensure(plan_for(tmp_path, block_size=16))
    second, reused = manager.ensure(plan_for(tmp_path, block_size=32))
    assert not reused and second.pid != first.pid
    old, new = standin.starts()
    assert wait_gone([old["pid"], old["grandchild"]]) == []
    assert "32" in new["argv"] and alive(new["pid"]) and alive(new["grandchild"])


def test_a_server_that_dies_at_start_fails_with_its_log_and_leaves_nothing(
    tmp_path: Path, standin: StandIn, manager: srv.ServerManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_MODE", "die")
    with pytest.raises(srv.ServerError) as caught:
        manager.ensure(plan_for(tmp_path))
    message = str(caught.value)
    assert "exited with code 1 before it was ready" in message
    # The cause, ~60 lines above the generic error that ends the log.
    assert "vLLM said: ValueError: No valid attention backend found\n" in message
    (start,) = standin.starts()
    # The grandchild outlived its parent; the manager still ended it with the group.
    assert wait_gone([start["pid"], start["grandchild"]]) == []
    assert manager.current is None


def test_the_stand_in_answers_a_request_longer_than_max_model_len_as_vllm_033_does(
    tmp_path: Path, standin: StandIn, manager: srv.ServerManager
) -> None:
    server, _ = manager.ensure(plan_for(tmp_path))  # --max-model-len 1024
    models = httpx.get(server.base_url + "/v1/models", trust_env=False).json()
    assert models["data"][0]["max_model_len"] == 1024

    def post(prompt: int, max_tokens: int) -> httpx.Response:
        body = {"model": "lab", "prompt": [1000] * prompt, "max_tokens": max_tokens}
        options = {"stream": True, "stream_options": {"include_usage": True}}
        return httpx.post(
            server.base_url + "/v1/completions", json={**body, **options}, trust_env=False
        )

    def generated(response: httpx.Response) -> int:
        assert response.status_code == 200, response.text
        events = [
            json.loads(line[len("data: ") :])
            for line in response.text.splitlines()
            if line.startswith("data: {")
        ]
        return events[-1]["usage"]["completion_tokens"]

    assert generated(post(1000, 24)) == 24  # exactly max_model_len is served
    # 1. Clamp: prompt + max_tokens above max_model_len is served, max_tokens lowered.
    assert generated(post(1001, 24)) == 23
    assert generated(post(1023, 24)) == 1
    # 2. 400 when max_tokens alone exceeds max_model_len.
    alone = post(1, 1025).json()["error"]
    assert alone["param"] == "max_tokens" and "cannot be greater than" in alone["message"]
    # 3. 400 when the prompt alone reaches it (above it: input_tokens; at it: no room left).
    too_long = post(1025, 1)
    assert too_long.status_code == 400
    assert too_long.json()["error"] == {
        "message": "This model's maximum context length is 1024 tokens. However, your prompt "
        "contains 1025 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt. (parameter=input_tokens, value=1025)",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
    full = post(1024, 1)
    assert full.status_code == 400 and full.json()["error"]["param"] == "max_tokens"


def test_a_max_model_len_above_the_models_context_fails_at_start_as_in_vllm(
    tmp_path: Path, standin: StandIn, manager: srv.ServerManager
) -> None:
    plan = plan_for(tmp_path)
    args = list(plan.args)
    args[args.index("--max-model-len") + 1] = "65536"  # Qwen2.5-0.5B: 32768
    with pytest.raises(srv.ServerError) as caught:
        manager.ensure(dataclasses.replace(plan, args=tuple(args)))
    assert "User-specified max_model_len (65536) is greater than the derived" in str(caught.value)
    (start,) = standin.starts()
    assert wait_gone([start["pid"], start["grandchild"]]) == []


def test_a_server_that_never_gets_healthy_times_out_and_leaves_nothing(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_MODE", "never_healthy")
    manager = srv.ServerManager(start_timeout_s=1.5, stop_timeout_s=3, cache=standin.cache)
    began = time.monotonic()
    with pytest.raises(srv.ServerError) as caught:
        manager.ensure(plan_for(tmp_path))
    assert time.monotonic() - began >= 1.5  # it waited its start timeout (a busy CPU only adds)
    assert "was not healthy 2 s after start" in str(caught.value)
    assert "stand-in vllm serve" in str(caught.value)  # the log's last lines
    (start,) = standin.starts()
    assert wait_gone([start["pid"], start["grandchild"]]) == []


def test_a_group_that_ignores_sigterm_is_killed(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_MODE", "ignore_term")
    manager = srv.ServerManager(start_timeout_s=120, stop_timeout_s=1, cache=standin.cache)
    server, _ = manager.ensure(plan_for(tmp_path))
    began = time.monotonic()
    manager.stop()
    assert time.monotonic() - began >= 1  # it gave SIGTERM its stop timeout before SIGKILL
    (start,) = standin.starts()
    assert wait_gone([start["pid"], start["grandchild"]]) == []
    assert server.process.returncode == -9


def test_an_engine_its_server_left_behind_is_killed_after_a_short_grace(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_MODE", "engine_ignores_term")
    manager = srv.ServerManager(start_timeout_s=120, stop_timeout_s=60, cache=standin.cache)
    manager.ensure(plan_for(tmp_path))
    began = time.monotonic()
    manager.stop()
    # Not the stop timeout: the grace once the server has gone (a busy machine adds seconds).
    assert srv.ORPHAN_GRACE_S <= time.monotonic() - began < 30
    (start,) = standin.starts()
    assert wait_gone([start["pid"], start["grandchild"]]) == []


def test_a_server_that_dies_later_is_noticed_and_its_group_ended(
    tmp_path: Path, standin: StandIn, manager: srv.ServerManager
) -> None:
    server, _ = manager.ensure(plan_for(tmp_path))
    (start,) = standin.starts()
    os.kill(server.pid, 9)
    server.process.wait(timeout=10)
    with pytest.raises(srv.ServerError) as caught:
        manager.check()
    # In words, not "exited with code -9": who sends SIGKILL.
    said = str(caught.value)
    assert said.startswith("vllm serve was killed (SIGKILL), which nothing in vLLM sends: ")
    assert "out-of-memory killer" in said and "during the run" in said and "-9" not in said
    assert wait_gone([start["grandchild"]]) == []


def test_each_way_a_server_ends_is_said_in_words() -> None:
    assert srv.ended_words(1) == "vllm serve exited with code 1"
    assert srv.ended_words(-15) == "vllm serve was stopped from outside (SIGTERM)"
    assert srv.ended_words(-11) == "vllm serve crashed (SIGSEGV)"
    assert "SIGKILL" in srv.ended_words(-9)


def test_a_server_left_by_a_killed_worker_is_stopped_by_the_next(
    tmp_path: Path, standin: StandIn
) -> None:
    plan = plan_for(tmp_path)
    first = srv.ServerManager(start_timeout_s=120, stop_timeout_s=3, cache=standin.cache)
    orphan, _ = first.ensure(plan)
    first.current = None  # the worker is gone without stopping it
    (start,) = standin.starts()
    successor = srv.ServerManager(start_timeout_s=120, stop_timeout_s=3, cache=standin.cache)
    try:
        server, reused = successor.ensure(plan)
        assert not reused and server.pid != orphan.pid
        assert wait_gone([start["pid"], start["grandchild"]]) == []
    finally:
        successor.stop()
        orphan.process.wait(timeout=10)


def test_a_server_whose_worker_still_runs_is_left_alone(tmp_path: Path, standin: StandIn) -> None:
    """A second process on the same devices (another worker, `lab calibrate`) must not stop a
    live worker's server mid-run: it is refused, naming the owner; once the owner is gone, the
    server is an orphan and is stopped as before."""
    plan = plan_for(tmp_path)
    first = srv.ServerManager(start_timeout_s=120, stop_timeout_s=3, cache=standin.cache)
    server, _ = first.ensure(plan)
    state_path = first._state_path
    owner = subprocess.Popen(["sleep", "120"])  # stands for the other worker's process
    try:
        state = json.loads(state_path.read_text())
        assert state["owner"] == os.getpid()
        state_path.write_text(json.dumps({**state, "owner": owner.pid}))
        second = srv.ServerManager(start_timeout_s=120, stop_timeout_s=3, cache=standin.cache)
        busy = f"another process of this installation \\(pid {owner.pid},"
        with pytest.raises(srv.ServerError, match=busy):
            second.ensure(plan)
        assert server.process.poll() is None  # still serving the first worker
        # What the worker's heartbeat announces, so the lab stops offering the device.
        assert srv.engine_busy(standin.cache).startswith("vLLM on this device is busy")
        owner.kill()
        owner.wait(timeout=10)
        assert srv.engine_busy(standin.cache) == ""
        replaced, reused = second.ensure(plan)
        assert not reused and replaced.pid != server.pid
        server.process.wait(timeout=10)
        second.stop()
    finally:
        owner.kill()
        first.current = None
        if server.process.poll() is None:
            srv.stop_group(server.pid, server.process, 3)


def test_a_missing_executable_says_how_to_install_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_EXECUTABLE", "no-such-vllm-here")
    manager = srv.ServerManager(cache=tmp_path)
    with pytest.raises(srv.ServerError, match=r"pip install '\.\[gpu\]'"):
        manager.ensure(plan_for(tmp_path))


def test_the_stand_in_answers_version_like_vllm() -> None:
    out = subprocess.run(
        [sys.executable, str(STANDIN), "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0.33.0"


def test_the_engine_lock_is_this_installations_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another checkout's worker on this machine keeps its server in its own directory: the
    default cache directory (and the lock in it) is named after this installation."""
    monkeypatch.delenv("LABS_VLLM_CACHE_DIR", raising=False)
    default = srv.cache_dir()
    assert default.name == f"serving-school-vllm-{srv._INSTALLATION}"
    assert srv.state_path(default).parent == default
