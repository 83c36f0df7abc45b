"""`python manage.py lab predict`: the interface scripts use, run as a script runs it
(tests/cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from labs.prediction.predict import Prediction
from tests.cli import Completed, manage

ROOT = Path(__file__).resolve().parents[2]
PREDICTION_KEYS = {f.name for f in fields(Prediction)}

# `lab predict` and `lab run` read the device calibrations stored in the database.
pytestmark = pytest.mark.django_db


def lab_predict(*options: str) -> Completed:
    return manage("lab", "predict", *options)


def predict_json(*options: str) -> dict[str, object]:
    out = StringIO()
    call_command("lab", "predict", *options, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_it_prints_one_json_object_with_the_issues_keys():
    done = lab_predict(
        "--model", "llama-3-8b", "--prompt-tokens", "700", "--output-tokens", "300", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1
    result = json.loads(done.stdout)
    # Every key of the prediction (test_predict checks that these include the issue's), and what
    # the run page compares beside them: the one prediction
    # (labs.prediction.predict.lab_prediction).
    assert set(result) == PREDICTION_KEYS | {"prefix_hit_rate", "breakdown"}
    assert result["breakdown"]["ttft_s"]["total"] == result["loaded_ttft_s"]
    # The seed numbers come through the command unchanged.
    assert result["kv_bytes_per_token"] == 128 * 1024
    assert (result["blocks_per_seq"], result["slots_wasted_per_seq"]) == (63, 8)
    assert (result["contiguous_reserved_slots"], result["contiguous_wasted_slots"]) == (2748, 1748)
    assert result["bound"] == "memory-bandwidth"


def test_it_prints_a_table_with_units_without_json():
    done = lab_predict("--concurrency", "32", "--context-tokens", "2048")
    assert done.returncode == 0, done.stderr
    assert "KiB" in done.stdout and "GiB" in done.stdout
    assert " ms" in done.stdout and "tokens/s" in done.stdout
    assert "memory-bandwidth" in done.stdout


@pytest.mark.parametrize(
    ("options", "option", "allowed"),
    [
        (["--block-size", "12"], "--block-size", "power of two between 1 and 256"),
        (["--block-size", "0"], "--block-size", "power of two"),
        (["--prompt-tokens", "-5"], "--prompt-tokens", "whole number between 1"),
        (["--model", "gpt-5"], "--model", "one of llama-3-8b"),
        (["--gpu", "h100"], "--gpu", "one of a100-40gb"),
        (["--acceptance", "1"], "--acceptance", "at least 0 and less than 1"),
        (["--tp", "3"], "--tp", "power of two"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_status_2(options, option, allowed):
    done = lab_predict(*options, "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert option in lines[0] and allowed in lines[0]
    assert "Traceback" not in done.stderr


def test_an_unknown_option_is_also_one_line_and_status_2():
    done = lab_predict("--blocksize", "16")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "manage.py lab predict: error: unrecognized arguments: --blocksize 16 (see --help)"
    ]


@pytest.mark.parametrize(
    ("options", "option"),
    [
        (["--hbm-gb", "0", "--bandwidth-tbs", "2", "--tflops", "100"], "--hbm-gb"),
        (["--acceptance", "-0.5"], "--acceptance"),
        (["--layers", "32"], "--kv-heads"),
        (["--model", "qwen2.5-7b", "--tp", "8"], "--tp"),
        (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
        (["--max-num-seqs", "100000"], "--max-num-seqs"),
    ],
)
def test_call_command_raises_a_command_error_with_status_2(options, option):
    with pytest.raises(CommandError) as caught:
        call_command("lab", "predict", *options)
    assert caught.value.returncode == 2
    assert option in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_custom_model_and_gpu_predict_what_the_catalog_entries_do():
    custom = predict_json(
        *("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--params-b", "8.03"),
        *("--hbm-gb", "80", "--bandwidth-tbs", "3.35", "--tflops", "989"),
    )
    catalog = predict_json("--model", "llama-3-8b", "--gpu", "h100-sxm")
    for key in ("kv_bytes_per_token", "weight_bytes", "kv_capacity_tokens", "tpot_s", "ttft_s"):
        assert custom[key] == pytest.approx(catalog[key])


def test_the_70b_fleet_question_from_the_command_line():
    options = ("--model", "llama-3-70b", "--tp", "4", "--concurrency", "2000")
    result = predict_json(*options, "--context-tokens", "8192")
    fp8 = predict_json(*options, "--context-tokens", "8192", "--kv-dtype", "fp8")
    assert (result["max_concurrent_seqs"], result["gpus_needed"]) == (54, 152)
    assert (fp8["max_concurrent_seqs"], fp8["gpus_needed"]) == (109, 76)


def test_boolean_options_have_a_no_form():
    on = predict_json("--prompt-tokens", "1000", "--shared-prefix-tokens", "512")
    off = predict_json(
        "--prompt-tokens", "1000", "--shared-prefix-tokens", "512", "--no-prefix-caching"
    )
    assert (on["prefix_cached_tokens"], off["prefix_cached_tokens"]) == (512, 0)


def test_it_takes_one_batch_for_prediction_and_run_as_the_lab_page_does():
    """`--max-concurrency 64` alone is the load the run keeps in flight; the lab page's form
    makes it the predictor's concurrency too (align_run_batch), and so does `lab predict`."""
    result = predict_json("--max-concurrency", "64", "--max-num-seqs", "8", "--num-prompts", "96")
    assert result["running_seqs"] == 8
    # 64 in flight on 8 slots wait for earlier waves; with concurrency 1 nothing would wait.
    assert result["queue_wait_s"] > 0
    assert result["loaded_ttft_s"] > result["ttft_s"]


def test_it_predicts_with_no_migrated_database_to_read_calibrations_from(tmp_path):
    import os

    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}"}
    done = subprocess.run(
        [sys.executable, "manage.py", "lab", "predict", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tpot_s"] > 0
