"""labs.parameters.params: one validation place for every lab parameter, from a form, the CLI or
code."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.parameters.params import (
    FIELDS_BY_NAME,
    PARAM_FIELDS,
    ParamError,
    align_run_batch,
    follow_unshown,
    parse_lab_params,
)
from tests.budget import examples

# The names scripts rely on (issue 3 and the simulator's issue 6), spelled exactly.
REQUIRED_NAMES = [
    "model",
    "layers",
    "kv_heads",
    "head_dim",
    "params_b",
    "hidden_size",
    "heads",
    "gpu",
    "hbm_gb",
    "bandwidth_tbs",
    "tflops",
    "tp",
    "weight_dtype",
    "kv_dtype",
    "gpu_memory_utilization",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "concurrency",
    "context_tokens",
    "spec_tokens",
    "acceptance",
    "draft_cost",
    "activation_reserve_gb",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "shared_prefix_tokens",
    "input_range_ratio",
    "output_range_ratio",
    "kv_allocation",
    "chunked_prefill",
    "prefix_caching",
    "kv_capacity_tokens",
    "seed",
    "spec_method",
    "step_overhead_ms",
]


def errors_of(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ParamError) as caught:
        parse_lab_params(data)
    return caught.value.errors


def test_every_parameter_name_is_spelled_as_the_issues_say():
    names = [f.name for f in PARAM_FIELDS]
    assert set(REQUIRED_NAMES) <= set(names)
    assert len(names) == len(set(names))
    assert FIELDS_BY_NAME["block_size"].option == "--block-size"
    assert FIELDS_BY_NAME["gpu_memory_utilization"].option == "--gpu-memory-utilization"


def test_every_field_describes_itself_for_a_form_and_a_parser():
    for f in PARAM_FIELDS:
        assert f.help and f.group in ("model", "hardware", "engine", "workload")
        assert f.allowed()
        if f.kind == "choice":
            assert f.choices and (f.default is None or f.default in f.choices)
        if f.kind in ("int", "float"):
            assert f.minimum is not None and f.maximum is not None


def test_the_defaults_make_a_sensible_lab():
    p = parse_lab_params({})
    assert (p.model.name, p.hardware.name) == ("llama-3-8b", "h100-sxm")
    e = p.engine
    assert (e.weight_dtype, e.kv_dtype, e.block_size, e.tp) == ("bf16", "auto", 16, 1)
    assert e.gpu_memory_utilization == 0.9
    assert (e.max_num_seqs, e.max_num_batched_tokens) == (256, 2048)
    assert e.activation_reserve_bytes == 0
    assert e.spec_method == "none" and e.spec_tokens == 0
    assert p.workload.context_tokens == p.workload.prompt_tokens + p.workload.output_tokens
    assert p.workload.request_rate is None


def test_it_accepts_form_strings_and_native_values_alike():
    from_form = parse_lab_params(
        {"block_size": " 32 ", "acceptance": "0.6", "tp": "2", "gpu": "H200", "seed": "7"}
    )
    native = parse_lab_params(
        {"block_size": 32, "acceptance": 0.6, "tp": 2.0, "gpu": "h200", "seed": 7}
    )
    assert from_form == native
    assert from_form.engine.block_size == 32 and from_form.hardware.name == "h200"


def test_empty_strings_and_none_mean_the_default():
    assert parse_lab_params({"block_size": "", "model": None}) == parse_lab_params({})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("on", True),
        ("yes", True),
        (1, True),
        (True, True),
        ("false", False),
        ("0", False),
        ("Off", False),
        ("no", False),
        (0, False),
        (False, False),
    ],
)
def test_booleans_accept_the_usual_spellings(raw, expected):
    assert parse_lab_params({"chunked_prefill": raw}).engine.chunked_prefill is expected


def test_the_block_size_message_names_the_field_and_what_is_allowed():
    assert errors_of({"block_size": 12}) == {
        "block_size": "block_size must be a power of two between 1 and 256, got 12"
    }


@pytest.mark.parametrize(
    ("name", "raw", "allowed"),
    [
        ("block_size", 0, "power of two between 1 and 256"),
        ("block_size", 512, "power of two between 1 and 256"),
        ("block_size", "16.5", "power of two"),
        ("prompt_tokens", -5, "whole number between 1 and 10,000,000"),
        ("prompt_tokens", 0, "whole number between 1"),
        ("prompt_tokens", 10**40, "whole number"),
        ("prompt_tokens", "1e400", "whole number"),
        ("prompt_tokens", "lots", "whole number"),
        ("prompt_tokens", True, "whole number"),
        ("prompt_tokens", [1000], "whole number"),
        ("max_num_seqs", 3.5, "whole number"),
        ("gpu_memory_utilization", 0, "greater than 0 and at most 1"),
        ("gpu_memory_utilization", 1.2, "greater than 0 and at most 1"),
        ("gpu_memory_utilization", float("nan"), "greater than 0"),
        ("gpu_memory_utilization", "inf", "greater than 0"),
        ("acceptance", 1, "at least 0 and less than 1"),
        ("acceptance", -0.1, "at least 0 and less than 1"),
        ("acceptance", "NaN", "less than 1"),
        ("tp", 3, "power of two between 1 and 64"),
        ("tp", 128, "power of two between 1 and 64"),
        ("model", "gpt-5", "one of llama-3-8b"),
        ("model", 7, "one of llama-3-8b"),
        ("gpu", "h100", "one of a100-40gb"),
        ("weight_dtype", "fp4", "one of bf16, fp16, fp8, int8, int4"),
        ("kv_dtype", "bf16", "one of auto, fp8"),
        ("kv_allocation", "slab", "one of paged, contiguous"),
        ("spec_method", "medusa", "one of none, draft_model, eagle, ngram"),
        ("chunked_prefill", "maybe", "true or false"),
        ("chunked_prefill", 2, "true or false"),
        ("request_rate", 0, "greater than 0"),
        ("request_rate", "-inf", "greater than 0"),
        ("seed", -1, "whole number between 0"),
        ("hbm_gb", -80, "greater than 0"),
    ],
)
def test_bad_values_get_a_message_naming_the_field_and_the_allowed_values(name, raw, allowed):
    errors = errors_of({name: raw})
    assert list(errors) == [name] or name in errors
    assert errors[name].startswith(f"{name} must be ")
    assert allowed in errors[name]


def test_all_bad_fields_are_reported_at_once():
    errors = errors_of({"block_size": 3, "tp": 0, "gpu": "x"})
    assert set(errors) == {"block_size", "tp", "gpu"}
    assert str(ParamError(errors)).count(";") == 2


def test_unknown_parameters_are_reported_unless_ignored():
    assert errors_of({"blocksize": 16}) == {"blocksize": "blocksize is not a lab parameter"}
    params = parse_lab_params({"csrfmiddlewaretoken": "x", "block_size": 32}, ignore_unknown=True)
    assert params.engine.block_size == 32


def test_a_non_mapping_is_a_param_error():
    with pytest.raises(ParamError):
        parse_lab_params(["block_size", 16])  # type: ignore[arg-type]


def test_param_error_is_a_value_error_with_a_dict_of_messages():
    error = ParamError({"tp": "tp must be ..."})
    assert isinstance(error, ValueError)
    assert error.errors == {"tp": "tp must be ..."}


def test_a_custom_model_comes_from_its_four_numbers():
    p = parse_lab_params({"layers": 40, "kv_heads": 8, "head_dim": 128, "params_b": 13})
    assert p.model.name == "custom"
    assert (p.model.layers, p.model.kv_heads, p.model.head_dim) == (40, 8, 128)
    assert p.model.params == 13e9
    # Unset heads mean plain multi-head attention: one query head per KV head.
    assert p.model.heads == 8 and p.model.hidden_size == 8 * 128


def test_a_custom_model_needs_all_four_numbers():
    errors = errors_of({"layers": 40, "kv_heads": 8})
    assert set(errors) == {"head_dim", "params_b"}
    assert "head_dim is required for a custom model" in errors["head_dim"]


def test_a_catalog_model_and_custom_numbers_together_are_refused():
    errors = errors_of({"model": "llama-3-8b", "layers": 40})
    assert set(errors) == {"model"}
    assert "layers" in errors["model"]


def test_custom_heads_must_group_evenly_over_kv_heads():
    data = {"layers": 4, "kv_heads": 3, "head_dim": 64, "params_b": 1, "heads": 8}
    assert set(errors_of(data)) == {"heads"}


def test_a_custom_gpu_comes_from_its_three_numbers():
    p = parse_lab_params({"hbm_gb": 96, "bandwidth_tbs": "4", "tflops": 500})
    assert p.hardware.name == "custom"
    assert p.hardware.hbm_bytes == 96 * 10**9
    assert p.hardware.bandwidth_bytes_per_s == 4e12
    assert p.hardware.bf16_flops_per_s == 500e12
    assert set(errors_of({"hbm_gb": 96})) == {"bandwidth_tbs", "tflops"}
    assert set(errors_of({"gpu": "l4", "tflops": 500})) == {"gpu"}


def test_tp_must_divide_the_models_attention_heads():
    # Qwen2.5-7B has 28 query heads: 8 GPUs cannot split them evenly.
    errors = errors_of({"model": "qwen2.5-7b", "tp": 8})
    assert errors["tp"].startswith("tp must divide qwen2.5-7b's 28 attention heads")
    assert parse_lab_params({"model": "qwen2.5-7b", "tp": 4}).engine.tp == 4


def test_the_token_budget_must_cover_max_num_seqs():
    errors = errors_of({"max_num_seqs": 512, "max_num_batched_tokens": 256})
    assert "at least max_num_seqs (512)" in errors["max_num_batched_tokens"]


def test_without_chunked_prefill_the_budget_must_hold_the_longest_prompt():
    data = {"chunked_prefill": "off", "prompt_tokens": 3000, "model": "llama-3.1-8b"}
    assert "longest prompt (3,000 tokens)" in errors_of(data)["max_num_batched_tokens"]
    assert parse_lab_params({**data, "chunked_prefill": "on"}).engine.chunked_prefill


def test_max_tokens_must_let_the_longest_output_finish():
    errors = errors_of({"output_tokens": 1000, "output_range_ratio": 0.5, "max_tokens": 1200})
    assert "longest output (1,500 tokens)" in errors["max_tokens"]


def test_prompt_and_max_tokens_must_fit_the_models_context():
    errors = errors_of({"model": "llama-3-8b", "prompt_tokens": 8000})
    assert "context of 8,192 tokens" in errors["max_tokens"]
    assert parse_lab_params({"model": "llama-3.1-8b", "prompt_tokens": 8000})


def test_the_shared_prefix_must_fit_in_the_shortest_prompt():
    errors = errors_of(
        {"prompt_tokens": 1000, "input_range_ratio": 0.5, "shared_prefix_tokens": 600}
    )
    assert "shortest prompt (500 tokens)" in errors["shared_prefix_tokens"]


def test_speculation_defaults_to_a_draft_model_when_tokens_are_given():
    engine = parse_lab_params({"spec_tokens": 3}).engine
    assert (engine.spec_method, engine.spec_tokens, engine.draft_cost) == ("draft_model", 3, 0.1)
    assert parse_lab_params({"spec_tokens": 4, "spec_method": "ngram"}).engine.draft_cost == 0
    assert parse_lab_params({"spec_tokens": 3, "draft_cost": 0.2}).engine.draft_cost == 0.2


def test_speculation_settings_must_agree():
    assert "must be 0" in errors_of({"spec_method": "none", "spec_tokens": 3})["spec_tokens"]
    assert "at least 1" in errors_of({"spec_method": "eagle"})["spec_tokens"]


@pytest.mark.parametrize("raw", ["inf", "Infinity", float("inf"), None, ""])
def test_an_infinite_request_rate_means_all_at_once(raw):
    assert parse_lab_params({"request_rate": raw}).workload.request_rate is None


def test_units_are_converted_once_here():
    e = parse_lab_params({"step_overhead_ms": 2.5, "activation_reserve_gb": "1.5"}).engine
    assert e.step_overhead_s == 0.0025
    assert e.activation_reserve_bytes == 1_500_000_000


# -- properties --------------------------------------------------------------------------------

_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(["16", "0.5", "on", "nan", "-1", "1e9", "custom", "h100-sxm", "qwen2.5-7b"]),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.sampled_from([f.name for f in PARAM_FIELDS]), _ANY_VALUE, max_size=6))
def test_any_input_gives_params_or_a_param_error_and_nothing_else(data):
    try:
        params = parse_lab_params(data)
    except ParamError as error:
        assert error.errors
        for name, message in error.errors.items():
            assert name in message
    else:
        assert params.as_dict()


_VALID = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"]),
        "gpu": st.sampled_from(["a100-80gb", "h100-sxm", "h200", "l40s"]),
        "tp": st.sampled_from([1, 2, 4, 8]),
        "kv_dtype": st.sampled_from(["auto", "fp8"]),
        "weight_dtype": st.sampled_from(["bf16", "fp8", "int4"]),
        "block_size": st.sampled_from([8, 16, 32, 64]),
        "prompt_tokens": st.integers(1, 2000),
        "output_tokens": st.integers(1, 2000),
        "concurrency": st.integers(1, 5000),
        "spec_tokens": st.integers(0, 8),
        "acceptance": st.floats(0, 0.99),
        "request_rate": st.one_of(st.none(), st.floats(0.1, 100)),
        "chunked_prefill": st.booleans(),
        "seed": st.integers(0, 2**32 - 1),
    },
)


@settings(max_examples=examples(200), deadline=None)
@given(_VALID)
def test_as_dict_is_json_and_parses_back_to_the_same_params(data):
    params = parse_lab_params(data)
    values = params.as_dict()
    assert set(values) == set(FIELDS_BY_NAME)
    again = parse_lab_params(json.loads(json.dumps(values)))
    assert again == params
    assert again.as_dict() == values
    assert all(not isinstance(v, float) or math.isfinite(v) for v in values.values())


@pytest.mark.parametrize(
    ("given", "concurrency", "max_concurrency"),
    [
        ({"num_prompts": "50"}, 50, None),  # neither: every prompt in flight
        ({"num_prompts": "50", "max_concurrency": "8"}, 8, 8),  # the run's cap sets the batch
        ({"num_prompts": "5", "max_concurrency": "8"}, 5, 8),  # but never more than the prompts
        ({"num_prompts": "50", "concurrency": "4"}, 4, 4),  # the prediction's batch caps the run
        ({"concurrency": "4", "max_concurrency": "16"}, 4, 16),  # both given: as given
    ],
)
def test_the_prediction_and_the_run_share_one_batch(given, concurrency, max_concurrency):
    params = parse_lab_params(align_run_batch(given))
    assert params.workload.concurrency == concurrency
    assert params.workload.max_concurrency == max_concurrency


def test_aligning_the_batch_leaves_bad_values_for_the_parser_to_name():
    with pytest.raises(ParamError) as info:
        parse_lab_params(align_run_batch({"max_concurrency": "many"}))
    assert set(info.value.errors) == {"max_concurrency"}


def test_a_derived_context_tokens_above_its_maximum_is_refused_naming_it():
    custom = {"layers": 32, "kv_heads": 8, "head_dim": 128, "params_b": 8}
    data = {
        **custom,
        "prompt_tokens": 9_000_000,
        "output_tokens": 2_000_000,
        "max_tokens": 2_000_000,
    }
    with pytest.raises(ParamError) as info:
        parse_lab_params(data)
    assert (
        "context_tokens (unset: prompt_tokens + output_tokens = 11,000,000)"
        in (info.value.errors["context_tokens"])
    )
    # At the maximum it is accepted, and what is saved parses again (as the worker does).
    ok = parse_lab_params({**data, "prompt_tokens": 8_000_000})
    assert parse_lab_params(ok.as_dict()) == ok


# -- settings a lab does not show follow the ones it does ---------------------------------------

BATCHING_SHOWN = {"max_num_seqs", "concurrency", "num_prompts", "prompt_tokens", "output_tokens"}


def test_a_hidden_max_tokens_follows_a_longer_output():
    data = {"output_tokens": "1000", "max_tokens": "512", "prompt_tokens": "512"}
    with pytest.raises(ParamError) as refused:
        parse_lab_params(data)
    assert set(refused.value.errors) == {"max_tokens"}
    followed = follow_unshown(data, BATCHING_SHOWN)
    assert followed["max_tokens"] == 1000
    assert parse_lab_params(followed).values["max_tokens"] == 1000


def test_a_hidden_max_tokens_covers_the_longest_output_of_a_range():
    data = {"output_tokens": "1000", "output_range_ratio": "0.5", "max_tokens": "512"}
    assert follow_unshown(data, BATCHING_SHOWN)["max_tokens"] == 1500


def test_a_hidden_max_tokens_leaves_the_prompt_room_in_the_context():
    # llama-3-8b has 8,192 tokens of context: 7,000 + the default 2,048 would not fit.
    data = {"prompt_tokens": "7000", "output_tokens": "100"}
    followed = follow_unshown(data, BATCHING_SHOWN)
    assert followed["max_tokens"] == 1192
    parse_lab_params(followed)


def test_a_shown_setting_is_never_moved():
    data = {"output_tokens": "1000", "max_tokens": "512"}
    assert follow_unshown(data, {*BATCHING_SHOWN, "max_tokens"}) == data


def test_hidden_batch_budget_and_shared_prefix_follow_what_needs_them():
    data = {
        "max_num_seqs": "1024",
        "max_num_batched_tokens": "512",
        "prompt_tokens": "256",
        "shared_prefix_tokens": "1536",
    }
    followed = follow_unshown(data, {"max_num_seqs", "prompt_tokens"})
    assert followed["max_num_batched_tokens"] == 1024
    assert followed["shared_prefix_tokens"] == 256
    parse_lab_params(followed)


def test_bad_values_are_left_for_the_parser_to_name():
    data = {"output_tokens": "lots", "max_tokens": "512"}
    assert follow_unshown(data, BATCHING_SHOWN) == data


def test_a_stored_run_lacking_a_parameter_reads_its_declared_default():
    from labs.parameters.params import param_default, stored_param

    stored = parse_lab_params({"block_size": 32}).as_dict()
    assert stored_param(stored, "block_size") == 32
    for name in ("block_size", "num_prompts", "temperature", "spec_tokens", "chunked_prefill"):
        assert stored_param({}, name) == param_default(name) == stored_param({name: None}, name)
    assert stored_param({"temperature": ""}, "temperature") == param_default("temperature")


def test_the_simulator_defaults_are_the_labs():
    from dataclasses import MISSING, fields

    from labs.parameters.params import EngineConfig
    from labs.sim.scheduler import SchedulerConfig

    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=1, num_gpu_blocks=1)
    engine = EngineConfig()
    same = {
        "block_size": "block_size",
        "chunked_prefill": "chunked_prefill",
        "prefix_caching": "prefix_caching",
        "kv_allocation": "kv_allocation",
        "num_spec_tokens": "spec_tokens",
        "spec_acceptance": "acceptance",
        "spec_draft_share": "draft_share",
    }
    defaulted = {f.name for f in fields(SchedulerConfig) if f.default is not MISSING}
    assert defaulted == set(same)
    assert {mine: getattr(config, mine) for mine in same} == {
        mine: getattr(engine, theirs) for mine, theirs in same.items()
    }
