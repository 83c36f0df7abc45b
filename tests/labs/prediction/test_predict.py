"""labs.prediction.predict against the seeds' worked answers, hand arithmetic and invariants.

Expected values come from the seed files tests/quiz/fixtures/000_36de575bee6c4e63.txt and
003_069e362ba7a89ee1.txt (quoted beside each test) or from arithmetic written out in the test,
never from the predictor. Where a seed rounds, the test rounds the same way.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from labs.parameters.catalog import GPUS, MODELS
from labs.parameters.params import FIELDS_BY_NAME, EngineConfig, LabParams, parse_lab_params
from labs.prediction.predict import (
    blocks_for_tokens,
    closed_loop_wait_s,
    decode_step_time,
    e2e_time_s,
    kv_bytes_per_token,
    predict,
    prefill_time_s,
    spec_speedup,
    spec_tokens_per_step,
    step_time_s,
)
from tests.budget import examples

KIB = 1024
GB = 1e9


def predicted(**params: object):
    return predict(parse_lab_params(params))


# -- the seeds' worked answers -----------------------------------------------------------------


def test_llama_3_8b_holds_128_kib_of_kv_per_token_in_bf16():
    # 001: "Llama 3 8B has 32 layers, 8 KV heads and a head dimension of 128. In BF16, how much
    # KV cache does one token occupy?"  2 x 32 x 8 x 128 x 2 bytes = 131,072 = 128 KiB.
    assert predicted(model="llama-3-8b").kv_bytes_per_token == 128 * KIB
    # The card's follow-up: an FP8 KV cache halves it to 64 KiB.
    assert predicted(model="llama-3-8b", kv_dtype="fp8").kv_bytes_per_token == 64 * KIB


def test_1000_tokens_take_63_blocks_with_8_slots_wasted():
    # 000: "1,000 tokens / 16 = 62.5 -> 63 blocks = 1,008 slots; ... (8 slots)".
    p = predicted(block_size=16, prompt_tokens=700, output_tokens=300, max_tokens=2048)
    assert p.blocks_per_seq == 63
    assert p.blocks_per_seq * 16 == 1008
    assert p.slots_wasted_per_seq == 8
    # Follow-up: the 700-token prompt alone needs 44 blocks.
    assert p.prompt_blocks == 44


def test_a_contiguous_reservation_wastes_1748_of_2748_slots():
    # 000: "700 + 2,048 = 2,748 slots reserved, 1,000 used, 1,748 wasted" (64%).
    p = predicted(prompt_tokens=700, output_tokens=300, max_tokens=2048)
    assert p.contiguous_reserved_slots == 2748
    assert p.contiguous_wasted_slots == 1748
    assert round(p.contiguous_waste_fraction * 100) == 64


def test_speculation_with_k3_alpha07_c01_gives_253_tokens_and_195x():
    # 000: "(1 - 0.7^4) / (1 - 0.7) = 0.7599 / 0.3 = 2.53 ... 2.53 / 1.3 = 1.95x".
    p = predicted(spec_tokens=3, acceptance=0.7, draft_cost=0.1)
    assert round(p.spec_tokens_per_step, 2) == 2.53
    assert round(p.spec_speedup, 2) == 1.95
    # At batch 1 decode is memory-bound, so verifying 4 tokens costs one pass: the TPOT gain is
    # the small-batch formula's, less the last steps of each request, which draft only up to its
    # last token (1.94x over 256 tokens).
    assert p.spec_speedup_at_batch == pytest.approx(1.95, rel=0.01)
    assert p.spec_speedup_at_batch < p.spec_speedup


def test_e2e_is_ttft_plus_tpot_for_each_later_token():
    # 000: "0.3 + 0.025 x 399 = 0.3 + 9.975 = 10.3 s".
    assert round(e2e_time_s(0.3, 0.025, 400), 1) == 10.3
    assert round(1 / 0.025) == 40  # "25 ms per token (40 tokens/s)"


def test_a_decode_step_of_llama_3_8b_on_h100_reads_16_gb_in_48_ms():
    # 000: "16 / 3,350 GB/s = 4.8 ms -> ~210 tokens/s ideal, ~150 realistic" (70% efficiency).
    p = predicted(model="llama-3-8b", gpu="h100-sxm", concurrency=1)
    assert round(p.weight_bytes / GB) == 16
    assert round(p.weight_read_s * 1000, 1) == 4.8
    assert round(1 / p.weight_read_s, -1) == 210
    at_70 = predicted(model="llama-3-8b", gpu="h100-sxm", bandwidth_efficiency=0.7)
    assert round(1 / at_70.weight_read_s, -1) == 150
    assert p.bound == "memory-bandwidth"


def test_batch_32_with_2k_contexts_adds_86_gb_and_gives_about_21x():
    # 000: "2k tokens x 128 KiB = 0.27 GB ... 32 x 0.27 = 8.6 GB extra per step ...
    # throughput = 32 x (16 / 24.6) = 21x batch 1".
    p = predicted(model="llama-3-8b", gpu="h100-sxm", concurrency=32, context_tokens=2048)
    assert round(p.kv_bytes_per_seq / GB, 2) == 0.27
    bandwidth = 3.35e12
    assert round(p.kv_read_s * bandwidth / GB, 1) == 8.6
    assert round((p.weight_read_s + p.kv_read_s) * bandwidth / GB, 1) == 24.6  # 16.06 + 8.59
    assert round(p.batch_speedup_vs_batch1) == 21
    assert p.running_seqs == 32


def test_2000_chats_of_8k_on_a_70b_model_need_152_gpus():
    # 000: "Weights 141 GB -> a TP-4 replica (4 x 80 GB, ~288 GB usable at 90%), leaving ~147 GB
    # for KV. KV per 8k conversation: 320 KiB x 8,192 = 2.7 GB -> ~54 conversations per replica
    # -> 2,000 / 54 = 38 replicas -> 152 GPUs."
    p = predicted(model="llama-3-70b", gpu="h100-sxm", tp=4, concurrency=2000, context_tokens=8192)
    assert (p.weight_bytes + p.kv_memory_bytes) / GB == pytest.approx(4 * 80 * 0.9)  # 288 GB
    assert round(p.weight_bytes / GB) == 141
    assert round(p.kv_memory_bytes / GB) == 147
    assert p.kv_bytes_per_token == 320 * KIB
    assert round(p.kv_bytes_per_seq / GB, 1) == 2.7
    assert p.max_concurrent_seqs == 54
    assert p.replicas_needed == 38
    assert p.gpus_needed == 152
    assert p.bound == "kv-capacity"


def test_an_fp8_kv_cache_halves_the_70b_fleet_to_76_gpus():
    # 000: "FP8 KV halves the cache (1.34 GB per conversation) -> ~109 per replica -> 19
    # replicas -> 76 GPUs."
    p = predicted(
        model="llama-3-70b",
        gpu="h100-sxm",
        tp=4,
        concurrency=2000,
        context_tokens=8192,
        kv_dtype="fp8",
    )
    assert round(p.kv_bytes_per_seq / GB, 2) == 1.34
    assert p.max_concurrent_seqs == 109
    assert p.replicas_needed == 19
    assert p.gpus_needed == 76


@pytest.mark.parametrize(("prompt", "output"), [(100, 500), (300, 300), (500, 100)])
def test_an_8192_reservation_ending_near_600_tokens_wastes_over_90_percent(prompt, output):
    # 003: "reserves a contiguous KV region sized for max_tokens = 8,192 ... the average
    # sequence ends near 600 tokens ... wastes over 90% of KV memory".
    p = predicted(
        model="llama-3.1-8b", prompt_tokens=prompt, output_tokens=output, max_tokens=8192 - prompt
    )
    assert p.contiguous_reserved_slots == 8192
    assert p.contiguous_waste_fraction > 0.9  # (8192 - 600) / 8192 = 92.7%


def test_paged_kv_admits_many_times_more_600_token_sequences_than_8192_reservations():
    # 003's node runs out of KV at about 20 contiguous requests. Llama 3 8B on an A100 40GB:
    # (40 x 0.9 - 16.06) GB / (128 KiB x 16) = 9,508 blocks = 152,128 tokens; / 8,192 = 18.
    common = dict(model="llama-3-8b", gpu="a100-40gb", prompt_tokens=100, output_tokens=500)
    contiguous = predicted(**common, max_tokens=8092, kv_allocation="contiguous")
    assert contiguous.kv_capacity_tokens == 152_128
    assert contiguous.max_concurrent_seqs == 18
    paged = predicted(**common, max_tokens=8092, kv_allocation="paged", concurrency=18)
    # 600 tokens = 38 blocks: 9,508 // 38 = 250 sequences, 13x more in the same pool.
    assert paged.max_concurrent_seqs == 250
    assert paged.max_concurrent_seqs >= 10 * contiguous.max_concurrent_seqs


# -- hand arithmetic for the rest ----------------------------------------------------------------


def test_prefill_is_compute_bound_at_2_flops_per_parameter_per_token():
    # 2 x 8.03e9 x 1,000 / 989e12 = 16.24 ms; the weights alone would take only 4.8 ms to read.
    p = predicted(model="llama-3-8b", gpu="h100-sxm", prompt_tokens=1000, output_tokens=10)
    assert p.prefill_s == pytest.approx(2 * 8.03e9 * 1000 / 989e12)
    assert p.ttft_s == pytest.approx(p.prefill_s)


def test_compute_efficiency_and_step_overhead_slow_the_step_as_stated():
    p = predicted(prompt_tokens=1000, compute_efficiency=0.5, step_overhead_ms=2)
    assert p.ttft_s == pytest.approx(2 * 8.03e9 * 1000 / (989e12 * 0.5) + 0.002)


def test_fp8_weights_halve_the_bytes_and_use_fp8_tensor_cores():
    bf16 = predicted(prompt_tokens=1000)
    fp8 = predicted(prompt_tokens=1000, weight_dtype="fp8")
    assert fp8.weight_bytes * 2 == bf16.weight_bytes
    assert fp8.prefill_s == pytest.approx(bf16.prefill_s * 989 / 1979)  # FP8 vs BF16 TFLOPS
    # An A100 has no FP8 tensor cores: FP8 weights still compute at the BF16 rate.
    a100_bf16 = predicted(gpu="a100-80gb", prompt_tokens=1000)
    a100_fp8 = predicted(gpu="a100-80gb", prompt_tokens=1000, weight_dtype="fp8")
    assert a100_fp8.prefill_s == pytest.approx(a100_bf16.prefill_s)


def test_int4_weights_take_half_a_byte_per_parameter():
    assert predicted(weight_dtype="int4").weight_bytes == round(8.03e9 * 0.5)


def test_tensor_parallelism_adds_memory_and_bandwidth():
    one = predicted(model="llama-3.1-8b", context_tokens=1000)
    two = predicted(model="llama-3.1-8b", context_tokens=1000, tp=2)
    # 2 x 72 GB - 16.06 GB vs 72 - 16.06 GB for KV.
    assert two.kv_memory_bytes == pytest.approx(2 * 80e9 * 0.9 - 16.06e9)
    assert two.weight_read_s == pytest.approx(one.weight_read_s / 2)


def test_activation_reserve_comes_off_each_gpu():
    p = predicted(model="llama-3-70b", tp=4, activation_reserve_gb=2)
    assert p.kv_memory_bytes == pytest.approx(4 * (72e9 - 2e9) - 141.2e9)


def test_a_mixture_of_experts_reads_few_experts_at_batch_1_and_all_of_them_at_large_batch():
    # 93.4 GB of BF16 weights need two H100s (2 x 72 GB usable).
    one = predicted(model="mixtral-8x7b", tp=2, context_tokens=1)
    many = predicted(model="mixtral-8x7b", tp=2, context_tokens=1, concurrency=128, num_prompts=128)
    assert one.running_seqs == 1 and many.running_seqs == 128
    # One token passes through 12.9B parameters: 25.8 GB in BF16, not 93.4 GB. 128 tokens
    # leave each expert untouched with chance (6/8)^128, next to nothing.
    assert one.weight_read_s * 2 * 3.35e12 == pytest.approx(12.9e9 * 2)
    assert many.weight_read_s * 2 * 3.35e12 == pytest.approx(46.7e9 * 2)
    assert one.weight_bytes == round(46.7e9 * 2)


def test_the_weights_not_fitting_is_reported_not_raised():
    p = predicted(model="llama-3-70b", gpu="h100-sxm", tp=1)  # 141 GB of weights in 72 GB
    assert not p.fits
    assert p.kv_capacity_tokens == 0 and p.max_concurrent_seqs == 0
    assert p.bound == "kv-capacity"
    assert p.tpot_s is None and p.replicas_needed is None


def test_kv_capacity_tokens_overrides_the_pool():
    p = predicted(kv_capacity_tokens=16_000, context_tokens=1000)
    assert p.kv_capacity_tokens == 16_000
    assert p.max_concurrent_seqs == 15  # 1,000 blocks // 63 blocks per 1,000-token sequence


def test_concurrency_beyond_what_fits_makes_kv_capacity_the_bound():
    fits = predicted(concurrency=400, context_tokens=1000)
    assert fits.bound in ("memory-bandwidth", "compute")
    assert predicted(concurrency=5000, context_tokens=1000).bound == "kv-capacity"


def test_a_big_batch_of_short_sequences_is_compute_bound():
    # 256 tokens x 2 x 8.03e9 / 989e12 = 4.16 ms of compute. In BF16 the weights take 4.79 ms to
    # read, so the step is still memory-bound; int4 weights (4.0 GB) plus 256 x 16 tokens of KV
    # (0.54 GB) take 1.36 ms, and compute binds.
    p = predicted(weight_dtype="int4", concurrency=256, context_tokens=16, prompt_tokens=8)
    assert p.bound == "compute"


def test_prefix_caching_skips_whole_blocks_of_the_shared_prefix():
    cold = predicted(prompt_tokens=1000, shared_prefix_tokens=600, prefix_caching=False)
    warm = predicted(prompt_tokens=1000, shared_prefix_tokens=600)
    assert cold.prefix_cached_tokens == 0
    assert warm.prefix_cached_tokens == 592  # 37 whole blocks of 16
    assert warm.prefill_s == pytest.approx(cold.prefill_s * (1000 - 592) / 1000)


def test_speculation_pays_off_less_in_a_compute_bound_batch():
    small = predicted(spec_tokens=4, acceptance=0.8, weight_dtype="int4", prompt_tokens=8)
    big = predicted(
        spec_tokens=4,
        acceptance=0.8,
        weight_dtype="int4",
        concurrency=256,
        context_tokens=16,
        prompt_tokens=8,
    )
    assert small.spec_speedup_at_batch > 2
    assert big.spec_speedup_at_batch < 1  # verifying 5 tokens per sequence costs 5x the compute


# -- properties ---------------------------------------------------------------------------------

_llama = MODELS["llama-3-8b"]


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 128), st.sampled_from([64, 128]))
def test_more_kv_heads_never_lower_kv_bytes(kv_heads, extra, layers, head_dim):
    fewer = dataclasses.replace(_llama, kv_heads=kv_heads, layers=layers, head_dim=head_dim)
    more = dataclasses.replace(fewer, kv_heads=kv_heads + extra)
    assert kv_bytes_per_token(more, "auto") >= kv_bytes_per_token(fewer, "auto")
    assert kv_bytes_per_token(more, "fp8") >= kv_bytes_per_token(fewer, "fp8")


@given(st.sampled_from(sorted(MODELS)), st.integers(1, 64))
def test_fp8_kv_exactly_halves_kv_bytes(slug, kv_heads):
    model = dataclasses.replace(MODELS[slug], kv_heads=kv_heads)
    assert 2 * kv_bytes_per_token(model, "fp8") == kv_bytes_per_token(model, "auto")


@given(st.integers(1, 10_000_000), st.sampled_from([2**i for i in range(9)]))
def test_blocks_cover_the_tokens_with_less_than_one_block_to_spare(tokens, block_size):
    blocks = blocks_for_tokens(tokens, block_size)
    assert blocks * block_size >= tokens > (blocks - 1) * block_size


@given(st.integers(1, 16), st.floats(0, 1))
def test_speedup_tends_to_one_over_kc_plus_one_as_alpha_tends_to_zero(k, c):
    limit = 1 / (k * c + 1)
    assert spec_speedup(k, 0.0, c) == pytest.approx(limit)
    gaps = [abs(spec_speedup(k, alpha, c) - limit) for alpha in (0.1, 0.01, 0.001, 1e-6)]
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] < 1e-5


@given(st.integers(0, 16), st.floats(0, 0.999))
def test_tokens_per_step_lie_between_1_and_k_plus_1(k, alpha):
    assert 1 - 1e-9 <= spec_tokens_per_step(k, alpha) <= k + 1 + 1e-9


_LAB = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen2.5-7b"]),
        "gpu": st.sampled_from(sorted(GPUS)),
        "tp": st.sampled_from([1, 2, 4]),
        "weight_dtype": st.sampled_from(["bf16", "fp8", "int8", "int4"]),
        "kv_dtype": st.sampled_from(["auto", "fp8"]),
        "block_size": st.sampled_from([1, 16, 32, 256]),
        "prompt_tokens": st.integers(1, 2000),
        "output_tokens": st.integers(1, 2000),
        "concurrency": st.integers(1, 3000),
        "context_tokens": st.integers(1, 8192),
        "max_num_batched_tokens": st.sampled_from([256, 512, 2048, 8192]),
        "shared_prefix_tokens": st.integers(0, 1),
        "spec_tokens": st.integers(0, 8),
        "acceptance": st.floats(0, 0.99),
        "step_overhead_ms": st.floats(0, 5),
        "bandwidth_efficiency": st.floats(0.1, 1),
    },
)


def work_tokens(params) -> int:
    """Every output token of the run."""
    return params.workload.num_prompts * params.workload.output_tokens


@settings(max_examples=examples(300), deadline=None)
@given(_LAB)
def test_e2e_is_ttft_plus_tpot_times_the_later_tokens(data):
    params = parse_lab_params(data)
    p = predict(params)
    json.dumps(p.as_dict())  # always serialisable
    if p.fits:
        n = params.workload.output_tokens
        if p.e2e_s is not None:
            tpot = p.tpot_s or 0.0  # None for one-token outputs: no later tokens
            assert p.e2e_s == pytest.approx(p.ttft_s + tpot * (n - 1))
        if p.output_tokens_per_s is not None:
            # A run lasts at least one request's prefill: its tokens over that at most.
            most = work_tokens(params) / p.ttft_s
            assert 0 < p.output_tokens_per_s <= most * (1 + 1e-9)


@settings(max_examples=examples(300), deadline=None)
@given(_LAB)
def test_capacity_and_fleet_figures_agree(data):
    params = parse_lab_params(data)
    p = predict(params)
    bs, work = params.engine.block_size, params.workload
    # A prefix every request shares is held once (whole blocks a warm cache serves).
    shared = p.prefix_cached_tokens // bs
    own = max(blocks_for_tokens(work.context_tokens, bs) - shared, 1)
    pool = p.kv_capacity_tokens // bs
    if p.max_concurrent_seqs:
        assert shared + p.max_concurrent_seqs * own <= pool
    assert shared + (p.max_concurrent_seqs + 1) * own > pool
    assert p.kv_capacity_tokens % bs == 0
    if p.fits:
        per_replica = min(p.max_concurrent_seqs, params.engine.max_num_seqs)
        assert p.replicas_needed * per_replica >= work.concurrency
        assert (p.replicas_needed - 1) * per_replica < work.concurrency
        assert p.gpus_needed == p.replicas_needed * params.engine.tp


_ENGINES = st.builds(
    EngineConfig,
    chunked_prefill=st.booleans(),
    max_num_batched_tokens=st.integers(16, 5000),
    step_overhead_s=st.floats(0, 0.01),
    weight_dtype=st.sampled_from(["bf16", "int4"]),
    kv_dtype=st.sampled_from(["auto", "fp8"]),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from(sorted(MODELS)),
    st.sampled_from(sorted(GPUS)),
    _ENGINES,
    st.integers(1, 60_000),
    st.integers(0, 60_000),
)
def test_chunked_prefill_time_is_the_sum_of_its_steps(slug, gpu, engine, prompt, cached):
    model, hardware = MODELS[slug], GPUS[gpu]
    cached = min(cached, prompt - 1)
    # The slow way: one step_time_s per chunk, each reading the KV of everything before it.
    chunk = engine.max_num_batched_tokens if engine.chunked_prefill else prompt - cached
    expected, done = 0.0, cached
    while done < prompt:
        size = min(chunk, prompt - done)
        expected += step_time_s(hardware, model, engine, size, 0, done)
        done += size
    assert prefill_time_s(hardware, model, engine, prompt, cached) == pytest.approx(expected)


@given(st.integers(1, 512), st.integers(1, 512), st.integers(1, 32_000))
def test_a_decode_step_never_gets_faster_with_more_sequences_or_longer_contexts(b, extra, ctx):
    hw, engine = GPUS["h100-sxm"], EngineConfig()
    step = decode_step_time(hw, _llama, engine, b, ctx)
    assert decode_step_time(hw, _llama, engine, b + extra, ctx) >= step
    assert decode_step_time(hw, _llama, engine, b, ctx + extra) >= step


# -- the module's shape -------------------------------------------------------------------------


def test_predict_params_and_catalog_import_no_django_and_nothing_but_numpy():
    code = (
        "import sys, labs.prediction.predict, labs.parameters.params, labs.parameters.catalog\n"
        "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [m for m in loaded if m.startswith("django")]
    third_party = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_")}
    assert third_party <= {"labs", "numpy"}


def test_prediction_as_dict_has_every_key_the_issue_names():
    keys = set(predicted().as_dict())
    assert {
        "kv_bytes_per_token",
        "blocks_per_seq",
        "slots_wasted_per_seq",
        "contiguous_reserved_slots",
        "contiguous_wasted_slots",
        "weight_bytes",
        "kv_capacity_tokens",
        "max_concurrent_seqs",
        "ttft_s",
        "decode_step_s",
        "tpot_s",
        "e2e_s",
        "output_tokens_per_s",
        "spec_tokens_per_step",
        "spec_speedup",
        "bound",
        "contiguous_waste_fraction",
        "prefill_s",
        "replicas_needed",
        "gpus_needed",
        "kv_bytes_per_seq",
        "batch_speedup_vs_batch1",
        "weight_read_s",
        "kv_read_s",
    } <= keys


# -- under the learner's load ----------------------------------------------------------------------


def _batching_lab(**overrides: object) -> LabParams:
    from labs.parameters.params import align_run_batch
    from labs.parameters.presets import LABS

    values = {**LABS["batching"].defaults, **overrides}
    return parse_lab_params(align_run_batch(values))


def test_concurrency_above_the_batch_predicts_waves_of_queueing_close_to_the_simulator():
    from labs.backends.sim import SimBackend
    from labs.measurement.metrics import summarize

    params = _batching_lab(max_num_seqs=8, concurrency=64, sim_profile="ideal")
    predicted = predict(params)
    simulated = summarize(SimBackend().run(params))
    assert predicted.loaded_ttft_s == pytest.approx(simulated["ttft_s"]["mean"], rel=0.30)
    assert predicted.loaded_e2e_s == pytest.approx(simulated["e2e_s"]["mean"], rel=0.30)
    # The idle number the cards use stays: one prompt's prefill on an idle engine.
    assert predicted.ttft_s < 0.05 < predicted.loaded_ttft_s


def test_moving_concurrency_from_32_to_64_moves_the_prediction():
    at_32 = predict(_batching_lab(max_num_seqs=8, concurrency=32))
    at_64 = predict(_batching_lab(max_num_seqs=8, concurrency=64))
    assert at_64.queue_wait_s > 1.5 * at_32.queue_wait_s > 0
    assert at_64.ttft_s == at_32.ttft_s


def test_concurrency_within_the_batch_waits_for_nothing():
    p = predict(_batching_lab(max_num_seqs=256, concurrency=8))
    assert p.queue_wait_s == 0
    assert p.loaded_ttft_s < 0.05


def test_a_poisson_rate_above_capacity_builds_a_queue_and_one_below_does_not():
    base = _batching_lab(max_num_seqs=8, concurrency=8)
    capacity = predict(base).capacity_requests_per_s
    over = predict(_batching_lab(max_num_seqs=8, concurrency=64, request_rate=3 * capacity))
    under = predict(_batching_lab(max_num_seqs=8, concurrency=8, request_rate=capacity / 3))
    assert over.queue_wait_s > 1.0
    # Below capacity an arrival waits only for the step in progress: milliseconds.
    assert under.queue_wait_s < 0.01


def test_a_client_that_holds_no_more_than_the_engine_queues_before_the_clock_starts():
    """max_concurrency at most max_num_seqs: a request that finds every client slot taken is
    sent when one frees (the simulator's clock starts then), so above capacity its TTFT
    carries no queue."""
    capacity = predict(_batching_lab(max_num_seqs=8, concurrency=8)).capacity_requests_per_s
    over = predict(_batching_lab(max_num_seqs=8, concurrency=8, request_rate=3 * capacity))
    assert over.regime == "rate above capacity"
    assert over.queue_wait_s == 0
    assert over.running_seqs == 8


def _first_wave(params, count):
    from labs.prediction.load import Pricer, first_wave, request_shape

    shape = request_shape(params.engine, params.workload, 0)
    pricer = Pricer(params.hardware, params.model, params.engine, shape.verify)
    return first_wave(pricer, shape, params.engine, count).first_token_s


def test_prompts_that_share_one_step_all_get_their_first_token_when_it_ends():
    params = parse_lab_params({"prompt_tokens": 1, "output_tokens": 2, "max_num_seqs": 8})
    hw, model, engine = params.hardware, params.model, params.engine
    first = _first_wave(params, 5)
    # Not "halfway through the wave": five 1-token prompts are one step, done together.
    assert first == pytest.approx([step_time_s(hw, model, engine, 5, 0, 0)] * 5, rel=1e-12)
    assert first.min() >= prefill_time_s(hw, model, engine, 1)


def _wave_first_tokens_step_by_step(hw, model, engine, batch, prompt_tokens):
    """Each request's first token in a wave, filling the token budget one step at a time."""
    budget, clock, firsts = engine.max_num_batched_tokens, 0.0, []
    left = [prompt_tokens] * batch
    while any(left):
        room, done_now = budget, []
        for i, tokens in enumerate(left):
            take = min(tokens, room)
            left[i] -= take
            room -= take
            if take and not left[i]:
                done_now.append(i)
            if not room:
                break
        clock += step_time_s(hw, model, engine, budget - room, 0, 0)
        firsts += [clock] * len(done_now)
    return firsts


@settings(max_examples=examples(100), deadline=None)
@given(
    batch=st.integers(2, 40),
    prompt_tokens=st.integers(1, 3000),
    budget=st.sampled_from([64, 512, 2048, 8192]),
    overhead_ms=st.sampled_from([0.0, 2.0]),
)
def test_a_waves_mean_first_token_is_each_prompts_last_step_in_turn(
    batch, prompt_tokens, budget, overhead_ms
):
    params = parse_lab_params(
        {
            "prompt_tokens": prompt_tokens,
            "max_num_seqs": 64,
            "max_num_batched_tokens": budget,
            "step_overhead_ms": overhead_ms,
        }
    )
    hw, model, engine = params.hardware, params.model, params.engine
    first = _first_wave(params, batch)
    firsts = _wave_first_tokens_step_by_step(hw, model, engine, batch, prompt_tokens)
    alone = prefill_time_s(hw, model, engine, prompt_tokens)
    expected = [max(t, alone) for t in firsts]
    assert first == pytest.approx(expected, rel=1e-9)


def test_a_kv_pool_smaller_than_the_batch_caps_it_and_the_rest_queue():
    roomy = predict(_batching_lab(max_num_seqs=64, concurrency=64))
    tight = _batching_lab(
        max_num_seqs=64, concurrency=64, kv_capacity_tokens=8 * 640, kv_allocation="contiguous"
    )
    tight = predict(tight)
    assert tight.running_seqs == tight.max_concurrent_seqs < roomy.running_seqs
    assert tight.queue_wait_s > roomy.queue_wait_s


def test_a_paged_pool_that_admits_more_than_it_holds_says_the_formulas_do_not_cover_it():
    """Paged KV admits a request when its prompt fits; 64 prompts fit a pool that holds 8 at
    their full length, so they are preempted mid-decode: no formula figure, a reason."""
    tight = predict(_batching_lab(max_num_seqs=64, concurrency=64, kv_capacity_tokens=8 * 640))
    assert tight.running_seqs is None and tight.output_tokens_per_s is None
    assert "preempted" in tight.uncovered["running_seqs"]
    assert set(tight.uncovered) >= {"loaded_ttft_s", "tpot_s", "output_tokens_per_s"}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"spec_method": "draft_model", "spec_tokens": 4, "acceptance": 0.8}],
    ids=["plain", "speculation"],
)
def test_a_poisson_rate_below_capacity_predicts_requests_one_at_a_time(overrides):
    """Arrivals at a low rate are prefilled alone and decode beside the few others in flight,
    not as one wave of every prompt (which put TTFT 20x too high)."""
    from labs.backends.sim import SimBackend
    from labs.measurement.metrics import summarize

    params = _batching_lab(
        max_num_seqs=64, request_rate=0.5, num_prompts=40, sim_profile="ideal", **overrides
    )
    predicted = predict(params)
    simulated = summarize(SimBackend().run(params))
    # No queue for a slot: only the step in progress when a request arrives.
    assert predicted.queue_wait_s < predicted.tpot_s
    assert predicted.loaded_ttft_p50_s == pytest.approx(simulated["ttft_s"]["p50"], rel=0.30)
    assert predicted.loaded_e2e_s == pytest.approx(simulated["e2e_s"]["mean"], rel=0.30)


def _waits_one_by_one(num_prompts, concurrency, batch, service_s):
    """Each request's wait, straight from closed_loop_wait_s's docstring, one request at a time."""
    waits = []
    for i in range(num_prompts):
        start = (i // batch) * service_s
        issued = 0.0 if i < concurrency else (1 + (i - concurrency) // batch) * service_s
        waits.append(max(start - issued, 0.0))
    return waits


@settings(max_examples=examples(300), deadline=None)
@given(
    num_prompts=st.integers(1, 400),
    concurrency=st.integers(1, 400),
    batch=st.integers(1, 64),
    service_s=st.floats(0.001, 100),
)
def test_closed_loop_waits_counted_in_closed_form_match_them_one_by_one(
    num_prompts, concurrency, batch, service_s
):
    # predict_load never passes more concurrency than prompts, nor a batch above it.
    concurrency = min(concurrency, num_prompts)
    batch = min(batch, concurrency)
    waits = _waits_one_by_one(num_prompts, concurrency, batch, service_s)
    mean, p50 = closed_loop_wait_s(num_prompts, concurrency, batch, service_s)
    assert mean == pytest.approx(statistics.fmean(waits), rel=1e-12, abs=1e-12)
    assert p50 == pytest.approx(statistics.median(waits), rel=1e-12, abs=1e-12)


def test_one_prediction_at_the_most_prompts_allowed_traces_under_1_mb():
    """The live prediction runs in the web process: what it holds must not grow with
    num_prompts (it built arrays of num_prompts waits, 38 MB at a million)."""
    most = int(FIELDS_BY_NAME["num_prompts"].maximum)
    params = _batching_lab(max_num_seqs=8, concurrency=64, num_prompts=most)
    gc.collect()
    tracemalloc.start()
    try:
        p = predict(params)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert p.queue_wait_s > 0  # the closed-loop queue, the path that counts every request
    assert peak < 1024 * 1024, f"peak {peak / 1024 / 1024:.1f} MB"


# -- the prediction's parts (predicted_breakdown) ------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(
    max_num_seqs=st.sampled_from([1, 4, 8, 64, 256]),
    concurrency=st.integers(1, 300),
    num_prompts=st.integers(1, 5000),
    prompt_tokens=st.integers(1, 4000),
    output_tokens=st.integers(1, 1000),
    spec_tokens=st.sampled_from([0, 0, 2, 4]),
    draft_cost=st.sampled_from([0.0, 0.1]),
    step_overhead_s=st.sampled_from([0.0, 0.002]),
    compute_efficiency=st.sampled_from([1.0, 0.6]),
    rate=st.sampled_from([None, None, 0.5, 20.0, 500.0]),
)
# A wave of 1-token prompts at a rate only the step overhead puts above capacity: the wave's
# mean first token once came before a lone prefill's, and the overhead part went negative.
@example(
    max_num_seqs=8,
    concurrency=5,
    num_prompts=5,
    prompt_tokens=1,
    output_tokens=2,
    spec_tokens=0,
    draft_cost=0.0,
    step_overhead_s=0.002,
    compute_efficiency=1.0,
    rate=500.0,
)
def test_the_predicted_parts_add_up_to_the_figures_the_pages_show(
    max_num_seqs,
    concurrency,
    num_prompts,
    prompt_tokens,
    output_tokens,
    spec_tokens,
    draft_cost,
    step_overhead_s,
    compute_efficiency,
    rate,
):
    from labs.prediction.predict import lab_prediction

    data = {
        "max_num_seqs": max_num_seqs,
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "context_tokens": prompt_tokens + output_tokens,
        "spec_tokens": spec_tokens,
        "draft_cost": draft_cost,
        "step_overhead_ms": step_overhead_s * 1000,
        "compute_efficiency": compute_efficiency,
        "request_rate": rate,
    }
    values = lab_prediction(parse_lab_params(data))
    breakdown = values["breakdown"]
    for key, figure in (
        ("ttft_s", "loaded_ttft_s"),
        ("tpot_s", "tpot_s"),
        ("e2e_s", "loaded_e2e_s"),
    ):
        if values[figure] is None:  # uncovered (or no TPOT): no parts to build on
            assert breakdown[key] is None
            continue
        parts = breakdown[key]["parts"]
        assert sum(parts.values()) == pytest.approx(values[figure], rel=1e-9)
        assert breakdown[key]["total"] == pytest.approx(values[figure], rel=1e-9)
        # What the formulas leave out is 0 on their side, by assumption.
        assert parts["communication"] == parts["preemption"] == 0
        assert parts["ideal"] > 0
        assert all(v >= -1e-12 * values[figure] for v in parts.values()), parts
        assert (parts["overhead"] > 0) == (step_overhead_s > 0)
        if not spec_tokens or key == "ttft_s":
            assert parts["speculation"] == 0
    # The wait the lab page shows is all queueing; TTFT adds the wait behind the wave's prompts.
    if breakdown["ttft_s"] is not None:
        assert breakdown["ttft_s"]["parts"]["queueing"] >= values["queue_wait_s"] - 1e-12
    if breakdown["tpot_s"] is not None:
        assert breakdown["tpot_s"]["parts"]["queueing"] == 0


def test_near_capacity_the_formulas_say_they_do_not_cover_ttft():
    capacity = predict(_batching_lab(max_num_seqs=8, concurrency=64)).capacity_requests_per_s
    near = predict(_batching_lab(max_num_seqs=8, concurrency=64, request_rate=0.8 * capacity))
    far = predict(_batching_lab(max_num_seqs=8, concurrency=64, request_rate=0.3 * capacity))
    assert near.loaded_ttft_s is None and near.loaded_ttft_p50_s is None
    assert "do not cover TTFT" in near.uncovered["loaded_ttft_p50_s"]
    assert near.tpot_s is not None and near.output_tokens_per_s is not None
    assert far.loaded_ttft_s is not None and "loaded_ttft_s" not in far.uncovered


def test_the_last_tokens_of_a_speculative_decode_are_counted_by_expectation():
    from labs.prediction.steps import spec_decode

    # Two tokens, one draft: one step if it is accepted (chance alpha), else two.
    steps, verify = spec_decode(2, 1, 0.5)
    assert steps == pytest.approx(1.5)
    # The first step verifies 1 + 1 tokens, a second (no draft past the last token) 1.
    assert verify == pytest.approx((2 + 0.5 * 1) / 1.5)
    # Nothing accepted: a token a step, drafting 4, 3, 2, 1, 0 as the end nears.
    assert spec_decode(5, 8, 0.0) == pytest.approx((5.0, (5 + 4 + 3 + 2 + 1) / 5))
