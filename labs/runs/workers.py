"""Workers announce themselves: one `WorkerHeartbeat` row per (hostname, backend), written when
the worker is ready and then every LABS_WORKER_HEARTBEAT_S by a daemon thread in the worker's
main process (solo and prefork pools alike; labs/worker_signals.py). The same thread runs the
stale-run reaper, so any live worker fails the runs a killed one left behind; no celery beat is
needed.

A worker serves the backends whose queues it consumes (settings.LABS_BACKEND_QUEUES). A GPU
worker is started on `labs.gpu`; at setup it reads its devices (labs.backends.worker_inventory) and
also consumes one queue per device count it can serve, `labs.gpu.<kind>.x<n>` for every power
of two n up to its count: a run that needs tp GPUs of a kind is sent to `...x<tp>`, so only a
worker with at least that many takes it (an 8-GPU worker takes tp 1, 2, 4 and 8; a 1-GPU worker
tp 1 only). Its heartbeat row carries the inventory (count, kind, memory each, vLLM version),
which `devices_online()` hands to the backend's start-up check and `gpu_offer()` turns into
what the lab form may offer.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Iterable
from importlib import metadata
from typing import Any

from django.conf import settings
from django.utils import timezone

from labs.backends import describe_worker, device_state, engine_busy, simulated_backends
from labs.backends.base import Device, Placement
from labs.parameters.catalog import CPU_KIND, GB, TB, TFLOPS, Hardware, cpu_hardware
from labs.parameters.device_calibration import announced_cpu_key

logger = logging.getLogger(__name__)

# The vLLM backend's queue (settings.LABS_BACKEND_QUEUES): a worker on it also consumes the
# queues of its device kind, `labs.gpu.<kind>.x<n>`.
GPU_QUEUE = "labs.gpu"

_state: dict[str, Any] = {}


def backends_for_queues(queues: Iterable[str]) -> list[str]:
    wanted = set(queues)
    return [
        b
        for b, q in settings.LABS_BACKEND_QUEUES.items()
        if q in wanted or any(w.startswith(q + ".") for w in wanted)
    ]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def start_command(queue: str) -> str:
    """The command that starts a worker for `queue`, as the README gives it. vLLM starts its own
    engine processes, which a prefork child may not, so the GPU queue runs a solo pool."""
    command = f"celery -A config worker -Q {queue}"
    if queue == GPU_QUEUE or queue.startswith(GPU_QUEUE + "."):
        command += " --pool=solo --concurrency=1"
    return command


def describe_backend(backend: str) -> dict[str, Any]:
    """How results from this worker are labelled, its GPU and the versions that matter."""
    versions = {
        "python": platform.python_version(),
        "celery": _version("celery"),
        "django": _version("django"),
        "numpy": _version("numpy"),
    }
    info: dict[str, Any] = {"where": backend, "gpu_name": "", "versions": versions, "gpus": {}}
    try:
        extra = describe_worker(backend)
        info["where"] = str(extra.pop("where", backend))
        info["gpu_name"] = str(extra.pop("gpu_name", ""))
        info["gpus"] = dict(extra.pop("gpus", None) or {})
        info["versions"] = {**versions, **extra.pop("versions", {}), **extra}
    except Exception:
        # Announce anyway: a worker that cannot describe itself can still run labs.
        logger.exception("could not describe backend %s", backend)
    return info


def announce(hostname: str, backends: Iterable[str]) -> None:
    """Create or refresh this worker's heartbeat rows (a flushed table is simply refilled)."""
    from labs.models import WorkerHeartbeat

    announced: set[str] = _state.setdefault("announced", set())
    for backend in backends:
        info = _state.setdefault("info", {}).get(backend) or describe_backend(backend)
        _state["info"][backend] = info
        # Stamped after describing: a CPU worker's first description measures its CPU, which
        # can take longer than the online window on a busy machine (born stale, it was offline).
        now = timezone.now()
        # A row a killed process left keeps its hostname: this process's first beat says when
        # it started (the reaper gives a worker that has just come back time to take its runs).
        restart = {} if backend in announced else {"started_at": now}
        # Checked on every beat: while another process of this installation holds the
        # device's engine, the lab must not offer runs this worker would fail.
        busy = engine_busy(backend) if info["gpus"] else ""
        # And what the device holds now (a CPU worker's memory, shared with the machine).
        gpus = {**info["gpus"], **device_state(backend)} if info["gpus"] else info["gpus"]
        fields = {
            **restart,
            "queue": _announced_queue(backend, info["gpus"]),
            "gpus": {**gpus, "busy": busy} if busy else gpus,
            "where": info["where"][:200],
            "gpu_name": info["gpu_name"][:200],
            "versions": info["versions"],
            "pid": os.getpid(),
            "last_seen": now,
        }
        WorkerHeartbeat.objects.update_or_create(
            hostname=hostname[:200],
            backend=backend,
            defaults=fields,
            create_defaults={**fields, "started_at": now},
        )
        announced.add(backend)


def queue_suffix(kind: str | None, name: str) -> str:
    """`h100-sxm`, or for a GPU outside the catalog a slug of its name (`nvidia-rtx-4090`)."""
    if kind is not None:
        return kind
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def gpu_queue(suffix: str) -> str:
    """The queue of one device kind's workers: `labs.gpu.h100-sxm`."""
    return f"{GPU_QUEUE}.{suffix}"


def _announced_queue(backend: str, gpus: dict[str, Any]) -> str:
    base = settings.LABS_BACKEND_QUEUES[backend]
    if base == GPU_QUEUE and gpus.get("name"):
        return gpu_queue(queue_suffix(gpus.get("kind"), gpus["name"]))
    return base


def gpu_offer(now: object = None) -> dict[str, int]:
    """What online vLLM workers can run: catalog GPU kind -> the most GPUs one worker of that
    kind has. GPUs outside the catalog are left out (nothing to predict them with)."""
    from labs.models import WorkerHeartbeat

    offer: dict[str, int] = {}
    for gpus in (
        WorkerHeartbeat.objects.online(now)
        .exclude(backend__in=simulated_backends())
        .values_list("gpus", flat=True)
    ):
        kind, count = (gpus or {}).get("kind"), (gpus or {}).get("count")
        if kind and isinstance(count, int) and count > 0 and not (gpus or {}).get("busy"):
            offer[kind] = max(offer.get(kind, 0), count)
    return offer


def cpu_worker_hardware(now: object = None) -> tuple[Hardware, dict[str, Any]] | None:
    """The CPU of an online CPU vLLM worker (device kind "cpu") as the formulas price it, with
    what it announced (name, cores, measurements); None when no such worker is online or it
    measured nothing. With several, the most recently seen."""
    from labs.models import WorkerHeartbeat

    beats = (
        WorkerHeartbeat.objects.online(now)
        .exclude(backend__in=simulated_backends())
        .order_by("-last_seen")
    )
    for gpus in beats.values_list("gpus", flat=True):
        if (gpus or {}).get("kind") == CPU_KIND:
            hardware = cpu_hardware(gpus)
            if hardware is not None:
                return hardware, dict(gpus)
    return None


def cpu_figures(now: object = None) -> dict[str, float]:
    """gpu cpu's three figures (labs.parameters.params) from the online CPU worker; {} without
    one."""
    found = cpu_worker_hardware(now)
    return {} if found is None else announced_cpu_figures(found[1])


def announced_cpu_figures(gpus: dict[str, Any] | None) -> dict[str, float]:
    """gpu cpu's three figures (labs.parameters.params) from one CPU worker's announced inventory
    (its heartbeat's `gpus`); {} when it measured nothing."""
    hardware = cpu_hardware(gpus)
    if hardware is None:
        return {}
    return {
        "hbm_gb": hardware.hbm_bytes / GB,
        "bandwidth_tbs": hardware.bandwidth_bytes_per_s / TB,
        "tflops": hardware.bf16_flops_per_s / TFLOPS,
    }


def count_queue(kind_queue: str, count: int) -> str:
    """`labs.gpu.h100-sxm` and 8 -> `labs.gpu.h100-sxm.x8`: runs that need 8 of that kind."""
    return f"{kind_queue}.x{count}"


def queues_for_count(kind_queue: str, count: int) -> list[str]:
    """The queues a worker with `count` devices consumes: every power of two up to it (tp is
    a power of two)."""
    return [count_queue(kind_queue, 1 << i) for i in range(count.bit_length()) if 1 << i <= count]


def placement_queue(base: str, placement: Placement | None) -> str:
    """The queue a run goes to: the backend's (`base`), or for a placement the queue that only
    workers with at least placement.count devices of its kind consume."""
    if placement is None:
        return base
    return count_queue(f"{base}.{placement.kind}", placement.count)


def served_queues(backend: str, announced: str, gpus: dict[str, Any] | None) -> set[str]:
    """Every queue a worker consumes, from its heartbeat row: the one it announced, and for a
    device inventory one per count it can serve; without one, its backend's (a vLLM worker
    with a device leaves `labs.gpu` to those without: labs.worker_signals)."""
    served = {announced}
    device = Device.from_announced(gpus)
    if device is not None:
        served.update(queues_for_count(announced, device.count))
    else:
        served.add(settings.LABS_BACKEND_QUEUES.get(backend, announced))
    return served


def devices_online(backend: str, now: object = None) -> list[Device]:
    """The devices the online workers of `backend` announced (none for the simulator's, or a
    vLLM worker measuring a server elsewhere)."""
    from labs.models import WorkerHeartbeat

    rows = WorkerHeartbeat.objects.online(now).filter(backend=backend)
    gpus = (g for g in rows.values_list("gpus", flat=True) if not (g or {}).get("busy"))
    devices = (Device.from_announced(g) for g in gpus)
    return [d for d in devices if d is not None]


def online_without_devices(backend: str, now: object = None) -> bool:
    """Whether an online worker of `backend` announced no device (a vLLM worker measuring a
    server elsewhere, LABS_VLLM_BASE_URL): it takes runs of any GPU kind the catalog knows."""
    from labs.models import WorkerHeartbeat

    rows = WorkerHeartbeat.objects.online(now).filter(backend=backend)
    return any(Device.from_announced(g) is None for g in rows.values_list("gpus", flat=True))


def engines_busy(now: object = None) -> dict[str, str]:
    """The devices of online vLLM workers that cannot run now, as they announced it
    (labs.backends.engine_busy: another process of their installation holds the device's
    engine): device key (a GPU kind, or a CPU's key as its calibration is stored) -> the
    worker's own words, for operators."""
    from labs.models import WorkerHeartbeat

    rows = WorkerHeartbeat.objects.online(now).exclude(backend__in=simulated_backends())
    busy: dict[str, str] = {}
    for gpus in rows.values_list("gpus", flat=True):
        device = Device.from_announced(gpus)
        if device is None or not (gpus or {}).get("busy"):
            continue
        key = announced_cpu_key(gpus) if device.kind == CPU_KIND else device.kind
        busy[key] = str(gpus["busy"])
    return busy


def busy_devices(backend: str, now: object = None) -> list[Device]:
    """The devices online workers of `backend` announced but cannot run now (busy)."""
    from labs.models import WorkerHeartbeat

    rows = WorkerHeartbeat.objects.online(now).filter(backend=backend)
    gpus = (g for g in rows.values_list("gpus", flat=True) if (g or {}).get("busy"))
    devices = (Device.from_announced(g) for g in gpus)
    return [d for d in devices if d is not None]
