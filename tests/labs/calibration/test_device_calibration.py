"""A device's own calibration (labs.models.DeviceCalibration) prices that device's predictions and
simulations, says so, and leaves every other device's numbers as they were."""

from __future__ import annotations

from dataclasses import replace
from datetime import date

import pytest
from django.urls import reverse
from django.utils import timezone

from labs.models import DeviceCalibration, RunState
from labs.parameters.catalog import GPUS, MODELS
from labs.parameters.device_calibration import DeviceConstants, check_constants, cpu_device_key
from labs.parameters.params import parse_lab_params
from labs.prediction.predict import lab_prediction, predict
from labs.runs import execution
from labs.runs.selectors import device_calibration
from labs.sim.engine_model import load_calibration, with_device
from tests.labs.factories import SMALL, make_run

SMALL_MODEL = MODELS["llama-3-8b"]
# Far from the published H100 SXM constants, so any use of them shows in every number.
SLOW = {
    "bandwidth_efficiency": 0.3,
    "kv_bandwidth_efficiency": 0.25,
    "gemm_efficiency": 0.2,
    "decode_step_overhead_s": 0.004,
    "mixed_step_overhead_s": 0.006,
}


def _params(gpu: str):
    return parse_lab_params({**SMALL, "gpu": gpu, "num_prompts": 4, "concurrency": 2})


def _simulated(owner, params) -> tuple[float, str]:
    run = make_run(owner, params=params.as_dict())
    assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    run.refresh_from_db()
    return run.result["tpot_s"]["mean"], run.where


@pytest.mark.django_db
def test_a_devices_stored_calibration_prices_its_predictor_and_simulator_and_nothing_else(alice):
    mine, other = _params("h100-sxm"), _params("a100-80gb")
    before = {p.hardware.name: execution._predicted(p) for p in (mine, other)}
    sim_before = {p.hardware.name: _simulated(alice, p) for p in (mine, other)}

    DeviceCalibration.objects.create(
        device="h100-sxm",
        constants=SLOW,
        fit_error=0.03,
        held_out_error=0.06,
        fitted_at=timezone.make_aware(timezone.datetime(2026, 12, 2, 1, 0)),
    )
    stored = device_calibration("h100-sxm")
    assert stored is not None and device_calibration("a100-80gb") is None

    # The predictor: the calibrated device's numbers move, exactly as predict(params, device),
    # and so do the predicted parts the run page shows.
    after = execution._predicted(mine)
    assert after["tpot_s"] > 1.5 * before["h100-sxm"]["tpot_s"]
    # Stored with what priced it, by which the run's parts are sized too.
    priced = after.pop("priced_with")
    assert priced["device"] == "h100-sxm" and priced["held_out_error"] == 0.06
    assert priced["label"] == "calibrated on this worker, 2026-12-02, held-out error 6%"
    assert after == lab_prediction(mine, stored)
    assert {k: after[k] for k in predict(mine).as_dict()} == predict(mine, stored).as_dict()
    assert after["breakdown"] != before["h100-sxm"]["breakdown"]
    assert execution._predicted(other) == before["a100-80gb"]
    assert before["a100-80gb"]["priced_with"] == {
        "device": "a100-80gb",
        "source": "published",
        "calibrating": False,
    }

    # The simulator: the calibrated device's run is slower and labelled with the calibration.
    tpot, where = _simulated(alice, mine)
    assert tpot > 1.5 * sim_before["h100-sxm"][0]
    assert "calibrated on this worker, 2026-12-02, held-out error 6%" in where
    assert _simulated(alice, other) == sim_before["a100-80gb"]


@pytest.mark.django_db
def test_the_lab_page_prediction_says_it_uses_the_devices_calibration(client, alice):
    client.force_login(alice)
    url = reverse("labs:lab-detail", args=["sandbox"])
    assert "held-out error" not in client.get(url, {"gpu": "h100-sxm"}).content.decode()
    DeviceCalibration.objects.create(
        device="h100-sxm", constants=SLOW, fit_error=0.02, held_out_error=0.09
    )
    page = client.get(url, {"gpu": "h100-sxm"}).content.decode()
    assert "calibrated on this worker" in page and "held-out error 9%" in page
    assert "held-out error" not in client.get(url, {"gpu": "a100-80gb"}).content.decode()


@pytest.mark.django_db
def test_the_newest_calibration_of_a_device_wins():
    old = timezone.now() - timezone.timedelta(days=3)
    DeviceCalibration.objects.create(
        device="l4", constants=SLOW, fit_error=0.1, held_out_error=0.2, fitted_at=old
    )
    DeviceCalibration.objects.create(
        device="l4", constants={**SLOW, "gemm_efficiency": 0.5}, fit_error=0.1, held_out_error=0.1
    )
    found = device_calibration("l4")
    assert found is not None and found.gemm_efficiency == 0.5 and found.held_out_error == 0.1


def _constants(**overrides) -> DeviceConstants:
    fields = {
        "device": "h100-sxm",
        **SLOW,
        "fitted_on": date(2026, 12, 2),
        "fit_error": 0.02,
        "held_out_error": 0.06,
    }
    fields.update(overrides)
    return DeviceConstants(**fields)


def test_an_efficiency_the_learner_set_is_kept_over_the_devices_fit():
    engine = replace(_params("h100-sxm").engine, bandwidth_efficiency=0.8)
    priced = _constants().predictor_engine(engine)
    assert priced.bandwidth_efficiency == 0.8
    assert priced.compute_efficiency == SLOW["gemm_efficiency"]
    assert priced.step_overhead_s == SLOW["decode_step_overhead_s"]


def test_with_device_changes_only_that_gpus_constants():
    cal = load_calibration()
    mine = with_device(cal, GPUS["h100-sxm"], _constants())
    assert mine.gpus["h100-sxm"].bandwidth_efficiency == SLOW["bandwidth_efficiency"]
    assert mine.gpus["a100-80gb"] == cal.gpus["a100-80gb"]
    assert cal.gpus["h100-sxm"].bandwidth_efficiency != SLOW["bandwidth_efficiency"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"gemm_efficiency": 1.7}, "gemm_efficiency must be between"),
        ({"bandwidth_efficiency": "fast"}, "bandwidth_efficiency must be a number"),
    ],
)
def test_bad_constants_are_refused_naming_the_constant(change, named):
    with pytest.raises(ValueError, match=named):
        check_constants({**SLOW, **change})
    missing = {k: v for k, v in SLOW.items() if k != "mixed_step_overhead_s"}
    with pytest.raises(ValueError, match="mixed_step_overhead_s is missing"):
        check_constants(missing)


def test_a_cpu_device_is_keyed_by_its_model_and_core_count():
    assert cpu_device_key("AMD  EPYC 7763 64-Core Processor", 2) == (
        "cpu:AMD EPYC 7763 64-Core Processor:2"
    )


def test_a_real_runs_expected_parts_are_priced_with_its_devices_calibration():
    from labs.backends.sim import SimBackend
    from labs.measurement.metrics import summarize
    from labs.sim.lab import run_breakdown

    params = _params("h100-sxm")
    record = replace(SimBackend().run(params), simulated=False)  # stands in for a vLLM run
    measured = summarize(record)
    published = run_breakdown(params, record, measured)
    own = run_breakdown(params, record, measured, _constants())
    assert own["tpot_s"]["total"] == published["tpot_s"]["total"]  # the measurement itself
    # The slower device explains more of the same measurement: less is left unexplained.
    assert own["tpot_s"]["parts"]["unexplained"] < published["tpot_s"]["parts"]["unexplained"]


def test_a_devices_gemm_half_tokens_prices_its_runs_and_an_older_row_keeps_the_gpus():
    cal = load_calibration()
    published = cal.gpus["h100-sxm"].gemm_half_tokens
    assert with_device(cal, GPUS["h100-sxm"], _constants()).gpus["h100-sxm"].gemm_half_tokens == (
        published
    )
    mine = with_device(cal, GPUS["h100-sxm"], _constants(gemm_half_tokens=0.5))
    assert mine.gpus["h100-sxm"].gemm_half_tokens == 0.5
    # A row stored before the constant was fitted still loads, without it.
    assert "gemm_half_tokens" not in check_constants(SLOW)
    with pytest.raises(ValueError, match="gemm_half_tokens must be between"):
        check_constants({**SLOW, "gemm_half_tokens": 0})


def test_a_devices_speculation_step_cost_prices_its_drafting_steps_only():
    import numpy as np

    from labs.parameters.params import EngineConfig
    from labs.sim.engine_model import SPECULATION, EngineModel
    from labs.sim.scheduler import SchedulerOutput

    cal = load_calibration()
    assert cal.spec_step_overhead_s == 0.0  # the catalog GPUs: no fitted speculation run
    mine = with_device(cal, GPUS["h100-sxm"], _constants(spec_step_overhead_s=0.004))
    assert mine.spec_step_overhead_s == 0.004
    before = with_device(cal, GPUS["h100-sxm"], _constants())  # a row stored without it
    assert before.spec_step_overhead_s == 0.0

    def step(drafts: int) -> SchedulerOutput:
        return SchedulerOutput(
            req_indices=np.arange(2),
            num_scheduled_tokens=np.full(2, 1 + drafts, dtype=np.int64),
            num_draft_tokens=np.full(2, drafts, dtype=np.int64),
            num_computed_before=np.full(2, 100, dtype=np.int64),
            num_decode_tokens=2 * (1 + drafts),
            kv_tokens_read=200,
            num_spec_seqs=2 if drafts else 0,
            spec_kv_tokens_read=200 if drafts else 0,
            max_num_draft_tokens=drafts,
        )

    ngram = EngineConfig(spec_method="ngram", spec_tokens=3, draft_cost=0.0)
    h100 = GPUS["h100-sxm"]
    for profile, added in (("realistic", 0.004), ("ideal", 0.0)):
        own = EngineModel(h100, SMALL_MODEL, ngram, profile, mine).step_parts_s(step(3))
        published = EngineModel(h100, SMALL_MODEL, ngram, profile, before).step_parts_s(step(3))
        assert own[SPECULATION] - published[SPECULATION] == pytest.approx(added), profile
    plain = EngineConfig()
    assert EngineModel(h100, SMALL_MODEL, plain, "realistic", mine).step_time_s(
        step(0)
    ) == EngineModel(h100, SMALL_MODEL, plain, "realistic", before).step_time_s(step(0))
    assert "spec_step_overhead_s" not in check_constants(SLOW)


def test_a_devices_attention_efficiency_prices_its_prefill_attention():
    from labs.parameters.params import EngineConfig
    from labs.sim.engine_model import EngineModel
    from tests.labs.sim.test_engine_model import mixed_out

    cal = load_calibration()
    before = with_device(cal, GPUS["h100-sxm"], _constants())
    assert before.attention_efficiency == cal.attention_efficiency  # a row stored without it
    slow = with_device(cal, GPUS["h100-sxm"], _constants(attention_efficiency=0.01))
    prefill = mixed_out([8192], decodes=0, context=0)

    def seconds(c):
        return EngineModel(
            GPUS["h100-sxm"], SMALL_MODEL, EngineConfig(), calibration=c
        ).step_time_s(prefill)

    assert seconds(slow) > 2 * seconds(before)
    assert "attention_efficiency" not in check_constants(SLOW)


def test_a_devices_per_sequence_overhead_prices_each_sequence_of_its_steps():
    from labs.parameters.params import EngineConfig
    from labs.sim.engine_model import OVERHEAD, EngineModel
    from tests.labs.sim.test_engine_model import decode_out

    cal = load_calibration()
    before = with_device(cal, GPUS["h100-sxm"], _constants())
    assert before.per_seq_overhead_s == cal.per_seq_overhead_s  # a row stored without it
    mine = with_device(cal, GPUS["h100-sxm"], _constants(per_seq_overhead_s=0.0005))

    def overhead(c, batch: int) -> float:
        model = EngineModel(GPUS["h100-sxm"], SMALL_MODEL, EngineConfig(), calibration=c)
        return model.step_parts_s(decode_out(batch, 100))[OVERHEAD]

    assert overhead(mine, 8) - overhead(mine, 1) == pytest.approx(7 * 0.0005)
    assert overhead(before, 8) - overhead(before, 1) == pytest.approx(7 * cal.per_seq_overhead_s)
    assert "per_seq_overhead_s" not in check_constants(SLOW)


def test_a_devices_front_end_cpu_time_slows_its_busy_engine_and_an_older_row_has_none():
    from labs.sim.lab import build_simulator

    def row(**constants) -> DeviceConstants:
        stored = DeviceCalibration(
            device="h100-sxm",
            constants={**SLOW, "frontend_latency_s": 0.01, **constants},
            fit_error=0.03,
            held_out_error=0.06,
            fitted_at=timezone.make_aware(timezone.datetime(2026, 12, 6, 1, 0)),
        )
        return stored.to_constants()

    older, mine = row(), row(frontend_cpu_s=0.01)
    assert older.frontend_cpu_s is None
    assert check_constants({**SLOW, "frontend_cpu_s": 0.01})["frontend_cpu_s"] == 0.01

    def duration(concurrency: int, device: DeviceConstants) -> float:
        runs = {"num_prompts": 6, "concurrency": concurrency, "max_concurrency": concurrency}
        params = parse_lab_params({**SMALL, **runs})
        return build_simulator(params, device=device).run().duration_s

    # Two clients: each request after the first reaches an engine stepping the other's.
    assert duration(2, mine) > duration(2, older) + 0.01
    # One client: every request reaches an idle engine.
    assert duration(1, mine) == duration(1, older)


def test_a_devices_per_sequence_cost_shrinks_the_predicted_batching_gain_as_its_ideal_engine():
    """The predicted column charges each sequence the device's fitted CPU time, so batching 8
    gains less than the roofline alone says; the ideal simulator, the engine the prediction is
    the closed form of, runs with the same knobs and agrees."""
    from labs.measurement.metrics import summarize
    from labs.sim.lab import build_simulator

    costly = _constants(per_seq_overhead_s=0.004)

    def params(batch: int):
        return parse_lab_params(
            {
                **SMALL,
                "gpu": "h100-sxm",
                "max_num_seqs": batch,
                "concurrency": 8,
                "num_prompts": 32,
                "prompt_tokens": 64,
                "output_tokens": 32,
                "sim_profile": "ideal",
            }
        )

    def predicted(batch: int, device=None) -> float:
        return float(lab_prediction(params(batch), device)["output_tokens_per_s"])

    roofline_gain = predicted(8) / predicted(1)
    costly_gain = predicted(8, costly) / predicted(1, costly)
    assert roofline_gain > 6 and costly_gain < roofline_gain / 2
    for batch in (1, 8):
        sim = build_simulator(params(batch), device=costly).run()
        measured = summarize(sim)["output_tokens_per_s"]
        assert predicted(batch, costly) == pytest.approx(measured, rel=0.25)


def test_a_devices_front_end_stays_off_the_ideal_engine():
    """The ideal profile is the engine the predicted column describes, which has no API server,
    even on a device whose calibration measured one; the realistic profile keeps it."""
    from labs.sim.lab import build_simulator

    device = _constants(frontend_latency_s=0.5, frontend_per_stream_s=0.1)
    params = _params("h100-sxm")
    ideal = replace(params, engine=replace(params.engine, sim_profile="ideal"))
    assert build_simulator(ideal, device=device).frontend_latency_s == 0.0
    realistic = build_simulator(params, device=device)
    assert (realistic.frontend_latency_s, realistic.frontend_per_stream_s) == (0.5, 0.1)
