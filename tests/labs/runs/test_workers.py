"""Workers announce themselves with a heartbeat row; "online" means seen recently."""

from __future__ import annotations

import time

import pytest

from labs.models import WorkerHeartbeat
from labs.runs import workers
from labs.runs.selectors import backends_online
from tests.labs.factories import make_heartbeat


def test_a_worker_serves_the_backends_of_the_queues_it_consumes():
    assert workers.backends_for_queues(["labs.sim", "default"]) == ["sim"]
    assert workers.backends_for_queues(["labs.gpu"]) == ["vllm"]
    assert workers.backends_for_queues(["default"]) == []


@pytest.mark.django_db
def test_announce_creates_then_refreshes_one_row_per_backend():
    workers.announce("w1@box", ["sim"])
    first = WorkerHeartbeat.objects.get(hostname="w1@box")
    assert first.where == "simulated on CPU" and first.queue == "labs.sim"
    assert first.versions["python"] and first.versions["celery"]
    time.sleep(0.01)
    workers.announce("w1@box", ["sim"])
    again = WorkerHeartbeat.objects.get(hostname="w1@box")
    assert again.last_seen > first.last_seen and again.started_at == first.started_at


@pytest.mark.django_db
def test_a_worker_whose_first_description_is_slow_is_online_when_announced(monkeypatch):
    """make test-vllm in CI: the CPU worker measured its CPU for longer than the online window
    on a busy machine, its first heartbeat was stamped before that, and the submit found no
    vLLM worker online ('a custom GPU (cpu) exists only in the simulator')."""
    import datetime as dt

    from django.utils import timezone

    clock = [timezone.now()]
    monkeypatch.setattr(workers.timezone, "now", lambda: clock[0])
    real = workers.describe_backend

    def slow_description(backend):
        clock[0] += dt.timedelta(seconds=120)  # measuring took two minutes
        return real(backend)

    monkeypatch.setattr(workers, "describe_backend", slow_description)
    monkeypatch.setattr(workers, "_state", {})
    workers.announce("slow@box", ["sim"])
    beat = WorkerHeartbeat.objects.get(hostname="slow@box")
    assert beat.last_seen == clock[0]
    assert WorkerHeartbeat.objects.online(clock[0]).filter(hostname="slow@box").exists()


@pytest.mark.django_db
def test_online_means_seen_within_the_window(settings):
    settings.LABS_WORKER_ONLINE_S = 30
    make_heartbeat("sim", age_s=5)
    make_heartbeat("vllm", age_s=31)
    assert list(WorkerHeartbeat.objects.online().values_list("backend", flat=True)) == ["sim"]
    status = {b.backend: b for b in backends_online()}
    assert status["sim"].online and status["sim"].workers == 1
    assert not status["vllm"].online and status["vllm"].queue == "labs.gpu"


@pytest.mark.worker
def test_a_real_worker_announces_itself_and_leaves_when_stopped(celery_worker):
    # start_worker returns once the worker logs "ready", after the first heartbeat is written.
    beat = WorkerHeartbeat.objects.get(hostname__startswith=celery_worker.name)
    assert beat.backend == "sim" and beat.where == "simulated on CPU"
    assert beat.pid in {celery_worker.process.pid} or beat.pid
    assert WorkerHeartbeat.objects.online().filter(pk=beat.pk).exists()
    celery_worker.stop()
    assert not WorkerHeartbeat.objects.filter(hostname__startswith=celery_worker.name).exists()


def test_gpu_workers_serve_vllm_from_their_kind_queue():
    assert workers.backends_for_queues(["labs.gpu", "labs.gpu.l4"]) == ["vllm"]
    assert workers.backends_for_queues(["labs.gpu.h100-sxm"]) == ["vllm"]
    assert workers.backends_for_queues(["labs.gpuish"]) == []


@pytest.mark.django_db
def test_the_offer_is_the_largest_online_worker_of_each_catalog_kind(settings):
    make_heartbeat("vllm", hostname="a", gpus={"kind": "h100-sxm", "count": 2, "name": "H100"})
    make_heartbeat("vllm", hostname="b", gpus={"kind": "h100-sxm", "count": 8, "name": "H100"})
    make_heartbeat("vllm", hostname="c", gpus={"kind": "l4", "count": 1, "name": "NVIDIA L4"})
    make_heartbeat("vllm", hostname="d", gpus={"kind": "a100-80gb", "count": 4}, age_s=300)
    make_heartbeat("vllm", hostname="e", gpus={"kind": None, "count": 2, "name": "RTX 4090"})
    assert workers.gpu_offer() == {"h100-sxm": 8, "l4": 1}
    labels = {b.backend: b for b in backends_online()}["vllm"].gpus
    assert "2\u00d7 RTX 4090 (not in the catalog)" in labels


def _executable(path, body: str):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.mark.worker
def test_runs_reach_the_gpu_worker_of_their_kind(transactional_db, tmp_path, alice):
    import json
    import sys

    from labs.models import LabRun, RunState
    from labs.runs import submission
    from tests.labs.factories import SMALL
    from tests.labs.vllm.conftest import STANDIN, alive
    from tests.worker import purge, start_worker

    smi = _executable(tmp_path / "nvidia-smi", 'printf "%b" "$STANDIN_GPUS"')
    vllm = _executable(tmp_path / "vllm", f'exec "{sys.executable}" "{STANDIN}" "$@"')
    record = tmp_path / "starts.jsonl"
    common = {
        "LABS_NVIDIA_SMI": str(smi),
        "VLLM_EXECUTABLE": str(vllm),
        "STANDIN_RECORD": str(record),
        "STANDIN_FAKE_CONFIG": json.dumps({"ttft_ms": 2, "itl_ms": [1]}),
    }
    gpus = {
        "l4": "0, NVIDIA L4, 23034\\n",
        "h100-sxm": "0, NVIDIA H100 80GB HBM3, 81559\\n1, NVIDIA H100 80GB HBM3, 81559\\n",
    }
    purge([f"labs.gpu.{kind}" for kind in gpus])
    started = {}
    try:
        for kind, table in gpus.items():
            env = {**common, "STANDIN_GPUS": table, "LABS_VLLM_CACHE_DIR": str(tmp_path / kind)}
            started[kind] = start_worker(["labs.gpu"], extra_env=env)
        beats = {b.gpus["kind"]: b for b in WorkerHeartbeat.objects.filter(backend="vllm")}
        assert beats["l4"].queue == "labs.gpu.l4" and beats["l4"].gpus["count"] == 1
        assert "consumes labs.gpu.h100-sxm.x1, labs.gpu.h100-sxm.x2\n" in started["h100-sxm"].log()
        assert beats["h100-sxm"].queue == "labs.gpu.h100-sxm"
        assert beats["h100-sxm"].gpus["memory_bytes"] == 81559 * 1024 * 1024
        assert workers.gpu_offer() == {"l4": 1, "h100-sxm": 2}
        runs = {}
        for kind, tp in (("l4", 1), ("h100-sxm", 2)):
            data = {**SMALL, "model": "qwen2.5-0.5b", "gpu": kind, "tp": tp}
            runs[kind] = submission.run_request(
                owner=alice, lab="sandbox", backend="vllm", data=data
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = set(LabRun.objects.values_list("state", flat=True))
            if states <= {RunState.DONE, RunState.FAILED, RunState.CANCELLED}:
                break
            time.sleep(0.5)
        for kind, run in runs.items():
            run.refresh_from_db()
            assert run.state == RunState.DONE, (run.error, started[kind].log()[-3000:])
            assert run.worker.startswith(started[kind].name), (kind, run.worker)
            assert run.result["completed"] == SMALL["num_prompts"]
        # The H100 run started vLLM with tensor parallelism over the worker's two GPUs.
        argvs = [json.loads(line)["argv"] for line in record.read_text().splitlines()]
        assert any(
            "--tensor-parallel-size" in a and a[a.index("--tensor-parallel-size") + 1] == "2"
            for a in argvs
        )
    finally:
        for worker in started.values():
            worker.stop()
        if record.exists():
            for line in record.read_text().splitlines():
                entry = json.loads(line)
                for pid in (entry["pid"], entry["grandchild"]):
                    assert not alive(pid), f"stand-in process {pid} left running"


H100_ROW = "{i}, NVIDIA H100 80GB HBM3, 81559\\n"


@pytest.mark.worker
def test_a_tp8_run_goes_only_to_the_8_gpu_worker_and_is_refused_without_one(
    transactional_db, tmp_path, alice
):
    """Two real GPU workers of one kind, 1 and 8 GPUs (stand-ins for nvidia-smi and vllm): the
    1-GPU worker consumes only labs.gpu.h100-sxm.x1, so it never takes a tp 8 run; once the
    8-GPU worker is gone, a tp 8 run is refused at submit."""
    import json
    import sys

    from labs.models import LabRun, RunState
    from labs.parameters.params import ParamError
    from labs.runs import submission
    from tests.labs.factories import SMALL
    from tests.labs.vllm.conftest import STANDIN
    from tests.worker import purge, start_worker

    smi = _executable(tmp_path / "nvidia-smi", 'printf "%b" "$STANDIN_GPUS"')
    vllm = _executable(tmp_path / "vllm", f'exec "{sys.executable}" "{STANDIN}" "$@"')
    purge([f"labs.gpu.h100-sxm.x{n}" for n in (1, 2, 4, 8)])
    started = {}
    try:
        for count in (1, 8):
            env = {
                "LABS_NVIDIA_SMI": str(smi),
                "VLLM_EXECUTABLE": str(vllm),
                "STANDIN_RECORD": str(tmp_path / f"starts-{count}.jsonl"),
                "STANDIN_FAKE_CONFIG": json.dumps({"ttft_ms": 2, "itl_ms": [1]}),
                "STANDIN_GPUS": "".join(H100_ROW.format(i=i) for i in range(count)),
                "LABS_VLLM_CACHE_DIR": str(tmp_path / f"x{count}"),
            }
            started[count] = start_worker(["labs.gpu"], extra_env=env)
        assert "consumes labs.gpu.h100-sxm.x1\n" in started[1].log()
        assert (
            "labs.gpu.h100-sxm.x1, labs.gpu.h100-sxm.x2, labs.gpu.h100-sxm.x4, " in started[8].log()
        )
        data = {**SMALL, "model": "llama-3-8b", "gpu": "h100-sxm"}
        runs = [
            submission.run_request(
                owner=alice, lab="sandbox", backend="vllm", data=data | {"tp": tp}
            )
            for tp in (8, 8, 1)
        ]
        assert [r.queue for r in runs] == ["labs.gpu.h100-sxm.x8"] * 2 + ["labs.gpu.h100-sxm.x1"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if not LabRun.objects.filter(state__in=[RunState.QUEUED, RunState.RUNNING]).exists():
                break
            time.sleep(0.5)
        for run in runs:
            run.refresh_from_db()
            assert run.state == RunState.DONE, (run.error, started[8].log()[-3000:])
        assert all(r.worker.startswith(started[8].name) for r in runs if r.params["tp"] == 8)
        assert not (tmp_path / "starts-1.jsonl").exists() or all(
            "--tensor-parallel-size" not in json.loads(line)["argv"]
            for line in (tmp_path / "starts-1.jsonl").read_text().splitlines()
        )
        started[8].stop()  # its heartbeat row goes with it
        with pytest.raises(ParamError) as info:
            submission.run_request(
                owner=alice, lab="sandbox", backend="vllm", data=data | {"tp": 8}
            )
        assert info.value.errors == {
            "tp": "tp must be at most 1 on h100-sxm: the largest h100-sxm worker has 1 GPU, got 8"
        }
        assert LabRun.objects.count() == 3
    finally:
        for worker in started.values():
            worker.stop()
