"""`lab serve-args` prints, for every lab preset, a `vllm serve` command vLLM 0.33 accepts."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from labs.backends.vllm.server import MODELS_DIR
from labs.parameters.params import align_run_batch
from labs.parameters.presets import LABS, lab_initial, load_presets

# Every flag the backend may pass, with where vLLM 0.33 defines it. "notes §1" is vLLM 0.33's
# `vllm serve` reference (its engine-arguments table and example server command); the file in
# brackets is the vLLM source file (under vllm/) that defines the flag. Value-less flags map to
# None.
VLLM_033_FLAGS: dict[str, str] = {
    "--served-model-name": "notes §1 example server",
    "--load-format": "notes §1 table: --load-format dummy (config/load.py)",
    "--skip-tokenizer-init": "notes §1 table (config/model.py)",
    "--seed": "notes §1 example server",
    "--max-model-len": "notes §1 table (config/model.py)",
    "--block-size": "notes §1 table (config/cache.py)",
    "--max-num-seqs": "notes §1 table (config/scheduler.py)",
    "--max-num-batched-tokens": "notes §1 table (config/scheduler.py)",
    "--enable-chunked-prefill": "notes §1 table; BooleanOptionalAction",
    "--no-enable-chunked-prefill": "notes §1 table; BooleanOptionalAction",
    "--enable-prefix-caching": "notes §1 table; BooleanOptionalAction",
    "--no-enable-prefix-caching": "notes §1 table; BooleanOptionalAction",
    "--kv-cache-dtype": "notes §1 table (CacheDType: auto, fp8, ...)",
    "--gpu-memory-utilization": "notes §1 table",
    "--kv-cache-memory-bytes": "notes §1 table",
    "--speculative-config": "notes §1 table and speculative_config keys",
    "--host": "notes §1 example server",
    "--port": "notes §1 example server",
    "--enable-prompt-tokens-details": "entrypoints/common/cli_args.py BaseFrontendArgs",
    "--tensor-parallel-size": "engine/arg_utils.py EngineArgs (ParallelConfig)",
    "--dtype": "engine/arg_utils.py EngineArgs (ModelConfig.dtype)",
    "--quantization": "engine/arg_utils.py EngineArgs (ModelConfig.quantization)",
}
TAKES_VALUE = {
    "--served-model-name", "--load-format", "--seed", "--max-model-len", "--block-size",
    "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype",
    "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--speculative-config", "--host",
    "--port", "--tensor-parallel-size", "--dtype", "--quantization",
}  # fmt: skip
ALLOWED_VALUES = {
    "--load-format": {"dummy", "auto"},
    "--kv-cache-dtype": {"auto", "fp8"},
    "--dtype": {"float16"},
    "--quantization": {"fp8"},
    "--block-size": {"16", "32", "64", "128", "256"},  # CUDA kernels: multiples of 16
}
SPEC_KEYS = {  # notes §1: speculative_config keys
    "method", "model", "num_speculative_tokens", "rejection_sample_method",
    "synthetic_acceptance_rates",
}  # fmt: skip
# Presets vLLM cannot run, and the field that says so (only the simulator has these).
SIM_ONLY = {"kv_allocation"}


def serve_args(**options: Any) -> list[str]:
    out = io.StringIO()
    call_command("lab", "serve-args", "--json", stdout=out, **options)
    return json.loads(out.getvalue())


def check_flags(argv: list[str]) -> None:
    assert argv[:3] == ["vllm", "serve", argv[2]] and Path(argv[2]).is_dir()
    rest = argv[3:]
    i = 0
    while i < len(rest):
        flag = rest[i]
        assert flag in VLLM_033_FLAGS, f"{flag} is not a vLLM 0.33 flag we know"
        if flag in TAKES_VALUE:
            value = rest[i + 1]
            assert not value.startswith("--"), f"{flag} has no value"
            if flag in ALLOWED_VALUES:
                assert value in ALLOWED_VALUES[flag], f"{flag} {value}"
            if flag == "--speculative-config":
                spec = json.loads(value)
                assert set(spec) <= SPEC_KEYS
                assert spec["rejection_sample_method"] == "synthetic"
                # vLLM's SpeculativeConfig: length k, each in [0, 1], non-increasing.
                rates = spec["synthetic_acceptance_rates"]
                assert len(rates) == spec["num_speculative_tokens"]
                assert all(0 <= r <= 1 for r in rates)
                assert rates == sorted(rates, reverse=True)
            i += 2
        else:
            i += 1
    flags = [a for a in rest if a.startswith("--")]
    assert len(flags) == len(set(flags)), "a flag appears twice"
    assert flags.count("--enable-chunked-prefill") + flags.count("--no-enable-chunked-prefill") == 1


def preset_cases() -> list[Any]:
    presets = load_presets()
    assert presets, "content/labs/presets.yaml has no presets"
    return [pytest.param(slug, id=slug) for slug in sorted(presets)]


@pytest.mark.parametrize("slug", preset_cases())
def test_every_preset_gets_flags_vllm_033_accepts(slug: str) -> None:
    preset = load_presets()[slug]
    values = align_run_batch(lab_initial(LABS[preset.lab], preset))
    options = {k: str(v) for k, v in values.items() if v is not None}
    try:
        argv = serve_args(**options)
    except CommandError as error:
        field = str(error).split(":")[0].lstrip("-").replace("-", "_")
        assert field in SIM_ONLY, f"{slug}: {error}"
        return
    check_flags(argv)


def test_speculation_and_a_fixed_kv_pool_use_only_known_flags() -> None:
    argv = serve_args(
        model="llama-3.1-70b",
        tp="4",
        weight_dtype="fp8",
        kv_dtype="fp8",
        spec_tokens="4",
        acceptance="0.8",
        kv_capacity_tokens="500000",
        chunked_prefill=False,
        max_num_batched_tokens="8192",
        prompt_tokens="2000",
    )
    check_flags(argv)
    assert argv[2] == str(MODELS_DIR / "llama-3.1-70b")
    assert "--no-enable-chunked-prefill" in argv and "--kv-cache-memory-bytes" in argv


def test_the_command_line_form_runs_nothing_and_is_one_shell_line() -> None:
    out = subprocess.run(
        [sys.executable, "manage.py", "lab", "serve-args", "--block-size", "64", "--port", "9000"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    ).stdout
    argv = shlex.split(out)
    assert argv[:2] == ["vllm", "serve"] and argv[-2:] == ["--port", "9000"]
    assert argv[argv.index("--block-size") + 1] == "64"


def test_a_setting_vllm_cannot_run_is_one_line_naming_it() -> None:
    with pytest.raises(CommandError, match="--block-size: block_size must be a multiple of 16"):
        serve_args(block_size="8")
