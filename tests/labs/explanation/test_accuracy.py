"""The errors a learner reads beside each column (labs/explanation/accuracy.py): the simulation's
expected error beside simulated figures, the formulas' own gap beside theirs, from the saved
leave-one-source-out errors, each a median and a worst with its runs and sources counted."""

from __future__ import annotations

import re

import pytest

from labs.explanation.accuracy import (
    ACCURACY_PATH,
    RunError,
    expected_error,
    expected_errors,
    figure_kind,
    load_errors,
)
from labs.parameters.catalog import GPUS
from labs.sim.engine_model import load_calibration

RUNS = (
    RunError("A", "h200", "TPOT", "V1", "s1", 0.30, 2.0),
    RunError("B", "h200", "TPOT", "V1", "s1", -0.10, 0.5),
    RunError("C", "b200", "TTFT", "V1", "s2", 0.07, -0.6),
    RunError("D", "h100-sxm", "TTFT", "unknown", "s3", 0.35, None),
    RunError("E", "a100-80gb", "TPOT", "V0", "s4", -0.16, 0.1),
    RunError("F", "b200", "TPOT", "V1", "s2", -0.04, 0.3),
)
LINE = re.compile(
    r"(TTFT|TPOT|throughput|E2E): median error ±\d+%, worst [+-]\d+% "
    r"\(\d+ runs? from \d+ sources? on (this GPU|every GPU \(V1 engines\))\)"
)


def test_a_gpus_own_runs_give_its_figure_as_a_median_and_a_worst_counted():
    estimate = expected_error("h200", "TPOT", RUNS)
    assert estimate is not None and estimate.own_gpu
    assert (estimate.runs, estimate.sources) == (2, 1)
    assert (estimate.median, estimate.worst) == (pytest.approx(0.2), 0.30)
    assert estimate.line() == (
        "TPOT: median error ±20%, worst +30% (2 runs from 1 source on this GPU)"
    )


def test_without_own_runs_of_a_kind_the_v1_runs_of_every_gpu_are_used_never_older_engines():
    ttft = expected_error("h200", "TTFT", RUNS)
    assert ttft is not None and not ttft.own_gpu
    assert (ttft.runs, ttft.worst) == (1, 0.07)  # the unknown-version run is not a V1 run
    assert "on every GPU (V1 engines)" in ttft.line()
    # A V0 run is never the figure, even on its own GPU.
    tpot = expected_error("a100-80gb", "TPOT", RUNS)
    assert tpot is not None and not tpot.own_gpu and tpot.runs == 3 and tpot.sources == 2
    # An unknown-version run on the GPU itself counts as its own evidence...
    own = expected_error("h100-sxm", "TTFT", RUNS)
    assert own is not None and own.own_gpu and own.worst == 0.35
    # ...unless the GPU is not calibrated by them: then every GPU's V1 runs.
    assert not expected_error("h200", "TPOT", RUNS, own=False).own_gpu
    assert expected_error("h200", "E2E", RUNS) is None


def test_the_formulas_gap_is_their_own_not_the_simulations():
    gap = expected_error("h200", "TPOT", RUNS, formula=True)
    assert gap is not None and (gap.median, gap.worst) == (pytest.approx(1.25), 2.0)
    assert gap.formula_line() == (
        "TPOT: the formulas land a median 125% from published runs, worst +200%"
        " (2 runs from 1 source on this GPU)"
    )
    # Runs the formulas give no figure for are left out of their gap.
    assert expected_error("h100-sxm", "TTFT", RUNS, formula=True).runs == 1


def test_predicted_keys_map_to_kinds_of_figure():
    assert figure_kind("loaded_ttft_s") == figure_kind("ttft_s") == "TTFT"
    assert figure_kind("tpot_s") == "TPOT"
    assert figure_kind("loaded_e2e_s") == "E2E"
    assert figure_kind("output_tokens_per_s") == figure_kind("requests_per_s") == "throughput"
    assert figure_kind("kv_capacity_tokens") is None


def test_a_calibrated_gpu_names_its_evidence_and_each_column_gets_its_own_error():
    fitted, held_out = load_calibration().gpu_runs["h200"]
    shown = expected_errors(GPUS["h200"], ("ttft_s", "tpot_s", "kv_capacity_tokens"))
    assert shown.calibrated and shown.provenance == (
        f"H200 · calibrated to {fitted} published vLLM runs, checked against {held_out} more"
    )
    # The simulation's lines cover what a run shows; the formulas' what the panel predicts.
    assert [line.split(":")[0] for line in shown.simulated] == ["TTFT", "TPOT", "throughput", "E2E"]
    for line in shown.simulated[:2]:
        assert LINE.fullmatch(line) and "on this GPU" in line, line
    assert shown.simulated[3] == "E2E: no published run checks it"
    assert [line.split(":")[0] for line in shown.formula] == ["TTFT", "TPOT"]
    assert all("the formulas land a median" in line for line in shown.formula)
    assert "ms for each other request in flight" in shown.frontend


def test_an_uncalibrated_gpu_gets_every_gpus_figure_and_names_the_gpu_it_borrows_from():
    for name, lender in (
        ("l40s", "A100 40GB SXM"),
        ("h100-pcie", "H100 SXM"),
        ("a100-80gb", "A100 40GB SXM"),
    ):
        shown = expected_errors(GPUS[name], ("ttft_s", "tpot_s"))
        assert not shown.calibrated
        assert f"constants borrowed from {lender}" in shown.provenance
        for line in shown.simulated[:2]:
            assert LINE.fullmatch(line) and "on every GPU (V1 engines)" in line, line


def test_a_gpu_whose_only_published_runs_are_older_says_so_with_their_error():
    saved = {r.id for r in load_errors() if r.gpu == "a100-80gb"}
    assert saved == {"F8", "H6"}
    shown = expected_errors(GPUS["a100-80gb"], ("tpot_s",))
    older = "Its published runs of an older V0 engine (F8, H6) set no constant"
    assert shown.older_runs.startswith(older)
    assert "median" in shown.older_runs
    assert expected_errors(GPUS["h200"], ("tpot_s",)).older_runs == ""


def test_every_calibrated_gpu_has_saved_errors_of_its_own():
    calibrated = {n for n, g in load_calibration().gpus.items() if g.calibrated and n in GPUS}
    assert calibrated <= {r.gpu for r in load_errors() if r.engine != "V0"}
    # ...and the formulas' figure for every run they give one for.
    assert any(r.formula_error is not None for r in load_errors())


def test_the_page_reads_what_the_report_writes():
    from labs.sim.published_calibration import ACCURACY_PATH as written

    assert written == ACCURACY_PATH
