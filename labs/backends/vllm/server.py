"""`vllm serve` for lab runs: validated lab parameters -> an argument list, and a manager that
starts the server, waits for it to be healthy, keeps it for the next run with the same arguments,
and stops its whole process group.

The arguments follow vllm-notes.md section 1 (vLLM 0.33):

- the model is a directory holding only a config.json (labs/backends/vllm/models/<slug>/), run
  with `--load-format dummy`: real architecture and kernels, random weights, nothing downloaded.
  `LABS_VLLM_MODEL_DIR_<SLUG>` (e.g. LABS_VLLM_MODEL_DIR_LLAMA_3_1_8B) or the backend's
  `model_path` option points at real weights instead (then `--load-format auto`);
- `--skip-tokenizer-init`: no tokenizer files are needed offline. Prompts are then token ids and
  streamed chunks carry no text, so the load generator counts tokens from `token_ids` / usage;
- a learner's acceptance rate alpha becomes vLLM's synthetic rejection sampler, given as
  `synthetic_acceptance_rates` = [alpha, alpha^2, ..., alpha^k]. vLLM 0.33 reads those as
  unconditional rates (rates[i] = chance that the first i+1 drafts are all accepted) and accepts
  position i with the conditional chance rates[i] / rates[i-1] (v1/spec_decode/utils.py
  `unconditional_to_conditional_rates`, v1/sample/rejection_sampler.py), stopping at the first
  rejection: so every draft is accepted with chance alpha given the ones before it, as the
  predictor assumes, and a step's tokens are spread as that model says. The other key,
  `synthetic_acceptance_length`, would only match the mean: vLLM turns a length into a
  minimum-variance schedule (k=3, alpha=0.7: rates [1.0, 0.533, 0.0], every step 2 or 3 tokens;
  docs/speculation-check.md). A draft model is the target's own config cut
  to round(draft_cost x layers) layers (random weights would accept almost nothing anyway);
  EAGLE heads cannot be built offline, so `eagle` runs as such a draft model too;
- `kv_capacity_tokens` becomes `--kv-cache-memory-bytes` for exactly that many tokens (plus
  vLLM's one null block), otherwise `--gpu-memory-utilization`.

Settings vLLM cannot run (contiguous KV, int8/int4 weights without a quantized checkpoint, block
sizes its CUDA kernels refuse) raise ParamError naming the field, like any bad lab parameter.

Why one module: starting, watching and stopping one vLLM server share its process handle and its
log; split, each half would reach into the other's state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from labs.backends.base import BackendError
from labs.backends.vllm.cpu import cpu_args, cpu_refusals, made_model
from labs.backends.vllm.identity import MODELS_DIR, differences
from labs.parameters.catalog import CPU_KIND, KV_DTYPE_BYTES, ModelSpec
from labs.parameters.params import LabParams, ParamError
from labs.prediction.predict import spec_tokens_per_step

logger = logging.getLogger(__name__)

SERVED_MODEL_NAME = "lab"
HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# vLLM's CUDA attention backends take block sizes that are multiples of 16 (notes, section 1).
BLOCK_SIZE_MULTIPLE = 16
_WEIGHT_FLAGS: dict[str, list[str]] = {
    "bf16": [],  # the configs say torch_dtype bfloat16
    "fp16": ["--dtype", "float16"],
    "fp8": ["--quantization", "fp8"],  # quantized on load, works with random weights
}
_LOG_TAIL_LINES = 40
# Read for vLLM's first error line: a server's whole log, unless it grew past this.
_LOG_SCAN_BYTES = 8 * 1024 * 1024
# Seconds a server's group gets once its leader has exited (see stop_group).
ORPHAN_GRACE_S = 2.0
_KEEP_LOGS = 5


def env_key(slug: str) -> str:
    """`llama-3.1-8b` -> `LLAMA_3_1_8B`, for LABS_VLLM_MODEL_DIR_<SLUG>."""
    return "".join(c if c.isalnum() else "_" for c in slug.upper())


# This installation (checkout): the default cache directory, and with it the lock on a
# device's engine, is its own, so another checkout's worker on this machine neither blocks nor
# stops this one's server.
_INSTALLATION = hashlib.sha256(str(Path(__file__).resolve().parents[3]).encode()).hexdigest()[:10]


def cache_dir() -> Path:
    """Where this worker keeps server logs, derived draft configs and its server's pid: one
    directory per installation unless LABS_VLLM_CACHE_DIR names one."""
    configured = os.environ.get("LABS_VLLM_CACHE_DIR")
    default = Path(tempfile.gettempdir()) / f"serving-school-vllm-{_INSTALLATION}"
    path = Path(configured) if configured else default
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_path(directory: Path) -> Path:
    """The file that records the server running on this process's devices (the lock)."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") or "none"
    return directory / f"server-gpus-{gpus}.json"


def busy_message(owner: int, pid: int) -> str:
    return (
        f"vLLM on this device is busy: another process of this installation (pid {owner}, a "
        f"second worker or `lab calibrate`) is running its engine (vllm serve, pid {pid}), and "
        "one device runs one engine. Try again when it has finished. Operators: stop it, or "
        "give this worker other GPUs (CUDA_VISIBLE_DEVICES) or its own LABS_VLLM_CACHE_DIR."
    )


def _running_state(path: Path) -> tuple[int, int] | None:
    """(owner, pid) of the server recorded at `path` if its pid still runs its command;
    owner 0 when unrecorded."""
    try:
        state = json.loads(path.read_text())
        pid, argv = int(state["pid"]), list(state["argv"])
        owner = int(state.get("owner") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    cmdline = _cmdline(pid)
    # A console script runs as `python .../vllm serve ...`: compare what follows the program.
    running = bool(cmdline and len(argv) > 1 and cmdline[-(len(argv) - 1) :] == argv[1:])
    return (owner, pid) if running else None


def engine_busy(cache: Path | None = None) -> str:
    """Why this process cannot start an engine on its devices now (another live process of
    this installation runs one there), or "" when it can."""
    found = _running_state(state_path(cache if cache is not None else cache_dir()))
    if found is None:
        return ""
    owner, pid = found
    if owner and owner != os.getpid() and _process_alive(owner):
        return busy_message(owner, pid)
    return ""


def _read_config(model_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ParamError(
            {"model": f"model directory {model_dir} has no readable config.json: {exc}"}
        ) from None


def _check_matches(model: ModelSpec, config: Mapping[str, Any], where: Path) -> None:
    """A model directory must be the lab's model: refuse one that differs in any field that
    tells models apart (identity.py: the shape, the MLP width, the context and its RoPE
    scaling), as Llama 3 8B's folder is not Llama 3.1 8B's."""
    wrong = differences(config, model.name)
    if wrong:
        raise ParamError(
            {"model": f"{where} is not {model.name}: its config.json has {', '.join(wrong)}"}
        )


@dataclass(frozen=True)
class ModelSource:
    path: Path
    real_weights: bool
    config: Mapping[str, Any]


def model_source(
    params: LabParams, model_path: str | os.PathLike[str] | None = None
) -> ModelSource:
    """The directory vLLM loads for the lab's model: `model_path`, LABS_VLLM_MODEL_DIR_<SLUG>, or
    the bundled config-only directory (random weights)."""
    slug = params.model.name
    override = model_path or os.environ.get(f"LABS_VLLM_MODEL_DIR_{env_key(slug)}")
    if override:
        path = Path(override).expanduser().resolve()
        config = _read_config(path)
        _check_matches(params.model, config, path)
        return ModelSource(path, True, config)
    # `lab make-model`'s weights are random too, so a run with a draft loses nothing by loading
    # the bundled config with vLLM's dummy weights, which its cut-down draft needs as well.
    drafted = params.engine.spec_method not in ("none", "ngram")
    made = None if drafted else made_model(slug)
    if made is not None:
        # Built by `lab make-model`: real (random) weights and a tokenizer.
        config = _read_config(made)
        _check_matches(params.model, config, made)
        return ModelSource(made, True, config)
    path = MODELS_DIR / slug
    if not (path / "config.json").is_file():
        raise ParamError(
            {"model": f"model must be a catalog model to run on vLLM (no config for {slug})"}
        )
    return ModelSource(path, False, _read_config(path))


@dataclass(frozen=True)
class ServePlan:
    """What to start: `args` follow the executable (no host or port: the manager adds those),
    `files` are written before the start (derived draft configs), `notes` go into the run's meta."""

    args: tuple[str, ...]
    files: Mapping[Path, str] = field(default_factory=dict)
    notes: Mapping[str, Any] = field(default_factory=dict)

    def argv(
        self, executable: str = "vllm", *, host: str = HOST, port: int = DEFAULT_PORT
    ) -> list[str]:
        return [executable, *self.args, "--host", host, "--port", str(port)]


def _unsupported(params: LabParams) -> dict[str, str]:
    engine = params.engine
    errors: dict[str, str] = {}
    if engine.kv_allocation != "paged":
        errors["kv_allocation"] = (
            "kv_allocation must be paged on vLLM, which always pages its KV cache; "
            "contiguous can only be simulated"
        )
    if engine.weight_dtype not in _WEIGHT_FLAGS:
        errors["weight_dtype"] = (
            f"weight_dtype must be one of {', '.join(_WEIGHT_FLAGS)} on vLLM (random weights "
            f"cannot be {engine.weight_dtype} without a quantized checkpoint), "
            f"got {engine.weight_dtype}"
        )
    if engine.block_size % BLOCK_SIZE_MULTIPLE:
        errors["block_size"] = (
            f"block_size must be a multiple of {BLOCK_SIZE_MULTIPLE} on vLLM (16, 32, 64, 128: "
            f"its CUDA attention kernels take no other), got {engine.block_size}"
        )
    return errors


def _max_model_len(params: LabParams) -> int:
    """Room for the longest request, rounded up to a power of two (at most the model's context)
    so that runs with nearby lengths reuse the same server instead of restarting it; never more
    than a fixed KV pool holds, as vLLM refuses to start when its pool, less the null block,
    cannot hold one request of max_model_len."""
    work, engine = params.workload, params.engine
    needed = work.prompt_range[1] + work.output_range[1]
    rounded = max(1024, 1 << (needed - 1).bit_length())
    if params.model.max_context:
        rounded = min(rounded, params.model.max_context)
    if not engine.chunked_prefill:
        # vLLM refuses max_num_batched_tokens < max_model_len without chunked prefill.
        rounded = min(rounded, engine.max_num_batched_tokens)
    if engine.kv_capacity_tokens is not None:
        pool = -(-engine.kv_capacity_tokens // engine.block_size) * engine.block_size
        rounded = min(rounded, pool)
    return max(needed, rounded)


def _kv_bytes_per_token(model: ModelSpec, tp: int, kv_bytes: int, layers: int) -> int:
    # Per GPU: KV heads are split across the tp GPUs, or replicated when there are fewer.
    heads_per_gpu = max(1, model.kv_heads // tp)
    return 2 * layers * heads_per_gpu * model.head_dim * kv_bytes


@dataclass(frozen=True)
class _Draft:
    path: Path
    layers: int
    config_text: str
    notes: Mapping[str, Any]


def _draft(params: LabParams, source: ModelSource, cache: Path) -> _Draft | None:
    """The draft model for speculation, or None for ngram or no speculation."""
    engine = params.engine
    if engine.spec_method in ("none", "ngram"):
        return None
    if source.real_weights:
        raise ParamError(
            {
                "spec_method": f"spec_method {engine.spec_method} needs a draft checkpoint next "
                "to real weights; run speculation on the bundled configs (random weights)"
            }
        )
    layers = max(1, round(engine.draft_cost * params.model.layers))
    text = json.dumps({**source.config, "num_hidden_layers": layers}, indent=2, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    note = (
        f"draft: {params.model.name} cut to {layers} of {params.model.layers} layers "
        f"(cost about {layers / params.model.layers:.2f} of a target pass), random weights"
    )
    if engine.spec_method == "eagle":
        note += "; EAGLE heads cannot be built offline, so eagle runs as this draft"
    path = cache / "drafts" / f"{params.model.name}-{layers}l-{digest}"
    return _Draft(path, layers, text + "\n", {"draft_layers": layers, "draft_note": note})


def synthetic_acceptance_rates(k: int, alpha: float) -> list[float]:
    """vLLM's unconditional per-position rates for k drafts each accepted with chance alpha
    (given the ones before it): [alpha, alpha^2, ..., alpha^k], non-increasing as vLLM requires.
    Not rounded: vLLM divides each rate by the one before, so rounding would bend the small ones
    (alpha^16 is 7e-12 at alpha 0.2); json.dumps writes each float the same way every time."""
    return [alpha ** (i + 1) for i in range(k)]


def supported_refusals(params: LabParams) -> dict[str, str]:
    """Settings vLLM cannot run whatever the worker, by field (empty when there are none)."""
    errors = _unsupported(params)
    engine = params.engine
    max_len = _max_model_len(params)
    if not engine.chunked_prefill and engine.max_num_batched_tokens < max_len:
        errors["max_num_batched_tokens"] = (
            "max_num_batched_tokens must be at least the longest request (prompt + output = "
            f"{max_len:,} tokens) on vLLM when chunked_prefill is off, got "
            f"{engine.max_num_batched_tokens:,}"
        )
    return errors


def check_supported(params: LabParams) -> None:
    """Refuse settings vLLM cannot run, without touching a GPU or a file. The whole start-up
    check, with the worker's GPUs and memory, is labs.backends.vllm.start.check_can_start.

    Raises:
        ParamError: each unsupported setting, naming its field.
    """
    errors = supported_refusals(params)
    if params.hardware.name == CPU_KIND:
        # vLLM's CPU build (start.py's DEVICE_RULES at submit): its message replaces the CUDA
        # one for the same field.
        errors.update(cpu_refusals(params))
    if errors:
        raise ParamError(errors)


def build_plan(
    params: LabParams,
    *,
    model_path: str | os.PathLike[str] | None = None,
    cache: Path | None = None,
) -> ServePlan:
    """The `vllm serve` arguments for validated lab parameters.

    Raises:
        ParamError: settings vLLM cannot run, each naming its field.
    """
    check_supported(params)
    engine, model = params.engine, params.model
    source = model_source(params, model_path)
    max_len = _max_model_len(params)
    draft = _draft(params, source, cache if cache is not None else cache_dir())
    draft_layers = draft.layers if draft is not None else 0
    notes: dict[str, Any] = dict(draft.notes) if draft is not None else {}
    args: list[str] = ["serve", str(source.path), "--served-model-name", SERVED_MODEL_NAME]
    args += ["--load-format", "auto" if source.real_weights else "dummy"]
    # A fixed engine seed: the workload's seed changes the requests, not the server.
    args += ["--skip-tokenizer-init", "--seed", "0"]
    if engine.tp > 1:
        args += ["--tensor-parallel-size", str(engine.tp)]
    args += _WEIGHT_FLAGS[engine.weight_dtype]
    args += ["--max-model-len", str(max_len), "--block-size", str(engine.block_size)]
    args += ["--max-num-seqs", str(engine.max_num_seqs)]
    args += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    args.append(
        "--enable-chunked-prefill" if engine.chunked_prefill else "--no-enable-chunked-prefill"
    )
    args.append(
        "--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching"
    )
    args += ["--kv-cache-dtype", engine.kv_dtype]
    notes.update(max_model_len=max_len, load_format=args[args.index("--load-format") + 1])
    if engine.kv_capacity_tokens is not None:
        # Whole blocks for the learner's tokens, plus the null block vLLM keeps back; the draft
        # model's layers take their share of the same pool.
        blocks = math.ceil(engine.kv_capacity_tokens / engine.block_size) + 1
        per_token = _kv_bytes_per_token(
            model, engine.tp, KV_DTYPE_BYTES[engine.kv_dtype], model.layers + draft_layers
        )
        kv_bytes = blocks * engine.block_size * per_token
        args += ["--kv-cache-memory-bytes", str(kv_bytes)]
        notes.update(kv_cache_memory_bytes=kv_bytes, num_gpu_blocks_expected=blocks)
    else:
        # repr: the value the fit check used, not one rounded to 6 digits.
        args += ["--gpu-memory-utilization", repr(float(engine.gpu_memory_utilization))]
    files: dict[Path, str] = {}
    if engine.spec_method != "none":
        rates = synthetic_acceptance_rates(engine.spec_tokens, engine.acceptance)
        spec: dict[str, Any] = {"num_speculative_tokens": engine.spec_tokens}
        if draft is None:
            spec["method"] = "ngram"
        else:
            spec.update(method="draft_model", model=str(draft.path))
            files[draft.path / "config.json"] = draft.config_text
        spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=rates)
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"), sort_keys=True)]
        notes["synthetic_acceptance_rates"] = rates
        notes["spec_tokens_per_step_expected"] = round(
            spec_tokens_per_step(engine.spec_tokens, engine.acceptance), 6
        )
        if engine.spec_method == "ngram":
            notes["spec_note"] = (
                "ngram drafts only where the context repeats itself, so fewer drafts than "
                "steps; accepted drafts follow alpha"
            )
    # Per-request prefix-cache hits in the final usage chunk (prompt_tokens_details).
    args.append("--enable-prompt-tokens-details")
    if params.hardware.name == CPU_KIND:
        notes.pop("synthetic_acceptance_rates", None)
        notes.pop("spec_tokens_per_step_expected", None)
        if engine.spec_method == "ngram":
            notes["spec_note"] = (
                "ngram on vLLM's CPU build: no synthetic sampler, so which drafts are accepted "
                "is the engine's own (greedy sampling), read from /metrics; alpha is only the "
                "prediction's"
            )
        return ServePlan(args=cpu_args(tuple(args)), files=files, notes={**notes, "device": "cpu"})
    return ServePlan(args=tuple(args), files=files, notes=notes)


# -- the manager ----------------------------------------------------------------------------------


_ERROR_LINE = re.compile(r"\b(\w+(Error|Exception)): \S")
# vLLM's line prefix: "(EngineCore_DP0 pid=7) ERROR 12-02 00:17:09 [core.py:1] " on a log record,
# "(EngineCore_DP0 pid=7) " alone on a traceback line its subprocess printed.
_PROCESS = r"\([\w.-]+ pid=\d+\)\s+"
_RECORD = re.compile(
    f"({_PROCESS})?"
    + r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+[\d-]+ [\d:.]+\s+\[[^\]]*\]\s+"
)
_PREFIX = re.compile(_PROCESS)
# Errors that only point at the cause above them, never the cause.
_POINTERS = ("See stack trace (above)", "See root cause above")
# The API server's word that its engine process died, logged as a warning.
_ENGINE_DIED = re.compile(r"engine core (exited|died) unexpectedly|died unexpectedly", re.I)


def vllm_error_line(lines: list[str]) -> str | None:
    """vLLM's own reason it stopped: the FIRST exception line of a server log ("ValueError: ...
    block_size ...", which comes ~60 lines above the generic "Engine core initialization
    failed"), else its first error record or its word that the engine died; warnings (a
    start-up "Tokenizer not available" every server logs) never count. None if there is none."""
    exception = record = None
    for raw in lines:
        line = raw.strip()
        match = _RECORD.match(line)
        level = match.group("level") if match else None
        prefix = match or _PREFIX.match(line)
        text = line[prefix.end() :] if prefix else line
        if _ENGINE_DIED.search(text) and record is None:
            record = text
        if level in ("DEBUG", "INFO", "WARNING"):
            continue
        if _ERROR_LINE.search(text) and not any(p in text for p in _POINTERS):
            exception = exception or text
        elif level in ("ERROR", "CRITICAL") and record is None:
            record = text
    return exception or record


def ended_words(code: int) -> str:
    """How `vllm serve` ended, from its exit status, in words: a signal by its name and what
    sends it ("was killed (SIGKILL) ..."), else the code it exited with."""
    if code >= 0:
        return f"vllm serve exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"vllm serve was ended by signal {-code}"
    if name == "SIGKILL":
        return (
            "vllm serve was killed (SIGKILL), which nothing in vLLM sends: the kernel's "
            "out-of-memory killer, when the machine runs out of memory, or someone on this "
            "machine"
        )
    if name in ("SIGTERM", "SIGINT", "SIGHUP"):
        return f"vllm serve was stopped from outside ({name})"
    return f"vllm serve crashed ({name})"


class ServerError(BackendError):
    """`vllm serve` is missing, died, or never became healthy. The message ends with the last
    lines of its log."""


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_executable(configured: str | None = None) -> str:
    """VLLM_EXECUTABLE, else `vllm` on PATH or next to this Python (a venv's bin/)."""
    name = configured or os.environ.get("VLLM_EXECUTABLE") or "vllm"
    found = shutil.which(name)
    if found is None and os.sep not in name:
        candidate = Path(sys.executable).parent / name
        found = str(candidate) if os.access(candidate, os.X_OK) else None
    if found is None:
        raise ServerError(
            f"{name} is not installed on this worker: pip install '.[gpu]' (vLLM 0.33), "
            "or set VLLM_EXECUTABLE"
        )
    return found


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`, from /proc; where /proc is missing,
    [pgid] if signal 0 reaches the group, else []."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Fields after the command name, which may itself hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def stop_group(
    pgid: int,
    leader: subprocess.Popen[bytes] | None,
    timeout_s: float,
    grace_s: float = ORPHAN_GRACE_S,
) -> None:
    """TERM the whole process group, wait up to `timeout_s` for every member to go, then KILL.
    vLLM's engine cores are children of the server; killing only the server would orphan them
    with the GPU memory they hold. Once the leader (vLLM's API server, which shuts its own engine
    down) is gone, what is left gets only `grace_s`: an engine its server left behind ignores
    SIGTERM, and would otherwise hold a failed run for the whole timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    orphaned_at: float | None = None
    while time.monotonic() < deadline:
        if leader is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                leader.wait(timeout=0.05)  # reap it, or it stays a member as a zombie
        members = group_members(pgid)
        if not members:
            return
        led = leader.poll() is None if leader is not None else pgid in members
        if not led:
            orphaned_at = orphaned_at or time.monotonic()
            if time.monotonic() - orphaned_at >= grace_s:
                break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if leader is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                leader.wait(timeout=0.05)
        if not group_members(pgid):
            return
        time.sleep(0.05)
    if group_members(pgid):
        logger.error("process group %s survived SIGKILL: %s", pgid, group_members(pgid))


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _process_alive(pid: int) -> bool:
    """The process exists and is not a zombie (its cmdline can read empty while it execs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    argv: list[str]
    plan_args: tuple[str, ...]
    port: int
    log_path: Path
    start_s: float  # seconds from Popen to healthy
    why: str = ""  # why it was started (StartWait.why)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class StartWait:
    """What `ServerManager.ensure` tells its caller while a new server starts."""

    why: str  # "first run on this worker", "engine arguments changed", ...
    elapsed_s: float  # since the start
    last_start_s: float | None  # how long this worker's previous start took, if known


FIRST_START = "first run on this worker"
ARGS_CHANGED = "engine arguments changed"
RESTART = "the previous server had stopped"


class ServerManager:
    """One `vllm serve` at a time for this worker, kept between runs with identical arguments.

    The server runs in its own process group (which holds vLLM's engine processes too) in the
    starter's session (see _start), logs to a file in cache_dir(), and is recorded in a state
    file there, so a worker that was killed outright has its orphaned server stopped by the next
    worker on the same GPUs.
    """

    def __init__(
        self,
        *,
        executable: str | None = None,
        start_timeout_s: float | None = None,
        stop_timeout_s: float | None = None,
        cache: Path | None = None,
    ) -> None:
        self.executable = executable
        self.start_timeout_s = start_timeout_s or float(
            os.environ.get("LABS_VLLM_START_TIMEOUT_S", "1200")
        )
        self.stop_timeout_s = stop_timeout_s or float(
            os.environ.get("LABS_VLLM_STOP_TIMEOUT_S", "30")
        )
        self.cache = cache
        self.current: RunningServer | None = None
        self._lock = threading.RLock()
        self._orphans_checked = False
        self._last_args: tuple[str, ...] | None = None  # of the last server started

    @property
    def _last_start_path(self) -> Path:
        return self._dir / "last-start.json"

    def last_start_s(self) -> float | None:
        """How long this worker's last successful start took (kept in cache_dir(), so a
        restarted worker still knows), or None."""
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            value = float(json.loads(self._last_start_path.read_text())["start_s"])
            return value if math.isfinite(value) and value >= 0 else None
        return None

    def _why_start(self, plan: ServePlan) -> str:
        if self._last_args is None:
            return FIRST_START
        return ARGS_CHANGED if self._last_args != plan.args else RESTART

    @property
    def _dir(self) -> Path:
        return self.cache if self.cache is not None else cache_dir()

    @property
    def _state_path(self) -> Path:
        return state_path(self._dir)

    def ensure(
        self, plan: ServePlan, *, on_wait: Callable[[StartWait], None] | None = None
    ) -> tuple[RunningServer, bool]:
        """A healthy server for `plan`: the running one if its arguments are identical (True),
        else a new one (False) after stopping the old. While a new one starts, `on_wait` is
        called about twice a second with why it starts and the seconds so far.

        Raises:
            ServerError: no executable, or the server died or was not healthy in time.
        """
        with self._lock:
            current = self.current
            if current is not None and current.plan_args == plan.args and self._healthy(current):
                return current, True
            why = self._why_start(plan)
            last = self.last_start_s()
            tick = None
            if on_wait is not None:
                callback = on_wait

                def tick(elapsed_s: float) -> None:
                    callback(StartWait(why, elapsed_s, last))

            self.stop()
            self._stop_orphan()
            server = self._start(plan, tick)
            server.why = why
            return server, False

    def _healthy(self, server: RunningServer) -> bool:
        if server.process.poll() is not None:
            return False
        try:
            response = httpx.get(f"{server.base_url}/health", timeout=5.0, trust_env=False)
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    def _start(self, plan: ServePlan, on_wait: Callable[[float], None] | None) -> RunningServer:
        executable = find_executable(self.executable)
        for path, text in plan.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
        port = free_port()
        argv = plan.argv(executable, port=port)
        log_path = self._new_log(port)
        env = {
            **os.environ,
            # Nothing to download (config-only model dirs, no tokenizer), and no usage reports.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        logger.info("starting %s", " ".join(argv))
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._dir,
                # Its own process group, so stopping it ends its engine processes too, but the
                # starter's session: a CPU worker's engine spins (sched_yield) on the cores the
                # load generator needs, and Linux's autogroup scheduler, which groups tasks by
                # session, would leave a load generator in another session runnable but
                # unscheduled for most of a second, so repeats of one run would differ severalfold
                # (tests/benchmarks/bench_cpu_vllm_repeats.py compares the two).
                process_group=0,
            )
        started = time.monotonic()
        server = RunningServer(process, argv, plan.args, port, log_path, 0.0)
        self._last_args = plan.args
        self._write_state(server)
        try:
            self._wait_healthy(server, on_wait)
        except BaseException:
            self._stop_server(server)
            raise
        server.start_s = time.monotonic() - started
        self.current = server
        with contextlib.suppress(OSError):
            self._last_start_path.write_text(json.dumps({"start_s": round(server.start_s, 3)}))
        return server

    def _wait_healthy(self, server: RunningServer, on_wait: Callable[[float], None] | None) -> None:
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                code = server.process.poll()
                if code is not None:
                    raise ServerError(
                        f"{ended_words(code)} before it was ready "
                        f"({time.monotonic() - started:.0f} s after start). "
                        + self.log_tail(server)
                    )
                try:
                    if client.get(f"{server.base_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"vllm serve was not healthy {self.start_timeout_s:.0f} s after start "
                        "(LABS_VLLM_START_TIMEOUT_S). " + self.log_tail(server)
                    )
                if on_wait is not None:
                    on_wait(time.monotonic() - started)
                time.sleep(0.5)

    def check(self, *, health: bool = False) -> None:
        """Raise ServerError (and clean up) if the current server has died; with `health`, also
        if it no longer answers /health: vLLM's API server outlives a dead engine by seconds,
        failing every request meanwhile, so a run can end before its server exits."""
        with self._lock:
            server = self.current
            if server is None:
                return
            code = server.process.poll()
            if code is not None:
                message = f"{ended_words(code)} during the run. "
            elif health and not self._healthy(server):
                message = "vLLM's engine stopped during the run (its server fails /health). "
            else:
                return
            message += self.log_tail(server)
            self.stop()
            raise ServerError(message)

    def stop(self) -> None:
        """Stop the current server and every process in its group. Safe to call at any time."""
        with self._lock:
            server, self.current = self.current, None
            if server is not None:
                self._stop_server(server)

    def _stop_server(self, server: RunningServer) -> None:
        logger.info("stopping vllm serve (pid %s)", server.pid)
        stop_group(server.pid, server.process, self.stop_timeout_s)
        with contextlib.suppress(OSError):
            state = json.loads(self._state_path.read_text())
            if state.get("pid") == server.pid:
                self._state_path.unlink()

    def _write_state(self, server: RunningServer) -> None:
        state = {
            "pid": server.pid,
            "argv": server.argv,
            "log": str(server.log_path),
            "owner": os.getpid(),
        }
        self._state_path.write_text(json.dumps(state))

    def _stop_orphan(self) -> None:
        """A server a killed worker left behind, if its recorded pid still runs its command.

        Raises:
            ServerError: the server belongs to another process that is still running (a second
                worker, or `lab calibrate`, on the same GPUs): it is left alone.
        """
        if self._orphans_checked:
            return
        found = _running_state(self._state_path)
        if found is not None:
            owner, pid = found
            if owner and owner != os.getpid() and _process_alive(owner):
                # Stopping it would fail that process's run mid-way; two servers cannot share
                # GPUs.
                raise ServerError(f"{busy_message(owner, pid)} ({self._state_path})")
        self._orphans_checked = True
        if found is not None:
            pid = found[1]
            logger.warning("stopping vllm serve (pid %s) left by an earlier worker", pid)
            stop_group(pid, None, self.stop_timeout_s)
        with contextlib.suppress(OSError):
            self._state_path.unlink()

    def _new_log(self, port: int) -> Path:
        logs = self._dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for old in sorted(logs.glob("vllm-serve-*.log"))[:-_KEEP_LOGS]:
            with contextlib.suppress(OSError):
                old.unlink()
        return logs / f"vllm-serve-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"

    def log_tail(self, server: RunningServer | None = None, lines: int = _LOG_TAIL_LINES) -> str:
        server = server or self.current
        if server is None:
            return ""
        try:
            with server.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _LOG_SCAN_BYTES))
                text = log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(its log {server.log_path} cannot be read: {exc})"
        all_lines = text.splitlines()
        tail = "\n".join(all_lines[-lines:])
        said = vllm_error_line(all_lines)
        # vLLM's reason can sit above a long shutdown traceback: name it first.
        first = f"vLLM said: {said}\n" if said else ""
        return f"{first}Last lines of its log ({server.log_path}):\n{tail}"
