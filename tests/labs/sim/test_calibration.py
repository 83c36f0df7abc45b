"""Every cited vLLM measurement of labs/sim/calibration.yaml, replayed on the simulator.

Virtual time only, so the numbers are the same on any machine: fitted runs within 10%, held-out
runs (which no fit saw) within 20%. Excluded runs are printed with their reason, not asserted.
Run with -s to see the table (`python -m labs.sim.published_calibration --report` prints it by GPU
kind).
"""

from __future__ import annotations

import math
import statistics

import pytest

from labs.catalog import GPUS
from labs.sim.engine_model import load_calibration
from labs.sim.published_calibration import (
    TOLERANCE,
    fit,
    format_report,
    format_table,
    held_out_errors,
    load_measurements,
    relative_error,
    simulate,
)


@pytest.fixture(scope="module")
def table() -> list:
    rows = [(m, simulate(m)) for m in load_measurements()]
    print("\n" + format_table(rows))
    return rows


def test_every_published_run_is_reproduced_within_its_tolerance(table):
    misses = [
        f"{m.id} ({m.role}): published {m.published:g}, simulated {sim:g}"
        for m, sim in table
        if m.role in TOLERANCE and abs(relative_error(sim, m.published)) > TOLERANCE[m.role]
    ]
    assert not misses, "\n".join(misses)


def test_the_runs_cover_four_gpus_models_tensor_parallelism_batch_1_and_high_concurrency():
    runs = load_measurements()
    asserted = [m for m in runs if m.role in TOLERANCE]
    assert len(runs) >= 12
    assert sum(m.role == "held_out" for m in runs) >= 4
    assert all(m.role in (*TOLERANCE, "excluded") for m in runs)
    assert all(m.excluded_because for m in runs if m.role == "excluded")
    gpus = {m.settings["gpu"] for m in asserted}
    assert gpus <= set(GPUS) and len(gpus) >= 4
    models = {(m.settings["model"], m.settings.get("params_b")) for m in asserted}
    assert len(models) >= 3
    assert any(m.settings.get("tp", 1) >= 2 for m in asserted)
    assert any(m.settings.get("max_concurrency") == 1 for m in asserted)
    # High-concurrency throughput: at least one asserted run with 64+ requests in flight.
    assert any(
        (m.settings.get("max_concurrency") or 0) >= 64 and m.metric == "output_tokens_per_s"
        for m in asserted
    )
    assert all(m.source.strip() and m.engine.strip() for m in runs)


def test_the_report_lists_every_catalog_gpu_with_its_runs_or_what_it_borrows(table):
    report = format_report(table)
    print("\n" + report)
    calibration = load_calibration()
    for name in GPUS:
        (line,) = [row for row in report.splitlines() if f"({name})" in row]
        gpu = calibration.gpus[name]
        if gpu.calibrated:
            runs = [m for m, _ in table if m.settings["gpu"] == name and m.role in TOLERANCE]
            assert any(m.role == "held_out" for m in runs), f"{name} has no held-out run"
            assert any(m.role == "fit" for m in runs), f"{name} has no fitted run"
            assert all(f"    {m.id} " in report for m in runs)
        else:
            assert "not calibrated" in line and gpu.borrows and gpu.borrows in line
    errors = held_out_errors(table)
    assert f"median |error| {statistics.median(errors):.1%}" in report
    moved = sum(m.moved_after_seen for m, _ in table)
    assert f"{moved} of them moved out of fit/held-out after being simulated" in report


def test_six_catalog_gpu_kinds_are_calibrated_and_h100_pcie_and_l40s_say_what_they_borrow():
    calibration = load_calibration()
    calibrated = {name for name in GPUS if calibration.gpus[name].calibrated}
    assert calibrated == {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "l4", "b200"}
    for name in set(GPUS) - calibrated:
        assert calibration.gpus[name].borrows


def test_a_gpu_kinds_own_fit_moves_only_its_constants_against_only_its_fit_runs():
    values, loss = fit(rounds=0, log=lambda _: None, gpu="l4")
    assert values and all(path.startswith("gpus.l4.") for path in values)
    own = [m for m in load_measurements() if m.role == "fit" and m.settings["gpu"] == "l4"]
    assert [m.id for m in own] == ["L1", "L2"]
    expected = sum((math.log(simulate(m) / m.published)) ** 2 for m in own)
    assert loss == pytest.approx(expected)
    with pytest.raises(ValueError):
        fit(rounds=0, log=lambda _: None, gpu="no-such-gpu")
