"""Ratios a card asks for ("about 21x", "about 1.95x") measured from two of the learner's runs.

One run cannot measure a ratio: a card that teaches "batch 32 gives about 21x the tokens/s of batch
1" needs the batch-32 run and a batch-1 run of the same workload. A `RatioCheck` says which
settings make the baseline point and which may differ between the two; everything else (model,
GPU, prompt and output lengths, engine settings) must be equal, or the ratio would mix two
workloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from django.urls import reverse

from labs.models import LabRun, RunState
from labs.parameters.presets import LABS, rerun_values


@dataclass(frozen=True)
class RatioCheck:
    label: str  # what the ratio divides, in words
    baseline_label: str  # the baseline point, in words
    metric: str  # summary key of the measured figure (higher is better)
    baseline: Mapping[str, object]  # the settings that make a run the baseline point
    # Settings the two runs may differ in besides `baseline`'s: the load's size, not its shape.
    free: frozenset[str]
    quick: Mapping[str, object]  # extra settings for the link that runs the baseline


_LOAD_SIZE = frozenset({"num_prompts", "seed", "request_rate"})

# By the predictor key a card's check names.
RATIO_CHECKS: dict[str, RatioCheck] = {
    "batch_speedup_vs_batch1": RatioCheck(
        label="output tok/s at this batch ÷ at batch 1, same workload",
        baseline_label="the same workload at batch 1",
        metric="output_tokens_per_s",
        baseline={"concurrency": 1},
        free=_LOAD_SIZE | {"max_concurrency", "max_num_seqs"},
        quick={"max_concurrency": 1, "num_prompts": 8},
    ),
    "spec_speedup": RatioCheck(
        label="output tok/s with speculation ÷ without, same workload",
        baseline_label="the same workload without speculation",
        metric="output_tokens_per_s",
        baseline={"spec_tokens": 0},
        free=_LOAD_SIZE | {"spec_method", "acceptance", "draft_cost"},
        quick={"spec_method": "none", "acceptance": None, "draft_cost": None},
    ),
}


def is_baseline_for(
    check: RatioCheck, params: Mapping[str, object], other: Mapping[str, object]
) -> bool:
    """Whether `other` is the baseline point of the workload `params` describes."""
    if any(other.get(name) != value for name, value in check.baseline.items()):
        return False
    if all(params.get(name) == value for name, value in check.baseline.items()):
        return False  # the run is itself at the baseline: dividing it by another says nothing
    ignored = check.free | set(check.baseline)
    names = (set(params) | set(other)) - ignored
    return all(params.get(name) == other.get(name) for name in names)


def baseline_url(check: RatioCheck, run: LabRun) -> str:
    """The lab page set to the run's workload at the baseline point, one click from running."""
    lab = LABS.get(run.lab) or LABS["sandbox"]
    settings = rerun_values(lab, {**run.params, **check.baseline, **check.quick})
    query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in settings.items()}
    return f"{reverse('labs:lab-detail', args=[lab.slug])}?{urlencode(query)}"


def measured_ratio(check: RatioCheck, run: LabRun, baseline: LabRun) -> float | None:
    """The run's figure over the baseline's, or None if either lacks it."""
    top = (run.result or {}).get(check.metric)
    bottom = (baseline.result or {}).get(check.metric)
    if not isinstance(top, int | float) or not isinstance(bottom, int | float) or bottom <= 0:
        return None
    return top / bottom


# A learner's recent runs of the lab are enough: the baseline is usually run just before or after.
_LOOK_BACK = 200


def find_baseline_run(check: RatioCheck, run: LabRun) -> LabRun | None:
    """The learner's newest finished run that is `run`'s baseline point."""
    candidates = (
        LabRun.objects.filter(
            owner_id=run.owner_id, lab=run.lab, backend=run.backend, state=RunState.DONE
        )
        .exclude(pk=run.pk)
        .order_by("-finished_at", "-id")[:_LOOK_BACK]
    )
    return next((c for c in candidates if is_baseline_for(check, run.params, c.params)), None)
