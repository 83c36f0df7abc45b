"""The figures a lab question may ask for: what a run measures, what the formulas say, and how a
learner types it. A ratio figure divides the run by its baseline run (labs.explanation.ratios), so
its question runs as a pair."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from labs.explanation.ratios import RATIO_CHECKS, RatioCheck
from labs.explanation.results import dig


@dataclass(frozen=True)
class Figure:
    key: str  # the name a question file uses
    label: str  # "TTFT, median"
    phrase: str  # inside a sentence: "the median TTFT"
    measured: str  # the run summary's key (labs.measurement.metrics)
    predicted: str | None  # the predictor's key; None: the formulas have no such figure
    unit: str  # what the learner types: "tok/s", "ms", "×", "sequences"
    scale: float  # summary value × scale = value in `unit`
    kind: (
        str | None
    )  # labs.explanation.accuracy's kind of figure (its expected error); None: a count
    ratio: RatioCheck | None = None

    def of(self, summary: Mapping[str, Any] | None, key: str | None = None) -> float | None:
        """This figure in `unit` from one run's summary (or prediction, with `key`)."""
        value = dig(summary, key or self.measured)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) * self.scale


def _ratio(key: str, label: str, phrase: str) -> Figure:
    check = RATIO_CHECKS[key]
    return Figure(
        key=key,
        label=label,
        phrase=phrase,
        measured=check.metric,
        predicted=check.metric,
        unit="×",
        scale=1.0,
        kind="throughput",
        ratio=check,
    )


FIGURES: dict[str, Figure] = {
    f.key: f
    for f in (
        Figure(
            "output_tokens_per_s",
            "Output tokens/s",
            "output tokens/s",
            "output_tokens_per_s",
            "output_tokens_per_s",
            "tok/s",
            1.0,
            "throughput",
        ),
        Figure(
            "ttft_p50",
            "TTFT, median",
            "the median TTFT",
            "ttft_s.p50",
            "loaded_ttft_p50_s",
            "ms",
            1000.0,
            "TTFT",
        ),
        Figure(
            "ttft_mean",
            "TTFT, mean",
            "the mean TTFT",
            "ttft_s.mean",
            "loaded_ttft_s",
            "ms",
            1000.0,
            "TTFT",
        ),
        Figure(
            "tpot_p50",
            "TPOT, median",
            "the median TPOT",
            "tpot_s.p50",
            "tpot_s",
            "ms",
            1000.0,
            "TPOT",
        ),  # fmt: skip
        Figure(
            "itl_p99",
            "ITL, p99",
            "the p99 inter-token latency",
            "itl_s.p99",
            None,
            "ms",
            1000.0,
            "TPOT",
        ),  # fmt: skip
        Figure(
            "e2e_mean",
            "E2E latency, mean",
            "the mean end-to-end latency",
            "e2e_s.mean",
            "loaded_e2e_s",
            "s",
            1.0,
            "E2E",
        ),
        Figure(
            "max_running_seqs",
            "Running sequences, peak",
            "the peak of running sequences",
            "max_running_seqs",
            "running_seqs",
            "sequences",
            1.0,
            None,
        ),
        _ratio(
            "batch_speedup_vs_batch1",
            "Output tokens/s as a multiple of batch 1",
            "the batching speedup over batch 1",
        ),
        _ratio(
            "spec_speedup",
            "Speculation's speedup (tok/s with ÷ without)",
            "speculation's speedup",
        ),
    )
}
