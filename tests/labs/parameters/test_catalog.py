"""The hardware and model catalogs: the figures the deck's answers start from."""

from __future__ import annotations

import pytest

from labs.parameters.catalog import GPUS, MODELS

REQUIRED_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l4", "l40s", "b200")
REQUIRED_MODELS = (
    "llama-3-8b",
    "llama-3.1-8b",
    "llama-3-70b",
    "llama-3.1-70b",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "mixtral-8x7b",
    "qwen2.5-0.5b",
)


def test_it_has_every_gpu_the_issue_names():
    assert set(REQUIRED_GPUS) <= set(GPUS)


def test_it_has_every_model_the_issue_names():
    assert set(REQUIRED_MODELS) <= set(MODELS)


@pytest.mark.parametrize(
    ("slug", "hbm_gb", "bandwidth_tbs", "bf16_tflops", "fp8_tflops"),
    [
        # perf-notes.md section 1: dense figures, half the data sheets' sparse ones.
        ("a100-40gb", 40, 1.555, 312, None),
        ("a100-80gb", 80, 2.039, 312, None),
        ("h100-sxm", 80, 3.35, 989, 1979),
        ("h100-pcie", 80, 2.0, 756, 1513),
        ("h200", 141, 4.8, 989, 1979),
        ("l4", 24, 0.3, 121, 242),
        ("l40s", 48, 0.864, 362, 733),
        ("b200", 180, 7.7, 2250, 4500),
    ],
)
def test_gpu_figures_are_the_data_sheets_dense_figures(
    slug, hbm_gb, bandwidth_tbs, bf16_tflops, fp8_tflops
):
    gpu = GPUS[slug]
    assert gpu.hbm_bytes == hbm_gb * 10**9
    assert gpu.bandwidth_bytes_per_s == pytest.approx(bandwidth_tbs * 10**12)
    assert gpu.bf16_flops_per_s == pytest.approx(bf16_tflops * 10**12)
    if fp8_tflops is None:
        assert gpu.fp8_flops_per_s is None
    else:
        assert gpu.fp8_flops_per_s == pytest.approx(fp8_tflops * 10**12)


@pytest.mark.parametrize("slug", REQUIRED_GPUS)
def test_every_gpu_cites_its_source(slug):
    assert "data sheet" in GPUS[slug].source or "table" in GPUS[slug].source
    assert "." in GPUS[slug].source  # names a page, not only a vendor


def test_llama_3_figures_match_their_config_json():
    small, large = MODELS["llama-3-8b"], MODELS["llama-3-70b"]
    assert (small.layers, small.kv_heads, small.head_dim) == (32, 8, 128)
    assert small.params == pytest.approx(8.03e9)
    assert (large.layers, large.kv_heads, large.head_dim) == (80, 8, 128)
    assert large.params == pytest.approx(70.6e9)
    # 3.1 changed the context length, not the shapes.
    for old, new in (("llama-3-8b", "llama-3.1-8b"), ("llama-3-70b", "llama-3.1-70b")):
        assert MODELS[new].kv_heads == MODELS[old].kv_heads
        assert MODELS[new].max_context > MODELS[old].max_context == 8192


@pytest.mark.parametrize("slug", REQUIRED_MODELS)
def test_model_shapes_are_consistent(slug):
    model = MODELS[slug]
    assert model.heads * model.head_dim == model.hidden_size
    assert model.heads % model.kv_heads == 0
    assert model.source
    assert 0 < model.active_params <= model.params


def test_mixtral_counts_total_and_active_parameters_apart():
    mixtral = MODELS["mixtral-8x7b"]
    assert mixtral.is_moe
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    assert mixtral.params == pytest.approx(46.7e9)
    assert mixtral.active_params == pytest.approx(12.9e9)
    assert not MODELS["llama-3-8b"].is_moe


def test_the_small_model_fits_a_modest_gpu_in_bf16():
    small = MODELS["qwen2.5-0.5b"]
    assert small.params < 1e9
    assert small.params * 2 < GPUS["l4"].hbm_bytes / 10
