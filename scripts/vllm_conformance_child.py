"""Run inside a venv holding vLLM 0.33.0's wheel (scripts/check_vllm_conformance.py builds it):
judge each case's `vllm serve` arguments with vLLM's own code, on CPU.

    python vllm_conformance_child.py cases.json  ->  one JSON verdict per case on stdout

Per case: vLLM's `serve` parser and validate_parsed_serve_args, AsyncEngineArgs.from_cli_args,
create_engine_config() (ModelConfig, CacheConfig, ParallelConfig, SpeculativeConfig,
SchedulerConfig and their cross-checks), the world size against the worker's GPUs, and
check_enough_kv_cache_memory (v1/core/kv_cache_planning.py) over FullAttentionSpecs built from
vLLM's own model config (KV heads per GPU, head size, layers, the draft's layers). vLLM's CUDA
platform cannot be imported without CUDA, so a stand-in subclass of its CudaPlatformBase answers
the device queries (capability 9.0, the case's memory and GPU count) and its native extension
modules are empty placeholders. What needs a GPU cannot be run: the memory vLLM's profiler
measures (weights, activations, CUDA context) comes in from the case as `non_kv_bytes`, the
project's model of it, and is labelled so in the output.
"""

from __future__ import annotations

import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
for _name in (
    "vllm._C_stable_libtorch",
    "vllm._C",
    "vllm._qutlass_C",
    "vllm.vllm_flash_attn._vllm_fa2_C",
    "vllm.vllm_flash_attn._vllm_fa3_C",
):
    sys.modules.setdefault(_name, types.ModuleType(_name))

import torch  # noqa: E402
import vllm.platforms  # noqa: E402

# Model inspection asks the (absent) CUTLASS extension what it supports.
for _op in (
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_group_gemm_supported",
):
    setattr(torch.ops._C, _op, lambda *a, **k: True)

from vllm.platforms.cuda import CudaPlatformBase  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402

GPU = {"memory": 80 * 1024**3, "count": 8}


class StandInCuda(CudaPlatformBase):
    """vLLM's CUDA platform, answering device queries without a GPU."""

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(9, 0)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "stand-in GPU"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return GPU["memory"]

    @classmethod
    def device_count(cls) -> int:
        return GPU["count"]

    @classmethod
    def is_fully_connected(cls, device_ids: list[int]) -> bool:
        return True

    @classmethod
    def get_cuda_runtime_major(cls) -> int:
        return 13


vllm.platforms._current_platform = StandInCuda()

from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.common.cli_args import (  # noqa: E402
    make_arg_parser,
    validate_parsed_serve_args,
)
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype  # noqa: E402
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # noqa: E402
from vllm.v1.core.kv_cache_planning import check_enough_kv_cache_memory  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

PARSER = make_arg_parser(FlexibleArgumentParser())


def _kv_specs(config) -> dict[str, FullAttentionSpec]:
    model, parallel, cache = config.model_config, config.parallel_config, config.cache_config
    dtype = kv_cache_dtype_str_to_dtype(cache.cache_dtype, model)
    specs = {}
    configs = [("target", model, parallel)]
    spec = config.speculative_config
    # ngram keeps a draft_model_config (the target's) but runs no draft model and has no KV.
    if spec is not None and spec.method == "draft_model" and spec.draft_model_config is not None:
        configs.append(("draft", spec.draft_model_config, spec.draft_parallel_config))
    for name, m, p in configs:
        for layer in range(m.get_num_layers(p)):
            specs[f"{name}.{layer}"] = FullAttentionSpec(
                block_size=cache.block_size,
                num_kv_heads=m.get_num_kv_heads(p),
                head_size=m.get_head_size(),
                dtype=dtype,
            )
    return specs


def judge(case: dict) -> dict:
    GPU.update(memory=case["gpu_memory"], count=case["gpus"])
    argv = case["argv"]
    try:
        args = PARSER.parse_args(argv[1:])  # without "serve"
        args.model = args.model_tag or args.model
        validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        config = engine_args.create_engine_config()
    except (Exception, SystemExit) as exc:
        return {"accepted": False, "rule": "config", "reason": f"{type(exc).__name__}: {exc}"}
    world = config.parallel_config.world_size
    if world > GPU["count"]:
        return {
            "accepted": False,
            "rule": "world size",
            "reason": f"World size ({world}) is larger than the number of available GPUs "
            f"({GPU['count']})",
        }
    gmu = config.cache_config.gpu_memory_utilization
    free = GPU["memory"] - case["context_bytes"]
    if gmu * GPU["memory"] > free:
        return {
            "accepted": False,
            "rule": "free memory at start (project's CUDA context size)",
            "reason": f"free {free} < gpu_memory_utilization {gmu} x total {GPU['memory']}",
        }
    fixed = config.cache_config.kv_cache_memory_bytes
    available = fixed if fixed is not None else int(gmu * GPU["memory"]) - case["non_kv_bytes"]
    if fixed is not None and fixed + case["non_kv_bytes"] > GPU["memory"]:
        return {
            "accepted": False,
            "rule": "out of memory (project's model of non-KV memory)",
            "reason": f"KV {fixed} + non-KV {case['non_kv_bytes']} > {GPU['memory']}",
        }
    specs = _kv_specs(config)
    # The engine core resolves the layout from what the attention backends report; FlashAttention
    # on CUDA reports NHD (LBNHC) first. The layout does not change a full-attention page size.
    resolve_kv_cache_layout(config, [["NHD"]], specs.values())
    try:
        check_enough_kv_cache_memory(config, specs, available)
    except ValueError as exc:
        return {"accepted": False, "rule": "KV cache", "reason": str(exc)}
    return {"accepted": True}


def main() -> None:
    with open(sys.argv[1]) as handle:
        cases = json.load(handle)
    for case in cases:
        print(json.dumps({"id": case["id"], **judge(case)}), flush=True)


if __name__ == "__main__":
    main()
