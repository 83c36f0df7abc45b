"""Every cited vLLM measurement of labs/sim/calibration.yaml, replayed on the simulator.

Virtual time only, so the numbers are the same on any machine: fitted runs within 10%, held-out
runs (which no fit saw) within 20%. Excluded runs are printed with their reason, not asserted.
Run with -s to see the table (`python -m labs.sim.published_calibration --report` prints it by GPU
kind).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pytest
import yaml

from labs.parameters.catalog import GPUS
from labs.sim.engine_model import CALIBRATION_PATH, load_calibration, parse_calibration
from labs.sim.published_calibration import (
    ACCURACY_PATH,
    AIMS,
    ROLES,
    SCORED,
    TOLERANCE,
    Fold,
    _set,
    accuracy_records,
    fit,
    fitted_constants,
    fold_data,
    format_constants,
    format_folds,
    format_report,
    format_table,
    held_out_errors,
    leave_one_source_out,
    load_measurements,
    metric_kind,
    out_of_prior,
    relative_error,
    simulate,
    tolerance,
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
        if m.role in TOLERANCE and abs(relative_error(sim, m.published)) > tolerance(m)
    ]
    assert not misses, "\n".join(misses)


def test_the_runs_cover_four_gpus_models_tensor_parallelism_batch_1_and_high_concurrency():
    runs = load_measurements()
    asserted = [m for m in runs if m.role in TOLERANCE]
    assert len(runs) >= 12
    assert sum(m.role == "held_out" for m in runs) >= 4
    assert all(m.role in ROLES for m in runs)
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


def test_five_catalog_gpu_kinds_are_calibrated_and_the_others_say_what_they_borrow():
    calibration = load_calibration()
    calibrated = {name for name in GPUS if calibration.gpus[name].calibrated}
    assert calibrated == {"a100-40gb", "h100-sxm", "h200", "l4", "b200"}
    for name in set(GPUS) - calibrated:
        assert calibration.gpus[name].borrows


def test_a_gpu_kinds_own_fit_moves_only_its_constants_against_only_its_fit_runs():
    values, loss = fit(rounds=0, log=lambda _: None, gpu="l4")
    assert values and all(path.startswith("gpus.l4.") for path in values)
    own = [m for m in load_measurements() if m.role == "fit" and m.settings["gpu"] == "l4"]
    assert [m.id for m in own] == ["L1", "L2", "T5", "T6"]
    expected = sum((math.log(simulate(m) / m.published)) ** 2 for m in own)
    assert loss == pytest.approx(expected)
    with pytest.raises(ValueError):
        fit(rounds=0, log=lambda _: None, gpu="no-such-gpu")


# -- engine versions and leave one source out ---------------------------------------------------


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor.split()[0])


def test_every_run_names_its_source_and_engine_and_no_older_engine_sets_a_constant():
    runs = load_measurements()
    assert all(m.source_id and m.vllm_version for m in runs)
    for m in runs:
        assert m.engine_generation in ("V1", "V0", "unknown"), m.id
        if m.vllm_version != "unknown":
            # vLLM 0.8 made the V1 engine the default; the V1 alpha is 0.7 with VLLM_USE_V1=1.
            v1 = _minor(m.vllm_version) >= (0, 8) or "VLLM_USE_V1=1" in m.vllm_version
            assert (m.engine_generation == "V1") == v1, m.id
        if m.engine_generation == "V0":
            assert m.role in ("v0", "excluded"), m.id
    fitted = {c.path: c for c in fitted_constants(yaml.safe_load(CALIBRATION_PATH.read_text()))}
    fit_runs = {m.id for m in runs if m.role == "fit"}
    for c in fitted.values():
        assert c.fitted_to and set(c.fitted_to) <= fit_runs, c.path
        if c.path.startswith("global."):
            assert c.prior is not None, c.path
    # The fit moves what the YAML says is fitted, and only that.
    values, _ = fit(rounds=0, log=lambda _: None)
    assert set(values) == set(fitted)


def test_a_fold_starts_the_constants_only_its_source_pinned_from_their_prior():
    data = yaml.safe_load(CALIBRATION_PATH.read_text())
    h200_left_out, orphaned = fold_data(data, "prelude-h200")
    assert sorted(orphaned) == [
        "gpus.h200.decode_step_overhead_ms",
        "hosts.prelude-h200.latency_ms",
        "hosts.prelude-h200.per_stream_ms",
    ]
    cal = parse_calibration(h200_left_out)
    assert cal.gpus["h200"].decode_step_overhead_s is None  # the global constant prices it
    # ... and its runs meet the default API server, the median of the other sources' hosts.
    assert "prelude-h200" not in cal.hosts
    assert cal.frontend("prelude-h200") == cal.frontend() != load_calibration().frontend()
    others = [h for h in load_calibration().published_hosts() if h.name != "prelude-h200"]
    assert cal.frontend()[1] == pytest.approx(statistics.median(h.per_stream_s for h in others))
    assert "decode_step_overhead_ms" in data["gpus"]["h200"]  # the file's mapping is untouched
    assert "left_out" not in data["hosts"]["prelude-h200"]
    l4_left_out, orphaned = fold_data(data, "inference-bench-l4")
    assert sorted(orphaned) == [
        "gpus.l4.bandwidth_efficiency",
        "gpus.l4.gemm_efficiency",
        "gpus.l4.gemm_half_tokens",
        "hosts.inference-bench-l4.latency_ms",
        "hosts.inference-bench-l4.per_stream_ms",
    ]
    assert (
        l4_left_out["gpus"]["l4"]["gemm_efficiency"]["value"]
        == data["gpus"]["custom"]["gemm_efficiency"]["value"]
    )
    # F1 and F3 still pin what F2 did; only the source's own host had no other source.
    assert sorted(fold_data(data, "yobitel-concurrency-sweep")[1]) == [
        "hosts.yobitel-h100.latency_ms",
        "hosts.yobitel-h100.per_stream_ms",
    ]


def test_every_fitted_constant_states_the_range_its_physics_allows_and_lies_inside_it():
    data = yaml.safe_load(CALIBRATION_PATH.read_text())
    constants = fitted_constants(data)
    assert constants
    for c in constants:
        assert c.prior_range is not None, f"{c.path} states no prior range"
        assert c.prior_range[0] < c.prior_range[1], c.path
    # Global constants say why beside the value; a GPU's or a host's may share its section's.
    assert all(c.prior_why for c in constants if c.path.startswith("global."))
    assert out_of_prior(data) == []
    report = format_constants(data)
    for c in constants:
        (line,) = [row for row in report.splitlines() if row.strip().startswith(c.path + " ")]
        assert f"[{c.prior_range[0]:g}, {c.prior_range[1]:g}]" in line and "inside" in line
    # A value outside is a model error, and the report says so.
    first = constants[0]
    _set(data, first.path, first.prior_range[1] * 2)
    assert out_of_prior(data) == [
        f"{first.path} = {first.prior_range[1] * 2:.4g}, outside"
        f" [{first.prior_range[0]:g}, {first.prior_range[1]:g}]"
    ]
    assert "OUTSIDE" in format_constants(data)


def test_the_report_opens_with_leave_one_source_out_and_says_whether_the_aims_are_met():
    runs = {m.id: m for m in load_measurements()}
    close = Fold(
        "a",
        (),
        ((runs["T1"], runs["T1"].published * 1.05), (runs["F2"], runs["F2"].published * 1.02)),
    )
    far = Fold(
        "b", (), ((runs["T5"], runs["T5"].published * 0.5),), ("gpus.l4.x = 9, outside [0, 1]",)
    )
    report = format_folds([close, far])
    lines = report.splitlines()
    assert lines[0].startswith("LEAVE ONE SOURCE OUT")
    (ttft,) = [line for line in lines if line.strip().startswith("V1 TTFT: median")]
    assert "worst -50.0% (aim <= 35%)" in ttft and ttft.endswith("NOT MET")
    (tpot,) = [line for line in lines if line.strip().startswith("V1 TPOT: median")]
    assert "median 2.0% (aim <= 8%)" in tpot and tpot.endswith(": MET")
    assert "OUTSIDE ITS PRIOR in this fold: gpus.l4.x = 9" in report
    assert AIMS == {"TTFT": (0.15, 0.35), "TPOT": (0.08, 0.25)}
    assert "QUICK" in format_folds([close], refitted=False).splitlines()[0]


def test_held_out_ttfts_are_held_to_40_percent_and_everything_else_held_out_to_20():
    held = [m for m in load_measurements() if m.role == "held_out"]
    assert {tolerance(m) for m in held if m.kind == "TTFT"} == {0.40}
    assert {tolerance(m) for m in held if m.kind != "TTFT"} == {0.20}


def test_the_h100_chatbot_rows_run_at_the_lengths_their_harness_sends():
    # yobitel bench's chatbot-short: ten built-in questions of 10-15 words with max_tokens=128,
    # each question sent again every ten requests (its whole blocks cached); not 128 in / 256 out.
    rows = [m for m in load_measurements() if m.source_id == "yobitel-concurrency-sweep"]
    assert {m.id for m in rows} >= {"T1", "T2", "T4", "T14"}
    for m in rows:
        assert (m.settings["prompt_tokens"], m.settings["output_tokens"]) == (45, 128), m.id
        assert m.settings["shared_prefix_tokens"] == 32, m.id
        assert m.host == "yobitel-h100"


def test_each_published_host_serves_its_own_sources_runs_only():
    cal = load_calibration()
    hosts = {m.source_id: m.host for m in load_measurements()}
    assert hosts["yobitel-concurrency-sweep"] == "yobitel-h100"
    assert hosts["inference-bench-l4"] == "inference-bench-l4"
    assert hosts["accelmark-b200"] == "in_process"  # AsyncLLM / LLM in the benchmark's process
    assert hosts["tt-inference-server-143"] == "api_server"
    published = {h.name for h in cal.published_hosts()}
    assert published == {"yobitel-h100", "prelude-h200", "inference-bench-l4"}
    for name in published:  # one source's runs, and no other source's, meet it
        assert len({m.source_id for m in load_measurements() if m.host == name}) == 1, name
    # A T1 on the L4 host's front end would be slower: the host, not the GPU, sets it.
    t1 = next(m for m in load_measurements() if m.id == "T1")
    on_l4_host = replace(t1, host="inference-bench-l4")
    assert simulate(on_l4_host) > simulate(t1)


def test_a_source_left_out_is_predicted_without_its_fit_runs():
    # rounds=0: the prior alone, no search (a full fold runs in the --report command).
    fold = leave_one_source_out("prelude-h200", rounds=0)
    assert [m.id for m, _ in fold.rows] == ["R1", "R2", "R3", "T3", "T11"]
    data, _ = fold_data(yaml.safe_load(CALIBRATION_PATH.read_text()), "prelude-h200")
    r1, sim = fold.rows[0]
    assert sim == pytest.approx(simulate(r1, parse_calibration(data)))
    assert sim != pytest.approx(simulate(r1))  # the file's h200 overhead was fitted to R1
    report = format_folds([fold])
    assert "prelude-h200 (V1, vLLM 0.18.0)" in report
    assert "gpus.h200.decode_step_overhead_ms" in report
    (row,) = [line for line in report.splitlines() if line.strip().startswith("V1 TPOT  ")]
    assert row.split()[2:4] == ["2", "1"]  # 2 runs, 1 source
    (row,) = [line for line in report.splitlines() if line.strip().startswith("V1 TTFT  ")]
    assert row.split()[2:4] == ["3", "1"]
    assert "h200 TPOT" in report


def test_older_engines_are_predicted_with_the_file_constants():
    fold = leave_one_source_out("vllm-blog-v0.6.0", rounds=0)
    assert {m.role for m, _ in fold.rows} == {"v0"}
    assert all(sim == pytest.approx(simulate(m)) for m, sim in fold.rows)


def test_the_saved_accuracy_matches_the_runs_of_calibration_yaml():
    """labs/sim/accuracy.json is `--report --write`'s output; rerun it when runs change."""
    saved = json.loads(ACCURACY_PATH.read_text())["runs"]
    scored = [m for m in load_measurements() if m.role in SCORED]
    assert sorted(r["id"] for r in saved) == sorted(m.id for m in scored)
    by_id = {m.id: m for m in scored}
    for r in saved:
        m = by_id[r["id"]]
        assert (r["gpu"], r["metric"], r["engine"], r["source_id"], r["role"]) == (
            m.settings["gpu"],
            m.metric,
            m.engine_generation,
            m.source_id,
            m.role,
        )
        assert r["kind"] == metric_kind(m.metric)
        assert r["error"] == pytest.approx(relative_error(r["simulated"], r["published"]), abs=1e-4)
    fold = Fold("x", (), ((scored[0], 1.0),))
    assert accuracy_records([fold])[0]["id"] == scored[0].id
