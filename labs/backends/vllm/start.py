"""Can this lab start on vLLM 0.33, and on which worker? The one place that decides it.

`check_can_start(params, devices)` is called at submit with the devices of the online vLLM
workers (labs.runs.workers.devices_online) and again on the worker, before any start, with its own.
It refuses, by field and with what would fit, every start-up rule of vLLM 0.33 that the lab's
settings can break:

- settings vLLM cannot run anywhere (server.supported_refusals: contiguous KV, weight dtypes
  without a checkpoint, no chunked prefill with a small token budget);
- the model: a catalog model (its bundled config.json) or a local checkpoint on the worker;
- the KV pool: a fixed pool, less vLLM's null block, must hold one request of max_model_len
  (server._max_model_len never asks for more than the pool holds, so the longest request
  decides);
- tp against the GPUs of the worker (vLLM: "World size (8) is larger than the number of
  available GPUs (1)");
- then the rules of the device kind: DEVICE_RULES[kind], or for a GPU `gpu_refusals`: block
  sizes its CUDA kernels take, gpu_memory_utilization below what the CUDA context leaves, and
  weights + draft + KV + activation reserve + CUDA context within each GPU's memory (fit.py);
  on a CPU the same sum with vLLM's own working memory in place of the CUDA context (its
  processes as the worker measured them, and the copies of the vocabulary matrices its CPU
  kernels keep), within what the CPU worker can give now: its RAM less what the machine's
  other processes hold.

A worker measuring a server elsewhere (LABS_VLLM_BASE_URL) announces no device: with one
online, a lab whose GPU kind no online device has is still checked against the catalog (its
GPU kind, up to fit.MAX_TP of them) and goes to such a worker, not refused because a worker
with other GPUs is online too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

from labs.backends.base import Device, Placement
from labs.backends.vllm.cpu import cpu_refusals
from labs.backends.vllm.fit import (
    CUDA_CONTEXT_BYTES,
    MAX_TP,
    cpu_memory_refusals,
    gpu_memory,
    in_gb,
    memory_need,
    memory_problem,
)
from labs.backends.vllm.server import (
    BLOCK_SIZE_MULTIPLE,
    MODELS_DIR,
    _max_model_len,
    env_key,
    supported_refusals,
)
from labs.parameters.catalog import CPU_KIND, GPUS
from labs.parameters.params import LabParams, ParamError

DeviceRules = Callable[[LabParams, Device], dict[str, str]]

# Device kind -> its start-up rules, replacing `gpu_refusals` for that kind. A kind's rules
# return {field: message} for what cannot start on `device` (empty when all is well); they may
# call fit.memory_problem and the helpers here. Register with `register_device_rules`.
DEVICE_RULES: dict[str, DeviceRules] = {}


def register_device_rules(kind: str, rules: DeviceRules) -> None:
    """Make `rules` decide what vLLM on a `kind` device (e.g. "cpu") can start."""
    DEVICE_RULES[kind] = rules


def cpu_device_refusals(params: LabParams, device: Device) -> dict[str, str]:
    """vLLM's CPU build (labs/backends/vllm/cpu.py): block sizes of its attention backend, the
    KV cache sized from kv_capacity_tokens, ngram speculation only; and, as on a GPU, weights +
    KV pool + the engine's own memory within what the worker announced."""
    return {**cpu_memory_refusals(params, device), **cpu_refusals(params)}


register_device_rules(CPU_KIND, cpu_device_refusals)


def max_gpu_memory_utilization(memory_bytes: float) -> float:
    """The largest gpu_memory_utilization vLLM can get on a GPU of this size: it refuses to
    start when free memory, the GPU less its CUDA context, is below that share. Not rounded:
    vLLM compares the learner's figure as given (0.9915 starts where 0.99 is the 2-decimal
    floor)."""
    return (memory_bytes - CUDA_CONTEXT_BYTES) / memory_bytes


def _share_text(share: float) -> str:
    """A share for a message, cut (never rounded up) to 4 decimals: every figure at or below
    the text is allowed."""
    return f"{math.floor(share * 10_000) / 10_000:.4f}"


def gpu_refusals(params: LabParams, device: Device) -> dict[str, str]:
    """vLLM's CUDA rules on `device`: block size, utilization, memory."""
    engine = params.engine
    errors: dict[str, str] = {}
    if engine.block_size % BLOCK_SIZE_MULTIPLE:
        errors["block_size"] = (
            f"block_size must be a multiple of {BLOCK_SIZE_MULTIPLE} on vLLM (16, 32, 64, 128: "
            f"its CUDA attention kernels take no other), got {engine.block_size}"
        )
    memory = gpu_memory(params, device.memory_bytes)
    most = max_gpu_memory_utilization(memory)
    # With a fixed pool the server passes no utilization (vLLM's default 0.9 applies).
    if engine.kv_capacity_tokens is None and engine.gpu_memory_utilization > most:
        errors["gpu_memory_utilization"] = (
            f"gpu_memory_utilization must be at most {_share_text(most)} on {device.kind}: vLLM "
            "refuses to start when free memory is below that share, and the CUDA context takes "
            "about "
            f"{CUDA_CONTEXT_BYTES / 1024**2:.0f} MiB of each GPU first; got "
            f"{engine.gpu_memory_utilization:g}"
        )
    problem = memory_problem(params, device.memory_bytes, most_gpus=device.count)
    if problem:
        errors["tp"] = problem
    return errors


def _model_refusal(params: LabParams) -> str | None:
    slug = params.model.name
    if (MODELS_DIR / slug / "config.json").is_file():
        return None
    bundled = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())
    return (
        f"model must be a catalog model to run on vLLM ({', '.join(bundled)}); a custom model "
        "exists only in the simulator"
    )


def _pool_refusal(params: LabParams) -> str | None:
    engine, work = params.engine, params.workload
    if engine.kv_capacity_tokens is None:
        return None
    longest = work.prompt_range[1] + work.output_range[1]
    if _max_model_len(params) <= engine.kv_capacity_tokens or longest <= (
        -(-engine.kv_capacity_tokens // engine.block_size) * engine.block_size
    ):
        return None
    return (
        f"kv_capacity_tokens must hold one whole request on vLLM, which refuses to start when "
        f"its pool (less the null block) cannot hold max_model_len: at least {longest:,} "
        f"(the longest prompt + output), got {engine.kv_capacity_tokens:,}"
    )


def _draft_refusal(params: LabParams) -> str | None:
    """A worker serving the model from its own checkpoint (LABS_VLLM_MODEL_DIR_<SLUG>) has no
    draft checkpoint beside it; decided on the worker, whose environment names it."""
    if params.engine.spec_method in ("none", "ngram"):
        return None
    weights = os.environ.get(f"LABS_VLLM_MODEL_DIR_{env_key(params.model.name)}")
    if not weights:
        return None
    return (
        f"spec_method must be ngram or none for {params.model.name} on this worker: it serves "
        f"real weights ({weights}) and has no draft checkpoint beside them"
    )


def settings_refusals(params: LabParams) -> dict[str, str]:
    """What no vLLM worker of any kind can start, by field."""
    errors = supported_refusals(params)
    errors.pop("block_size", None)  # a device kind's rule (gpu_refusals)
    refusals = (
        ("model", _model_refusal(params)),
        ("kv_capacity_tokens", _pool_refusal(params)),
        ("spec_method", _draft_refusal(params)),
    )
    for field, refusal in refusals:
        if refusal:
            errors.setdefault(field, refusal)
    return errors


def _catalog_device(params: LabParams) -> Device | None:
    gpu = GPUS.get(params.hardware.name)
    return None if gpu is None else Device(gpu.name, MAX_TP, gpu.hbm_bytes)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def check_can_start(
    params: LabParams, devices: Sequence[Device], *, elsewhere: bool = False
) -> Placement | None:
    """Where the lab starts: tp devices of its GPU kind, on the smallest worker that can; None
    for a worker that announced no device (it measures a server elsewhere: the backend's own
    queue, which only such workers consume).

    Args:
        params: validated lab parameters.
        devices: the online workers' devices (at submit), or this worker's (before a start).
        elsewhere: a worker that announced no device is online too. A kind no device has, or
            no device announced at all, is then judged against the catalog's GPU, up to MAX_TP
            of them.

    Raises:
        ParamError: every setting that cannot start, by field, saying what would fit.
    """
    errors = settings_refusals(params)
    kind, tp = params.hardware.name, params.engine.tp
    candidates = sorted((d for d in devices if d.kind == kind), key=lambda d: d.count)
    on_catalog = not candidates and (elsewhere or not devices)
    if on_catalog:
        catalog = _catalog_device(params)
        candidates = [catalog] if catalog else []
    if not candidates:
        if devices and not elsewhere:
            online = ", ".join(sorted({f"{d.kind} (up to {d.count})" for d in devices}))
            errors["gpu"] = (
                f"gpu must be a GPU kind an online vLLM worker has: {online}; got {kind}. "
                "Run it on the simulator, or pick one of those"
            )
        else:
            errors["gpu"] = (
                f"gpu must be a catalog GPU on vLLM; a custom GPU ({kind}) exists only in the "
                "simulator"
            )
        raise ParamError(errors)
    largest = candidates[-1]
    big_enough = [d for d in candidates if d.count >= tp]
    if not big_enough:
        errors.setdefault(
            "tp",
            f"tp must be at most {largest.count} on {kind}: the largest {kind} worker has "
            f"{largest.count} GPU{_s(largest.count)}, got {tp}",
        )
        raise ParamError(errors)
    device_errors: dict[str, str] = {}
    for device in big_enough:
        rules = DEVICE_RULES.get(device.kind, gpu_refusals)
        device_errors = rules(params, device)
        if not device_errors:
            break
    for field, message in device_errors.items():
        errors.setdefault(field, message)
    if errors:
        raise ParamError(errors)
    # Judged on the catalog, it goes to a worker measuring a server elsewhere
    # (LABS_VLLM_BASE_URL): no kind queue, the backend's own, which only those consume.
    return None if on_catalog else Placement(kind, tp)


def requirement(params: LabParams) -> str:
    """What a lab needs to run on vLLM, in a sentence: `4× h100-sxm` and why more would not
    help, or why it cannot run on vLLM at all."""
    if params.hardware.name not in GPUS:
        return "cannot run on vLLM: a custom GPU exists only in the simulator"
    try:
        check_can_start(params, [])
    except ParamError as exc:
        memory = memory_problem(params)
        if memory and set(exc.errors) == {"tp"}:
            return "cannot start as set: " + memory
        return "cannot run on vLLM: " + "; ".join(exc.errors.values())
    need = memory_need(params)
    tp, gpu = params.engine.tp, params.hardware.name
    gpus = f"{tp}\u00d7 {gpu}" if tp > 1 else f"a {gpu}"
    return (
        f"needs a vLLM worker with {gpus} (at least {in_gb(need.total)} of {in_gb(need.have)} each)"
    )
