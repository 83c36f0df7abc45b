"""`python manage.py lab run --backend sim`: JSON keys, the table, and one-line errors."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from labs.prediction.predict import Prediction
from tests.cli import Completed, manage
from tests.labs.vllm.conftest import _idle_fakes, fake_server  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
MEASURED_KEYS = {
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "output_tokens_per_s",
    "requests_per_s",
    "max_running_seqs",
    "preemptions",
    "kv_usage_peak",
    "prefix_cache_hit_rate",
    "spec_acceptance_rate",
    "simulated_s",
    "wall_s",
}
STATS = {"mean", "p50", "p90", "p95", "p99"}
SMALL = ("--num-prompts", "20", "--prompt-tokens", "256", "--output-tokens", "32")

# `lab predict` and `lab run` read the device calibrations stored in the database.
pytestmark = pytest.mark.django_db


def lab_run(*options: str) -> Completed:
    return manage("lab", "run", *options)


def run_json(*options: str) -> dict:
    out = StringIO()
    call_command("lab", "run", *options, "--json", stdout=out)
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_it_prints_one_json_object_with_the_issues_keys():
    done = lab_run("--backend", "sim", *SMALL, "--request-rate", "50", "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["backend"] == "sim"
    assert result["where"].startswith("simulated on CPU as H100 SXM (calibrated to ")
    assert set(result["measured"]) >= MEASURED_KEYS
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(result["measured"][key]) == STATS
    assert result["measured"]["completed"] == 20
    # The one prediction every page shows (labs.prediction.predict.lab_prediction): every
    # Prediction field, the rates the table compares and the predicted breakdown.
    assert set(result["predicted"]) >= {f.name for f in Prediction.__dataclass_fields__.values()}
    assert result["predicted"]["breakdown"]["e2e_s"]["total"] == result["predicted"]["loaded_e2e_s"]


def test_every_option_of_the_issue_reaches_the_simulator():
    result = run_json(
        *SMALL,
        "--max-concurrency",
        "4",
        "--shared-prefix-tokens",
        "128",
        "--kv-allocation",
        "paged",
        "--no-chunked-prefill",
        "--prefix-caching",
        "--kv-capacity-tokens",
        "4096",
        "--spec-tokens",
        "3",
        "--goodput",
        "ttft:1000",
        "tpot:50",
        "--seed",
        "7",
    )
    m = result["measured"]
    assert m["max_running_seqs"] == 4  # the closed loop's limit
    assert m["prefix_cache_hit_rate"] > 0
    assert m["spec_acceptance_rate"] > 0
    assert m["goodput_requests_per_s"] is not None
    assert result["predicted"]["kv_capacity_tokens"] == 4096


def test_same_options_same_output_except_wall_time():
    first, second = run_json(*SMALL, "--seed", "5"), run_json(*SMALL, "--seed", "5")
    for result in (first, second):
        result["measured"].pop("wall_s")
    assert first == second


def test_it_prints_a_table_labelled_simulated_without_json():
    out = StringIO()
    call_command("lab", "run", *SMALL, stdout=out)
    text = out.getvalue()
    assert "simulated on CPU" in text
    assert "TTFT" in text and " ms" in text and "predicted" in text
    # The run page's words for why they differ, and its reading, from the same functions.
    assert "predicted under this load: concurrency 20, max_num_seqs 256, 20 prompts" in text
    why = text.split("why they differ (measured vs predicted):\n", 1)[1]
    assert "  TPOT, mean: " in why and "\nreading: " in why
    assert "differs most" in why.split("\nreading: ", 1)[1]


@pytest.mark.parametrize(
    ("options", "option"),
    [
        (["--num-prompts", "0"], "--num-prompts"),
        (["--request-rate", "-1"], "--request-rate"),
        (["--kv-allocation", "ring"], "--kv-allocation"),
        (["--kv-capacity-tokens", "100"], "--kv-capacity-tokens"),
        (["--goodput", "latency:5"], "--goodput"),
        (["--backend", "tpu"], "--backend"),
    ],
)
def test_bad_options_are_one_line_naming_the_option_and_exit_status_2(options, option):
    done = lab_run(*options, "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert option in lines[0]


def test_call_command_raises_command_error_with_status_2():
    with pytest.raises(CommandError) as error:
        call_command("lab", "run", "--kv-capacity-tokens", "100")
    assert error.value.returncode == 2
    assert "--kv-capacity-tokens" in str(error.value)


def test_a_backend_that_cannot_start_is_one_line_with_status_1(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_EXECUTABLE", "/nonexistent/vllm")
    # Its own cache: the manager stops a server the shared one records as left by a killed
    # worker, which on a shared machine may be another session's running vLLM.
    monkeypatch.setenv("LABS_VLLM_CACHE_DIR", str(tmp_path / "vllm-cache"))
    result = lab_run("--backend", "vllm", "--num-prompts", "2")
    assert result.returncode == 1
    assert "not installed on this worker" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_prediction_is_for_the_batch_the_run_keeps_in_flight():
    capped = run_json(*SMALL, "--max-concurrency", "8")
    assert capped["predicted"]["running_seqs"] == 8
    assert capped["measured"]["max_running_seqs"] == 8
    all_at_once = run_json(*SMALL, "--max-concurrency", "32")  # only 20 prompts to send
    assert all_at_once["predicted"]["running_seqs"] == 20
    assert all_at_once["measured"]["max_running_seqs"] == 20
    given = run_json(*SMALL, "--max-concurrency", "32", "--concurrency", "4")
    assert given["predicted"]["running_seqs"] == 4


def test_the_json_says_where_the_time_went_and_the_profile_switches_the_engine_model():
    realistic = run_json(*SMALL, "--max-concurrency", "4")
    ideal = run_json(*SMALL, "--max-concurrency", "4", "--sim-profile", "ideal")
    assert ideal["where"].endswith("ideal hardware (roofline, no overheads)")
    for result in (realistic, ideal):
        section = result["breakdown"]["e2e_s"]
        assert section["total"] == pytest.approx(result["measured"]["e2e_s"]["mean"], rel=0.01)
        assert result["breakdown"]["source"] == "simulated"
    assert realistic["breakdown"]["tpot_s"]["parts"]["overhead"] > 0
    assert ideal["breakdown"]["tpot_s"]["parts"]["overhead"] == 0
    assert realistic["measured"]["tpot_s"]["mean"] > ideal["measured"]["tpot_s"]["mean"]


def test_a_bad_profile_is_refused_naming_the_option():
    out = StringIO()
    with pytest.raises(CommandError, match="sim_profile must be one of realistic, ideal"):
        call_command("lab", "run", *SMALL, "--sim-profile", "fast", stdout=out)
