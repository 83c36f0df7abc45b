"""The worker process's side of labs, connected to Celery's worker signals (labs.tasks imports
this module, so every worker that runs lab tasks has them):

- after setup, a worker on `labs.gpu` with a device consumes `labs.gpu.<its GPU kind>.x<n>`
  for each count n it can serve instead (labs.runs.workers names the queues); `labs.gpu` itself is
  left to workers without one (measuring a server elsewhere);
- when ready, it announces itself (labs.runs.workers.announce), a vLLM worker whose device has no
  calibration queues a short one to itself (LABS_SELF_CALIBRATE), and it starts a daemon
  thread that announces it again every LABS_WORKER_HEARTBEAT_S and runs the stale-run reaper
  (labs.runs.reaping.run_reap_stale), so any live worker fails the runs a killed one left behind;
- at shutdown, it stops the thread and removes its heartbeat rows.
"""

from __future__ import annotations

import logging
import platform
import threading
from typing import Any

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.conf import settings
from django.db import connections

from labs.backends import device_label, worker_inventory
from labs.calibration.jobs import calibration_self_request
from labs.models import WorkerHeartbeat
from labs.runs.reaping import run_reap_stale
from labs.runs.workers import (
    GPU_QUEUE,
    announce,
    backends_for_queues,
    gpu_queue,
    queue_suffix,
    queues_for_count,
)

logger = logging.getLogger(__name__)

# This process's heartbeat: hostname, backends, the thread and its stop event.
_process: dict[str, Any] = {}


@celeryd_after_setup.connect
def _add_gpu_kind_queue(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """A worker on `labs.gpu` also consumes `labs.gpu.<its GPU kind>.x<n>` for each count n it can
    serve, where runs that need n GPUs of that kind are sent (labs.runs.submission routes them)."""
    if instance is None:
        return
    queues = instance.app.amqp.queues
    if GPU_QUEUE not in set(queues.consume_from or ()):
        return
    inventory = worker_inventory("vllm")
    if inventory is None:
        logger.warning("labs: no GPU found (nvidia-smi); this worker gets no GPU-kind queue")
        return
    kind_queue = gpu_queue(queue_suffix(inventory["kind"], inventory["name"]))
    names = queues_for_count(kind_queue, inventory["count"])
    for name in names:
        queues.select_add(name)
    # `labs.gpu` carries the runs meant for workers without a device (measuring a server
    # elsewhere): one with a device takes its own kind's runs only, never one it cannot start.
    queues.deselect([GPU_QUEUE])
    logger.info("labs: %s consumes %s", device_label("vllm", inventory), ", ".join(names))


def beat_once(hostname: str, backends: list[str]) -> None:
    announce(hostname, backends)
    run_reap_stale()


def _heartbeat_loop(hostname: str, backends: list[str], stop: threading.Event) -> None:
    interval = settings.LABS_WORKER_HEARTBEAT_S
    while not stop.wait(interval):
        try:
            beat_once(hostname, backends)
        except Exception:
            # A database blip must not kill the thread: the next beat tries again.
            logger.exception("worker heartbeat failed")
            connections.close_all()
    connections.close_all()


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    hostname = str(getattr(sender, "hostname", "") or platform.node())
    queues = sender.app.amqp.queues.consume_from if sender is not None else {}
    backends = backends_for_queues(queues)
    try:
        beat_once(hostname, backends)
    except Exception:
        logger.exception("first worker heartbeat failed")
    try:
        if "vllm" in backends:
            calibration_self_request(hostname=hostname)
    except Exception:
        # Runs go on with the probe's figures; a staff member can still calibrate the device.
        logger.exception("could not queue this device's own calibration")
    finally:
        # This runs on the worker's main thread; do not keep a connection open across forks.
        connections.close_all()
    stop = threading.Event()
    thread = threading.Thread(
        target=_heartbeat_loop, args=(hostname, backends, stop), name="labs-heartbeat", daemon=True
    )
    thread.start()
    _process.update(hostname=hostname, backends=backends, stop=stop, thread=thread)
    logger.info("labs: %s announced backends %s", hostname, ", ".join(backends) or "(none)")


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    stop: threading.Event | None = _process.get("stop")
    if stop is None:
        return
    stop.set()
    thread: threading.Thread = _process["thread"]
    thread.join(timeout=5)
    try:
        # Offline at once, rather than after LABS_WORKER_ONLINE_S.
        WorkerHeartbeat.objects.filter(hostname=_process["hostname"]).delete()
    except Exception:
        logger.exception("could not remove heartbeat rows")
    finally:
        connections.close_all()
