"""A finished lab run becomes the learner's own card: predict a neighbouring setting."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from labs.backends import get_backend
from labs.metrics import summarize
from labs.models import LabRun, RunState, Sweep
from labs.params import parse_lab_params
from labs.presets import LABS, lab_initial
from quiz import personal, selectors
from quiz.models import Card
from quiz.selectors import content_snapshot
from tests.quiz.factories import at, make_card

pytestmark = pytest.mark.django_db


def _measure(params: dict) -> tuple[dict, str]:
    record = get_backend("sim").run(parse_lab_params(params), lambda _: None)
    return summarize(record), str(record.where)


def finished_run(owner, lab: str = "batching", sweep=None, index=None, **values) -> LabRun:
    """A run as the worker leaves it: the sim backend's real summary, state done."""
    params = parse_lab_params({**lab_initial(LABS[lab]), **values}).as_dict()
    result, where = _measure(params)
    now = timezone.now()
    return LabRun.objects.create(
        owner=owner,
        lab=lab,
        backend="sim",
        params=params,
        state=RunState.DONE,
        progress=1.0,
        result=result,
        where=where,
        started_at=now,
        finished_at=now,
        sweep=sweep,
        sweep_index=index,
    )


def test_it_asks_for_the_next_setting_and_answers_with_the_simulator(alice):
    run = finished_run(alice, max_num_seqs=64, concurrency=128)
    card = personal.card_from_run(user=alice, run=run)

    assert card.owner == alice and card.kind == Card.Kind.NUMERIC and card.is_active
    measured = run.result["output_tokens_per_s"]
    assert "llama-3-8b on h100-sxm, max_num_seqs 64" in card.prompt
    assert f"{measured:,.0f} tok/s" in card.prompt and "simulated" in card.prompt
    assert card.prompt.endswith("Predict the output tokens/s at max_num_seqs 128.")
    # The answer is what the simulator gives at max_num_seqs 128, same workload and seed.
    neighbour, _ = _measure({**run.params, "max_num_seqs": 128})
    assert card.numeric_value == pytest.approx(neighbour["output_tokens_per_s"], rel=1e-3)
    assert card.numeric_value > measured  # a bigger batch, more tokens/s on the simulator
    assert card.numeric_unit == "tok/s"
    assert card.numeric_tolerance >= 0.045 * card.numeric_value
    assert card.numeric_accepts(card.numeric_value + card.numeric_tolerance * 0.9)
    assert not card.numeric_accepts(card.numeric_value * 2)
    # Worked steps: the run's own number, the predictor at both settings, the simulator's answer.
    assert f"Your run #{run.pk}" in card.steps[0]
    assert any("Predictor, decode step" in step for step in card.steps)
    assert any(step.startswith("Predicted Output tokens/s") for step in card.steps)
    assert "simulated with the same workload and seed" in card.steps[-1]
    # Making it again returns the same card.
    assert personal.card_from_run(user=alice, run=run) == card


def test_a_sweep_point_answers_with_the_learners_own_measurement(alice):
    sweep = Sweep.objects.create(
        owner=alice, lab="batching", backend="sim", field="max_num_seqs", values=[16, 32]
    )
    low = finished_run(alice, sweep=sweep, index=0, max_num_seqs=16, concurrency=64)
    high = finished_run(alice, sweep=sweep, index=1, max_num_seqs=32, concurrency=64)
    assert personal.sweep_card_run(sweep) == low
    card = personal.card_from_run(user=alice, run=low)
    assert card.numeric_value == pytest.approx(high.result["output_tokens_per_s"], rel=1e-3)
    assert f"your sweep's run #{high.pk}" in card.answer
    assert "max_num_seqs 32" in card.prompt


def test_a_latency_metric_is_asked_in_milliseconds(alice):
    run = finished_run(alice, lab="speculative", spec_tokens=3)
    card = personal.card_from_run(user=alice, run=run)
    assert card.numeric_unit == "ms"
    assert "at spec_tokens 4" in card.prompt
    neighbour, _ = _measure({**run.params, "spec_tokens": 4})
    assert card.numeric_value == pytest.approx(neighbour["tpot_s"]["p50"] * 1000, rel=1e-3)


def test_it_refuses_unfinished_foreign_and_oversized_runs(alice, bob):
    run = finished_run(alice)
    with pytest.raises(personal.CardRefused, match="Only the learner who ran it"):
        personal.card_from_run(user=bob, run=run)
    LabRun.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    run.refresh_from_db()
    with pytest.raises(personal.CardRefused, match="Only a finished run"):
        personal.card_from_run(user=alice, run=run)
    big = LabRun.objects.create(
        owner=alice,
        lab="batching",
        backend="sim",
        params={**run.params, "num_prompts": 100_000},
        state=RunState.DONE,
        result=run.result,
    )
    with pytest.raises(personal.CardRefused, match="fewer num_prompts"):
        personal.card_from_run(user=alice, run=big)
    assert not Card.objects.exists()


def test_personal_cards_stay_out_of_the_deck_files_the_anki_export_and_load_content(alice):
    call_command("load_content", stdout=io.StringIO())
    card = personal.card_from_run(user=alice, run=finished_run(alice))
    tree, retired = content_snapshot()
    assert card.slug not in {c.slug for c in tree.cards} | retired
    assert personal.PERSONAL_DECK not in {d.slug for d in tree.decks}
    call_command("load_content", stdout=io.StringIO())  # would retire cards not in the files
    card.refresh_from_db()
    assert card.is_active


def test_only_its_owner_is_quizzed_on_it_and_it_comes_first(alice, bob):
    make_card(slug="shared")
    card = personal.card_from_run(user=alice, run=finished_run(alice))
    now = at(2026, 3, 2, 12)
    assert selectors.queue_today(user=alice, now=now).next_card_id == card.pk
    bobs = selectors.queue_today(user=bob, now=now)
    assert bobs.next_card_id != card.pk and bobs.new_left == 1
    with pytest.raises(Card.DoesNotExist):
        selectors.card_detail_get(slug=card.slug, user=bob)


def test_the_buttons_make_show_and_retire_a_card(alice_client, alice, bob):
    run = finished_run(alice)
    page = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    assert reverse("quiz:card-from-run", args=[run.pk]) in page
    response = alice_client.post(reverse("quiz:card-from-run", args=[run.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("quiz:today")
    card = Card.objects.get(owner=alice)
    today = alice_client.get(reverse("quiz:today")).content.decode()
    assert "Predict the output tokens/s at max_num_seqs" in today
    assert "it comes first among today" in today

    client = Client()
    client.force_login(bob)
    assert client.post(reverse("quiz:card-from-run", args=[run.pk])).status_code == 404
    assert client.post(reverse("quiz:card-retire", args=[card.slug])).status_code == 404
    shared = make_card(slug="deck-card")
    assert client.post(reverse("quiz:card-retire", args=[shared.slug])).status_code == 404

    response = alice_client.post(reverse("quiz:card-retire", args=[card.slug]))
    assert response.status_code == 302
    card.refresh_from_db()
    assert not card.is_active


def test_a_sweep_page_offers_the_button_once_two_points_are_done(alice_client, alice):
    sweep = Sweep.objects.create(
        owner=alice, lab="batching", backend="sim", field="max_num_seqs", values=[8, 16]
    )
    finished_run(alice, sweep=sweep, index=0, max_num_seqs=8)
    url = reverse("quiz:card-from-sweep", args=[sweep.pk])
    assert url not in alice_client.get(sweep.get_absolute_url()).content.decode()
    finished_run(alice, sweep=sweep, index=1, max_num_seqs=16)
    assert url in alice_client.get(sweep.get_absolute_url()).content.decode()
    assert alice_client.post(url).status_code == 302
    assert Card.objects.filter(owner=alice, prompt__contains="at max_num_seqs 16").exists()


def _reveal(client) -> str:
    page = client.get(reverse("quiz:today")).content.decode()
    match = re.search(r"/quiz/answer/([\w-]+)/", page)
    if match is None:  # this showing was revealed already: the panel shows its answer side
        assert 'data-side="answer"' in page
        return page
    token = match.group(1)
    response = client.post(reverse("quiz:answer-submit", args=[token]), {}, HTTP_HX_REQUEST="true")
    return response.content.decode()


def test_your_number_comes_from_the_learners_newest_finished_run_of_the_preset(alice, bob):
    preset = "batching-llama3-8b-h100-batch-32"
    older, newer = finished_run(alice, max_num_seqs=16), finished_run(alice, max_num_seqs=32)
    unfinished, others = finished_run(alice), finished_run(bob)
    LabRun.objects.filter(pk__in=[older.pk, newer.pk, unfinished.pk, others.pk]).update(
        preset=preset
    )
    LabRun.objects.filter(pk=older.pk).update(finished_at=at(2026, 6, 1, 9))
    LabRun.objects.filter(pk=newer.pk).update(finished_at=at(2026, 6, 2, 9))
    LabRun.objects.filter(pk=unfinished.pk).update(state=RunState.RUNNING, finished_at=None)
    LabRun.objects.filter(pk=others.pk).update(finished_at=at(2026, 6, 3, 9))

    found = personal.latest_done_run(user_id=alice.pk, preset=preset)
    assert found.pk == newer.pk
    # Read by hand, it is the ORM's row: JSON, datetimes and all.
    orm = LabRun.objects.get(pk=newer.pk)
    for field in LabRun._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(orm, field.attname), field.name
    assert personal.latest_done_run(user_id=alice.pk, preset="no-such-preset") is None


def test_a_deck_card_shows_the_learners_own_number_from_its_preset(alice_client, alice, bob):
    card = make_card(
        slug="batch-32",
        lab_preset="batching-llama3-8b-h100-batch-32",
        check_json='{"key": "output_tokens_per_s", "params": {}}',
    )
    assert "You measured" not in _reveal(alice_client)  # no run of the preset yet

    run = finished_run(alice, max_num_seqs=32)
    LabRun.objects.filter(pk=run.pk).update(preset=card.lab_preset)
    finished_run(bob)  # someone else's run of another preset changes nothing
    html = _reveal(alice_client)
    value = f"{run.result['output_tokens_per_s']:,.0f} tok/s"
    assert f"You measured <strong>{value}</strong>" in html
    assert f"run #{run.pk}</a>" in html and "simulated · H100 SXM · calibrated</span>" in html
    detail = alice_client.get(reverse("quiz:card-detail", args=[card.slug])).content.decode()
    assert value in detail

    other = Client()
    other.force_login(bob)
    assert "You measured" not in _reveal(other)
