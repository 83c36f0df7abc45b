"""The engine model's terms, its two profiles and its vectorised pricing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.measurement.metrics import summarize
from labs.parameters.catalog import GPUS, MODELS, Hardware
from labs.parameters.params import EngineConfig, parse_lab_params
from labs.prediction.predict import step_time_s
from labs.sim.cost_model import RooflineCostModel, build_cost_model
from labs.sim.engine_model import (
    CALIBRATION_PATH,
    COMMUNICATION,
    EFFICIENCY,
    IDEAL,
    OVERHEAD,
    SPECULATION,
    EngineModel,
    allreduce_algorithm,
    attention_flops,
    dequant_overhead,
    gemm_efficiency,
    layer_params,
    lm_head_params,
    load_calibration,
    memory_read_s,
    short_where_label,
    step_overhead_s,
    tp_communication_s,
    where_label,
)
from labs.sim.lab import build_simulator
from labs.sim.scheduler import SchedulerOutput
from tests.budget import examples

H100, A100 = GPUS["h100-sxm"], GPUS["a100-80gb"]
LLAMA8, LLAMA70, MIXTRAL = MODELS["llama-3-8b"], MODELS["llama-3-70b"], MODELS["mixtral-8x7b"]


def decode_out(batch: int, context: int, drafts: int = 0) -> SchedulerOutput:
    return SchedulerOutput(
        req_indices=np.arange(batch),
        num_scheduled_tokens=np.full(batch, 1 + drafts, dtype=np.int64),
        num_draft_tokens=np.full(batch, drafts, dtype=np.int64),
        num_computed_before=np.full(batch, context, dtype=np.int64),
        num_decode_tokens=batch * (1 + drafts),
        kv_tokens_read=batch * context,
        num_spec_seqs=batch if drafts else 0,
        spec_kv_tokens_read=batch * context if drafts else 0,
        max_num_draft_tokens=drafts,
    )


def mixed_out(prefill: list[int], decodes: int, context: int) -> SchedulerOutput:
    n = len(prefill) + decodes
    return SchedulerOutput(
        req_indices=np.arange(n),
        num_scheduled_tokens=np.array([1] * decodes + prefill, dtype=np.int64),
        num_draft_tokens=np.zeros(n, dtype=np.int64),
        num_computed_before=np.array([context] * decodes + [0] * len(prefill), dtype=np.int64),
        num_prefill_tokens=sum(prefill),
        num_decode_tokens=decodes,
        kv_tokens_read=decodes * context,
    )


@settings(max_examples=examples(60), deadline=None, derandomize=True)
@given(
    batch=st.integers(1, 300),
    context=st.integers(1, 20000),
    drafts=st.integers(0, 4),
    gpu=st.sampled_from(sorted(GPUS)),
    tp=st.sampled_from([1, 2, 4]),
)
def test_the_ideal_profile_is_the_predictors_step_time(batch, context, drafts, gpu, tp):
    engine = EngineConfig(tp=tp, spec_tokens=drafts, draft_cost=0.1 if drafts else 0.0)
    out = decode_out(batch, context, drafts)
    model = RooflineCostModel(GPUS[gpu], LLAMA8, engine)
    expected = step_time_s(GPUS[gpu], LLAMA8, engine, 0, out.num_decode_tokens, out.kv_tokens_read)
    if drafts:
        plain = step_time_s(GPUS[gpu], LLAMA8, engine, 0, batch, out.spec_kv_tokens_read)
        expected += drafts * 0.1 * plain
    assert model.step_time_s(out) == pytest.approx(expected, rel=1e-12)
    parts = model.step_parts_s(out)
    assert parts[EFFICIENCY] == parts[OVERHEAD] == parts[COMMUNICATION] == 0


def test_the_predictors_efficiency_knobs_move_the_ideal_profile_only():
    # As the fields' help says: they are the formulas' assumptions. The realistic profile keeps its
    # calibrated kernels, as a real GPU would whatever a learner assumes.
    knobs = {"compute_efficiency": 0.5, "bandwidth_efficiency": 0.5, "step_overhead_s": 0.002}
    out = mixed_out([512], decodes=16, context=900)
    for profile, moves in (("realistic", False), ("ideal", True)):
        plain = build_cost_model(H100, LLAMA8, EngineConfig(sim_profile=profile))
        assumed = build_cost_model(H100, LLAMA8, EngineConfig(sim_profile=profile, **knobs))
        assert (assumed.step_time_s(out) != plain.step_time_s(out)) is moves, profile


@pytest.mark.parametrize("profile", ["realistic", "ideal"])
def test_many_steps_at_once_price_like_one_step_at_a_time(profile):
    engine = EngineConfig(tp=2, spec_tokens=2, draft_cost=0.05, sim_profile=profile)
    model = build_cost_model(H100, LLAMA70, engine)
    batch, context = 24, 700
    out = decode_out(batch, context, drafts=2)
    kv = [batch * (context + j) for j in range(5)]
    many = model.steps_time_s(out, kv, kv)
    one_by_one = [model.step_time_s(decode_out(batch, context + j, drafts=2)) for j in range(5)]
    assert many == pytest.approx(one_by_one, rel=1e-12)
    assert model.steps_time_s(out, [out.kv_tokens_read], [out.spec_kv_tokens_read])[
        0
    ] == model.step_time_s(out)


def test_realistic_steps_are_slower_than_the_roofline_and_split_into_non_negative_parts():
    for out in (decode_out(1, 500), decode_out(256, 2000), mixed_out([2048, 300], 30, 900)):
        for gpu in ("h100-sxm", "a100-40gb", "l4"):
            engine = EngineConfig(tp=2)
            real = EngineModel(GPUS[gpu], LLAMA8, engine)
            ideal = RooflineCostModel(GPUS[gpu], LLAMA8, engine)
            parts = real.step_parts_s(out)
            assert (parts >= 0).all()
            assert real.step_time_s(out) > ideal.step_time_s(out)
            assert parts.sum() == pytest.approx(real.step_time_s(out))


def test_batch_1_decode_of_an_8b_model_on_an_h100_is_about_a_third_slower_than_the_roofline():
    # The example: 4.82 ms at the roofline; published vLLM runs decode at 6.5 ms.
    real = EngineModel(H100, LLAMA8, EngineConfig()).step_time_s(decode_out(1, 576))
    ideal = RooflineCostModel(H100, LLAMA8, EngineConfig()).step_time_s(decode_out(1, 576))
    assert 1.2 < real / ideal < 1.6


def test_gemm_efficiency_rises_with_tokens_towards_the_gpus_ceiling():
    gpu = load_calibration().gpu(H100)
    values = [gemm_efficiency(gpu, n) for n in (1, 16, 256, 8192)]
    assert values == sorted(values)
    assert values[0] < 0.05 < values[-1] < gpu.gemm_efficiency


def test_small_reads_reach_less_of_the_bandwidth():
    cal = load_calibration()
    gpu = cal.gpu(H100)
    peak = H100.bandwidth_bytes_per_s

    def fraction(num_bytes: float) -> float:
        seconds = memory_read_s(num_bytes, peak, gpu.bandwidth_efficiency, 1, cal.kernel_latency_s)
        return num_bytes / peak / seconds

    small, large = fraction(1e6), fraction(1e9)
    assert small < large < gpu.bandwidth_efficiency


def test_prefill_attention_grows_with_the_square_of_the_prompt():
    def pairs(n: int) -> float:
        return n * (n + 1) / 2

    ratio = attention_flops(LLAMA8, pairs(8192)) / attention_flops(LLAMA8, pairs(4096))
    assert ratio == pytest.approx(4, rel=0.001)


def test_vllm_reduces_by_its_custom_kernel_or_nccl_as_its_code_decides():
    # vLLM's CustomAllreduce: world sizes 2, 4, 6, 8; messages under 8 MiB; one stage on two
    # GPUs, up to 512 KiB on four and 256 KiB on eight; two stages above; NCCL beyond its
    # buffer, on other world sizes, and on more than two GPUs without NVLink.
    kib = 1024
    assert allreduce_algorithm(2, "nvlink", 4 * 1024 * kib) == "one-stage"
    assert allreduce_algorithm(2, "pcie", 64 * kib) == "one-stage"
    assert allreduce_algorithm(4, "pcie", 64 * kib) == "nccl"
    assert allreduce_algorithm(4, "nvlink", 511 * kib) == "one-stage"
    assert allreduce_algorithm(4, "nvlink", 512 * kib) == "two-stage"
    assert allreduce_algorithm(8, "nvlink", 255 * kib) == "one-stage"
    assert allreduce_algorithm(8, "nvlink", 256 * kib) == "two-stage"
    assert allreduce_algorithm(8, "nvlink", 8 * 1024 * kib) == "nccl"
    assert allreduce_algorithm(3, "nvlink", 16 * kib) == "nccl"


def test_all_reduces_cost_nothing_on_one_gpu_latency_for_a_decode_step_and_bytes_for_a_prefill():
    cal = load_calibration()
    nvlink, pcie = cal.gpu(H100), cal.gpu(GPUS["h100-pcie"])
    assert tp_communication_s(cal, nvlink, LLAMA70, 1, 4096) == 0
    # A decode step's message (16 sequences x 8192 x 2 bytes = 256 KiB) is mostly latency, and
    # the latency barely grows with tp: 2 all-reduces a layer of a few microseconds each.
    per_tp = {tp: tp_communication_s(cal, nvlink, LLAMA70, tp, 16) for tp in (2, 4, 8)}
    kernels = 2 * LLAMA70.layers
    assert per_tp[2] < per_tp[4] < per_tp[8] < 2.5 * per_tp[2]
    assert per_tp[8] < kernels * 30e-6  # never a ring of 2 (tp - 1) hops of 16 us
    one = tp_communication_s(cal, nvlink, LLAMA70, 4, 1)
    assert one == pytest.approx(kernels * cal.allreduce.custom_latency_s["nvlink"], rel=0.03)
    # A long prefill's message goes to NCCL, and its bytes dominate; PCIe is slower still.
    prefill = tp_communication_s(cal, nvlink, LLAMA70, 4, 8192)
    bytes_s = kernels * 2 * 3 / 4 * 8192 * LLAMA70.hidden_size * 2
    rate = nvlink.link_bytes_per_s * cal.allreduce.bandwidth_efficiency
    assert prefill == pytest.approx(
        kernels * cal.allreduce.nccl_latency_s["nvlink"] + bytes_s / rate
    )
    assert prefill < tp_communication_s(cal, pcie, LLAMA70, 4, 8192)


def test_more_gpus_make_a_70b_decode_faster_with_communication_a_modest_share():
    # Llama 3 70B on H100 SXM, 16 clients of 512 + 128 tokens: E2E falls as tp grows, as the
    # published multi-GPU runs do, and the all-reduces stay a minor part of a decode step.
    e2e, share = {}, {}
    for tp in (2, 4, 8):
        params = parse_lab_params(
            {
                "model": "llama-3-70b",
                "gpu": "h100-sxm",
                "tp": tp,
                "prompt_tokens": 512,
                "output_tokens": 128,
                "concurrency": 16,
                "max_concurrency": 16,
                "num_prompts": 32,
            }
        )
        record = build_simulator(params).run()
        e2e[tp] = summarize(record)["e2e_s"]["mean"]
        tpot = record.meta["breakdown"]["tpot_s"]
        share[tp] = tpot["parts"]["communication"] / tpot["total"]
    assert e2e[2] > e2e[4] > e2e[8]
    assert all(0 < s < 0.35 for s in share.values()), share


def test_a_gpu_with_its_own_decode_step_constant_uses_it_and_others_use_the_global_one():
    cal = load_calibration()
    b200, h100 = cal.gpu(GPUS["b200"]), cal.gpu(H100)
    assert b200.decode_step_overhead_s is not None and h100.decode_step_overhead_s is None
    assert step_overhead_s(cal, True, 1, b200) == pytest.approx(
        b200.decode_step_overhead_s + cal.per_seq_overhead_s
    )
    assert step_overhead_s(cal, True, 1, h100) == step_overhead_s(cal, True, 1)
    # Mixed steps keep the global constant on every GPU.
    assert step_overhead_s(cal, False, 1, b200) == step_overhead_s(cal, False, 1)
    # ...and the step price uses it: a B200 decode step's overhead part is the B200 constant.
    parts = EngineModel(GPUS["b200"], LLAMA8, EngineConfig()).step_parts_s(decode_out(4, 300))
    assert parts[OVERHEAD] == pytest.approx(
        b200.decode_step_overhead_s + 4 * cal.per_seq_overhead_s
    )


def test_a_moe_decode_at_batch_1_reads_only_the_experts_it_touches():
    model = EngineModel(H100, MIXTRAL, EngineConfig(tp=2))
    one, many = model.step_time_s(decode_out(1, 100)), model.step_time_s(decode_out(64, 100))
    assert one < 0.6 * many


def test_narrow_weights_pay_a_dequantisation_cost_where_the_gpu_cannot_compute_in_them():
    cal = load_calibration()
    assert dequant_overhead(cal, H100, "fp8") == 0
    assert dequant_overhead(cal, A100, "fp8") > 0
    assert dequant_overhead(cal, H100, "int4") > dequant_overhead(cal, H100, "bf16") == 0


def test_speculation_is_a_part_of_its_own():
    engine = EngineConfig(spec_tokens=3, draft_cost=0.1)
    parts = EngineModel(H100, LLAMA8, engine).step_parts_s(decode_out(4, 300, drafts=3))
    assert parts[-1] > 0


def test_a_speculating_engine_pays_its_fixed_cost_at_every_step_drafts_or_not():
    # vLLM's proposer runs after every step, found drafts or not: a speculating engine's steps
    # without drafts pay spec_step_overhead too, in the speculation part; a plain engine's not.
    cal = replace(load_calibration(), spec_step_overhead_s=0.002)
    ngram = EngineModel(H100, LLAMA8, EngineConfig(spec_tokens=3), calibration=cal)
    plain = EngineModel(H100, LLAMA8, EngineConfig(), calibration=cal)
    for out in (decode_out(4, 300), mixed_out([200], 3, 300)):
        with_spec, without = ngram.step_parts_s(out), plain.step_parts_s(out)
        assert with_spec[SPECULATION] == pytest.approx(0.002)
        assert without[SPECULATION] == 0
        assert with_spec.sum() == pytest.approx(without.sum() + 0.002)
        assert ngram.step_time_s(out) == pytest.approx(plain.step_time_s(out) + 0.002)
    # Priced once per step, not once per draft; the prompt's share of a mixed step is the same.
    assert ngram.step_parts_s(decode_out(4, 300, drafts=3))[SPECULATION] > 0.002
    mixed = mixed_out([200], 3, 300)
    assert ngram.prefill_share_s(mixed) == pytest.approx(plain.prefill_share_s(mixed))
    ideal = EngineModel(H100, LLAMA8, EngineConfig(spec_tokens=3), "ideal", calibration=cal)
    assert ideal.step_parts_s(decode_out(4, 300))[SPECULATION] == 0


def test_every_constant_names_its_source():
    data = yaml.safe_load(CALIBRATION_PATH.read_text())

    def constants(node: dict) -> list[dict]:
        if "source" in node or "value" in node:
            return [node]
        return [c for child in node.values() if isinstance(child, dict) for c in constants(child)]

    for name, entry in data["global"].items():
        for e in constants(entry):
            assert e["source"].strip(), name
    for gpu, entry in data["gpus"].items():
        for key, e in entry.items():
            if isinstance(e, dict):
                assert e["source"].strip(), (gpu, key)
    assert set(GPUS) <= set(data["gpus"])


def test_every_simulated_result_says_which_hardware_it_ran_on():
    fitted, held_out = load_calibration().gpu_runs["h100-sxm"]
    assert where_label(H100, "realistic") == (
        f"simulated on CPU as H100 SXM (calibrated to {fitted} published vLLM runs,"
        f" checked against {held_out} more)"
    )
    # Each GPU kind names its own evidence, not the whole file's.
    assert where_label(GPUS["a100-40gb"], "realistic") == (
        "simulated on CPU as A100 40GB SXM (calibrated to 1 published vLLM run,"
        " checked against 1 more)"
    )
    assert "not calibrated" in where_label(GPUS["l40s"], "realistic")
    # A CPU is calibrated by its own sweep only: without it, it says so in a CPU's words.
    cpu = parse_lab_params(
        {"gpu": "cpu", "model": "lab-llama-20m", "hbm_gb": 23, "bandwidth_tbs": 0.04,
         "tflops": 0.2, "kv_capacity_tokens": 8192, "block_size": 128}
    ).hardware  # fmt: skip
    label = where_label(cpu, "realistic")
    assert label.startswith("simulated on CPU as a CPU vLLM worker (not calibrated: this CPU")
    assert "published vLLM run" not in label and "custom GPU" not in label
    assert where_label(A100, "ideal").startswith(
        "simulated on CPU as A100 80GB SXM, ideal hardware"
    )


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_the_badge_is_short_and_names_the_gpu_and_profile(gpu):
    hardware = GPUS[gpu]
    display = load_calibration().gpus[gpu].display
    realistic = short_where_label(where_label(hardware, "realistic"))
    calibrated = load_calibration().gpu(hardware).calibrated
    kind = "calibrated" if calibrated else "not calibrated"
    assert realistic == f"simulated · {display} · {kind}"
    assert short_where_label(where_label(hardware, "ideal")) == (
        f"simulated · {display} · ideal hardware"
    )


def test_a_label_the_simulator_did_not_write_is_kept_as_it_is():
    for label in ("simulated on CPU", "vLLM 0.32.0 on NVIDIA H100 80GB HBM3", ""):
        assert short_where_label(label) == label


@settings(max_examples=examples(80), deadline=None, derandomize=True)
@given(
    chunks=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8000)), max_size=4),
    decodes=st.integers(0, 200),
    context=st.integers(1, 20000),
    gpu=st.sampled_from(sorted(GPUS)),
    model=st.sampled_from(["llama-3-8b", "mixtral-8x7b"]),
    tp=st.sampled_from([1, 2]),
    profile=st.sampled_from(["realistic", "ideal"]),
)
def test_a_step_priced_from_its_totals_is_the_step_priced_from_its_arrays(
    chunks, decodes, context, gpu, model, tp, profile
):
    # Single and steady steps are priced in plain floats from totals (composition_parts_s);
    # the vectorised path prices from the SchedulerOutput's arrays. Same floats, to the bit.
    if not chunks and not decodes:
        decodes = 1
    n = len(chunks) + decodes
    new = np.array([1] * decodes + [c for c, _ in chunks], dtype=np.int64)
    before = np.array([context] * decodes + [b for _, b in chunks], dtype=np.int64)
    out = SchedulerOutput(
        req_indices=np.arange(n),
        num_scheduled_tokens=new,
        num_draft_tokens=np.zeros(n, dtype=np.int64),
        num_computed_before=before,
        num_prefill_tokens=int(new[decodes:].sum()),
        num_decode_tokens=decodes,
        kv_tokens_read=int(before.sum()),
    )
    engine = EngineConfig(tp=tp, sim_profile=profile)
    cost = build_cost_model(GPUS[gpu], MODELS[model], engine)
    from_arrays = cost.steps_parts_s(out, [out.kv_tokens_read], [0])[0]
    assert cost.step_parts_s(out).tolist() == from_arrays.tolist()
    # The prefill share from totals equals the share from the decode-only sub-step's arrays.
    decoding = (before > 0) & (new == 1)
    alone = SchedulerOutput(
        req_indices=out.req_indices[decoding],
        num_scheduled_tokens=new[decoding],
        num_draft_tokens=np.zeros(int(decoding.sum()), dtype=np.int64),
        num_computed_before=before[decoding],
        num_prefill_tokens=0,
        num_decode_tokens=decodes,
        kv_tokens_read=int(before[decoding].sum()),
    )
    want = 0.0
    if out.num_prefill_tokens and decodes:
        alone_s = cost.steps_parts_s(alone, [alone.kv_tokens_read], [0])[0].sum()
        want = max(0.0, float(from_arrays.sum()) - float(alone_s))
    assert cost.prefill_share_s(out) == want


# Peaks that make a step's roofline compute-bound (endless bandwidth) or memory-bound (endless
# FLOP/s), so its "ideal" part shows the FLOPs or the bytes the engine model counts.
ALL_COMPUTE = Hardware("compute-bound", 10**12, 1e18, 1e12)
ALL_MEMORY = Hardware("memory-bound", 10**12, 1e10, 1e18)
LAB20 = MODELS["lab-llama-20m"]


def test_the_lm_head_runs_once_per_prompt_in_a_prefill_not_at_every_prompt_token():
    # vLLM samples a prefill chunk's last position only: 80% of lab-llama-20m's weights (its
    # 32k-vocabulary embedding and LM head) are not multiplied through by the other 1,023.
    model = EngineModel(ALL_COMPUTE, LAB20, EngineConfig())
    ideal = model.step_parts_s(mixed_out([1024], decodes=0, context=0))[IDEAL]
    flops = 2 * (layer_params(LAB20) * 1024 + lm_head_params(LAB20) * 1)
    assert ideal == pytest.approx(flops / 1e12)
    assert layer_params(LAB20) == pytest.approx(LAB20.params - 2 * 32000 * 256)
    # Two prompts: two sampled positions; verifying 3 drafts of 4 sequences: 4 x 4.
    two = model.step_parts_s(mixed_out([512, 512], decodes=0, context=0))[IDEAL]
    assert two == pytest.approx(flops / 1e12 + 2 * lm_head_params(LAB20) / 1e12)
    verify = model.step_parts_s(decode_out(4, 100, drafts=3))
    sampled = 2 * (layer_params(LAB20) + lm_head_params(LAB20)) * 16 / 1e12
    assert verify[IDEAL] + verify[SPECULATION] == pytest.approx(sampled)


def test_a_decode_step_reads_the_embedding_rows_of_its_tokens_and_the_whole_lm_head():
    untied = EngineModel(ALL_MEMORY, LAB20, EngineConfig())
    ideal = untied.step_parts_s(decode_out(1, 0))[IDEAL]
    table = 32000 * 256
    assert ideal == pytest.approx((LAB20.params - table + 256) * 2 / 1e10)
    # A tied model's LM head reads the one table whole: nothing is left unread.
    qwen = MODELS["qwen2.5-0.5b"]
    tied = EngineModel(ALL_MEMORY, qwen, EngineConfig()).step_parts_s(decode_out(1, 0))[IDEAL]
    assert tied == pytest.approx(qwen.params * 2 / 1e10)
    # The ideal profile keeps the predictor's count (every weight read, every token multiplied).
    roofline = RooflineCostModel(ALL_MEMORY, LAB20, EngineConfig()).step_time_s(decode_out(1, 0))
    assert roofline == pytest.approx(LAB20.params * 2 / 1e10)


def test_a_cpus_linear_layers_add_their_reads_and_math_where_a_gpu_overlaps_them():
    from labs.sim.engine_model import linear_s

    cpu = Hardware("cpu", 10**10, 3.4e10, 2e11)
    assert linear_s(cpu, 0.002, 0.003) == pytest.approx(0.005)
    assert linear_s(H100, 0.002, 0.003) == 0.003
    # So on a CPU a step of eight decoding sequences costs their math on top of the reads.
    model = EngineModel(cpu, LAB20, EngineConfig())
    one, eight = model.step_time_s(decode_out(1, 100)), model.step_time_s(decode_out(8, 100))
    assert eight - one > 2 * (layer_params(LAB20) + lm_head_params(LAB20)) * 7 / 2e11
