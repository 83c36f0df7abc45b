"""A metric's "why they differ" as a waterfall: bars from the formulas' figure to the measured
one, each the size the explanation gives its part, what it does not name or explain last."""

from __future__ import annotations

import pytest

from labs.explanation.explain import Cause, Explanation
from labs.explanation.results import format_value
from labs.explanation.waterfall import BAR_LABELS, REST_LABEL, build, run_waterfalls
from labs.parameters.params import align_run_batch, parse_lab_params
from labs.parameters.presets import LABS, lab_initial, load_presets


def _ms(value: float) -> str:
    return format_value(value, "s")


def test_the_bars_walk_from_predicted_to_measured_with_the_unexplained_last():
    explanation = Explanation(
        difference=0.5,
        causes=(
            Cause("queueing", 0.4, "+400 ms queueing"),
            Cause("unexplained", 0.05, "+50 ms not explained"),
            Cause("overhead", 0.03, "+30 ms overhead"),
        ),
        counters=(),
        rest=0.02,
        says_not_explained=True,
        text="the full text",
    )
    wf = build("TTFT, mean", 1.5, 1.0, explanation, _ms, "max_num_seqs 8 held admission: x; y")
    assert wf is not None
    labels = [b.label for b in wf.bars]
    assert labels == [
        "predicted by the formulas",
        BAR_LABELS["queueing"],
        BAR_LABELS["overhead"],
        REST_LABEL,
        BAR_LABELS["unexplained"],
        "measured",
    ]
    steps = wf.bars[1:-1]
    assert steps[0].start == 1.0
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.start == pytest.approx(before.end)
    assert steps[-1].end == pytest.approx(1.5) == wf.bars[-1].end
    for bar in wf.bars:
        assert 0 <= bar.x <= 100 and 0 < bar.width <= 100.0001
    assert wf.short == (
        "+500 ms in all; the largest part: queueing, +400 ms. Max_num_seqs 8 held admission: x."
    )
    assert wf.text == "the full text"


def test_no_waterfall_without_a_named_part():
    bare = Explanation(0.1, (), (), 0.1, False, "text")
    assert build("x", 1.1, 1.0, bare, _ms) is None


def test_a_simulated_run_gets_waterfalls_for_ttft_and_throughput():
    from labs.backends import get_backend
    from labs.measurement.metrics import summarize
    from labs.prediction.predict import lab_prediction
    from labs.sim.lab import run_breakdown

    preset = load_presets()["batching-concurrency-sweep-128"]
    params = parse_lab_params(align_run_batch(lab_initial(LABS["batching"], preset)))
    record = get_backend("sim").run(params)
    summary = summarize(record)
    summary["breakdown"] = run_breakdown(params, record, summary, None)
    predicted = lab_prediction(params)
    found = run_waterfalls(summary, predicted, params.as_dict())
    for label, measured_key, predicted_key in (
        ("TTFT, mean", ("ttft_s", "mean"), "loaded_ttft_s"),
        ("Output tokens/s", ("output_tokens_per_s",), "output_tokens_per_s"),
    ):
        wf = found[label]
        measured = summary
        for part in measured_key:
            measured = measured[part]
        assert wf.bars[0].end == pytest.approx(predicted[predicted_key])
        assert wf.bars[-2].end == pytest.approx(measured)
        assert wf.bars[-1].end == pytest.approx(measured)
