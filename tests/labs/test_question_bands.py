"""The band a prediction is graded within, and the grade: Good within the measurement's expected
error, Hard within a factor of 2, Again beyond."""

from __future__ import annotations

import pytest

from labs.explanation import accuracy
from labs.questions import bands
from labs.questions.figures import FIGURES

TTFT, E2E, RUNNING, SPEEDUP = (
    FIGURES[k] for k in ("ttft_p50", "e2e_mean", "max_running_seqs", "spec_speedup")
)


def test_the_simulators_band_is_its_published_error_for_the_figure_and_gpu():
    band = bands.expected_band(TTFT, {"gpu": "h100-sxm"}, "sim")
    estimate = accuracy.expected_error("h100-sxm", "TTFT", accuracy.load_errors())
    assert estimate is not None
    assert band.relative == max(estimate.median, bands.MIN_BAND)
    assert band.source == "published" and "on TTFT" in band.words
    # A ratio of throughputs takes the throughput error.
    ratio = bands.expected_band(SPEEDUP, {"gpu": "h100-sxm"}, "sim")
    throughput = accuracy.expected_error("h100-sxm", "throughput", accuracy.load_errors())
    assert throughput is not None and ratio.relative == max(throughput.median, bands.MIN_BAND)


def test_e2e_takes_the_larger_of_the_ttft_and_tpot_errors():
    errors = accuracy.load_errors()
    larger = max(
        accuracy.expected_error("a100-80gb", kind, errors).median for kind in ("TTFT", "TPOT")
    )
    band = bands.expected_band(E2E, {"gpu": "a100-80gb"}, "sim")
    assert band.relative == pytest.approx(larger)
    assert "the larger of their errors" in band.words


def test_a_count_is_within_one_or_five_percent():
    band = bands.expected_band(RUNNING, {"gpu": "h100-sxm"}, "sim")
    assert band.source == "count"
    assert bands.grade(6, 5, band, count=True).rating == bands.GOOD  # one sequence off
    assert bands.grade(7, 5, band, count=True).rating == bands.HARD


def test_a_real_engines_band_is_its_run_to_run_spread():
    band = bands.expected_band(TTFT, {}, "vllm", [100.0, 104.0, 95.0])
    assert band.source == "device-spread"
    assert band.relative == pytest.approx(0.05)  # 95 is 5% under the median, 100
    # A ratio's two runs both vary.
    assert bands.expected_band(SPEEDUP, {}, "vllm", [100, 104, 95]).relative == pytest.approx(0.1)
    alone = bands.expected_band(TTFT, {}, "vllm", [100.0])
    assert alone.source == "device-default" and alone.relative == bands.DEFAULT_BAND


@pytest.mark.parametrize(
    ("value", "rating", "says"),
    [
        (110, bands.GOOD, "within the expected error"),
        (89, bands.HARD, "0.89× the measurement: outside its expected error"),
        (199, bands.HARD, "within a factor of 2"),
        (201, bands.AGAIN, "2× the measurement, more than a factor of 2 above it"),
        (49, bands.AGAIN, "more than a factor of 2 below it"),
    ],
)
def test_good_within_the_band_hard_within_a_factor_of_two_else_again(value, rating, says):
    band = bands.Band(0.10, "±10%: test", "published")
    grade = bands.grade(value, 100, band)
    assert grade.rating == rating
    assert says in grade.words
