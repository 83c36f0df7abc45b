"""labs.backends.vllm.start.check_can_start: every vLLM 0.33 start-up rule the lab's settings can
break, refused by field with the numbers and what would fit."""

from __future__ import annotations

import pytest

from labs.backends.base import Device, Placement
from labs.backends.vllm.fit import memory_problem, vllm_weight_bytes
from labs.backends.vllm.server import _max_model_len, build_plan
from labs.backends.vllm.start import (
    DEVICE_RULES,
    check_can_start,
    max_gpu_memory_utilization,
    register_device_rules,
    requirement,
)
from labs.parameters.catalog import GB, GPUS, MODELS
from labs.parameters.params import ParamError, align_run_batch, parse_lab_params
from labs.parameters.presets import LABS, lab_initial, load_presets

SMALL = {"model": "llama-3-8b", "num_prompts": 8, "prompt_tokens": 64, "output_tokens": 16}
H100 = GPUS["h100-sxm"].hbm_bytes


def params(**given):
    return parse_lab_params({**SMALL, **given})


def refusal(p, devices) -> dict[str, str]:
    with pytest.raises(ParamError) as info:
        check_can_start(p, devices)
    return info.value.errors


def test_the_draft_model_reproduction_is_refused_with_the_memory_each_part_takes():
    # Issue 24 item 2: the pool spans the target's and the draft's 16 layers (48 in all).
    p = params(
        gpu="h100-sxm",
        spec_method="draft_model",
        spec_tokens=3,
        draft_cost=0.5,
        kv_capacity_tokens=420000,
    )
    message = refusal(p, [Device("h100-sxm", 8, H100)])["tp"]
    assert "weights 16.1 GB (bf16)" in message
    assert "draft model 9.1 GB" in message
    assert "420,000-token KV pool 82.6 GB" in message
    assert "CUDA context 0.5 GB = 108.3 GB, but one h100-sxm holds 80.0 GB" in message
    assert "tp 2 would fit" in message and "kv_capacity_tokens up to 276,272" in message
    # What it suggests does start.
    check_can_start(params(**{**p.as_dict(), "tp": 2}), [Device("h100-sxm", 8, H100)])
    smaller = params(**{**p.as_dict(), "kv_capacity_tokens": 276272})
    check_can_start(smaller, [Device("h100-sxm", 1, H100)])
    assert (
        "kv_capacity_tokens"
        in refusal(params(**{**p.as_dict(), "kv_capacity_tokens": 276272 + 16}), [])["tp"]
    )


def test_a_gpu_kind_no_worker_has_is_refused_naming_what_is_online():
    errors = refusal(params(gpu="a100-80gb"), [Device("h100-sxm", 2), Device("l4", 1)])
    assert list(errors) == ["gpu"]
    assert "h100-sxm (up to 2), l4 (up to 1)" in errors["gpu"] and "a100-80gb" in errors["gpu"]


def test_tp_above_the_largest_worker_is_refused_with_its_gpu_count():
    p = params(model="llama-3.1-70b", gpu="h100-sxm", tp=4, kv_capacity_tokens=8192)
    assert refusal(p, [Device("h100-sxm", 2, H100), Device("h100-sxm", 1, H100)]) == {
        "tp": "tp must be at most 2 on h100-sxm: the largest h100-sxm worker has 2 GPUs, got 4"
    }
    assert check_can_start(p, [Device("h100-sxm", 4, H100)]) == Placement("h100-sxm", 4)


def test_with_no_gpu_announced_the_catalog_still_decides_fit_and_tp():
    # Issue 24 item 5: 141 GB of weights do not fit one H100, whatever the workers announce.
    assert "tp 2 would fit" in refusal(params(model="llama-3.1-70b", gpu="h100-sxm"), [])["tp"]
    assert "at most 8" in refusal(params(model="llama-3.1-70b", gpu="h100-sxm", tp=16), [])["tp"]
    ok = params(model="llama-3.1-70b", gpu="h100-sxm", tp=8, kv_capacity_tokens=8192)
    # Checked, but placed on no kind's queue: no worker announced one (see test_backend.py).
    assert check_can_start(ok, []) is None
    assert "custom GPU" in refusal(params(hbm_gb=80, bandwidth_tbs=3, tflops=900), [])["gpu"]


def test_gpu_memory_utilization_one_is_refused_with_the_largest_that_starts():
    # vLLM starts when the GPU less its CUDA context holds the share asked for, compared as
    # given: 80 GB less 512 MiB is 0.99329 of it.
    most = (H100 - 512 * 1024**2) / H100
    assert max_gpu_memory_utilization(H100) == pytest.approx(most)
    errors = refusal(params(gpu="h100-sxm", gpu_memory_utilization=1.0), [])
    assert errors["gpu_memory_utilization"].startswith(
        "gpu_memory_utilization must be at most 0.9932 on h100-sxm"
    )
    check_can_start(params(gpu="h100-sxm", gpu_memory_utilization=0.99), [])


def test_a_share_above_two_decimals_is_judged_as_vllm_judges_it():
    # Rounded down to 0.99, the largest share once refused 0.9915, which vLLM starts with.
    check_can_start(params(gpu="h100-sxm", gpu_memory_utilization=0.9915), [])
    check_can_start(params(gpu="h100-sxm", gpu_memory_utilization=0.9932), [])
    errors = refusal(params(gpu="h100-sxm", gpu_memory_utilization=0.9934), [])
    assert "at most 0.9932" in errors["gpu_memory_utilization"]
    assert errors["gpu_memory_utilization"].endswith("got 0.9934")


def test_a_pool_smaller_than_the_longest_request_is_refused_and_max_model_len_never_exceeds_it():
    # 64 + 16 tokens in a 96-token pool: vLLM would refuse max_model_len 1024 at start, so the
    # server asks for no more than the pool holds; a pool below the request is refused.
    fits = params(gpu="h100-sxm", kv_capacity_tokens=96)
    assert _max_model_len(fits) == 96
    assert "--max-model-len" in (args := build_plan(fits).args)
    assert args[args.index("--max-model-len") + 1] == "96"
    check_can_start(fits, [])
    errors = refusal(params(gpu="h100-sxm", kv_capacity_tokens=64), [])
    assert errors["kv_capacity_tokens"].startswith("kv_capacity_tokens must hold one whole")
    assert "at least 80" in errors["kv_capacity_tokens"]


def test_a_custom_model_is_refused_at_submit():
    custom = params(model="custom", layers=4, kv_heads=2, head_dim=64, params_b=0.1)
    assert refusal(custom, [])["model"].startswith("model must be a catalog model to run on vLLM")


def test_online_fp8_keeps_embeddings_and_the_lm_head_in_bf16():
    model = MODELS["llama-3-8b"]
    embed = 2 * model.vocab_size * model.hidden_size
    assert vllm_weight_bytes(model, "fp8") == pytest.approx((model.params - embed) + 2 * embed)
    assert vllm_weight_bytes(model, "fp8") - model.params == pytest.approx(1.05 * GB, rel=0.01)


def test_a_device_kind_can_bring_its_own_rules():
    calls = []

    def rules(p, device):
        calls.append(device)
        return {"block_size": "block_size must be a multiple of 32 on cpu, got 16"}

    p = params(gpu="h100-sxm")
    assert check_can_start(p, [Device("h100-sxm", 1, H100)])  # the CUDA rules pass it
    register_device_rules("h100-sxm", rules)
    try:
        # Registered rules replace the CUDA ones for devices of that kind.
        assert refusal(p, [Device("h100-sxm", 1, H100)]) == {
            "block_size": "block_size must be a multiple of 32 on cpu, got 16"
        }
        assert calls[-1] == Device("h100-sxm", 1, H100)
    finally:
        DEVICE_RULES.pop("h100-sxm", None)


def test_the_activation_reserve_counts():
    assert memory_problem(params(gpu="l4", gpu_memory_utilization=0.97)) is None
    assert "activation reserve 8.0 GB" in memory_problem(
        params(gpu="l4", gpu_memory_utilization=0.97, activation_reserve_gb=8)
    )


def preset_params(slug: str):
    preset = load_presets()[slug]
    values = lab_initial(LABS[preset.lab], preset)
    return parse_lab_params(align_run_batch({k: v for k, v in values.items() if v is not None}))


@pytest.mark.parametrize("slug", list(load_presets()))
def test_every_preset_runs_on_some_worker_kind_or_says_why_not(slug):
    p = preset_params(slug)
    need = requirement(p)
    if need.startswith("needs a vLLM worker"):
        gpu = p.hardware
        assert check_can_start(p, [Device(gpu.name, p.engine.tp, gpu.hbm_bytes)])
    else:
        assert need.startswith(("cannot run on vLLM: ", "cannot start as set: "))
        with pytest.raises(ParamError):
            check_can_start(p, [Device(name, 8, g.hbm_bytes) for name, g in GPUS.items()])


def test_the_presets_the_audit_named_are_judged_right():
    assert "4\u00d7 h100-sxm" in requirement(preset_params("kv-capacity-70b-tp4-8k"))
    assert "8\u00d7 h100-sxm" in requirement(preset_params("kv-capacity-70b-tp8-32k"))
    too_big = requirement(preset_params("kv-capacity-32k-context"))
    assert too_big.startswith("cannot start as set: tp 1 is too few h100-sxm GPUs")
    assert "contiguous" in requirement(preset_params("contiguous-vs-paged-8k-reservation"))


def test_a_draft_model_run_starts_beside_a_made_local_model_and_is_refused_beside_real_weights(
    tmp_path, monkeypatch
):
    """The conformance script (scripts/check_vllm_conformance.py) on a machine where `lab
    make-model` had run: lab-llama-20m with a draft model passed check_can_start, then
    build_plan refused it ('needs a draft checkpoint'), a failure at start."""
    from labs.backends.vllm import cpu
    from labs.backends.vllm.server import MODELS_DIR

    made = tmp_path / "models" / "lab-llama-20m"
    made.mkdir(parents=True)
    (made / "config.json").write_text((MODELS_DIR / "lab-llama-20m" / "config.json").read_text())
    (made / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("LABS_MODELS_DIR", str(tmp_path / "models"))
    assert cpu.made_model("lab-llama-20m") == made
    drafting = params(model="lab-llama-20m", spec_method="draft_model", spec_tokens=2)
    check_can_start(drafting, [Device("h100-sxm", 1, H100)])
    plan = build_plan(drafting, cache=tmp_path / "cache")
    # Both random: the bundled config with vLLM's dummy weights, as the draft gets.
    assert plan.args[1] == str(MODELS_DIR / "lab-llama-20m")
    assert plan.args[plan.args.index("--load-format") + 1] == "dummy"
    ngram = build_plan(
        params(model="lab-llama-20m", spec_method="ngram", spec_tokens=2), cache=tmp_path
    )
    assert ngram.args[1] == str(made)  # without a draft, the made weights and tokenizer
    # A worker serving its own checkpoint refuses a draft model before any start.
    monkeypatch.setenv("LABS_VLLM_MODEL_DIR_LLAMA_3_8B", str(tmp_path / "ckpt"))
    errors = refusal(
        params(spec_method="draft_model", spec_tokens=2), [Device("h100-sxm", 1, H100)]
    )
    assert errors["spec_method"].startswith("spec_method must be ngram or none for llama-3-8b")
