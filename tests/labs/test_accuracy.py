"""The error a learner should expect (labs/accuracy.py): per GPU kind and kind of figure, from
the saved leave-one-source-out errors."""

from __future__ import annotations

import pytest

from labs.accuracy import (
    ACCURACY_PATH,
    NOT_CALIBRATED,
    RunError,
    expected_error,
    expected_errors,
    figure_kind,
    load_errors,
)
from labs.catalog import GPUS
from labs.sim.engine_model import load_calibration

RUNS = (
    RunError("A", "h200", "TPOT", "V1", "s1", 0.30),
    RunError("B", "h200", "TPOT", "V1", "s1", -0.10),
    RunError("C", "b200", "TTFT", "V1", "s2", 0.07),
    RunError("D", "h100-sxm", "TTFT", "unknown", "s3", 0.35),
    RunError("E", "a100-80gb", "TPOT", "V0", "s4", -0.16),
    RunError("F", "b200", "TPOT", "V1", "s2", -0.04),
)


def test_a_gpus_own_runs_give_its_figure():
    estimate = expected_error("h200", "TPOT", RUNS)
    assert estimate is not None and estimate.own_gpu
    assert (estimate.runs, estimate.median, estimate.worst) == (2, pytest.approx(0.2), 0.30)
    assert estimate.line() == (
        "TPOT: within about ±20% on published runs like this (worst +30%; 2 runs on this GPU)"
    )


def test_without_own_runs_of_a_kind_the_v1_runs_of_every_gpu_are_used_never_older_engines():
    ttft = expected_error("h200", "TTFT", RUNS)
    assert ttft is not None and not ttft.own_gpu
    assert (ttft.runs, ttft.worst) == (1, 0.07)  # the unknown-version run is not a V1 run
    assert "none on this GPU; 1 V1 run on others" in ttft.line()
    # A V0 run is never the figure, even on its own GPU.
    tpot = expected_error("a100-80gb", "TPOT", RUNS)
    assert tpot is not None and not tpot.own_gpu and tpot.runs == 3
    # An unknown-version run on the GPU itself counts as its own evidence.
    own = expected_error("h100-sxm", "TTFT", RUNS)
    assert own is not None and own.own_gpu and own.worst == 0.35
    assert expected_error("h200", "E2E", RUNS) is None


def test_predicted_keys_map_to_kinds_of_figure():
    assert figure_kind("loaded_ttft_s") == figure_kind("ttft_s") == "TTFT"
    assert figure_kind("tpot_s") == "TPOT"
    assert figure_kind("loaded_e2e_s") == "E2E"
    assert figure_kind("output_tokens_per_s") == figure_kind("requests_per_s") == "throughput"
    assert figure_kind("kv_capacity_tokens") is None


def test_a_calibrated_gpu_names_its_own_evidence_and_one_line_per_kind_shown():
    fitted, held_out = load_calibration().gpu_runs["h200"]
    shown = expected_errors(GPUS["h200"], ("ttft_s", "tpot_s", "kv_capacity_tokens"))
    assert shown.provenance == (
        f"H200 · calibrated to {fitted} published vLLM runs, checked against {held_out} more"
    )
    assert [line.split(":")[0] for line in shown.lines] == ["TTFT", "TPOT"]
    assert "on this GPU)" in shown.lines[1]  # R1 and R2, each predicted without its source
    assert all("within about ±" in line for line in shown.lines)


def test_an_uncalibrated_gpu_gives_no_error_estimate():
    for name in ("l40s", "h100-pcie", "a100-80gb"):
        shown = expected_errors(GPUS[name], ("ttft_s", "tpot_s"))
        assert shown.lines == (NOT_CALIBRATED,)
        assert "borrowed" in shown.provenance


def test_every_calibrated_gpu_has_saved_errors_of_its_own():
    calibrated = {n for n, g in load_calibration().gpus.items() if g.calibrated and n in GPUS}
    assert calibrated <= {r.gpu for r in load_errors() if r.engine != "V0"}


def test_the_page_reads_what_the_report_writes():
    from labs.sim.published_calibration import ACCURACY_PATH as written

    assert written == ACCURACY_PATH
