"""Calibrating a device from its own sweep (labs/calibration/sweep.py, `manage.py lab
calibrate`): the fit sees only the `fit` points, recovers constants the runs were made with, and
the command stores the result for the device against the fake vLLM server."""

from __future__ import annotations

import io
import re
import statistics
from dataclasses import replace
from datetime import date
from typing import Any

import pytest
from django.core.management import call_command

from labs.calibration.sweep import (
    CHANGES,
    SWEEP,
    Measured,
    Runs,
    check_changes,
    cpu_times,
    device_frontend_line,
    drafted_share,
    fit_device,
    frontend_cpu,
    frontend_latency,
    measure_changes,
    measure_sweep,
    other_streams,
    paired_ratio,
    point_params,
    run_summary,
    settings_params,
    simulate,
    simulate_point,
    steal_share,
    step_acceptance,
    sweep_settings,
)
from labs.measurement.metrics import summarize
from labs.models import DeviceCalibration
from labs.parameters.device_calibration import CONSTANT_BOUNDS, DeviceConstants
from labs.runs.selectors import device_calibration
from labs.sim.lab import build_simulator
from tests.labs.vllm.conftest import _idle_fakes, fake_server  # noqa: F401 (fixtures)

BASE = {"model": "qwen2.5-0.5b", "gpu": "l4"}
TRUTH = DeviceConstants(
    device="l4",
    bandwidth_efficiency=0.5,
    kv_bandwidth_efficiency=0.5,
    gemm_efficiency=0.4,
    decode_step_overhead_s=0.002,
    mixed_step_overhead_s=0.004,
    fitted_on=date(2026, 12, 2),
    fit_error=0.0,
    held_out_error=0.0,
)


def _measured_with(device: DeviceConstants) -> list[Measured]:
    """The sweep as a device with `device`'s constants would measure it (by simulating it)."""
    out = []
    for point in SWEEP:
        m = Measured(point, point_params(BASE, point), 0.0)
        out.append(replace(m, value=simulate_point(m, device)))
    return out


def test_the_sweep_fixes_its_roles_and_covers_decode_batching_prefill_and_speculation():
    roles = {p.role for p in SWEEP}
    assert roles == {"fit", "held_out"}
    changes = [p.changes for p in SWEEP]
    assert any(c.get("max_concurrency") == 1 and c.get("output_tokens", 0) > 8 for c in changes)
    assert len({c.get("max_concurrency") for c in changes}) >= 3  # a batch sweep
    assert any(c.get("prompt_tokens", 0) >= 1000 for c in changes)  # a long prefill
    assert any(c.get("spec_method", "none") != "none" for c in changes)
    # Each name fits the log table's column (labs/cli/calibrate.py).
    assert max(len(p.what) for p in SWEEP) <= 30


def test_the_fit_recovers_a_devices_runs_and_never_sees_the_held_out_ones():
    measured = _measured_with(TRUTH)
    result = fit_device("l4", measured, on=date(2026, 12, 2), rounds=3, log=lambda _: None)
    assert result.constants.held_out_error < 0.15
    assert result.constants.fit_error < 0.10
    assert [p["id"] for p in result.points] == [p.id for p in SWEEP]

    # Doubling every held-out measurement changes their errors, never the constants.
    skewed = [replace(m, value=m.value * 2) if m.point.role == "held_out" else m for m in measured]
    again = fit_device("l4", skewed, on=date(2026, 12, 2), rounds=3, log=lambda _: None)
    names = tuple(CONSTANT_BOUNDS)
    assert [getattr(again.constants, n) for n in names] == [
        getattr(result.constants, n) for n in names
    ]
    assert again.constants.held_out_error > result.constants.held_out_error + 0.3


@pytest.mark.django_db
def test_the_command_calibrates_a_device_from_its_vllm_server_and_stores_it(
    fake_server: Any,  # noqa: F811
):
    # 5 ms of each 20 ms TTFT are the API server's: the engine's histograms time the rest.
    server = fake_server({"ttft_ms": 20, "frontend_ms": 5, "itl_ms": [8], "chunk_tokens": [1]})
    out = io.StringIO()
    call_command(
        "lab",
        "calibrate",
        "--base-url",
        server.base_url,
        "--model",
        "qwen2.5-0.5b",
        "--gpu",
        "l4",
        "--repeats",
        "1",
        "--rounds",
        "1",
        "--where",
        "the test worker",
        stdout=out,
    )
    row = DeviceCalibration.objects.get(device="l4")
    assert [p["id"] for p in row.points] == [p.id for p in SWEEP]
    held_out = sorted(abs(p["error"]) for p in row.points if p["role"] == "held_out")
    assert row.held_out_error == pytest.approx(held_out[len(held_out) // 2])
    # The fake answers the first token after 20 ms, then each 8 ms apart, whatever the batch:
    # batch-1 decode's TPOT is 8 ms, and S1's 128 tokens take 20 + 127 x 8 ms end to end.
    decode = next(p for p in row.points if p["id"] == "D1")
    assert decode["metric"] == "tpot_s.mean"
    assert decode["measured"] == pytest.approx(0.008, rel=0.3)
    speculative = next(p for p in row.points if p["id"] == "S1")
    assert speculative["metric"] == "e2e_s.mean"
    assert speculative["measured"] == pytest.approx(0.020 + 127 * 0.008, rel=0.3)
    stored = device_calibration("l4")
    assert stored is not None and stored.where == "the test worker"
    assert "stored for l4: calibrated on the test worker" in out.getvalue()
    assert "max_num_seqs 1 -> 8" in out.getvalue()
    assert "ngram speculation off -> on" in out.getvalue()
    assert re.search(r"the hypervisor took \d+\.\d% of this machine's CPU time", out.getvalue())
    assert re.search(r"D1 batch-1 decode: .* over 1 runs; steal \d+\.\d% to", out.getvalue())
    # The front end's time: the client's TTFT less the engine's 15 ms (plus HTTP's own time).
    found = re.search(
        r"the API server's time per request: (\d+\.\d+) ms alone, plus (\d+\.\d+) ms for each",
        out.getvalue(),
    )
    assert found is not None, out.getvalue()
    assert row.constants["frontend_latency_s"] == pytest.approx(float(found[1]) / 1e3, abs=1e-5)
    assert row.constants["frontend_per_stream_s"] == pytest.approx(float(found[2]) / 1e3, abs=1e-5)
    # About the fake's 5 ms (the client's clock starts before the fake's; a busy machine's late
    # timers and HTTP add to it, and a line through noisy figures may start a little below).
    assert 0.004 <= row.constants["frontend_latency_s"] < 0.1


@pytest.mark.django_db
def test_the_command_refuses_bad_repeats_naming_the_option():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--repeats must be a whole number from 1 to 10"):
        call_command("lab", "calibrate", "--repeats", "0", "--base-url", "http://127.0.0.1:9")
    assert not DeviceCalibration.objects.exists()


def test_the_lessons_changes_are_measured_once_per_setting_and_set_beside_the_simulators():
    base = {**BASE, "max_num_seqs": 8}
    ran: list[Any] = []

    def device_runs(params: Any, faster_batches: float = 1.0) -> dict[str, Any]:
        """A device with TRUTH's constants; max_num_seqs 8 runs `faster_batches` x faster."""
        ran.append(params)
        summary = summarize(build_simulator(params, device=TRUTH).run())
        if params.engine.max_num_seqs == 8 and params.workload.max_concurrency == 8:
            summary["output_tokens_per_s"] *= faster_batches
        return summary

    runs = Runs(device_runs, repeats=2)
    logged: list[str] = []
    measure_sweep(base, runs, log=logged.append)
    changes = measure_changes(base, runs, log=logged.append)
    # Each line shows how far its repeats disagree, not only their median.
    assert all("over 2 runs)" in line for line in logged), logged
    # These runs report no drafts counter: the S1 line does not claim the engine's share.
    (s1_line,) = [line for line in logged if line.startswith("S1 ")]
    assert s1_line.endswith("100% of its sequence-steps (no drafts counter: every step)")
    # Speculation on is the sweep's S1 and max_num_seqs 8 its D3: two new settings (off, and
    # max_num_seqs 1).
    assert len(ran) == 2 * (len(SWEEP) + 2)
    assert [c.change.what for c in changes] == [c.what for c in CHANGES]
    rows = check_changes(changes, TRUTH)
    batching = rows[0]
    assert batching["measured_change"] > 1.0  # eight sequences at once: more tokens/s
    assert batching["error"] == pytest.approx(0, abs=1e-9)
    assert batching["simulated_change"] == pytest.approx(batching["measured_change"])

    # A device whose batches run twice as fast as the constants say: the change is off by half.
    skewed = Runs(lambda p: device_runs(p, faster_batches=2.0), repeats=1)
    rows = check_changes(measure_changes(base, skewed, log=lambda _: None), TRUTH)
    assert rows[0]["error"] == pytest.approx(-0.5)
    assert rows[1]["error"] == pytest.approx(0, abs=1e-9)


def test_a_change_is_simulated_with_the_devices_constants():
    params = point_params(BASE, SWEEP[0])
    slow = replace(TRUTH, bandwidth_efficiency=0.1)
    assert simulate(params, "tpot_s.mean", slow) > simulate(params, "tpot_s.mean", TRUTH)


def test_a_cpu_whose_matmuls_need_no_batch_to_be_efficient_is_fitted():
    """On a CPU a one-row matmul runs near the rate of a large one: the fit moves the GEMM
    half-efficiency token count below a GPU's tens, or batch-1 decode stays several times off
    (it did: +700% on this machine's CPU vLLM worker)."""
    base = {
        "model": "lab-llama-20m",
        "gpu": "cpu",
        "hbm_gb": 25,
        "bandwidth_tbs": 0.014,
        "tflops": 0.065,
        "block_size": 128,
        "kv_capacity_tokens": 8192,
        "max_num_seqs": 8,
    }
    cpu_like = replace(
        TRUTH,
        device="cpu:test:2",
        gemm_efficiency=0.8,
        gemm_half_tokens=0.5,
        decode_step_overhead_s=0.008,
        spec_step_overhead_s=0.006,
    )
    measured = []
    for point in SWEEP:
        m = Measured(point, point_params(base, point), 0.0)
        measured.append(replace(m, value=simulate_point(m, cpu_like)))
    result = fit_device("cpu:test:2", measured, on=date(2026, 12, 2), log=lambda _: None)
    assert result.constants.gemm_half_tokens is not None
    assert result.constants.gemm_half_tokens <= 10  # a GPU's are tens
    assert result.constants.fit_error < 0.15
    decode = next(p for p in result.points if p["id"] == "D1")
    assert abs(decode["error"]) < 0.15
    # Speculation's own step cost is fitted from S2 (4 decoding), up from its start (the
    # published decode step's 0.95 ms), and S1 (held out, one decoding) follows. A step's
    # fixed costs trade against each other (overhead against weight reads), so the constants
    # themselves are not all recovered, only what they price.
    assert result.constants.spec_step_overhead_s > 0.003
    assert abs(next(p for p in result.points if p["id"] == "S1")["error"]) < 0.15


def test_every_point_and_change_runs_without_the_prefix_cache():
    # Repeats draw the same token ids and P2's prompts start P1's: with the cache on, the medians
    # were cached prefills the simulator (each run fresh) never sees.
    for point in SWEEP:
        assert point_params(BASE, point).engine.prefix_caching is False, point.id
    for change in CHANGES:
        for side in (change.before, change.after):
            assert (
                settings_params({**BASE, "prefix_caching": True}, side).engine.prefix_caching
                is False
            )


def test_the_tables_line_up_under_their_headers():
    from labs.cli.calibrate import format_changes, format_points

    point = {"id": "D1", "role": "fit", "what": "batch-1 decode", "metric": "e2e_s.mean",
             "measured": 0.1234567, "predicted": 0.13, "error": 0.053}  # fmt: skip
    lines = format_points([point]).splitlines()
    assert lines[0].split() == ["id", "role", "what", "metric", "measured", "simulated", "error"]
    assert len(lines[0]) == len(lines[1]) and lines[1].endswith("0.13    +5.3%")
    change = {"what": "max_num_seqs 1 -> 8", "metric": "output_tokens_per_s",
              "measured_change": 3.11, "simulated_change": 1.2, "error": -0.46,
              "change_error": -0.61}  # fmt: skip
    lines = format_changes([change]).splitlines()
    assert len(lines[0]) == len(lines[1]) and lines[1].endswith(
        "+311.0%    +120.0%    -46.0%     -61.0%"
    )


def test_the_simulator_is_told_the_acceptance_the_engine_made_not_the_labs_alpha():
    # The simulator's own run at alpha 0.6 gives back about 0.6 from its counters.
    params = point_params({**BASE, "acceptance": 0.6}, next(p for p in SWEEP if p.id == "S1"))
    runs = Runs(lambda p: run_summary(build_simulator(p).run()), repeats=1)
    assert runs.simulated_params(params).engine.acceptance == pytest.approx(0.6, abs=0.12)
    # An engine that accepted nothing of 31 x 3 decode tokens: alpha 0; a third of them: the
    # alpha whose steps make 1.5 tokens each, (1 - a^4) / (1 - a) = 1.5.
    assert step_acceptance(3, 93, 0) == 0.0
    alpha = step_acceptance(3, 93, 31)
    assert (1 - alpha**4) / (1 - alpha) == pytest.approx(93 / 62)
    engine = {"spec_accepted_tokens": 31, "decode_tokens": 93, "completed": 3}
    told = Runs(lambda p: engine, repeats=3).simulated_params(params)
    assert told.engine.acceptance == pytest.approx(alpha)
    assert told.engine.draft_share == 1.0  # no drafts counter: every step drafts
    # How often the engine drafted at all: an engine that drafted 31 times in the 62 steps
    # above did at half of them, and its drafted steps made 2 tokens each (31 + 31 over 31):
    # the simulator drafts at half the steps, at the alpha whose drafted steps make 2.
    counted = {**engine, "spec_drafts": 31}
    assert drafted_share(counted) == pytest.approx(0.5)
    assert drafted_share(engine) is None
    told = Runs(lambda p: counted, repeats=3).simulated_params(params)
    assert told.engine.draft_share == pytest.approx(0.5)
    a = told.engine.acceptance
    assert (1 - a**4) / (1 - a) == pytest.approx(2.0) and a > alpha
    simulated = run_summary(build_simulator(params).run())
    assert drafted_share(simulated) == pytest.approx(1.0, abs=0.05)
    # Without drafts, or without the engine's counter, the settings stay as they were.
    plain = point_params(BASE, SWEEP[0])
    assert Runs(lambda p: engine, repeats=1).simulated_params(plain) is plain
    silent = {**engine, "spec_accepted_tokens": None}
    assert Runs(lambda p: silent, repeats=1).simulated_params(params) is params


def test_the_simulator_drafting_at_the_engines_share_gives_that_share_back():
    # A run simulated at a share and an acceptance, read back from its counters as an
    # engine's are, gives the same share and acceptance: what the calibration is told of a
    # drafting engine, the simulator reproduces.
    s2 = point_params(BASE, next(p for p in SWEEP if p.id == "S2"))
    engine = replace(s2.engine, acceptance=0.7, draft_share=0.35)
    summary = run_summary(build_simulator(replace(s2, engine=engine)).run())
    assert drafted_share(summary) == pytest.approx(0.35, abs=0.05)
    told = Runs(lambda p: summary, repeats=1).simulated_params(s2).engine
    assert told.draft_share == pytest.approx(0.35, abs=0.05)
    assert told.acceptance == pytest.approx(0.7, abs=0.06)


def test_the_share_of_cpu_time_the_hypervisor_took_is_read_from_proc_stat(tmp_path):
    # /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice.
    stat = tmp_path / "stat"
    stat.write_text("cpu  700 0 100 1000 0 0 0 200 50 0\ncpu0 350 0 50 500 0 0 0 100 25 0\n")
    before = cpu_times(str(stat))
    assert before == (200, 2000)  # guest time is inside user time, not added again
    stat.write_text("cpu  1500 0 200 1200 0 0 0 600 90 0\n")
    assert steal_share(before, cpu_times(str(stat))) == pytest.approx(400 / 1500)
    assert steal_share(before, before) is None  # no time passed
    assert cpu_times(str(tmp_path / "missing")) is None
    assert steal_share(None, before) is None
    stat.write_text("intr 1 2 3\n")
    assert cpu_times(str(stat)) is None
    # Each run's share beside the spread of its values, where the runs carry it.
    d1 = point_params(BASE, SWEEP[0])
    shares = iter([0.0, 0.125, 0.021])
    runs = Runs(lambda p: {"e2e_s": {"mean": 1.0}, "steal_share": next(shares)}, repeats=3)
    assert runs.spread(d1, "e2e_s.mean") == "(1 to 1 over 3 runs; steal 0.0% to 12.5%)"
    plain = Runs(lambda p: {"e2e_s": {"mean": 1.0}}, repeats=2)
    assert plain.spread(d1, "e2e_s.mean") == "(1 to 1 over 2 runs)"


def test_a_warm_up_run_of_each_setting_goes_first_and_is_not_kept():
    seen: list[float] = []

    def run(params: Any) -> dict[str, Any]:
        seen.append(params.workload.prompt_tokens)
        return {"e2e_s": {"mean": 5.0 if len(seen) == 1 else 1.0}}

    runs = Runs(run, repeats=3, warmups=1)
    params = point_params(BASE, SWEEP[0])
    assert runs.values(params, "e2e_s.mean") == [1.0, 1.0, 1.0]
    assert runs.values(params, "e2e_s.mean") == [1.0, 1.0, 1.0] and len(seen) == 4


def test_the_settings_are_measured_in_rounds_grouped_by_server():
    ran: list[str] = []
    names = {}

    def run(params: Any) -> dict[str, Any]:
        ran.append(names[Runs._key(params)])
        return {"e2e_s": {"mean": 1.0}}

    d1, d2 = point_params(BASE, SWEEP[0]), point_params(BASE, SWEEP[1])  # one engine
    s1 = point_params(BASE, next(p for p in SWEEP if p.id == "S1"))  # drafts: another
    one_seq = settings_params(BASE, {"max_num_seqs": 1})  # a third
    for name, params in {"D1": d1, "D2": d2, "S1": s1, "M1": one_seq}.items():
        names[Runs._key(params)] = name
    runs = Runs(run, repeats=3, warmups=1)
    runs.measure([d1, d2, s1, d1, one_seq])  # D1 asked twice: measured once
    # Each round visits every setting once, a server's settings together, every other round
    # backwards; wherever the server changes, a warm-up of each of its settings first.
    assert ran == [
        "D1", "D2", "D1", "D2", "S1", "S1", "M1", "M1",
        "M1", "S1", "S1", "D1", "D2", "D2", "D1",
        "D1", "D2", "S1", "S1", "M1", "M1",
    ]  # fmt: skip
    assert runs.values(d1, "e2e_s.mean") == [1.0, 1.0, 1.0]
    runs.measure([d1, s1])
    assert len(ran) == 21  # nothing measured twice


def test_each_changes_two_sides_run_one_after_the_other_in_every_round():
    ran: list[str] = []

    def run(params: Any) -> dict[str, Any]:
        ran.append(Runs._key(params))
        return {"e2e_s": {"mean": 1.0}}

    base = {**BASE, "max_num_seqs": 8}
    settings = sweep_settings(base)
    assert len({Runs._key(p) for p in settings}) == len(settings)  # each once
    Runs(run, repeats=4).measure(settings)
    rounds = [ran[i : i + len(settings)] for i in range(0, len(ran), len(settings))]
    assert len(rounds) == 4
    for change in CHANGES:
        before = Runs._key(settings_params(base, change.before))
        after = Runs._key(settings_params(base, change.after))
        for order in rounds:
            assert abs(order.index(before) - order.index(after)) == 1, change.what


def test_a_change_is_the_median_of_its_rounds_ratios():
    # A machine twice as slow in rounds 2 and 3 (both sides alike): the rounds' ratios agree,
    # where the ratio of the medians mixes a fast round's side with a slow round's.
    assert paired_ratio([1.0, 2.0, 2.0, 1.0, 1.0], [0.5, 1.0, 1.0, 0.5, 0.5]) == 0.5
    assert paired_ratio([1.0, 2.0, 2.0], [0.5, 1.0, 1.0]) == 0.5
    before, after = [1.0, 2.0, 2.0, 1.0, 1.5], [0.5, 1.0, 0.55, 0.5, 0.75]
    assert statistics.median(after) / statistics.median(before) != 0.5
    assert paired_ratio(before, after) == 0.5
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])


def test_a_machine_that_slows_during_the_sweep_moves_every_point_alike():
    # Every run takes longer than the one before, as on a VM whose neighbours get busy: run
    # back to back, the settings measured last look slowest; in rounds, they agree.
    calls = []

    def slowing(params: Any) -> dict[str, Any]:
        calls.append(params)
        return {"e2e_s": {"mean": 1.0 + 0.01 * len(calls)}}

    settings = [point_params(BASE, p) for p in SWEEP if not p.changes.get("spec_method")]
    back_to_back = Runs(slowing, repeats=5)
    first_then_last = [back_to_back.median(p, "e2e_s.mean") for p in settings]
    calls.clear()
    rounds = Runs(slowing, repeats=5)
    rounds.measure(settings)
    interleaved = [rounds.median(p, "e2e_s.mean") for p in settings]

    def spread(medians: list[float]) -> float:
        return max(medians) / min(medians) - 1

    assert spread(first_then_last) > 0.2
    # Rounds leave the medians apart by about one round's slowing, not by all the repeats'.
    assert spread(interleaved) < spread(first_then_last) / 4


def test_a_cpus_gemm_ceiling_is_its_measured_matmul_rate_not_fitted():
    from labs.calibration.sweep import searched_bounds, starting_values

    cpu = {**BASE, "model": "lab-llama-20m", "gpu": "cpu", "hbm_gb": 23, "bandwidth_tbs": 0.034,
           "tflops": 0.2, "block_size": 128, "kv_capacity_tokens": 8192}  # fmt: skip
    on_cpu = [Measured(p, point_params(cpu, p), 1.0) for p in SWEEP]
    assert "gemm_efficiency" not in searched_bounds(on_cpu)
    assert starting_values(on_cpu)["gemm_efficiency"] == 1.0
    on_gpu = [Measured(p, point_params(BASE, p), 1.0) for p in SWEEP]
    assert "gemm_efficiency" in searched_bounds(on_gpu)


def test_the_front_ends_time_is_the_clients_ttft_less_the_engines_own():
    summary = {
        "completed": 4,
        "ttft_s": {"mean": 0.020},
        "engine_first_token_s": 4 * 0.016,
        "engine_requests": 4,
    }
    assert frontend_latency(summary) == pytest.approx(0.004)
    # Not reported, or counted over other requests than the client finished: not measured.
    assert frontend_latency({**summary, "engine_first_token_s": None}) is None
    assert frontend_latency({**summary, "engine_requests": 3}) is None


def test_the_fit_takes_the_front_ends_time_as_a_line_over_the_streams_and_never_moves_it():
    # 4 ms for a request alone and 2 ms for each other stream in flight, with noise that sums
    # to 0 at each load (so the least-squares line is exactly the one the runs were made with);
    # the held-out points' figures are far off it and must not move it.
    noise = {"D1": 5e-4, "D4": -5e-4, "P1": 2e-4, "P3": -2e-4, "D2": 3e-4, "S2": -3e-4, "D5": 0}
    measured = [
        replace(
            m,
            frontend_latency_s=0.050
            if m.point.role == "held_out"
            else 0.004 + 0.002 * other_streams(m.params) + noise[m.point.id],
        )
        for m in _measured_with(TRUTH)
    ]
    assert {other_streams(m.params) for m in measured if m.point.role == "fit"} == {0, 3, 7}
    result = fit_device("l4", measured, on=date(2026, 12, 2), rounds=1, log=lambda _: None)
    assert result.constants.frontend_latency_s == pytest.approx(0.004)
    assert result.constants.frontend_per_stream_s == pytest.approx(0.002)
    # The simulator priced with it: a lone request's TTFT carries the time alone on top of the
    # engine's; at 8 in flight each request waits on the other streams too.
    p3 = next(m for m in measured if m.point.id == "P3")
    flat = replace(result.constants, frontend_latency_s=0.0, frontend_per_stream_s=0.0)
    ttft = simulate(p3.params, "ttft_s.mean", result.constants)
    assert ttft - simulate(p3.params, "ttft_s.mean", flat) == pytest.approx(0.004, rel=1e-6)
    d3 = next(m for m in measured if m.point.id == "D3")
    alone = replace(result.constants, frontend_per_stream_s=0.0)
    assert simulate(d3.params, "output_tokens_per_s", result.constants) < simulate(
        d3.params, "output_tokens_per_s", alone
    )


def test_a_cpu_workers_busy_engine_loses_the_front_ends_time_per_stream_and_a_gpus_does_not():
    from labs.calibration.sweep import searched_bounds, starting_values

    cpu = {**BASE, "model": "lab-llama-20m", "gpu": "cpu", "hbm_gb": 23, "bandwidth_tbs": 0.034,
           "tflops": 0.2, "block_size": 128, "kv_capacity_tokens": 8192}  # fmt: skip

    def reported(base: dict[str, Any]) -> list[Measured]:
        # 4 ms alone, 2 ms more per other stream, as a CPU worker's front end reports it.
        points = [Measured(p, point_params(base, p), 1.0) for p in SWEEP]
        return [
            replace(m, frontend_latency_s=0.004 + 0.002 * other_streams(m.params)) for m in points
        ]

    on_cpu, on_gpu = reported(cpu), reported(BASE)
    # What each other stream adds: the one API server process busy with that stream's request.
    assert frontend_cpu(on_cpu) == pytest.approx(0.002)
    assert starting_values(on_cpu)["frontend_cpu_s"] == pytest.approx(0.002)
    assert frontend_cpu(on_gpu) == starting_values(on_gpu)["frontend_cpu_s"] == 0.0
    assert "frontend_cpu_s" not in searched_bounds(on_cpu)  # measured, never fitted
    # Priced with it, 8 clients (D3) lose throughput to it; one client's prefill (P3) does not.
    device = replace(TRUTH, frontend_latency_s=0.004, frontend_per_stream_s=0.002)
    busy = replace(device, frontend_cpu_s=0.002)
    d3, p3 = (next(m for m in on_cpu if m.point.id == i) for i in ("D3", "P3"))
    tokens = simulate(d3.params, "output_tokens_per_s", busy)
    assert tokens < 0.98 * simulate(d3.params, "output_tokens_per_s", device)
    assert simulate(p3.params, "ttft_s.mean", busy) == simulate(p3.params, "ttft_s.mean", device)


def test_the_front_ends_line_falls_back_to_the_median_where_it_cannot_be_drawn():
    measured = _measured_with(TRUTH)
    fit = [m for m in measured if m.point.role == "fit"]
    assert device_frontend_line(measured) == (0.0, 0.0)  # no point reported it
    # One load only: the median, flat.
    lone = [m for m in fit if other_streams(m.params) == 0]
    lone = [replace(m, frontend_latency_s=0.001 * (i + 1)) for i, m in enumerate(lone)]
    assert device_frontend_line(lone) == (pytest.approx(0.0025), 0.0)
    # Falling with the streams (noise): the median, flat, not a line down through 0.
    falling = [replace(m, frontend_latency_s=0.010 - 0.001 * other_streams(m.params)) for m in fit]
    figures = [m.frontend_latency_s for m in falling]
    assert device_frontend_line(falling) == (pytest.approx(statistics.median(figures)), 0.0)
