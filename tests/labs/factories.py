"""Plain factory functions for lab tests (no factory_boy)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from labs.models import LabRun, RunState, WorkerHeartbeat
from labs.parameters.params import parse_lab_params

SMALL = {"num_prompts": 8, "prompt_tokens": 64, "output_tokens": 16, "max_tokens": 64}


def make_run(owner: Any, **overrides: Any) -> LabRun:
    params = overrides.pop("params", None) or parse_lab_params(SMALL).as_dict()
    fields: dict[str, Any] = {
        "lab": "sandbox",
        "backend": "sim",
        "params": params,
        "state": RunState.QUEUED,
    }
    fields.update(overrides)
    return LabRun.objects.create(owner=owner, **fields)


def make_heartbeat(backend: str = "sim", *, age_s: float = 0, **overrides: Any) -> WorkerHeartbeat:
    seen = timezone.now() - timedelta(seconds=age_s)
    fields: dict[str, Any] = {
        "hostname": f"{backend}@test-host",
        "backend": backend,
        "queue": "labs.sim" if backend == "sim" else "labs.gpu",
        "where": "simulated on CPU" if backend == "sim" else "vLLM 0.33.0 on NVIDIA H100",
        "last_seen": seen,
        # Up for an hour unless a test says otherwise: long enough to have taken waiting runs.
        "started_at": seen - timedelta(hours=1),
    }
    fields.update(overrides)
    return WorkerHeartbeat.objects.create(**fields)


def gpu_record_slower_than_the_model(params: Any, factor: float = 1.25) -> Any:
    """A run record as if a GPU had run the simulator's requests `factor` times slower than the
    engine model expects (every chunk and finish stretched from its arrival), marked vllm."""
    from labs.backends.base import RequestRecord
    from labs.backends.sim import SimBackend

    record = SimBackend().run(params)
    record.simulated, record.backend = False, "vllm"
    record.requests = [
        RequestRecord(
            req_id=r.req_id,
            prompt_tokens=r.prompt_tokens,
            max_tokens=r.max_tokens,
            arrival_s=r.arrival_s,
            chunks=[(r.arrival_s + factor * (t - r.arrival_s), n) for t, n in r.chunks],
            finish_s=r.arrival_s + factor * (r.finish_s - r.arrival_s),
        )
        for r in record.requests
    ]
    return record
