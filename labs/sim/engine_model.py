"""The engine model: how long a vLLM step takes on the GPU the lab names, and what it is made of.

The predictor (labs/prediction/predict.py) prices a step at the roofline: max(compute, memory) at
peak FLOP/s and bandwidth. Real kernels fall short of that, a step has CPU and launch costs, and a
tensor-parallel replica talks between GPUs. This module adds those terms, each a named function
with its constants in labs/sim/calibration.yaml (every constant cites the public vLLM runs it was
fitted to; docs/engine-model.md explains them, and `python -m labs.sim.published_calibration
--report` prints each run's error):

    step = linear layers      max(2 x (layer params x tokens / gemm_efficiency(tokens)
                                       + LM head x sampled / gemm_efficiency(sampled)) / FLOP/s,
                                  weight bytes read / (bandwidth x bandwidth_efficiency)
                                  + kernels x kernel_latency) x (1 + dequant overhead)
         + attention          max(4 x layers x heads x head_dim x token pairs / (FLOP/s x attn eff),
                                  KV bytes read / (bandwidth x kv_bandwidth_efficiency))
         + per-step overhead  decode-only steps (CUDA graphs) or mixed steps, + per sequence
         + communication      tp > 1: 2 all-reduces per layer, each as vLLM performs it (its
                              custom all-reduce or NCCL): a latency + the bytes over the link
         + speculation        k draft passes, each c x a plain decode step, + the fixed CPU
                              time speculation adds to every step of a speculating engine
                              (its proposer runs after each step, drafts found or not)

The vocabulary tables are priced as vLLM runs them (`layer_params`, `lm_head_params`): the input
embedding is a lookup (no FLOPs, and a step reads only its tokens' rows) and the LM head runs only
at the positions sampled, one per sequence in the step plus each draft verified, not at every
prompt token. The predictor's roofline counts every weight as read and multiplied per token (the
deck's figures: 16 GB and 4.8 ms per Llama-3-8B decode step on an H100); for Llama-3-8B the two
tables are 13% of its weights, for the CPU worker's lab-llama-20m 80%.

Two profiles:

- `realistic` (the default): the terms above with the calibrated constants.
- `ideal`: the predictor's own `step_time_s` (efficiency 1, no overheads unless the lab sets
  them), so the simulator differs from the formulas only through scheduling.

What the host in front of the engine adds to a request (the API server, or an engine in the
client's own process) is the host's, not the GPU's (`Host`, calibration.yaml `hosts`); the
simulator puts it between a client and the engine (labs/sim/lab.frontend_s).

Each step is also split into additive parts (PARTS), which labs/sim/breakdown.py accumulates per
request: the ideal roofline time, the efficiency loss, the fixed overheads, communication and
speculation. Every price is vectorised over steps (`steps_parts_s`): the simulator's fast path
prices a run of decode-only steps with a constant batch in one call.

Pure Python + numpy + PyYAML; never Django.

Why one module: the realistic and the ideal profile share every part of a step's time; kept
together so a new part is added to both or to neither.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import ArrayLike

from labs.parameters.catalog import CPU_KIND, WEIGHT_DTYPE_BYTES, Hardware, ModelSpec
from labs.parameters.device_calibration import DeviceConstants
from labs.parameters.params import EngineConfig
from labs.prediction.predict import (
    compute_rate,
    kv_bytes_per_token,
    kv_replication,
    memory_rate,
    weight_bytes_read,
)
from labs.sim.scheduler import SchedulerOutput

PROFILES = ("realistic", "ideal")
# The parts a step's time is split into, in this order (columns of `steps_parts_s`).
PARTS = ("ideal", "efficiency", "overhead", "communication", "speculation")
IDEAL, EFFICIENCY, OVERHEAD, COMMUNICATION, SPECULATION = range(len(PARTS))

CALIBRATION_PATH = Path(__file__).with_name("calibration.yaml")
# Activations cross the all-reduce in 16 bits whatever the weights are.
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class GpuConstants:
    """What one GPU kind reaches in vLLM's kernels (fractions of its data-sheet peaks)."""

    name: str
    display: str  # "H100 SXM"
    bandwidth_efficiency: float  # weight reads, large
    kv_bandwidth_efficiency: float  # paged-attention KV reads
    gemm_efficiency: float  # long prefills approach this fraction of dense peak FLOP/s
    gemm_half_tokens: float  # tokens in a step at which GEMMs reach half of that
    link: str  # "nvlink" | "pcie"
    link_bytes_per_s: float  # one direction, per GPU
    # Fixed CPU time of a decode-only step where this GPU's measurements pin it down (its
    # engine version's scheduler); None = the global constant.
    decode_step_overhead_s: float | None = None
    # False where no published vLLM run of this GPU was found and its efficiencies are
    # borrowed from a calibrated part (their source says "not calibrated").
    calibrated: bool = True
    borrows: str = ""  # which part's constants an uncalibrated GPU uses, and how
    borrows_from: str = ""  # the catalog name of that part ("" for the custom GPU's assumed ones)


@dataclass(frozen=True)
class AllReduceConstants:
    """What a tensor-parallel all-reduce costs beyond its bytes, per link ("nvlink" | "pcie"):
    vLLM's custom all-reduce (one kernel: peers read each other's buffers directly) and NCCL's.
    `bandwidth_efficiency` is the share of the link's one-way bandwidth both reach."""

    custom_latency_s: dict[str, float]
    nccl_latency_s: dict[str, float]
    bandwidth_efficiency: float


@dataclass(frozen=True)
class Host:
    """What the host in front of the engine adds to every request: the time between a client
    sending it and the engine seeing it (HTTP, chat template, tokenization, the hand-over to the
    engine core, and the first token's way back), and what each other request in flight adds
    to that time (one front-end process relays every stream). A host's, not a GPU's."""

    name: str
    kind: str  # "api_server" (an HTTP server) | "in_process" (an engine in the client's process)
    latency_s: float
    per_stream_s: float
    display: str = ""


# The two kinds of front end a client can reach an engine through, and the host a lab run gets.
HOST_KINDS = ("api_server", "in_process")
DEFAULT_HOST = "api_server"


@dataclass(frozen=True)
class Calibration:
    """Every constant of the realistic profile (labs/sim/calibration.yaml)."""

    gpus: dict[str, GpuConstants]
    kernel_latency_s: float
    kernels_per_layer: int
    attention_efficiency: float
    decode_step_overhead_s: float
    mixed_step_overhead_s: float
    per_seq_overhead_s: float
    allreduce: AllReduceConstants
    dequant_overhead: dict[str, float]
    num_fitted: int
    num_held_out: int
    spec_step_overhead_s: float = 0.0
    # The hosts in front of the engine: one per kind (the defaults, `HOST_KINDS`) and one per
    # published source that measured its own (`published_hosts`).
    hosts: dict[str, Host] = field(default_factory=dict)
    # Per GPU kind: its own (fit, held-out) published runs, which its provenance label names.
    gpu_runs: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def num_runs(self) -> int:
        return self.num_fitted + self.num_held_out

    def gpu(self, hardware: Hardware) -> GpuConstants:
        """The GPU's constants; a custom GPU gets the `custom` entry (the catalog's median)."""
        found = self.gpus.get(hardware.name)
        if found is not None:
            return found
        return replace(self.gpus["custom"], name=hardware.name)

    def host(self, name: str | None = None) -> Host:
        """The host `name` (a published source's own, or a kind's default); the API server's
        default for None or a host this calibration does not hold (a source left out)."""
        return self.hosts.get(name or DEFAULT_HOST) or self.hosts[DEFAULT_HOST]

    def frontend(self, host: str | None = None) -> tuple[float, float]:
        """(latency, per other stream in flight) of the front end of `host`, in seconds."""
        found = self.host(host)
        return found.latency_s, found.per_stream_s

    def published_hosts(self, kind: str = DEFAULT_HOST) -> list[Host]:
        """The hosts published runs measured, of one kind (what the default is the median of,
        and the spread a lab page quotes)."""
        return [h for h in self.hosts.values() if h.kind == kind and h.name not in HOST_KINDS]


_NESTED = ("allreduce", "dequant_overhead")


def _value(entry: Any) -> Any:
    """A constant is either a bare value or {value: ..., source: ...}."""
    return entry["value"] if isinstance(entry, dict) and "value" in entry else entry


def parse_calibration(data: dict[str, Any]) -> Calibration:
    """A Calibration from the YAML's mapping (raises KeyError/ValueError on a malformed file)."""
    g = {k: v if k in _NESTED else _value(v) for k, v in data["global"].items()}
    gpus = {}
    for name, entry in data["gpus"].items():
        c = {k: _value(v) for k, v in entry.items()}
        source = entry["bandwidth_efficiency"]
        borrowed = name == "custom" or (
            isinstance(source, dict) and "not calibrated" in str(source.get("source", ""))
        )
        gpus[name] = GpuConstants(
            name=name,
            display=str(c["display"]),
            bandwidth_efficiency=float(c["bandwidth_efficiency"]),
            kv_bandwidth_efficiency=float(c["kv_bandwidth_efficiency"]),
            gemm_efficiency=float(c["gemm_efficiency"]),
            gemm_half_tokens=float(c["gemm_half_tokens"]),
            link=str(c["link"]),
            link_bytes_per_s=float(c["link_gb_per_s"]) * 1e9,
            decode_step_overhead_s=(
                float(c["decode_step_overhead_ms"]) * 1e-3
                if "decode_step_overhead_ms" in c
                else None
            ),
            calibrated=not borrowed,
            borrows=str(c.get("borrows", "")),
            borrows_from=str(c.get("borrows_from", "")),
        )
    if "custom" not in gpus:
        raise ValueError("calibration.yaml needs a `custom` GPU entry")
    measurements = data.get("measurements", [])
    roles = [m.get("role") for m in measurements]
    gpu_runs = {
        name: tuple(
            sum(m.get("role") == role and m["settings"]["gpu"] == name for m in measurements)
            for role in ("fit", "held_out")
        )
        for name in gpus
    }
    return Calibration(
        gpus=gpus,
        kernel_latency_s=float(g["kernel_latency_us"]) * 1e-6,
        kernels_per_layer=int(g["kernels_per_layer"]),
        attention_efficiency=float(g["attention_efficiency"]),
        decode_step_overhead_s=float(g["decode_step_overhead_ms"]) * 1e-3,
        mixed_step_overhead_s=float(g["mixed_step_overhead_ms"]) * 1e-3,
        per_seq_overhead_s=float(g["per_seq_overhead_us"]) * 1e-6,
        allreduce=_allreduce(g["allreduce"]),
        dequant_overhead={k: float(_value(v)) for k, v in g["dequant_overhead"].items()},
        num_fitted=roles.count("fit"),
        num_held_out=roles.count("held_out"),
        spec_step_overhead_s=float(_value(g.get("spec_step_overhead_ms", 0.0))) * 1e-3,
        hosts=parse_hosts(data["hosts"]),
        gpu_runs={name: (fitted, held) for name, (fitted, held) in gpu_runs.items()},
    )


def _allreduce(entry: dict[str, Any]) -> AllReduceConstants:
    def per_link(key: str) -> dict[str, float]:
        return {link: float(_value(v)) * 1e-6 for link, v in entry[key].items()}

    return AllReduceConstants(
        custom_latency_s=per_link("custom_latency_us"),
        nccl_latency_s=per_link("nccl_latency_us"),
        bandwidth_efficiency=float(_value(entry["bandwidth_efficiency"])),
    )


def parse_hosts(entries: dict[str, Any]) -> dict[str, Host]:
    """The hosts of the YAML's `hosts`: every published one (a source's own front end), then
    each kind's default. A default given as `median` takes, constant by constant, the median
    of the published hosts of its kind: the typical host, which no single source decides. An
    entry marked `left_out` (a leave-one-source-out fold without its source) is skipped, so
    its runs get their kind's default."""
    hosts: dict[str, Host] = {}
    for name, e in entries.items():
        if name in HOST_KINDS or e.get("left_out"):
            continue
        hosts[name] = Host(
            name,
            str(e["kind"]),
            float(_value(e["latency_ms"])) * 1e-3,
            float(_value(e["per_stream_ms"])) * 1e-3,
            str(e.get("display", name)),
        )
    for kind in HOST_KINDS:
        e = entries[kind]
        if e.get("default") == "median":
            own = [h for h in hosts.values() if h.kind == kind]
            if not own:
                raise ValueError(f"hosts.{kind} is the median of published hosts, and has none")
            latency = statistics.median(h.latency_s for h in own)
            per_stream = statistics.median(h.per_stream_s for h in own)
        else:
            latency = float(_value(e["latency_ms"])) * 1e-3
            per_stream = float(_value(e["per_stream_ms"])) * 1e-3
        hosts[kind] = Host(kind, kind, latency, per_stream, str(e.get("display", kind)))
    return hosts


@cache
def load_calibration(path: Path = CALIBRATION_PATH) -> Calibration:
    """The calibration file, parsed once per process."""
    return parse_calibration(yaml.safe_load(path.read_text()))


def with_device(cal: Calibration, hardware: Hardware, device: DeviceConstants) -> Calibration:
    """`cal` with the GPU's efficiencies, the step overheads, and where fitted the attention
    efficiency, speculation's step cost and the per-sequence overhead, replaced by the
    constants fitted on that device itself (labs.parameters.device_calibration). Only the run priced
    for that device gets this Calibration; every other run keeps `cal`."""
    own = cal.gpu(hardware)
    gpu = replace(
        own,
        gemm_half_tokens=(
            own.gemm_half_tokens if device.gemm_half_tokens is None else device.gemm_half_tokens
        ),
        bandwidth_efficiency=device.bandwidth_efficiency,
        kv_bandwidth_efficiency=device.kv_bandwidth_efficiency,
        gemm_efficiency=device.gemm_efficiency,
        decode_step_overhead_s=device.decode_step_overhead_s,
        calibrated=True,
    )
    spec, attention = device.spec_step_overhead_s, device.attention_efficiency
    per_seq = device.per_seq_overhead_s
    return replace(
        cal,
        gpus={**cal.gpus, hardware.name: gpu},
        decode_step_overhead_s=device.decode_step_overhead_s,
        mixed_step_overhead_s=device.mixed_step_overhead_s,
        spec_step_overhead_s=cal.spec_step_overhead_s if spec is None else spec,
        attention_efficiency=cal.attention_efficiency if attention is None else attention,
        per_seq_overhead_s=cal.per_seq_overhead_s if per_seq is None else per_seq,
    )


def gpu_display_name(hardware: Hardware) -> str:
    """ "H100 SXM" for a catalog GPU, "a CPU vLLM worker" for gpu cpu, "a custom GPU"
    otherwise."""
    if hardware.name == CPU_KIND:
        return "a CPU vLLM worker"
    found = load_calibration().gpus.get(hardware.name)
    return found.display if found is not None else "a custom GPU"


def where_label(hardware: Hardware, profile: str, device: DeviceConstants | None = None) -> str:
    """What every simulated number is labelled with: where it ran and on which profile, and
    whose constants priced it (the device's own calibration when `device` is given)."""
    name = gpu_display_name(hardware)
    if profile == "ideal":
        return f"simulated on CPU as {name}, ideal hardware (roofline, no overheads)"
    if device is not None:
        return f"simulated on CPU as {name} ({device.label()})"
    return f"simulated on CPU as {name} ({calibration_evidence(hardware)})"


def calibration_evidence(hardware: Hardware) -> str:
    """What this GPU kind's own published evidence is: "calibrated to 1 published vLLM run,
    checked against 1 more", or "not calibrated: ..." for a GPU without a V1 run of its own."""
    calibration = load_calibration()
    fitted, held_out = calibration.gpu_runs.get(hardware.name, (0, 0))
    if hardware.name == CPU_KIND:
        # A CPU is calibrated only by its own sweep (labs/parameters/device_calibration.py), stored
        # under its model and cores, which the online CPU worker announces.
        return (
            "not calibrated: this CPU has no calibration of its own; a CPU vLLM worker"
            " calibrates itself when it first starts, and runs find it while that worker is"
            " online; efficiencies assumed"
        )
    gpu = calibration.gpu(hardware)
    if not gpu.calibrated or not fitted:
        lender = calibration.gpus.get(gpu.borrows_from)
        source = lender.display if lender is not None else "between the A100's and the H100's"
        return (
            "not calibrated: no published vLLM V1 run of this GPU;"
            f" efficiencies borrowed from {source}"
        )
    runs = "run" if fitted == 1 else "runs"
    return f"calibrated to {fitted} published vLLM {runs}, checked against {held_out} more"


def short_where_label(where: str) -> str:
    """The badge for a stored `where_label`: "simulated · H100 SXM · calibrated". The long form
    stays on the run's record (it is the provenance, shown on demand); a label this module did
    not write (a vLLM engine, the worker's "simulated on CPU") is short already and kept."""
    found = _WHERE_FORM.fullmatch(where)
    if found is None:
        return where
    detail = found["detail"]
    if detail.startswith("ideal"):
        kind = "ideal hardware"
    elif detail.startswith("(not calibrated"):
        kind = "not calibrated"
    else:
        kind = "calibrated"
    return f"simulated · {found['gpu']} · {kind}"


_WHERE_FORM = re.compile(r"simulated on CPU as (?P<gpu>.+?),? (?P<detail>ideal hardware .*|\(.*\))")


# -- the terms, one function each -----------------------------------------------------------------


def memory_read_s(
    num_bytes: np.ndarray | float,
    bandwidth_bytes_per_s: float,
    efficiency: float,
    num_reads: int = 0,
    read_latency_s: float = 0.0,
) -> np.ndarray | float:
    """Time to read `num_bytes` in `num_reads` kernels: streaming at `efficiency` of peak, plus
    a fixed latency per kernel (launch, ramp-up and tail), which is why small reads fall short."""
    return num_bytes / (bandwidth_bytes_per_s * efficiency) + num_reads * read_latency_s


def lm_head_params(model: ModelSpec) -> float:
    """Weights of the LM head (vocabulary x hidden). vLLM's model runner gathers the hidden
    states of the positions it samples (each sequence's last scheduled token, and every draft
    it verifies) before the LM head, so the head's FLOPs scale with those, not with the step's
    tokens. 0 when the vocabulary is unknown (a custom model): all its weights count per token."""
    return float(model.vocab_size * model.hidden_size) if model.vocab_size else 0.0


def embedding_table_params(model: ModelSpec) -> float:
    """Weights of the input embedding's own table: a lookup, no FLOPs, and only the rows of the
    step's tokens are read. 0 when tied to the LM head (which reads the table whole anyway)."""
    return 0.0 if model.tied_embeddings else lm_head_params(model)


def layer_params(model: ModelSpec) -> float:
    """Weights every token is multiplied through: the active ones less the vocabulary tables."""
    return model.active_params - lm_head_params(model) - embedding_table_params(model)


def vocab_weight_bytes_read(model: ModelSpec, weight_dtype: str, num_tokens: int) -> float:
    """labs.prediction.predict.weight_bytes_read with the embedding table read as a lookup: the
    rows of the step's tokens instead of the whole table."""
    table = embedding_table_params(model)
    rows = min(max(num_tokens, 1), model.vocab_size or 0) * model.hidden_size if table else 0
    unread = (table - rows) * WEIGHT_DTYPE_BYTES[weight_dtype]
    return weight_bytes_read(model, weight_dtype, num_tokens) - unread


def linear_s(hardware: Hardware, gemm_s: float, weight_read_s: float) -> float:
    """The linear layers' time from their math and their weight reads. A GPU keeps thousands of
    warps in flight, so reads hide under math or math under reads: the slower sets the time. A
    CPU worker's engine runs one thread per core, whose loads and multiply-adds share one
    instruction stream: they add up (on one core, eight rows of lab-llama-20m's LM head take
    markedly longer than one, where the roofline says equal)."""
    if hardware.name == CPU_KIND:
        return gemm_s + weight_read_s
    return max(gemm_s, weight_read_s)


def gemm_efficiency(gpu: GpuConstants, num_tokens: np.ndarray | float) -> np.ndarray | float:
    """Fraction of peak FLOP/s a step's GEMMs reach with `num_tokens` rows: a few tokens leave
    the tensor cores idle, a long prefill approaches the GPU's ceiling (half of it at
    `gemm_half_tokens`)."""
    n = np.maximum(num_tokens, 1)
    return gpu.gemm_efficiency * n / (n + gpu.gemm_half_tokens)


def attention_flops(model: ModelSpec, token_pairs: np.ndarray | float) -> np.ndarray | float:
    """Attention FLOPs for `token_pairs` (query, key) pairs: QK^T and PV, 2 FLOPs per multiply-add
    over heads x head_dim, in every layer. A prefill chunk of n tokens after c cached ones has
    n x c + n (n + 1) / 2 pairs, so it grows with the square of the prompt."""
    return 4 * model.layers * model.heads * model.head_dim * token_pairs


def token_pairs(out: SchedulerOutput) -> float:
    """(query, key) pairs the step's attention computes: each new token attends to the tokens
    before it (cached or earlier in its chunk) and itself."""
    new = out.num_scheduled_tokens.astype(np.float64)
    before = out.num_computed_before.astype(np.float64)
    return float((new * before + new * (new + 1) / 2).sum())


def step_overhead_s(
    cal: Calibration, decode_only: bool, num_seqs: int, gpu: GpuConstants | None = None
) -> float:
    """Fixed CPU and launch time of a step: scheduling, input preparation, sampling and output
    processing. A decode-only step replays a CUDA graph (cheaper) while a step with prefill
    tokens launches its kernels one by one; each sequence adds its share of bookkeeping.
    `gpu` may carry its own decode-step constant (fitted where its runs pin it down)."""
    fixed = cal.decode_step_overhead_s if decode_only else cal.mixed_step_overhead_s
    if decode_only and gpu is not None and gpu.decode_step_overhead_s is not None:
        fixed = gpu.decode_step_overhead_s
    return fixed + cal.per_seq_overhead_s * num_seqs


# vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py and
# csrc/custom_all_reduce.cuh): the world sizes it supports, the largest message it takes (its
# default buffer; anything this size or larger goes to NCCL), and where its kernel switches from
# one stage (every GPU reads every peer's whole buffer) to two (reduce-scatter, then all-gather).
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
ONE_STAGE_MAX_BYTES = {4: 512 * 1024, 8: 256 * 1024}  # world size at most the key


def allreduce_algorithm(tp: int, link: str, num_bytes: float) -> str:
    """How vLLM reduces a message of `num_bytes` over `tp` GPUs joined by `link`: "one-stage"
    or "two-stage" (its custom all-reduce), or "nccl". The custom kernel needs a supported world
    size and a message under its buffer; over PCIe it runs only on two GPUs (beyond two, GPUs
    that are not fully connected by NVLink go to NCCL)."""
    if tp not in CUSTOM_AR_WORLD_SIZES or num_bytes >= CUSTOM_AR_MAX_BYTES:
        return "nccl"
    if tp == 2:
        return "one-stage"
    if link != "nvlink":
        return "nccl"
    small = (tp <= 4 and num_bytes < ONE_STAGE_MAX_BYTES[4]) or num_bytes < ONE_STAGE_MAX_BYTES[8]
    return "one-stage" if small else "two-stage"


def allreduce_s(cal: Calibration, gpu: GpuConstants, tp: int, num_bytes: float) -> float:
    """Seconds of one all-reduce of `num_bytes` over `tp` GPUs, as vLLM performs it: a fixed
    latency (a kernel replayed in the CUDA graph and its flag handshakes over the link, or NCCL's
    protocol) plus the bytes each GPU receives over its link at the all-reduce's share of the
    link's bandwidth. One stage: each GPU reads the whole message from each of its tp - 1
    peers. Two stages and NCCL's ring: 2 (tp - 1) / tp of the message each way; two stages pay
    the custom kernel's handshake twice."""
    if tp <= 1:
        return 0.0
    ar = cal.allreduce
    link = gpu.link if gpu.link in ar.custom_latency_s else "pcie"
    rate = gpu.link_bytes_per_s * ar.bandwidth_efficiency
    algorithm = allreduce_algorithm(tp, link, num_bytes)
    if algorithm == "one-stage":
        return ar.custom_latency_s[link] + (tp - 1) * num_bytes / rate
    moved = 2 * (tp - 1) / tp * num_bytes / rate
    if algorithm == "two-stage":
        return 2 * ar.custom_latency_s[link] + moved
    return ar.nccl_latency_s[link] + moved


def tp_communication_s(
    cal: Calibration, gpu: GpuConstants, model: ModelSpec, tp: int, num_tokens: float
) -> float:
    """Tensor-parallel all-reduces of one step of `num_tokens` tokens: two per layer (after
    attention's output projection and after the MLP), each of the step's activations (tokens x
    hidden x 2 bytes), priced by `allreduce_s`. A decode step's messages are kilobytes, so the
    latency dominates and barely grows with tp; a long prefill's go to NCCL and its bytes."""
    if tp <= 1:
        return 0.0
    num_bytes = float(num_tokens) * model.hidden_size * ACTIVATION_BYTES
    return 2 * model.layers * allreduce_s(cal, gpu, tp, num_bytes)


def dequant_overhead(cal: Calibration, hardware: Hardware, weight_dtype: str) -> float:
    """Extra linear-layer time for weights stored narrower than the math: int8/int4 always, FP8
    on a GPU without FP8 tensor cores (A100), where kernels dequantise on the fly."""
    if weight_dtype == "fp8" and hardware.fp8_flops_per_s is not None:
        return 0.0
    return cal.dequant_overhead.get(weight_dtype, 0.0)


# -- the model ------------------------------------------------------------------------------------


def _maximum(a: Any, b: Any) -> Any:
    """np.maximum for arrays, the builtin for two floats (the same value, 20x cheaper)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def parts_total(parts: tuple[float, ...]) -> float:
    """A step's seconds from its parts, added left to right as `np.sum` adds five of them (so a
    tuple and an array of the same parts give the same float)."""
    total = 0.0
    for value in parts:
        total += value
    return total


@dataclass(frozen=True)
class _TokenTerms:
    """What a step's price takes from its token count alone (computed once per count)."""

    peak_compute_s: float  # the step's linear FLOPs at peak FLOP/s
    knob_compute_s: float  # the same at the lab's compute efficiency
    weight_bytes: float
    linear_s: float  # realistic linear layers (GEMMs or weight reads, with dequantisation)
    communication_s: float


class EngineModel:
    """Prices steps from their composition on one profile.

    Args:
        hardware: one GPU of the replica.
        model: the model served.
        engine: dtypes, tp, speculation; on the ideal profile also the lab's efficiencies and
            fixed overhead (the predictor's knobs).
        profile: "realistic" or "ideal".
        calibration: the constants (default: labs/sim/calibration.yaml).
    """

    def __init__(
        self,
        hardware: Hardware,
        model: ModelSpec,
        engine: EngineConfig,
        profile: str = "realistic",
        calibration: Calibration | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile}")
        self.hardware, self.model, self.engine, self.profile = hardware, model, engine, profile
        self.cal = calibration or load_calibration()
        self.gpu = self.cal.gpu(hardware)
        # The roofline at peak, with no overhead: the "ideal" part of every step.
        self._peak = replace(
            engine, compute_efficiency=1.0, bandwidth_efficiency=1.0, step_overhead_s=0.0
        )
        self._kv_bytes = kv_bytes_per_token(model, engine.kv_dtype) * kv_replication(
            model, engine.tp
        )
        # NOTE: everything below depends only on (hardware, model, engine, calibration); a step
        # is priced thousands of times per run, so these are worked out once here.
        self._memory_rate = {
            False: memory_rate(hardware, self._peak),
            True: memory_rate(hardware, engine),
        }
        self._bandwidth = hardware.bandwidth_bytes_per_s * engine.tp
        self._attention_rate = hardware.bf16_flops_per_s * engine.tp * self.cal.attention_efficiency
        self._token_terms: dict[tuple[int, int], _TokenTerms] = {}

    def _terms(self, num_tokens: int, num_logits: int) -> _TokenTerms:
        """The token-count terms of a step of `num_tokens` tokens sampled at `num_logits`
        positions (cached per pair)."""
        key = (num_tokens, num_logits)
        found = self._token_terms.get(key)
        if found is not None:
            return found
        hw, model, engine, gpu, cal = self.hardware, self.model, self.engine, self.gpu, self.cal
        if self.profile == "ideal":
            # The predictor's own count: every weight read and multiplied per token.
            weights = weight_bytes_read(model, engine.weight_dtype, int(num_tokens))
            flops = 2 * model.active_params * num_tokens
        else:
            weights = vocab_weight_bytes_read(model, engine.weight_dtype, int(num_tokens))
            flops = 2 * (layer_params(model) * num_tokens + lm_head_params(model) * num_logits)
        # The LM head's GEMM has one row per sampled position, the layers' one per token: each
        # at the efficiency of its own row count.
        gemm = (
            2 * layer_params(model) * num_tokens / gemm_efficiency(gpu, num_tokens)
            + 2 * lm_head_params(model) * num_logits / gemm_efficiency(gpu, num_logits)
        ) / compute_rate(hw, self._peak)
        reads = model.layers * cal.kernels_per_layer
        weight_read = memory_read_s(
            weights, self._bandwidth, gpu.bandwidth_efficiency, reads, cal.kernel_latency_s
        )
        linear = linear_s(hw, float(gemm), float(weight_read)) * (  # one step: scalars
            1 + dequant_overhead(cal, hw, engine.weight_dtype)
        )
        terms = _TokenTerms(
            peak_compute_s=flops / compute_rate(hw, self._peak),
            knob_compute_s=flops / compute_rate(hw, engine),
            weight_bytes=weights,
            linear_s=float(linear),
            communication_s=float(tp_communication_s(cal, gpu, model, engine.tp, num_tokens)),
        )
        self._token_terms[key] = terms
        return terms

    # NOTE: every method below takes per-step arrays (kv, spec_kv) and treats the rest of `out`
    # as fixed, so that `steps_time_s(out, [out.kv_tokens_read], [out.spec_kv_tokens_read])[0]`
    # is exactly `step_time_s(out)`. They also take plain floats for kv (one step, priced from
    # its totals by `composition_parts_s`), and give the same value either way.

    def _roofline_s(
        self, knobs: bool, num_tokens: int, num_logits: int, kv: Any, overhead: bool = True
    ) -> Any:
        """labs.prediction.predict.step_time_s, vectorised over the steps' KV reads: at peak with no
        overhead (`knobs` False, the "ideal" part) or with the lab's efficiencies."""
        terms = self._terms(num_tokens, num_logits)
        compute = terms.knob_compute_s if knobs else terms.peak_compute_s
        memory = (terms.weight_bytes + kv * self._kv_bytes) / self._memory_rate[knobs]
        extra = self.engine.step_overhead_s if knobs and overhead else 0.0
        return _maximum(compute, memory) + extra

    def _seq_s(self, num_seqs: int) -> float:
        """The ideal profile's per-sequence cost: the lab's `seq_overhead_s` (0 unless a device
        calibration set it), as labs.prediction.predict.step_time_s charges it."""
        return self.engine.seq_overhead_s * num_seqs

    def _kernels_s(self, num_tokens: int, num_logits: int, kv: Any, pairs: Any) -> Any:
        """Realistic GPU time of the step's kernels: linear layers + attention."""
        # Attention math runs in 16 bits (BF16 tensor cores) whatever the weights are.
        attn_flops = attention_flops(self.model, pairs) / self._attention_rate
        kv_read = memory_read_s(
            kv * self._kv_bytes, self._bandwidth, self.gpu.kv_bandwidth_efficiency
        )
        return self._terms(num_tokens, num_logits).linear_s + _maximum(attn_flops, kv_read)

    def _pairs(self, out: SchedulerOutput, kv: np.ndarray) -> np.ndarray:
        # Every scheduled token attends to its sequence's KV, so pairs grow with the KV read by
        # the tokens per sequence (1 for a plain decode, 1 + k when verifying drafts).
        per_seq = out.total_num_scheduled_tokens / max(len(out.req_indices), 1)
        return token_pairs(out) + (kv - out.kv_tokens_read) * per_seq

    def _decode_step_s(self, num_seqs: int, kv: np.ndarray) -> np.ndarray:
        """A plain decode step of `num_seqs` sequences (a draft pass is c times this)."""
        if self.profile == "ideal":
            return self._roofline_s(True, num_seqs, num_seqs, kv) + self._seq_s(num_seqs)
        pairs = kv + num_seqs
        return (
            self._kernels_s(num_seqs, num_seqs, kv, pairs)
            + step_overhead_s(self.cal, True, num_seqs, self.gpu)
            + self._terms(num_seqs, num_seqs).communication_s
        )

    def steps_parts_s(
        self, out: SchedulerOutput, kv_tokens_read: ArrayLike, spec_kv_tokens_read: ArrayLike
    ) -> np.ndarray:
        """Parts (columns PARTS) of len(kv_tokens_read) steps composed like `out` except for
        their KV totals. Rows sum to each step's time; every part is >= 0.

        Returns:
            Array (steps, len(PARTS)) in seconds.
        """
        kv = np.asarray(kv_tokens_read, dtype=np.float64)
        spec_kv = np.asarray(spec_kv_tokens_read, dtype=np.float64)
        n_tokens = out.total_num_scheduled_tokens
        drafts = int(out.num_draft_tokens.sum())
        parts = np.zeros((len(kv), len(PARTS)))
        # The LM head runs once per sequence (its last scheduled token) and at each draft.
        num_seqs = len(out.req_indices)
        logits = num_seqs + drafts
        base_ideal = self._roofline_s(False, n_tokens - drafts, num_seqs, kv)
        full_ideal = self._roofline_s(False, n_tokens, logits, kv)
        parts[:, IDEAL] = base_ideal
        draft_s = np.zeros_like(kv)
        if out.max_num_draft_tokens and self.engine.draft_cost:
            plain = self._decode_step_s(out.num_spec_seqs, spec_kv)
            draft_s = out.max_num_draft_tokens * self.engine.draft_cost * plain
        if self._spec_overhead(out):
            # Drafting costs the engine's CPU beyond any draft model: the ngram proposer
            # searches the sequences' tokens after every step (c = 0 leaves it out), whether or
            # not it finds a draft, and the rejection sampler checks the drafts. On a CPU worker
            # that CPU is the device. Priced only in steps with drafts, it would make batch-1
            # ngram fast, since vLLM's proposer searches after every step.
            draft_s = draft_s + self.cal.spec_step_overhead_s
        parts[:, SPECULATION] = np.maximum(full_ideal - base_ideal, 0) + draft_s
        if self.profile == "ideal":
            with_knobs = self._roofline_s(True, n_tokens, logits, kv, overhead=False)
            parts[:, EFFICIENCY] = np.maximum(with_knobs - full_ideal, 0)
            parts[:, OVERHEAD] = self.engine.step_overhead_s + self._seq_s(num_seqs)
            return parts
        kernels = self._kernels_s(n_tokens, logits, kv, self._pairs(out, kv))
        parts[:, EFFICIENCY] = np.maximum(kernels - full_ideal, 0)
        parts[:, OVERHEAD] = step_overhead_s(
            self.cal, out.num_prefill_tokens == 0, num_seqs, self.gpu
        )
        parts[:, COMMUNICATION] = self._terms(n_tokens, logits).communication_s
        return parts

    def composition_parts_s(
        self, num_tokens: int, num_prefill_tokens: int, num_seqs: int, kv: int, pairs: int
    ) -> tuple[float, float, float, float, float]:
        """Parts (PARTS order) of one step without drafts, from its totals: tokens, prefill
        tokens, sequences, KV read and attention pairs (`token_pairs`). The same floats as
        `steps_parts_s` gives that step, in plain Python (a step's arrays are small, and numpy's
        per-call cost would dominate)."""
        kv_f, pairs_f = float(kv), float(pairs)
        ideal = self._roofline_s(False, num_tokens, num_seqs, kv_f)
        if self.profile == "ideal":
            with_knobs = self._roofline_s(True, num_tokens, num_seqs, kv_f, overhead=False)
            overhead = self.engine.step_overhead_s + self._seq_s(num_seqs)
            return (ideal, max(with_knobs - ideal, 0.0), overhead, 0.0, 0.0)
        kernels = self._kernels_s(num_tokens, num_seqs, kv_f, pairs_f)
        return (
            ideal,
            max(kernels - ideal, 0.0),
            step_overhead_s(self.cal, num_prefill_tokens == 0, num_seqs, self.gpu),
            self._terms(num_tokens, num_seqs).communication_s,
            0.0,
        )

    def composition_share_s(
        self, step_s: float, num_decode_tokens: int, num_alone: int, kv_alone: int
    ) -> float:
        """`prefill_share_s` of a step without drafts that took `step_s`, from the totals of
        its decoding sequences (each schedules one token): how many, and their KV read."""
        alone = self.composition_parts_s(
            num_decode_tokens, 0, num_alone, kv_alone, kv_alone + num_alone
        )
        return max(0.0, step_s - parts_total(alone))

    def steps_time_s(
        self, out: SchedulerOutput, kv_tokens_read: ArrayLike, spec_kv_tokens_read: ArrayLike
    ) -> np.ndarray:
        """Seconds of len(kv_tokens_read) steps composed like `out` except for their KV totals."""
        return self.steps_parts_s(out, kv_tokens_read, spec_kv_tokens_read).sum(axis=1)

    def _spec_overhead(self, out: SchedulerOutput) -> bool:
        """Whether the step pays speculation's fixed CPU time: on the realistic profile, every
        step of an engine that speculates, and any step with drafts."""
        return self.profile == "realistic" and bool(
            out.max_num_draft_tokens or self.engine.spec_tokens
        )

    def step_parts_s(self, out: SchedulerOutput) -> np.ndarray:
        """The parts of the one step `out`."""
        plain = not out.max_num_draft_tokens and not out.num_draft_tokens.any()
        if plain and not self._spec_overhead(out):
            parts = self.composition_parts_s(
                out.total_num_scheduled_tokens,
                out.num_prefill_tokens,
                len(out.req_indices),
                out.kv_tokens_read,
                token_pairs(out),  # type: ignore[arg-type]
            )
            return np.array(parts)
        return self.steps_parts_s(out, [out.kv_tokens_read], [out.spec_kv_tokens_read])[0]

    def step_time_s(self, out: SchedulerOutput) -> float:
        """Seconds the step `out` takes."""
        return float(self.step_parts_s(out).sum())

    def prefill_share_s(self, out: SchedulerOutput) -> float:
        """How much of the step's time its prefill tokens cost: the step minus the same step
        with only its decode tokens (0 for a decode-only or prefill-only step). A decoding
        request in this step waits that long because others' prompts share it."""
        if out.num_prefill_tokens == 0 or out.num_decode_tokens == 0:
            return 0.0
        decoding = out.num_computed_before > 0
        decoding &= out.num_scheduled_tokens <= 1 + out.num_draft_tokens
        plain = not out.max_num_draft_tokens and not out.num_draft_tokens.any()
        if plain and not self._spec_overhead(out):
            # Each decoding sequence schedules exactly one token: its totals are enough.
            return self.composition_share_s(
                self.step_time_s(out),
                out.num_decode_tokens,
                int(decoding.sum()),
                int(out.num_computed_before[decoding].sum()),
            )
        alone = SchedulerOutput(
            req_indices=out.req_indices[decoding],
            num_scheduled_tokens=out.num_scheduled_tokens[decoding],
            num_draft_tokens=out.num_draft_tokens[decoding],
            num_computed_before=out.num_computed_before[decoding],
            num_prefill_tokens=0,
            num_decode_tokens=out.num_decode_tokens,
            kv_tokens_read=int(out.num_computed_before[decoding].sum()),
            num_spec_seqs=out.num_spec_seqs,
            spec_kv_tokens_read=out.spec_kv_tokens_read,
            max_num_draft_tokens=out.max_num_draft_tokens,
        )
        return max(0.0, self.step_time_s(out) - self.step_time_s(alone))
