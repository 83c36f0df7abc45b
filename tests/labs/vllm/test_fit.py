"""Refused at submit, by field and with numbers: a lab no online GPU worker can start."""

from __future__ import annotations

import pytest

from labs.backends.vllm.fit import check_fits, memory_problem, requirement
from labs.backends.vllm.server import check_supported
from labs.catalog import GPUS
from labs.params import ParamError, align_run_batch, parse_lab_params
from labs.presets import LABS, lab_initial, load_presets

SMALL = {"model": "llama-3-8b", "num_prompts": 8, "prompt_tokens": 64, "output_tokens": 16}


def params(**given):
    return parse_lab_params({**SMALL, **given})


def refusal(p, offer) -> dict[str, str]:
    with pytest.raises(ParamError) as info:
        check_fits(p, offer)
    return info.value.errors


def test_a_gpu_kind_no_worker_has_is_refused_naming_what_is_online():
    errors = refusal(params(gpu="a100-80gb"), {"h100-sxm": 2, "l4": 1})
    assert list(errors) == ["gpu"]
    assert "h100-sxm (up to 2), l4 (up to 1)" in errors["gpu"] and "a100-80gb" in errors["gpu"]


def test_tp_above_the_largest_worker_is_refused_with_its_gpu_count():
    p = params(model="llama-3.1-70b", gpu="h100-sxm", tp=4, kv_capacity_tokens=8192)
    errors = refusal(p, {"h100-sxm": 2})
    assert errors == {
        "tp": "tp must be at most 2 on h100-sxm: the largest online h100-sxm worker has 2 GPUs, "
        "got 4"
    }
    check_fits(p, {"h100-sxm": 4})  # a worker with four runs it


def test_weights_and_kv_beyond_the_gpus_memory_are_refused_with_the_numbers():
    # Llama 3.1 70B in BF16 at tp 1 with a 163,840-token pool: 141.2 GB of weights alone.
    p = params(model="llama-3.1-70b", gpu="h100-sxm", tp=1, kv_capacity_tokens=163840)
    errors = refusal(p, {"h100-sxm": 8})
    assert list(errors) == ["tp"]
    message = errors["tp"]
    assert "weights 141.2 GB (bf16)" in message
    assert "163,840-token KV pool 53.7 GB" in message
    assert "= 194.9 GB, but 1\u00d7 h100-sxm holds 80.0 GB" in message
    assert "tp 4 would fit" in message
    # Without a fixed pool vLLM sizes it from the utilization; 8B on one L4 fits, 70B does not.
    assert memory_problem(params(gpu="l4")) is None
    assert "at gpu_memory_utilization 0.9" in memory_problem(
        params(model="llama-3.1-70b", gpu="l4")
    )


def test_the_activation_reserve_counts():
    fits = params(gpu="l4", gpu_memory_utilization=1.0)
    assert memory_problem(fits) is None
    assert "activation reserve 8.0 GB" in memory_problem(
        params(gpu="l4", gpu_memory_utilization=1.0, activation_reserve_gb=8)
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
        # Some worker runs it: one of its GPU kind with tp GPUs passes every check.
        check_supported(p)
        check_fits(p, {p.hardware.name: p.engine.tp})
        assert p.hardware.name in GPUS and f"{p.hardware.name}" in need
    else:
        # Otherwise the sentence says why, naming the setting to change.
        assert need.startswith(("cannot run on vLLM: ", "cannot start as set: "))
        assert any(field in need for field in ("kv_allocation", "tp ", "weight_dtype", "gpu"))
        with pytest.raises(ParamError):
            check_supported(p)  # what labs.services checks at submit, before check_fits
            check_fits(p, {name: 8 for name in GPUS})


def test_the_presets_the_audit_named_are_judged_right():
    assert "4\u00d7 h100-sxm" in requirement(preset_params("kv-capacity-70b-tp4-8k"))
    assert "8\u00d7 h100-sxm" in requirement(preset_params("kv-capacity-70b-tp8-32k"))
    too_big = requirement(preset_params("kv-capacity-32k-context"))
    assert too_big.startswith("cannot start as set: tp 1 is too few h100-sxm GPUs")
    assert "contiguous" in requirement(preset_params("contiguous-vs-paged-8k-reservation"))
