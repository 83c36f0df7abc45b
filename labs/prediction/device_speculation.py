"""Speculation as a calibrated CPU worker's engine runs it, for the formulas.

vLLM's CPU build has no synthetic rejection sampler: an ngram run accepts what its greedy tokens
match, not the lab's alpha, and its proposer drafts only where the context repeats. A CPU
worker's calibration measures both on its sweep's speculative points (`ngram_acceptance` where
it drafted, `ngram_draft_share` of the steps that did; labs.calibration.sweep
.ngram_drafting) and fits the CPU time drafting adds to every step (`spec_step_overhead_s`).
`lab_prediction_on` prices an ngram run on that device with them:

- the tokens a step makes, share x (1 - a^(k+1)) / (1 - a) + (1 - share), given to the formula
  as the acceptance of a step that always drafts (`every_step_acceptance`);
- the proposer's time on every step as the draft cost that takes as long at batch 1;
- "Draft tokens accepted" as vLLM counts it, of the drafts made: (tokens per drafting step - 1)
  / k at the measured acceptance.

Elsewhere (a GPU, whose sampler takes the lab's alpha; a calibration without these figures) the
prediction is the formulas' own. Plain Python; never Django.
"""

from __future__ import annotations

from dataclasses import replace

from labs.parameters.catalog import CPU_KIND
from labs.parameters.device_calibration import DeviceConstants, every_step_acceptance
from labs.parameters.params import LabParams
from labs.prediction.predict import decode_step_time, lab_prediction, spec_tokens_per_step


def _drafts_as_measured(params: LabParams, device: DeviceConstants | None) -> bool:
    engine = params.engine
    return (
        device is not None
        and params.hardware.name == CPU_KIND
        and engine.spec_method == "ngram"
        and engine.spec_tokens > 0
        and device.ngram_acceptance is not None
        and device.ngram_draft_share is not None
    )


def priced_params(params: LabParams, device: DeviceConstants | None) -> LabParams:
    """`params` with the acceptance and draft cost the device's ngram runs have; unchanged where
    its calibration did not measure them or the run does not speculate by ngram on a CPU."""
    if device is None or not _drafts_as_measured(params, device):
        return params
    assert device.ngram_acceptance is not None and device.ngram_draft_share is not None
    engine = params.engine
    k, share = engine.spec_tokens, device.ngram_draft_share
    per_step = share * spec_tokens_per_step(k, min(device.ngram_acceptance, 0.999)) + (1 - share)
    plain = decode_step_time(
        params.hardware,
        params.model,
        device.predictor_engine(engine),
        1,
        params.workload.prompt_tokens,
    )
    cost = (device.spec_step_overhead_s or 0.0) / (k * plain) if plain > 0 else 0.0
    priced = replace(
        engine,
        acceptance=every_step_acceptance(k, per_step),
        draft_cost=max(engine.draft_cost, cost),
    )
    return replace(params, engine=priced)


def draft_acceptance_rate(params: LabParams, device: DeviceConstants | None) -> float | None:
    """The share of its drafts the device's engine accepts, as vLLM counts it (accepted over
    drafted, where the proposer drafted); None where the formulas' own figure stands."""
    if device is None or not _drafts_as_measured(params, device):
        return None
    assert device.ngram_acceptance is not None
    k = params.engine.spec_tokens
    return (spec_tokens_per_step(k, min(device.ngram_acceptance, 0.999)) - 1) / k


def lab_prediction_on(params: LabParams, device: DeviceConstants | None) -> dict[str, object]:
    """labs.prediction.predict.lab_prediction on the lab's device: priced by its calibration, and
    an ngram run on a calibrated CPU worker as its engine drafts."""
    values = lab_prediction(priced_params(params, device), device)
    rate = draft_acceptance_rate(params, device)
    if rate is not None:
        values["draft_acceptance_rate"] = rate
    return values
