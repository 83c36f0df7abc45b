"""A ratio card's number from two runs: which run is the baseline of which, and whether a card's
preset can measure the ratio the card teaches at all."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings

from labs.backends import get_backend
from labs.explanation import ratios
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState
from labs.parameters.params import parse_lab_params
from labs.parameters.presets import LABS, load_presets
from quiz.content import read_tree
from tests.labs.factories import make_run

BATCH = ratios.RATIO_CHECKS["batch_speedup_vs_batch1"]
SPEC = ratios.RATIO_CHECKS["spec_speedup"]
RATIO_CARDS = [
    card
    for card in read_tree(Path(settings.BASE_DIR) / "content").cards
    if card.lab_preset and (card.check or {}).get("key") in ratios.RATIO_CHECKS
]


def _preset_params(slug: str) -> dict[str, object]:
    preset = load_presets()[slug]
    return parse_lab_params({**LABS[preset.lab].defaults, **preset.params}).as_dict()


def _measured(params: dict[str, object]) -> dict:
    return summarize(get_backend("sim").run(parse_lab_params(params), lambda _: None))


def test_the_baseline_is_the_same_workload_at_batch_1():
    batch32 = _preset_params("batching-llama3-8b-h100-batch-32")
    batch1 = parse_lab_params({**batch32, "concurrency": 1, "max_concurrency": 1}).as_dict()
    assert ratios.is_baseline_for(BATCH, batch32, batch1)
    # The load's size may differ; its shape may not.
    assert ratios.is_baseline_for(BATCH, batch32, {**batch1, "num_prompts": 4})
    assert not ratios.is_baseline_for(BATCH, batch32, {**batch1, "prompt_tokens": 2048})
    assert not ratios.is_baseline_for(BATCH, batch32, {**batch1, "gpu": "a100-80gb"})
    assert not ratios.is_baseline_for(BATCH, batch32, {**batch1, "concurrency": 2})
    # A batch-1 run has no batch-1 baseline to be divided by.
    assert not ratios.is_baseline_for(BATCH, batch1, {**batch1, "num_prompts": 4})


def test_the_baseline_of_a_speculation_run_is_the_same_workload_without_it():
    spec = _preset_params("speculation-k3-batch-1")
    plain = parse_lab_params({**spec, "spec_tokens": 0, "spec_method": None}).as_dict()
    assert ratios.is_baseline_for(SPEC, spec, plain)
    assert not ratios.is_baseline_for(SPEC, spec, {**plain, "output_tokens": 128})


@pytest.mark.parametrize("card", RATIO_CARDS, ids=lambda c: c.slug)
def test_a_ratio_cards_preset_and_its_baseline_measure_the_cards_answer(card):
    """The preset's workload can test the card's claim: on the simulator, the preset's run over
    its baseline run lands within 10% of the card's answer (the card's formula leaves out real
    kernels' efficiencies, so not within its tolerance)."""
    check = ratios.RATIO_CHECKS[card.check["key"]]
    params = _preset_params(card.lab_preset)
    baseline = parse_lab_params(
        {**params, **check.baseline, **check.quick}, ignore_unknown=True
    ).as_dict()
    assert ratios.is_baseline_for(check, params, baseline)
    top, bottom = _measured(params), _measured(baseline)
    measured = top[check.metric] / bottom[check.metric]
    assert measured == pytest.approx(card.numeric_value, rel=0.10), (
        f"{card.lab_preset} measures {measured:.2f}x, the card {card.slug} teaches "
        f"{card.numeric_value}x"
    )


def test_there_are_ratio_cards_to_check():
    assert {c.check["key"] for c in RATIO_CARDS} == set(ratios.RATIO_CHECKS)


@pytest.mark.django_db
def test_it_finds_the_learners_newest_baseline_run_and_divides_by_it(alice, bob):
    batch32 = _preset_params("batching-llama3-8b-h100-batch-32")
    batch1 = parse_lab_params({**batch32, "concurrency": 1, "max_concurrency": 1}).as_dict()
    run = make_run(alice, lab="batching", params=batch32, state=RunState.DONE)
    LabRun.objects.filter(pk=run.pk).update(result={"output_tokens_per_s": 3000.0})
    run.refresh_from_db()
    assert ratios.find_baseline_run(BATCH, run) is None

    other_shape = make_run(
        alice, lab="batching", params={**batch1, "output_tokens": 256}, state=RunState.DONE
    )
    someone_elses = make_run(bob, lab="batching", params=batch1, state=RunState.DONE)
    unfinished = make_run(alice, lab="batching", params=batch1, state=RunState.RUNNING)
    assert ratios.find_baseline_run(BATCH, run) is None, (other_shape, someone_elses, unfinished)

    mine = make_run(alice, lab="batching", params=batch1, state=RunState.DONE)
    LabRun.objects.filter(pk=mine.pk).update(result={"output_tokens_per_s": 150.0})
    found = ratios.find_baseline_run(BATCH, run)
    assert found is not None and found.pk == mine.pk
    assert ratios.measured_ratio(BATCH, run, found) == pytest.approx(20.0)


def test_the_link_to_the_baseline_opens_the_lab_at_batch_1_with_the_same_workload(alice):
    batch32 = _preset_params("batching-llama3-8b-h100-batch-32")
    run = LabRun(owner=alice, lab="batching", params=batch32, backend="sim")
    url = urlsplit(ratios.baseline_url(BATCH, run))
    assert url.path == "/labs/batching/"
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert query["concurrency"] == "1" and query.get("max_concurrency", "1") == "1"
    assert query["prompt_tokens"] == "1024" and query["output_tokens"] == "2048"
    # It parses, and what it would run is the baseline of the run.
    linked = parse_lab_params({**LABS["batching"].defaults, **query}).as_dict()
    assert ratios.is_baseline_for(BATCH, batch32, linked)
