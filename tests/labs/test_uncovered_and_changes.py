"""Where the formulas do not cover a figure the pages say so in words, and build no "why they
differ" on it; the compare and sweep pages show the predicted change beside the measured one."""

from __future__ import annotations

import pytest
from django.urls import reverse

from labs.explanation import results
from labs.models import RunState
from labs.parameters.params import align_run_batch, parse_lab_params
from labs.prediction.predict import lab_prediction
from labs.runs import execution, selectors, submission
from tests.labs.factories import make_run

# A paged pool that holds 8 sequences at full length and admits 64 on their prompts.
PREEMPTING = {
    "prompt_tokens": 512,
    "output_tokens": 128,
    "max_tokens": 256,
    "max_num_seqs": 64,
    "concurrency": 64,
    "num_prompts": 64,
    "kv_capacity_tokens": 8 * 640,
}


def _prediction(values):
    return lab_prediction(parse_lab_params(align_run_batch(values)))


def test_the_lab_panel_says_the_formulas_do_not_cover_a_figure_and_why():
    predicted = _prediction(PREEMPTING)
    items = results.predicted_items(predicted, ("running_seqs", "tpot_s", "kv_capacity_tokens"))
    running, tpot, capacity = items
    assert running["value"] == "the formulas do not cover sequences running at once here"
    assert "preempted" in running["note"]
    assert tpot["value"].startswith("the formulas do not cover") and "note" in tpot
    assert "note" not in capacity and capacity["value"].endswith("tokens")


def test_the_run_table_prints_no_figure_and_builds_no_reason_on_an_uncovered_one():
    predicted = _prediction(PREEMPTING)
    summary = {
        "ttft_s": {"mean": 0.5, "p50": 0.4},
        "tpot_s": {"mean": 0.01, "p50": 0.01},
        "e2e_s": {"mean": 1.8},
        "output_tokens_per_s": 4000.0,
        "max_running_seqs": 20,
        "completed": 64,
        "duration_s": 2.0,
    }
    rows = {row.label: row for row in results.compare(summary, predicted, PREEMPTING)}
    for label in ("TTFT, mean", "TPOT, mean", "Output tokens/s", "Running sequences, peak"):
        row = rows[label]
        assert row.predicted == "not covered" and row.diff == "" and row.explanation is None
        assert row.reading.startswith("The formulas do not cover") and "preempted" in row.reading
    line = results.headline(list(rows.values()))
    assert "The formulas do not cover TTFT, mean, TTFT, median" in line
    assert "the run behaved like the formulas" not in line and "preempted" in line


def test_a_change_is_after_over_before():
    assert results.change(2.0, 5.0) == pytest.approx(2.5)
    assert results.change(None, 5.0) is None and results.change(0, 5.0) is None
    assert results.format_change(2.5) == "×2.5" and results.format_change(None) == ""


def test_a_sweep_shows_each_points_change_from_the_first_measured_and_predicted():
    points = [
        {"measured": 100.0, "predicted": 110.0},
        {"measured": 300.0, "predicted": 330.0},
        {"measured": None, "predicted": 550.0},
    ]
    rows = selectors._changes([1, 4, 16], points)
    assert rows == [
        {"value": "4", "measured": "×3", "predicted": "×3"},
        {"value": "16", "measured": "", "predicted": "×5"},
    ]


@pytest.mark.django_db
def test_the_compare_page_shows_the_predicted_change_beside_the_measured_one(alice, alice_client):
    def done(**values):
        run = make_run(alice, lab="batching", params=parse_lab_params(values).as_dict())
        run.predicted = execution._predicted(submission.parse_lab_params(run.params))
        run.save()
        assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
        run.refresh_from_db()
        return run

    small = {"num_prompts": 8, "output_tokens": 32, "prompt_tokens": 128, "max_tokens": 64}
    one = done(**small, concurrency=1, max_concurrency=1, sim_profile="ideal")
    eight = done(**small, concurrency=8, max_concurrency=8, sim_profile="ideal")
    response = alice_client.get(reverse("labs:run-compare"), {"a": one.pk, "b": eight.pk})
    assert response.status_code == 200
    row = next(r for r in response.context["rows"] if r["label"] == "Output tokens/s")
    measured, predicted = (float(row[k].lstrip("×")) for k in ("change", "predicted_change"))
    # The batching gain, both sides: more than 3x from batch 1 to 8, and the two agree.
    assert measured > 3 and predicted == pytest.approx(measured, rel=0.25)
    assert "B / A predicted" in response.content.decode()
