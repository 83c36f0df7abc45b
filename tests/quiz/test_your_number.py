"""A deck card's "your number": the learner's own measurement of the card's quantity, in the
card's unit (a ratio card divides two of the learner's runs), or said not to be the card's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.conf import settings

from labs.models import LabRun
from labs.parameters.presets import load_presets
from quiz import personal
from quiz.content import read_tree
from tests.quiz.factories import make_card
from tests.quiz.test_personal import _reveal, finished_run

pytestmark = pytest.mark.django_db


def test_a_ratio_card_shows_the_learners_measured_ratio_in_its_own_unit(alice_client, alice):
    """The batch-32 card teaches "about 21x": its number is the batch-32 run over a batch-1 run
    of the same workload, not the batch-32 run's tok/s next to a "x" answer."""
    card = make_card(
        "numeric",
        slug="batch32-ratio",
        lab_preset="batching-llama3-8b-h100-batch-32",
        check_json='{"key": "batch_speedup_vs_batch1", "params": {}}',
        numeric_value=21.0,
        numeric_unit="x",
    )
    presets = load_presets()
    batch32 = finished_run(alice, **presets[card.lab_preset].params)
    LabRun.objects.filter(pk=batch32.pk).update(preset=card.lab_preset)

    # One point only: its own figure, and the link that runs the other point.
    html = _reveal(alice_client)
    tok_s = f"{batch32.result['output_tokens_per_s']:,.0f} tok/s"
    assert f"You measured <strong>{tok_s}</strong>" in html
    assert "×</strong>" not in html
    link = re.search(r'<a href="([^"]+)" data-baseline-link>run the same workload at batch 1', html)
    assert link and "concurrency=1" in link.group(1).replace("&amp;", "&")

    # Both points: the ratio, in the card's unit, from both runs.
    batch1 = finished_run(alice, **presets["batching-llama3-8b-h100-batch-1"].params)
    html = _reveal(alice_client)
    ratio = batch32.result["output_tokens_per_s"] / batch1.result["output_tokens_per_s"]
    assert f"You measured <strong>{ratio:.3g}×</strong>" in html
    assert f"run #{batch32.pk}</a>" in html and f"run #{batch1.pk}</a>" in html
    assert "data-baseline-link" not in html
    assert 19 <= ratio <= 23  # the decode-heavy preset pair measures the card's claim


DECK_NUMERIC_WITH_PRESET = [
    spec
    for spec in read_tree(Path(settings.BASE_DIR) / "content").cards
    if spec.kind == "numeric" and spec.lab_preset
]
SAME_UNIT = {"ms": (" ms", " s", " µs"), "s": (" ms", " s", " µs"), "x": ("×",)}


@pytest.mark.parametrize("spec", DECK_NUMERIC_WITH_PRESET, ids=lambda s: s.slug)
def test_a_deck_cards_number_is_in_its_own_unit_or_says_it_is_not_the_cards(alice, spec):
    """After a run of the card's preset, "You measured" is the card's quantity in the card's
    unit; a quantity no run measures (KiB per token, GPUs needed) is not passed off as one."""
    card = make_card(
        "numeric",
        slug=spec.slug,
        lab_preset=spec.lab_preset,
        check_json=json.dumps(spec.check or {}),
        numeric_value=spec.numeric_value,
        numeric_unit=spec.numeric_unit,
    )
    preset = load_presets()[spec.lab_preset]
    run = finished_run(alice, preset.lab, **preset.params)
    LabRun.objects.filter(pk=run.pk).update(preset=preset.slug)
    number = personal.your_number(user_id=alice.pk, card=card)
    assert number is not None and number.run.pk == run.pk
    if number.card_quantity:
        endings = SAME_UNIT.get(spec.numeric_unit, (f" {spec.numeric_unit}",))
        ratio_link = number.baseline_url and spec.numeric_unit == "x"  # one point of a ratio
        assert ratio_link or number.value.endswith(endings), (number.value, spec.numeric_unit)
    else:
        measured = {"decode_step_s", "spec_tokens_per_step", "max_concurrent_seqs"}
        assert (spec.check or {}).get("key") not in measured


def test_a_quantity_no_run_measures_is_not_shown_as_measured(alice_client, alice):
    card = make_card(
        "numeric",
        slug="kv-bytes",
        lab_preset="kv-capacity-llama3-8b-h100-bf16",
        check_json='{"key": "kv_bytes_per_token", "params": {}}',
        numeric_value=128,
        numeric_unit="KiB",
    )
    preset = load_presets()[card.lab_preset]
    run = finished_run(alice, preset.lab, **preset.params)
    LabRun.objects.filter(pk=run.pk).update(preset=preset.slug)
    html = _reveal(alice_client)
    assert "You measured" not in html
    assert f"Your run #{run.pk}</a> of this card's preset" in html
    assert "no run measures it directly" in html


def test_a_recall_card_shows_its_labs_headline_figure(alice_client, alice):
    """A card with no check shows the lab's headline figure (batching: output tok/s)."""
    card = make_card(slug="why-batch", lab_preset="batching-llama3-8b-h100-batch-32")
    run = finished_run(alice, **load_presets()[card.lab_preset].params)
    LabRun.objects.filter(pk=run.pk).update(preset=card.lab_preset)
    html = _reveal(alice_client)
    tok_s = f"{run.result['output_tokens_per_s']:,.0f} tok/s"
    assert f"You measured <strong>{tok_s}</strong>" in html and "(Output tokens/s)" in html
