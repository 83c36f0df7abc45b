"""The `vllm` backend: a lab run on a real vLLM engine, measured over streaming HTTP.

    ensure `vllm serve` (server.py) -> run the workload (loadgen.py) -> /metrics before, during
    and after (prom.py) -> a RunRecord like the simulator's, with simulated=False and `where`
    saying "vLLM <version> on <GPU>" as read on this worker.

Or, with `base_url` (or LABS_VLLM_BASE_URL), against a vLLM server that is already running: then
nothing is started or stopped, and the server's own engine arguments are whatever it was given.

The load generator runs on its own thread with its own event loop; this thread waits, reports
progress and watches the server. So `on_progress` (which writes to the database) is always
called from the caller's thread, never from inside an event loop.

A Celery worker keeps one server between runs; it is stopped when the arguments change, when a
run fails, and when the worker shuts down (worker_shutdown, or atexit).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import httpx

from labs.backends.base import (
    BackendError,
    Device,
    EngineSample,
    Phase,
    ProgressCallback,
    RequestRecord,
    RunRecord,
)
from labs.backends.vllm import cpu, prom
from labs.backends.vllm.fit import cpu_memory
from labs.backends.vllm.gpus import GpuInventory, read_gpus
from labs.backends.vllm.loadgen import (
    LoadOptions,
    LoadResult,
    PlannedRequest,
    Progress,
    plan_requests,
    run_load,
)
from labs.backends.vllm.served import ServedModel, read_served_model
from labs.backends.vllm.server import (
    SERVED_MODEL_NAME,
    RunningServer,
    ServerError,
    ServerManager,
    StartWait,
    build_plan,
    group_members,
)
from labs.backends.vllm.start import check_can_start
from labs.explanation.definitions import definitions
from labs.parameters.catalog import CPU_KIND
from labs.parameters.params import LabParams, ParamError

logger = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 0.5
_manager: ServerManager | None = None
_manager_lock = threading.Lock()


def server_manager() -> ServerManager:
    """This process's one server manager (one GPU worker, one server at a time)."""
    global _manager
    with _manager_lock:
        if _manager is None:
            # A CPU worker runs vLLM's CPU build with that virtualenv's python (cpu.py).
            executable = cpu.vllm_python() if cpu.device() == "cpu" else None
            _manager = ServerManager(executable=executable)
        return _manager


def stop_server(**_: Any) -> None:
    """Stop the worker's server, if any (worker shutdown, interpreter exit)."""
    if _manager is not None:
        _manager.stop()


atexit.register(stop_server)
with contextlib.suppress(ImportError):
    from celery.signals import worker_shutdown

    worker_shutdown.connect(stop_server, weak=False)


@functools.lru_cache(maxsize=1)
def gpu_inventory() -> GpuInventory | None:
    """This worker's GPUs as nvidia-smi reports them (read once); on a CPU worker, its CPU."""
    if cpu.device() == "cpu":
        return cpu.cpu_inventory()
    return read_gpus()


def device_state() -> dict[str, Any]:
    """What this worker's device holds now, refreshed on every heartbeat: on a CPU worker the
    memory a new engine could have and what the engine's own processes take (cpu.memory_state);
    nothing on a GPU worker, whose GPUs are its own."""
    if cpu.device() != "cpu":
        return {}
    current = _manager.current if _manager is not None else None
    return cpu.memory_state(group_members(current.pid) if current is not None else [])


def cpu_model_bytes(params: LabParams) -> float:
    """What a CPU engine for `params` holds for its model: weights, KV pool and the copies of
    the vocabulary matrices (fit.cpu_memory), all but its own processes."""
    found = cpu_memory(params, Device(CPU_KIND, 1, 1))
    return 0.0 if found is None else found.total - found.processes - found.reserve


@functools.lru_cache(maxsize=1)
def gpu_name() -> str | None:
    """The name of this worker's (first visible) GPU: nvidia-smi, else torch in a subprocess
    (importing torch here would put a CUDA context in the worker)."""
    inventory = gpu_inventory()
    if inventory is not None:
        return inventory.name
    probe = (
        "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or None


def installed_vllm() -> str | None:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def _server_version(client: httpx.Client) -> str | None:
    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
        response = client.get("/version")
        if response.status_code == 200:
            return str(response.json().get("version") or "") or None
    return None


def _is_local(base_url: str) -> bool:
    return httpx.URL(base_url).host in ("127.0.0.1", "localhost", "::1")


def where_label(version: str | None, gpu: str | None, tp: int, base_url: str | None) -> str:
    label = f"vLLM {version or '(version unknown)'}"
    if base_url and not _is_local(base_url):
        return f"{label} at {httpx.URL(base_url).host}"
    if base_url and gpu is None:
        # A server on this machine that this worker did not start: nothing here says what it
        # runs on (no GPU is visible, and vLLM's CPU build reports a version like any other),
        # so its address is named, not a device it may not use.
        url = httpx.URL(base_url)
        return f"{label} at {url.host}:{url.port or 80} (already running on this machine)"
    if gpu is None:
        return f"{label} on an unknown GPU"
    return f"{label} on {tp}\u00d7 {gpu}" if tp > 1 else f"{label} on {gpu}"


# vLLM's latency histograms, whose totals since the server's start hold the warm-up request.
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_queue_time_seconds",
)


def _histograms(snapshot: prom.Snapshot | None) -> dict[str, list[float]]:
    """{name: [sum, count]} of HISTOGRAMS on a /metrics page; {} without one."""
    if snapshot is None:
        return {}
    found = {}
    for name in HISTOGRAMS:
        total, count = snapshot.total(f"{name}_sum"), snapshot.total(f"{name}_count")
        if total is not None and count is not None:
            found[name] = [total, count]
    return found


_REASONS_SHOWN = 3


def all_failed(requests: Sequence[RequestRecord]) -> str | None:
    """Why the run failed when no request succeeded (with its first distinct reasons), else
    None. A run with nothing measured must not pass for a result."""
    if not requests or any(r.error is None for r in requests):
        return None
    reasons = list(dict.fromkeys(str(r.error) for r in requests))
    shown = "; ".join(reasons[:_REASONS_SHOWN])
    more = f" (and {len(reasons) - _REASONS_SHOWN} other reasons)" if len(reasons) > 3 else ""
    return f"every one of the {len(requests)} requests failed: {shown}{more}"


def refuse_what_does_not_fit(planned: Sequence[PlannedRequest], max_model_len: int | None) -> None:
    """Refuse a workload whose longest request (prompt + output tokens, the max_tokens it asks
    for) is longer than the server's max_model_len. vLLM 0.33 would not refuse all of them: it
    answers 400 only when max_tokens alone exceeds max_model_len or the prompt alone reaches
    it, and otherwise lowers max_tokens to what is left, so the run would silently measure
    fewer output tokens than the workload asks for.

    Raises:
        ParamError: naming prompt_tokens, with the numbers.
    """
    if max_model_len is None or not planned:
        return
    longest = max(planned, key=lambda p: len(p.prompt) + p.output_tokens)
    prompt, output = len(longest.prompt), longest.output_tokens
    if prompt + output > max_model_len:
        raise ParamError(
            {
                "prompt_tokens": "prompt_tokens + output_tokens must fit the server's "
                f"max_model_len of {max_model_len:,} tokens, as vLLM refuses a longer request; "
                f"the longest request is {prompt:,} + {output:,} = {prompt + output:,} tokens "
                "(lower them or their range ratios, or start the server with a larger "
                "--max-model-len)"
            }
        )


def _starting(report: ProgressCallback, wait: StartWait) -> None:
    """While the manager waits for a new server: tell the run page, with the seconds so far."""
    last = None if wait.last_start_s is None else round(wait.last_start_s, 1)
    phase = Phase("starting", "vLLM", wait.why, round(wait.elapsed_s, 1), last)
    report(0.0, phase)


def _ready(server: RunningServer, reused: bool) -> Phase:
    if reused:
        return Phase("ready", "vLLM", "same engine arguments", reused=True)
    return Phase("ready", "vLLM", server.why, elapsed_s=round(server.start_s, 1))


class _Driver:
    """Runs run_load on its own thread and event loop; the caller's thread waits on it."""

    def __init__(self, coro_factory: Callable[[Progress], Any], total: int) -> None:
        self.progress = Progress(total=total)
        self._factory = coro_factory
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.result: LoadResult | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="vllm-loadgen", daemon=True)

    def _main(self) -> None:
        async def wrapped() -> LoadResult:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._ready.set()
            return await self._factory(self.progress)

        try:
            self.result = asyncio.run(wrapped())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def wait(self, seconds: float) -> bool:
        """True once the load has finished (or failed)."""
        self._thread.join(seconds)
        return not self._thread.is_alive()

    def cancel(self) -> None:
        if self._loop is not None and self._task is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)


class VLLMBackend:
    """Runs a lab on vLLM: a server this worker starts, or one at `base_url`."""

    name = "vllm"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        model_path: str | None = None,
        metrics_poll_s: float = 0.5,
        read_timeout_s: float | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("LABS_VLLM_BASE_URL") or "").rstrip("/") or None
        self.model_path = model_path
        self.metrics_poll_s = metrics_poll_s
        self.read_timeout_s = read_timeout_s or float(
            os.environ.get("LABS_VLLM_READ_TIMEOUT_S", "300")
        )

    def runs_here(self) -> bool:
        """Whether the engine it measures is on this machine (its own, or a local base_url)."""
        return self.base_url is None or _is_local(self.base_url)

    def describe(self) -> dict[str, Any]:
        """How this worker's results are labelled (for its heartbeat row)."""
        if cpu.device() == "cpu" and self.base_url is None:
            version = cpu.installed_version()
            gpus = {**cpu.inventory_dict(), "vllm": version}
            return {
                "where": cpu.where_label(version, gpus),
                "gpu_name": str(gpus.get("name") or ""),
                "versions": {"vllm": version},
                "gpus": gpus,
            }
        version, gpu, inventory = installed_vllm(), None, None
        if self.runs_here():
            gpu, inventory = gpu_name(), gpu_inventory()
        gpus = inventory.as_dict() if inventory is not None else {}
        if gpus:
            gpus["vllm"] = version
        return {
            "where": where_label(version, gpu, 1, self.base_url),
            "gpu_name": gpu or "",
            "versions": {"vllm": version},
            "gpus": gpus,
        }

    def run(self, params: LabParams, on_progress: ProgressCallback | None = None) -> RunRecord:
        """Run the lab's workload on vLLM and return the run record.

        Raises:
            ParamError: settings vLLM cannot run, or requests longer than the running server's
                max_model_len (before anything starts or is sent).
            ServerError: the server is missing, died, or never became healthy (with its log).
        """
        report: ProgressCallback = on_progress or (lambda fraction, phase=None: None)
        began = time.monotonic()
        manager: ServerManager | None = None
        meta: dict[str, Any] = {
            "seed": params.workload.seed,
            "params": params.as_dict(),
            "definitions": definitions(self.name, params.workload.temperature),
        }
        if self.base_url is not None:
            base_url = self.base_url
            served = self.served_model()
            model = served.id
            # Someone else's server: its model and context length are its own. Token ids are
            # drawn within its vocabulary, and what vLLM would refuse request by request (a
            # run of 400s, or worse, a run missing its longest) is refused here.
            planned = plan_requests(params.workload, vocab_size=served.vocab_size)
            refuse_what_does_not_fit(planned, served.max_model_len)
            meta.update(
                base_url=base_url,
                server="already running (base_url)",
                served_model=served.as_dict(),
                no_prediction=served.why_no_prediction(),
            )
            where = httpx.URL(base_url)
            report(
                0.0,
                Phase(
                    "ready",
                    "vLLM",
                    f"already running at {where.host}:{where.port}, serving {served.id!r}",
                ),
            )
        else:
            # The same start-up check as at submit, now with this worker's own devices (on a
            # CPU, the memory it can give now).
            inventory = gpu_inventory()
            announced = {**inventory.as_dict(), **device_state()} if inventory else None
            device = Device.from_announced(announced)
            check_can_start(params, [device] if device else [])
            planned = plan_requests(params.workload, vocab_size=params.model.vocab_size)
            plan = build_plan(params, model_path=self.model_path)
            manager = server_manager()
            server, reused = manager.ensure(plan, on_wait=functools.partial(_starting, report))
            if not reused and cpu.device() == "cpu":
                cpu.record_engine_memory(group_members(server.pid), cpu_model_bytes(params))
            base_url, model = server.base_url, SERVED_MODEL_NAME
            # Replaces the "starting" phase: the page says how the server came to be ready.
            report(0.0, _ready(server, reused))
            meta.update(
                engine_args=server.argv,
                server_reused=reused,
                server_start_s=round(server.start_s, 3),
                server_start_why="" if reused else server.why,
                server_pid=server.pid,
                **plan.notes,
            )
        caller_stopped = False
        try:
            with httpx.Client(base_url=base_url, timeout=10.0, trust_env=False) as client:
                version = _server_version(client) or installed_vllm()
            options = LoadOptions(
                max_concurrency=params.workload.max_concurrency,
                read_timeout_s=self.read_timeout_s,
                metrics_poll_s=self.metrics_poll_s,
                cache_salt=uuid.uuid4().hex,
                temperature=params.workload.temperature,
            )
            driver = _Driver(
                lambda progress: run_load(base_url, model, planned, options, progress),
                total=len(planned),
            )
            driver.start()
            try:
                while not driver.wait(_PROGRESS_EVERY_S):
                    if manager is not None:
                        manager.check()
                    caller_stopped = True
                    report(driver.progress.fraction)
                    caller_stopped = False
            except BaseException:
                driver.cancel()
                raise
            if driver.error is not None:
                raise driver.error
            assert driver.result is not None
            if manager is not None:
                manager.check(health=True)
        except BaseException:
            # A failed run stops the server (it may be the cause); a run the caller stopped
            # (cancelled) leaves it for the next one.
            if manager is not None and not caller_stopped:
                manager.stop()
            raise
        report(1.0)
        failure = all_failed(driver.result.requests)
        if failure is not None:
            raise BackendError(failure)
        gpu = gpu_name() if _is_local(base_url) else None
        meta.update(vllm_version=version, gpu_name=gpu)
        return self._record(params, planned, driver.result, meta, began, version, gpu, base_url)

    def served_model(self) -> ServedModel:
        """What the server at base_url serves (labs/backends/vllm/served.py).

        Raises:
            ServerError: no server answers /v1/models there as vLLM does.
        """
        base_url = self.base_url or ""
        try:
            return read_served_model(base_url)
        except (
            httpx.HTTPError,
            ValueError,
            KeyError,
            IndexError,
            TypeError,
            AttributeError,
        ) as exc:
            raise ServerError(
                f"no vLLM server answers at {base_url} (GET /v1/models: {exc})"
            ) from None

    def _record(
        self,
        params: LabParams,
        planned: Sequence[PlannedRequest],
        result: LoadResult,
        meta: dict[str, Any],
        began: float,
        version: str | None,
        gpu: str | None,
        base_url: str,
    ) -> RunRecord:
        pages: list[tuple[float, str]] = []
        if result.metrics_before is not None:
            pages.append((0.0, result.metrics_before))
        pages += result.metrics_polls
        if result.metrics_after is not None:
            pages.append((result.wall_s, result.metrics_after))
        snapshots: list[tuple[float, prom.Snapshot]] = []
        bad_pages = 0
        for t_s, text in pages:
            try:
                snapshots.append((t_s, prom.Snapshot.from_text(text)))
            except prom.MetricsFormatError as exc:
                bad_pages += 1
                logger.warning("unreadable /metrics page: %s", exc)
        before = snapshots[0][1] if result.metrics_before is not None and snapshots else None
        after = snapshots[-1][1] if result.metrics_after is not None and snapshots else None
        counters = prom.counters_between(before, after)
        samples: list[EngineSample] = []
        for t_s, snapshot in snapshots:
            sample = prom.engine_sample(t_s, snapshot, counters.num_gpu_blocks)
            if sample is not None:
                samples.append(sample)
        requests = result.requests
        finishes = [r.finish_s for r in requests if r.finish_s is not None]
        arrivals = [r.arrival_s for r in requests]
        meta.update(
            # The old figure, kept under its own name: the span in which requests were served.
            first_arrival_to_last_finish_s=(
                round(max(finishes) - min(arrivals), 6) if finishes and arrivals else None
            ),
            t0_monotonic=result.t0,
            failed=sum(1 for r in requests if r.error),
            token_counts_from=dict(result.count_sources),
            usage_mismatches=result.usage_mismatches,
            metrics_pages=len(pages),
            unreadable_metrics_pages=bad_pages,
            load_wall_s=round(result.wall_s, 3),
            # The run's own counters (after - before, the warm-up before "before"), and the
            # server's latency histograms as the run found them, so its own can be told from
            # the server's totals since its start.
            engine_counters=dataclasses.asdict(counters),
            histograms_before=_histograms(before),
            warmup_s=None if result.warmup_s is None else round(result.warmup_s, 3),
            warmup_error=result.warmup_error,
        )
        where = where_label(version, gpu, params.engine.tp, base_url if self.base_url else None)
        if meta.get("device") == "cpu":
            where = cpu.where_label(version, cpu.inventory_dict())
        return RunRecord(
            backend=self.name,
            where=where,
            simulated=False,
            requests=requests,
            samples=samples,
            counters=counters,
            duration_s=result.duration_s,
            wall_s=time.monotonic() - began,
            meta=meta,
        )
