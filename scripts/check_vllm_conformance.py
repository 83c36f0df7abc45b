"""Does the project refuse exactly what vLLM 0.33 refuses at start? Optional; needs no GPU.

    .venv/bin/python scripts/check_vllm_conformance.py [--samples 300] [--seed 0]

Builds (once) a scratch venv with vLLM 0.33.0's wheel installed `--no-deps`, CPU torch 2.13.0
and the pure-Python packages vLLM's config code imports, under var/vllm-0.33-venv (or
--venv). Then, for the 26 presets and --samples random combinations that the lab form accepts
(catalog models and GPUs, on a worker of the lab's GPU kind with 1 or 8 GPUs): the project's
verdict is labs.backends.vllm.start.check_can_start; vLLM's is its own parser, EngineArgs,
config classes and KV-cache start check run over the `vllm serve` arguments build_plan writes
(scripts/vllm_conformance_child.py says what runs and what is the project's model). Prints both
disagreement counts; exits 1 if either is not 0.

Settings with no vLLM expression (contiguous KV, int8/int4 weights without a checkpoint, block
sizes vLLM's CUDA kernels refuse when choosing an attention backend, which happens on a GPU
only) are counted apart as "project-only refusals".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

VLLM = "vllm==0.33.0"
TORCH = "torch==2.13.0"  # CPU build; pip's configuration here finds a local wheel
# What vLLM's parser and config modules import (its full list pulls CUDA kernels and torch 2.14).
DEPS = [
    "regex", "cachetools", "psutil", "sentencepiece", "numpy", "requests", "tqdm", "blake3",
    "py-cpuinfo", "transformers>=5.16.1,<5.21.0", "huggingface_hub>=1.31.0",
    "tokenizers>=0.23.2", "safetensors", "protobuf", "fastapi>=0.133,<0.137", "pydantic>=2.12",
    "orjson", "prometheus_client", "pillow", "tiktoken", "pyyaml", "msgspec", "pyzmq",
    "cloudpickle", "einops", "openai", "aiohttp", "partial-json-parser", "jsonschema", "cbor2",
    "pybase64", "setproctitle", "ijson", "python-json-logger", "filelock", "starlette>=1.0.1",
    "prometheus-fastapi-instrumentator", "oss-harmony>=0.0.11", "mcp>=2.2,<3", "anthropic",
    "watchfiles", "lm-format-enforcer==0.11.3", "model-hosting-container-standards>=0.1.14,<1",
    "opentelemetry-sdk", "opentelemetry-api", "uvloop", "loguru", "xgrammar==0.2.8",
    "llguidance>=1.7,<1.8",
]  # fmt: skip


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        return python
    print(f"building {venv} (torch CPU, {VLLM} --no-deps) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "--no-deps", VLLM], check=True)
    subprocess.run([*pip, *DEPS], check=True)
    # vLLM's fp8 config imports it; its own requirements would bring CUDA torch back.
    subprocess.run([*pip, "--no-deps", "compressed-tensors==0.17.0"], check=True)
    return python


def random_form_data(rng: random.Random) -> dict[str, object]:
    from labs.parameters.catalog import GPUS, MODELS

    data: dict[str, object] = {
        "model": rng.choice(sorted(MODELS)),
        "gpu": rng.choice(sorted(GPUS)),
        "tp": rng.choice([1, 1, 2, 4, 8]),
        "weight_dtype": rng.choice(["bf16", "bf16", "fp16", "fp8"]),
        "kv_dtype": rng.choice(["auto", "fp8"]),
        "gpu_memory_utilization": rng.choice([0.5, 0.8, 0.9, 0.95, 0.99, 1.0]),
        "block_size": rng.choice([16, 16, 32, 64, 128]),
        "max_num_seqs": rng.choice([1, 8, 32, 128, 256]),
        "max_num_batched_tokens": rng.choice([512, 2048, 8192, 16384]),
        "chunked_prefill": rng.random() < 0.8,
        "prefix_caching": rng.random() < 0.7,
        "prompt_tokens": rng.choice([16, 128, 512, 1024, 2048, 4000]),
        "output_tokens": rng.choice([1, 16, 128, 512]),
        "num_prompts": 8,
        "activation_reserve_gb": rng.choice([0, 0, 1, 4]),
    }
    if rng.random() < 0.5:
        data["kv_capacity_tokens"] = rng.choice([256, 800, 1024, 5000, 50_000, 420_000])
    method = rng.choice(["none", "none", "ngram", "draft_model", "eagle"])
    if method != "none":
        data.update(spec_method=method, spec_tokens=rng.randint(1, 5))
        if method != "ngram":
            data["draft_cost"] = rng.choice([0.1, 0.25, 0.5])
    return data


def cases(samples: int, seed: int, drafts: Path) -> tuple[list[dict], int]:
    from labs.backends.base import Device
    from labs.backends.vllm.fit import memory_need
    from labs.backends.vllm.server import build_plan, check_supported
    from labs.backends.vllm.start import check_can_start
    from labs.parameters.catalog import GPUS
    from labs.parameters.params import ParamError, align_run_batch, parse_lab_params
    from labs.parameters.presets import LABS, lab_initial, load_presets

    inputs: list[tuple[str, object, int]] = []
    for slug, preset in load_presets().items():
        values = lab_initial(LABS[preset.lab], preset)
        data = align_run_batch({k: v for k, v in values.items() if v is not None})
        inputs.append((f"preset {slug}", parse_lab_params(data), 8))
    rng = random.Random(seed)
    accepted = 0
    while accepted < samples:
        try:
            params = parse_lab_params(random_form_data(rng))
        except ParamError:
            continue  # the form would refuse it: not a form-accepted combination
        accepted += 1
        inputs.append((f"random {accepted}", params, rng.choice([1, 8])))
    out, project_only = [], 0
    for name, params, gpus in inputs:
        gpu = GPUS[params.hardware.name]
        try:
            check_can_start(params, [Device(gpu.name, gpus, gpu.hbm_bytes)])
            ours = {"accepted": True}
        except ParamError as exc:
            ours = {
                "accepted": False,
                "reason": "; ".join(f"{k}: {v}" for k, v in exc.errors.items()),
            }
        try:
            check_supported(params)
        except ParamError:
            project_only += 1
            continue
        plan = build_plan(params, cache=drafts)
        for path, text in plan.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        need = memory_need(params, memory_bytes=gpu.hbm_bytes)
        out.append(
            {
                "id": len(out),
                "name": name,
                "ours": ours,
                "argv": list(plan.args),
                "gpus": gpus,
                "gpu_memory": gpu.hbm_bytes,
                "context_bytes": int(need.context),
                "non_kv_bytes": int(need.weights + need.draft + need.reserve + need.context),
            }
        )
    presets = sum(name.startswith("preset") for name, _, _ in inputs)
    print(f"{presets} presets and {samples} random form-accepted combinations", file=sys.stderr)
    return out, project_only


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--venv", type=Path, default=ROOT / "var" / "vllm-0.33-venv")
    parser.add_argument("--show", type=int, default=5, help="disagreements to print")
    args = parser.parse_args()

    import django

    django.setup()
    python = ensure_venv(args.venv)
    with tempfile.TemporaryDirectory() as tmp:
        judged, project_only = cases(args.samples, args.seed, Path(tmp) / "drafts")
        cases_file = Path(tmp) / "cases.json"
        cases_file.write_text(json.dumps(judged))
        child = ROOT / "scripts" / "vllm_conformance_child.py"
        run = subprocess.run(
            [str(python), str(child), str(cases_file)], capture_output=True, text=True, cwd=tmp
        )
        verdicts = {}
        for line in run.stdout.splitlines():
            if line.startswith("{"):
                verdict = json.loads(line)
                verdicts[verdict["id"]] = verdict
        if len(verdicts) != len(judged):
            print(run.stderr[-3000:], file=sys.stderr)
            print(f"vLLM judged {len(verdicts)} of {len(judged)} cases", file=sys.stderr)
            return 2
    ours_only, vllm_only, rules = [], [], {}
    for case in judged:
        theirs = verdicts[case["id"]]
        if not theirs["accepted"]:
            rules[theirs["rule"]] = rules.get(theirs["rule"], 0) + 1
        if case["ours"]["accepted"] and not theirs["accepted"]:
            ours_only.append((case, theirs))
        elif not case["ours"]["accepted"] and theirs["accepted"]:
            vllm_only.append((case, theirs))
    presets = sum(c["name"].startswith("preset") for c in judged)
    print(f"vLLM 0.33.0 conformance: {len(judged)} cases judged by vLLM ({presets} presets)")
    print(f"  project-only refusals (no vLLM expression): {project_only}")
    print(f"  refused by vLLM, by rule: {json.dumps(rules, sort_keys=True)}")
    print(f"  accepted by the project, refused by vLLM: {len(ours_only)}")
    print(f"  refused by the project, accepted by vLLM: {len(vllm_only)}")
    for case, theirs in (ours_only + vllm_only)[: args.show]:
        print(f"- {case['name']} on {case['gpus']} GPUs: ours {case['ours']}; vLLM {theirs}")
        print("  " + " ".join(case["argv"]))
    return 0 if not ours_only and not vllm_only else 1


if __name__ == "__main__":
    sys.exit(main())
