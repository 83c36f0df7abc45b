"""A finished lab run becomes the learner's own card: predict a neighbouring setting."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import sqlite3
import zipfile

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from labs import api as labs_api
from labs.backends import get_backend
from labs.explanation.your_number import latest_done_run
from labs.measurement.metrics import summarize
from labs.models import LabRun, RunState, Sweep, WorkerHeartbeat
from labs.parameters.params import parse_lab_params
from labs.parameters.presets import LABS, lab_initial
from quiz import personal, selectors
from quiz.models import Card, PersonalCardRequest
from quiz.selectors import content_snapshot
from tests.conftest import make_user
from tests.labs.factories import make_heartbeat, make_run
from tests.quiz.factories import (
    at,
    make_card,
    make_deck,
    make_review_state,
    make_settings,
    review,
)
from tests.threads import race

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


def _last_number(text: str) -> str:
    """The last number written in `text`, as it is written ("1,965", "4.29")."""
    return re.findall(r"\d[\d,]*(?:\.\d+)?", text)[-1]


def test_it_asks_for_the_next_setting_and_answers_with_the_worked_method(alice):
    run = finished_run(alice, max_num_seqs=64, concurrency=128)
    card = personal.card_from_run(user=alice, run=labs_api.run_data(run.pk))

    assert card.owner == alice and card.kind == Card.Kind.NUMERIC and card.is_active
    measured = run.result["output_tokens_per_s"]
    title, details = card.prompt.split("\n\n")
    assert title == (
        f"Run #{run.pk} at max_num_seqs 64: predict the output tokens/s at max_num_seqs 128."
    )
    assert details.startswith("Your run: llama-3-8b on h100-sxm, max_num_seqs 64; workload: ")
    assert f"{measured:,.0f} tok/s" in card.prompt and "simulated" in card.prompt
    assert details.endswith("Everything else stays the same.")
    # The graded answer is the last step's result: your measurement x the predictor's ratio.
    ratio = float(re.search(r"a ratio of (\d\.\d{3})", " ".join(card.steps)).group(1))
    assert card.numeric_value == round(round(measured) * ratio)
    assert card.steps[-1].endswith(f"= {card.numeric_value:,.0f} tok/s.")
    assert card.numeric_unit == "tok/s"
    assert card.numeric_tolerance >= 0.05 * card.numeric_value
    assert not card.numeric_accepts(card.numeric_value * 2)
    # What the simulator measured at max_num_seqs 128 (same workload and seed) is shown beside it.
    neighbour, _ = _measure({**run.params, "max_num_seqs": 128})
    observed = neighbour["output_tokens_per_s"]
    assert "What the run measured: at max_num_seqs 128, simulated with the same workload" in (
        card.explanation
    )
    assert f"{observed:,.0f} tok/s" in card.explanation
    if abs(observed - card.numeric_value) <= 0.25 * card.numeric_value:
        assert card.numeric_accepts(observed)  # within reach: the measurement counts too
    # Worked steps: the run's own number, the predictor at both settings, the scaling.
    assert f"Your run #{run.pk}" in card.steps[0]
    assert any("Predictor, decode step" in step for step in card.steps)
    assert any(step.startswith("Predicted output tokens/s") for step in card.steps)
    # Making it again returns the same card.
    assert personal.card_from_run(user=alice, run=labs_api.run_data(run.pk)) == card


def test_it_asks_at_a_setting_where_the_limit_binds_and_titles_each_card_apart(alice):
    # Both cards made from the batching lab's own runs (32 requests in flight) asked at
    # max_num_seqs 128, where the limit never binds (a ratio of 1.000), and had one title.
    runs = [finished_run(alice), finished_run(alice, max_num_seqs=16)]
    assert [run.params["concurrency"] for run in runs] == [32, 32]
    cards = [personal.card_from_run(user=alice, run=labs_api.run_data(run.pk)) for run in runs]
    ratios = [
        float(re.search(r"a ratio of (\d\.\d{3})", " ".join(card.steps)).group(1)) for card in cards
    ]
    assert all(ratio != 1.0 for ratio in ratios), ratios
    current = runs[0].params["max_num_seqs"]
    assert current >= 32 and f"at max_num_seqs {current}: predict" in cards[0].title
    # Above 32 nothing changes; the nearest value below that binds is asked.
    assert "at max_num_seqs 16." in cards[0].prompt.split("\n")[0]
    assert "at max_num_seqs 32." in cards[1].prompt.split("\n")[0]
    assert len({card.title for card in cards}) == 2


def test_the_prompt_states_the_whole_workload(alice):
    run = finished_run(alice, lab="prefix-caching", tp=2, input_range_ratio=0.25)
    card = personal.card_from_run(user=alice, run=labs_api.run_data(run.pk))
    p = run.params
    for text in (
        f"{p['model']} on {p['gpu']} × 2 (tp 2)",
        f"{p['num_prompts']:,} requests of {p['prompt_tokens']:,} prompt + "
        f"{p['output_tokens']:,} output tokens, {p['concurrency']:,} in flight",
        f"the first {p['shared_prefix_tokens']:,} prompt tokens shared",
        "prompt lengths ± 25%",
        f"shared_prefix_tokens {p['shared_prefix_tokens']};",
    ):
        assert text in card.prompt, text
    rated = finished_run(alice, request_rate=4.0, max_concurrency=16)
    prompt = personal.card_from_run(user=alice, run=labs_api.run_data(rated.pk)).prompt
    assert "arriving at 4 req/s (at most 16 in flight)" in prompt


def test_the_prompt_names_its_runs_provenance_by_the_short_badge(alice):
    run = finished_run(alice)
    assert run.where.startswith("simulated on CPU as ")  # the long form, kept on the run
    prompt = personal.card_from_run(user=alice, run=labs_api.run_data(run.pk)).prompt
    assert "(simulated · " in prompt and "simulated on CPU as" not in prompt


def test_every_number_in_the_cards_unit_has_the_answers_decimals(alice):
    card = personal.card_from_run(
        user=alice, run=labs_api.run_data(finished_run(alice, lab="speculative").pk)
    )
    assert card.numeric_unit == "ms"
    # The answer as shown ("≈ 4.00 ms"): a stored 4.0 is the same value, written to its decimals.
    shown = re.search(r"(\d[\d,]*(?:\.\d+)?) ms", card.answer).group(1)
    assert float(shown.replace(",", "")) == pytest.approx(card.numeric_value)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    written = [
        number
        for text in [card.prompt, card.answer, card.steps[0], card.steps[-1]]
        for number in re.findall(r"(\d[\d,]*(?:\.\d+)?) ms", text)
    ]
    assert len(written) >= 4
    assert {len(n.split(".")[1]) if "." in n else 0 for n in written} == {decimals}


def test_the_worked_method_typed_as_the_answer_is_graded_correct(alice_client, alice):
    """Through the real quiz: fetch the card, type the last step's result, read the verdict."""
    for lab, values in (("batching", {"max_num_seqs": 16, "concurrency": 64}), ("speculative", {})):
        card = personal.card_from_run(
            user=alice, run=labs_api.run_data(finished_run(alice, lab=lab, **values).pk)
        )
        typed = _last_number(card.steps[-1])
        page = alice_client.get(reverse("quiz:today")).content.decode()
        assert card.prompt.split("\n")[0] in page  # the personal card is the one on screen
        token = re.search(r"/quiz/answer/([\w-]+)/", page).group(1)
        response = alice_client.post(
            reverse("quiz:answer-submit", args=[token]), {"value": typed}, HTTP_HX_REQUEST="true"
        )
        html = response.content.decode()
        assert 'class="numeric-result good"' in html, (lab, typed, card.numeric_value)
        personal.card_retire(user=alice, slug=card.slug)  # the next lab's card comes next


def test_a_sweep_point_shows_the_learners_own_measurement(alice):
    sweep = Sweep.objects.create(
        owner=alice, lab="batching", backend="sim", field="max_num_seqs", values=[16, 32]
    )
    low = finished_run(alice, sweep=sweep, index=0, max_num_seqs=16, concurrency=64)
    high = finished_run(alice, sweep=sweep, index=1, max_num_seqs=32, concurrency=64)
    assert personal.sweep_card_run(labs_api.sweep_data(sweep.pk)) == labs_api.run_data(low.pk)
    card = personal.card_from_run(user=alice, run=labs_api.run_data(low.pk))
    assert f"your sweep's run #{high.pk}" in card.explanation
    assert f"{high.result['output_tokens_per_s']:,.0f} tok/s" in card.explanation
    assert "max_num_seqs 32" in card.prompt


def test_a_latency_metric_is_asked_in_milliseconds(alice):
    run = finished_run(alice, lab="speculative", spec_tokens=3)
    card = personal.card_from_run(user=alice, run=labs_api.run_data(run.pk))
    assert card.numeric_unit == "ms"
    assert "at spec_tokens 4" in card.prompt
    neighbour, _ = _measure({**run.params, "spec_tokens": 4})
    assert f"{neighbour['tpot_s']['p50'] * 1000:.2f} ms" in card.explanation
    assert card.steps[-1].endswith(f"= {card.numeric_value:.2f} ms.")


def _oversized(run: LabRun) -> LabRun:
    """A finished run too large to re-simulate for a card (100,000 prompts)."""
    return LabRun.objects.create(
        owner=run.owner,
        lab=run.lab,
        backend="sim",
        params={**run.params, "num_prompts": 100_000},
        state=RunState.DONE,
        result=run.result,
    )


def test_it_refuses_unfinished_foreign_and_oversized_runs(alice, bob):
    run = finished_run(alice)
    with pytest.raises(personal.CardRefused, match="Only the learner who ran it"):
        personal.card_from_run(user=bob, run=labs_api.run_data(run.pk))
    LabRun.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    run.refresh_from_db()
    with pytest.raises(personal.CardRefused, match="Only a finished run"):
        personal.card_from_run(user=alice, run=labs_api.run_data(run.pk))
    big = _oversized(run)
    with pytest.raises(personal.CardRefused, match="fewer num_prompts"):
        personal.card_from_run(user=alice, run=labs_api.run_data(big.pk))
    assert not Card.objects.exists()


def test_personal_cards_stay_out_of_the_deck_files_and_load_content(alice):
    call_command("load_content", stdout=io.StringIO())
    card = personal.card_from_run(user=alice, run=labs_api.run_data(finished_run(alice).pk))
    tree, retired = content_snapshot()
    assert card.slug not in {c.slug for c in tree.cards} | retired
    assert personal.PERSONAL_DECK not in {d.slug for d in tree.decks}
    call_command("load_content", stdout=io.StringIO())  # would retire cards not in the files
    card.refresh_from_db()
    assert card.is_active


def _download_slugs(client, tmp_path) -> dict[str, str]:
    """The notes of a learner's Anki download: their deck's name by the note's slug field."""
    apkg = tmp_path / "download.apkg"
    apkg.write_bytes(client.get(reverse("quiz:anki-export")).content)
    with zipfile.ZipFile(apkg) as zf:
        (tmp_path / "download.anki2").write_bytes(zf.read("collection.anki2"))
    with sqlite3.connect(tmp_path / "download.anki2") as conn:
        decks = {
            int(deck_id): deck["name"]
            for deck_id, deck in json.loads(
                conn.execute("SELECT decks FROM col").fetchone()[0]
            ).items()
        }
        rows = conn.execute("SELECT n.flds, c.did FROM notes n JOIN cards c ON c.nid = n.id")
        return {fields.split("\x1f")[0]: decks[did] for fields, did in rows}


def test_a_learners_anki_download_has_their_run_cards_and_says_why_predictions_are_not(
    alice, alice_client, bob, tmp_path
):
    # Personal cards were not in the download, and the page did not say so.
    shared = make_card(slug="shared")
    card = personal.card_from_run(user=alice, run=labs_api.run_data(finished_run(alice).pk))
    prediction = make_card("prediction", slug="mine-prediction", owner=alice, deck=card.deck)
    notes = _download_slugs(alice_client, tmp_path)
    assert notes[card.slug] == "Serving School::Your runs"
    assert shared.slug in notes and prediction.slug not in notes
    page = alice_client.get(reverse("quiz:stats")).content.decode()
    assert "It includes your 1 card made from runs" in page
    assert "Your 1 prediction card is left out: each time, the quiz asks one at a setting" in page
    # Nobody else's.
    bob_client = Client()
    bob_client.force_login(bob)
    assert card.slug not in _download_slugs(bob_client, tmp_path)
    assert "made from runs" not in bob_client.get(reverse("quiz:stats")).content.decode()


def test_only_its_owner_is_quizzed_on_it_and_it_comes_first(alice, bob):
    make_card(slug="shared")
    card = personal.card_from_run(user=alice, run=labs_api.run_data(finished_run(alice).pk))
    now = at(2026, 3, 2, 12)
    assert selectors.queue_today(user=alice, now=now).next_card_id == card.pk
    bobs = selectors.queue_today(user=bob, now=now)
    assert bobs.next_card_id != card.pk and bobs.new_left == 1
    with pytest.raises(Card.DoesNotExist):
        selectors.card_detail_get(slug=card.slug, user=bob)


@pytest.fixture
def sent(monkeypatch):
    """The queue of each turn sent to Celery (labs.runs.turns) instead of a broker, and every
    simulation that ran: the web side must send one turn and simulate nothing."""
    messages, simulated = [], []
    monkeypatch.setattr(personal.labs_api, "send_turn", lambda queue, **_: messages.append(queue))
    real = personal._simulate
    monkeypatch.setattr(personal, "_simulate", lambda *a, **k: simulated.append(a) or real(*a, **k))
    return messages, simulated


def _work(messages) -> None:
    """Be the lab worker: take each sent turn (whoever's work is next in turn goes)."""
    for queue in messages:
        personal.labs_api.take_turn(queue=queue, hostname="sim@test")
    messages.clear()


def test_the_button_queues_the_card_on_the_lab_worker_and_my_cards_shows_it(
    alice_client, alice, bob, sent, django_capture_on_commit_callbacks
):
    messages, simulated = sent
    make_heartbeat("sim")
    run = finished_run(alice)
    page = alice_client.get(reverse("labs:run-detail", args=[run.pk])).content.decode()
    assert reverse("quiz:card-from-run", args=[run.pk]) in page
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("quiz:card-from-run", args=[run.pk]))
    request = PersonalCardRequest.objects.get(owner=alice)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('quiz:my-cards')}?request={request.pk}"
    # Nothing simulated in the web request: one message to the sim queue, no card yet.
    assert simulated == [] and not Card.objects.filter(owner=alice).exists()
    assert messages == ["labs.sim"]
    mine = alice_client.get(response["Location"]).content.decode()
    assert f"Making your card from run #{run.pk}" in mine and 'hx-trigger="every 1s"' in mine

    _work(messages)
    assert simulated  # the worker's side is where it simulates
    card = Card.objects.get(owner=alice)
    request.refresh_from_db()
    assert request.state == "done" and request.card == card
    polled = alice_client.get(response["Location"], HTTP_HX_REQUEST="true")
    assert polled.status_code == 286  # htmx stops polling
    html = polled.content.decode()
    assert f"Your card from run #{run.pk} is made." in html
    assert "It comes today, before the deck&#x27;s new cards." in html
    assert reverse("quiz:card-detail", args=[card.slug]) in html
    today = alice_client.get(reverse("quiz:today")).content.decode()
    assert "predict the output tokens/s at max_num_seqs" in today
    listed = alice_client.get(reverse("quiz:my-cards")).content.decode()
    assert "predict the output tokens/s at max_num_seqs" in listed and card.slug in listed
    assert '<strong class="my-card-when">today</strong>' in listed

    client = Client()
    client.force_login(bob)
    assert client.post(reverse("quiz:card-from-run", args=[run.pk])).status_code == 404
    assert client.get(response["Location"]).status_code == 404  # not bob's request
    assert client.post(reverse("quiz:card-retire", args=[card.slug])).status_code == 404
    assert card.slug not in client.get(reverse("quiz:my-cards")).content.decode()
    shared = make_card(slug="deck-card")
    assert client.post(reverse("quiz:card-retire", args=[shared.slug])).status_code == 404
    assert alice_client.get(reverse("quiz:my-cards") + "?request=x%00").status_code == 400

    response = alice_client.post(reverse("quiz:card-retire", args=[card.slug]))
    assert response.status_code == 302
    card.refresh_from_db()
    assert not card.is_active
    # Pressed again: the existing card comes back at once, nothing queued or simulated.
    simulated.clear()
    alice_client.post(reverse("quiz:card-from-run", args=[run.pk]))
    card.refresh_from_db()
    assert card.is_active and messages == [] and simulated == []


def test_eight_parallel_presses_simulate_nothing_in_the_web_and_one_is_queued(
    transactional_db, sent
):
    """The probe's case (issue 26): eight parallel POSTs /quiz/from-run/<pk>/ by one learner. Each
    request does O(1) work (no simulation, which happens only on the worker), one is queued and
    seven are refused by the learner's lock, and /healthz answers beside them."""
    messages, simulated = sent
    learner = make_user("racer")
    make_heartbeat("sim")
    runs = [finished_run(learner, max_num_seqs=16 * (i + 1)) for i in range(8)]

    def worker_still_online():
        # Simulating the runs above can take longer than LABS_WORKER_ONLINE_S on a busy
        # machine; the worker is meant to be online throughout.
        WorkerHeartbeat.objects.update(last_seen=timezone.now())

    def press(run):
        client = Client()
        client.force_login(learner)
        return client.post(reverse("quiz:card-from-run", args=[run.pk]), follow=True)

    def health():
        return Client().get("/healthz")

    worker_still_online()
    results = race(*(lambda r=r: press(r) for r in runs), health)
    assert all(not isinstance(r, Exception) for r in results), results
    *pressed, healthz = results
    assert healthz.status_code == 200
    assert simulated == []
    assert len(messages) == 1
    assert PersonalCardRequest.objects.filter(owner=learner, state="queued").count() == 1
    refused = [r for r in pressed if "already making a card" in r.content.decode()]
    assert len(refused) == 7
    assert all(r.status_code == 200 for r in pressed)

    made_from = PersonalCardRequest.objects.get(owner=learner, state="queued").run_id
    _work(messages)  # the worker makes the one; the lock is free again
    assert Card.objects.filter(owner=learner).count() == 1
    worker_still_online()
    # Which of the eight won the race is chance; pressing that run again would return its card.
    other = next(run for run in runs if run.pk != made_from)
    again = press(other)
    assert again.status_code == 200 and "already making a card" not in again.content.decode()
    assert len(messages) == 1
    assert PersonalCardRequest.objects.filter(run=other, state="queued").count() == 1
    messages.clear()
    simulated.clear()  # the worker's, above

    # Eight learners at once: each press is queued, none simulates in the web.
    others = [make_user(f"learner{i}") for i in range(8)]
    their_runs = [finished_run(other) for other in others]

    def press_own(user, run):
        client = Client()
        client.force_login(user)
        return client.post(reverse("quiz:card-from-run", args=[run.pk]))

    worker_still_online()
    results = race(
        *(lambda u=u, r=r: press_own(u, r) for u, r in zip(others, their_runs, strict=True)),
        health,
    )
    *pressed, healthz = results
    assert healthz.status_code == 200
    assert all(r.status_code == 302 and "/quiz/mine/?request=" in r["Location"] for r in pressed)
    assert simulated == [] and len(messages) == 8


def test_the_worker_records_a_refusal_and_releases_the_lock(
    alice, sent, monkeypatch, django_capture_on_commit_callbacks
):
    messages, _ = sent
    make_heartbeat("sim")
    run = finished_run(alice)
    with django_capture_on_commit_callbacks(execute=True):
        request = personal.card_request(user=alice, run=labs_api.run_data(run.pk))

    def refuse(*_args, **_kwargs):
        raise personal.CardRefused("no.")

    monkeypatch.setattr(personal, "_simulate", refuse)
    _work(messages)
    request.refresh_from_db()
    assert request.state == "failed" and request.error == "no." and request.card is None
    # A second delivery of the same message does nothing (claimed once).
    assert "not claimed" in personal.card_request_execute(request_id=request.pk)
    assert personal.card_request(user=alice, run=labs_api.run_data(run.pk)).state == "queued"


def test_a_broker_that_refuses_the_message_fails_the_request_with_a_reason(
    alice_client, alice, monkeypatch, django_capture_on_commit_callbacks
):
    def broker_down(*_args, **_kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(personal.labs_api, "send_turn", broker_down)
    make_heartbeat("sim")
    run = finished_run(alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("quiz:card-from-run", args=[run.pk]))
    request = PersonalCardRequest.objects.get(owner=alice)
    assert request.state == "failed"  # the lock is free, nothing waits forever
    page = alice_client.get(response["Location"]).content.decode()
    assert "No card was made from run" in page
    assert "The lab queue is unavailable right now" in page
    assert not Card.objects.filter(owner=alice).exists()


def test_the_lab_memory_bound_holds_in_the_web_and_on_the_worker(alice, sent, settings):
    messages, simulated = sent
    make_heartbeat("sim")
    run = finished_run(alice)
    settings.LABS_SIM_MAX_RUN_MB = 1  # nothing fits
    with pytest.raises(personal.CardRefused, match="too large to re-simulate for a card"):
        personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    assert messages == [] and not PersonalCardRequest.objects.exists()
    # Queued while it fitted, simulated when it does not: refused with the reason, no card.
    request = PersonalCardRequest.objects.create(owner=alice, run=run)
    personal.card_request_execute(request_id=request.pk)
    request.refresh_from_db()
    assert request.state == "failed" and "cannot be simulated" in request.error
    assert len(simulated) == 1 and not Card.objects.filter(owner=alice).exists()


def test_a_card_takes_its_turn_among_the_lab_runs_not_after_them(
    alice, bob, sent, django_capture_on_commit_callbacks
):
    # Alice's runs wait on the simulator's queue before Bob asks for a card: the card goes
    # second, in Bob's turn, not after all of Alice's runs (labs.runs.turns).
    messages, _ = sent
    make_heartbeat("sim")
    alices = [make_run(alice, queue="labs.sim") for _ in range(3)]
    run = finished_run(bob)
    with django_capture_on_commit_callbacks(execute=True):
        request = personal.card_request(user=bob, run=labs_api.run_data(run.pk))
    assert messages == ["labs.sim"]  # a turn on the lab queue, naming no work
    # A turn for each piece of work waiting (each run sent its own), taken one by one.
    done = [personal.labs_api.take_turn(queue="labs.sim", hostname="sim@test") for _ in range(4)]
    card = Card.objects.get(owner=bob)
    assert done == [
        f"run {alices[0].pk} done",
        f"card request {request.pk} made card {card.pk}",
        f"run {alices[1].pk} done",
        f"run {alices[2].pk} done",
    ]


def test_a_card_keeps_to_its_own_time_limit_in_a_turn_with_a_runs_longer_one(
    alice, sent, monkeypatch, django_capture_on_commit_callbacks
):
    messages, _ = sent
    make_heartbeat("sim")
    run = finished_run(alice)
    with django_capture_on_commit_callbacks(execute=True):
        request = personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    monkeypatch.setattr(personal, "CARD_SOFT_TIME_LIMIT_S", 0)
    _work(messages)
    request.refresh_from_db()
    assert request.state == "failed" and "took longer than 0 s" in request.error
    assert not Card.objects.filter(owner=alice).exists()


def test_a_request_whose_worker_died_no_longer_holds_the_lock(alice, sent):
    make_heartbeat("sim")
    run = finished_run(alice)
    stuck = personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    with pytest.raises(personal.CardRefused, match="already making a card"):
        personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    assert personal._card_claim(stuck.pk, "sim@test")  # a worker took it, then died
    PersonalCardRequest.objects.filter(pk=stuck.pk).update(
        started_at=timezone.now() - personal.CARD_REQUEST_STALE - dt.timedelta(seconds=1)
    )
    # The page watching it stops waiting; a new press is taken.
    assert personal.card_request_get(user=alice, pk=stuck.pk).state == "failed"
    assert (
        "stopped before the card was made"
        in personal.card_request_get(user=alice, pk=stuck.pk).error
    )
    assert personal.card_request(user=alice, run=labs_api.run_data(run.pk)).state == "queued"


def test_a_request_waiting_its_turn_keeps_the_lock_until_its_message_is_lost(alice, bob, sent):
    """Queued behind other learners' runs, a request waits as long as their turns take: only the
    time since a worker claimed it says that worker was lost; a queued one is released only
    after CARD_QUEUED_STALE, when its message must have been lost."""
    make_heartbeat("sim")
    run = finished_run(alice)
    waiting = personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    long_ago = timezone.now() - personal.CARD_REQUEST_STALE - dt.timedelta(minutes=30)
    PersonalCardRequest.objects.filter(pk=waiting.pk).update(created_at=long_ago)
    assert personal.card_request_get(user=alice, pk=waiting.pk).state == "queued"
    with pytest.raises(personal.CardRefused, match="already making a card"):
        personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    # Claimed now, after its long wait: the worker's own time starts at the claim.
    assert personal._card_claim(waiting.pk, "sim@test")
    assert personal.card_request_get(user=alice, pk=waiting.pk).state == "running"
    # Never claimed in CARD_QUEUED_STALE: its message was lost; the learner can press again.
    lost = PersonalCardRequest.objects.create(owner=bob, run=run)
    PersonalCardRequest.objects.filter(pk=lost.pk).update(
        created_at=timezone.now() - personal.CARD_QUEUED_STALE - dt.timedelta(seconds=1)
    )
    personal._release_stale(lost.owner)
    lost.refresh_from_db()
    assert lost.state == "failed" and "lab queue lost this request" in lost.error


def test_without_a_lab_worker_or_too_large_nothing_is_queued(alice_client, alice, sent):
    messages, simulated = sent
    run = finished_run(alice)
    response = alice_client.post(reverse("quiz:card-from-run", args=[run.pk]), follow=True)
    assert "No lab worker is online" in response.content.decode()
    make_heartbeat("sim")
    big = _oversized(run)
    response = alice_client.post(reverse("quiz:card-from-run", args=[big.pk]), follow=True)
    assert "fewer num_prompts" in response.content.decode()
    assert messages == [] and simulated == [] and not PersonalCardRequest.objects.exists()


def test_a_sweep_page_offers_the_button_once_two_points_are_done(
    alice_client, alice, sent, django_capture_on_commit_callbacks
):
    messages, _ = sent
    make_heartbeat("sim")
    sweep = Sweep.objects.create(
        owner=alice, lab="batching", backend="sim", field="max_num_seqs", values=[8, 16]
    )
    finished_run(alice, sweep=sweep, index=0, max_num_seqs=8)
    url = reverse("quiz:card-from-sweep", args=[sweep.pk])
    assert url not in alice_client.get(sweep.get_absolute_url()).content.decode()
    finished_run(alice, sweep=sweep, index=1, max_num_seqs=16)
    assert url in alice_client.get(sweep.get_absolute_url()).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        assert alice_client.post(url).status_code == 302
    _work(messages)
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

    found = latest_done_run(user_id=alice.pk, preset=preset)
    assert found.pk == newer.pk
    # Read by hand, it is the ORM's row: JSON, datetimes and all.
    orm = LabRun.objects.get(pk=newer.pk)
    for field in LabRun._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(orm, field.attname), field.name
    assert latest_done_run(user_id=alice.pk, preset="no-such-preset") is None


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


def test_my_cards_says_when_each_comes_given_the_new_card_limit(alice, bob):
    make_settings(alice, new_per_day=2, time_zone="Europe/Berlin", rollover_hour=4)
    now = at(2026, 3, 2, 12)  # Monday, 13:00 in Berlin
    review(alice, make_card(slug="shared"), 3, now)  # one of today's two new cards used
    deck = make_deck(personal.PERSONAL_DECK)
    mine = [make_card("numeric", owner=alice, deck=deck, slug=f"mine-{i}") for i in range(4)]
    make_review_state(alice, mine[3], due=at(2026, 3, 9, 8))  # studied; due Monday 9 March
    make_card("numeric", owner=bob, deck=deck, slug="bobs")

    coming = personal.my_cards(user=alice, now=now)
    assert [(c.card.slug, c.when) for c in coming] == [
        ("mine-3", "Mon 9 Mar 2026"),
        ("mine-2", "Tue 3 Mar 2026, from 04:00"),
        ("mine-1", "Tue 3 Mar 2026, from 04:00"),
        ("mine-0", "today"),
    ]
    # The quiz agrees: the first of them is next, and one new card is left today.
    queue = selectors.queue_today(user=alice, now=now)
    assert queue.next_card_id == mine[0].pk and queue.new_left == 1
    assert personal.made_message(user=alice, card=mine[0], now=now) == (
        "It comes today, before the deck's new cards."
    )
    assert personal.made_message(user=alice, card=mine[1], now=now) == (
        "No new card is left for it today (your limit is 2 a day), so it comes on "
        "Tue 3 Mar 2026, from 04:00, when new cards are next available."
    )
    make_settings(alice, new_per_day=0)
    alice = type(alice).objects.get(pk=alice.pk)  # settings are cached on the user
    assert personal.made_message(user=alice, card=mine[2], now=now) == (
        "It comes when you allow new cards (your limit is 0 a day)."
    )


@pytest.mark.parametrize("raw", ["%C2%B2", "%E2%91%A0", "%D9%A3", "1%C2%B2", "x%00"])
def test_a_request_number_that_is_not_ascii_digits_is_refused_by_name(alice_client, raw):
    # "²" and "①" pass str.isdigit() but int() refuses them: once a 500.
    response = alice_client.get(reverse("quiz:my-cards") + f"?request={raw}")
    assert response.status_code == 400
    assert "?request= must be a card request number (digits 0-9" in response.content.decode()


def test_a_card_request_counts_against_the_learners_share(alice, sent, settings):
    """Issue 52: card requests simulate on the lab worker, so they count as runs in the learner's
    share of the simulator queue (and a card in flight counts against the next run)."""
    from labs.runs import submission

    messages, simulated = sent
    make_heartbeat("sim")
    settings.LABS_SIM_QUEUE_CAP, settings.LABS_SIM_QUEUE_SHARES = 4, 2  # a share of 2
    run = finished_run(alice)
    for _ in range(2):
        LabRun.objects.create(owner=alice, lab=run.lab, backend="sim", params=run.params)
    with pytest.raises(personal.CardRefused, match=r"Your share of the simulator queue is 2 runs"):
        personal.card_request(user=alice, run=labs_api.run_data(run.pk))
    assert messages == [] and simulated == [] and not PersonalCardRequest.objects.exists()
    LabRun.objects.filter(state=RunState.QUEUED).delete()
    LabRun.objects.create(owner=alice, lab=run.lab, backend="sim", params=run.params)
    assert personal.card_request(user=alice, run=labs_api.run_data(run.pk)).state == "queued"
    with pytest.raises(submission.RunRefused, match=r"you have 2 .*counting 1 card being made"):
        submission.sim_work_check(owner=alice)


def test_a_parameter_fit_counts_against_the_learners_quota(alice, sent, settings):
    from labs.runs import submission
    from quiz.models import ParameterFit

    make_heartbeat("sim")
    settings.LABS_MAX_ACTIVE_PER_LEARNER = settings.LABS_NEW_LEARNER_MAX_ACTIVE = 2
    run = finished_run(alice)
    ParameterFit.objects.create(user=alice, created_at=timezone.now())
    assert personal.card_request(user=alice, run=labs_api.run_data(run.pk)).state == "queued"
    with pytest.raises(
        submission.RunRefused, match=r"already have 2 runs .*1 card being made and 1 parameter fit"
    ):
        submission.sim_work_check(owner=alice)


def test_a_card_too_long_to_simulate_in_its_time_limit_is_refused_up_front(alice, sent):
    """Bounded by its cost in simulated steps: one request at a time decodes one token a step,
    so 3,000 prompts of 300 tokens (990,000 tokens, under the old token proxy) at max_num_seqs 2
    (the neighbour) take too long."""
    messages, simulated = sent
    make_heartbeat("sim")
    run = finished_run(alice)
    long = LabRun.objects.create(
        owner=alice,
        lab=run.lab,
        backend="sim",
        params={
            **run.params,
            "num_prompts": 3000,
            "prompt_tokens": 30,
            "output_tokens": 300,
            "max_num_seqs": 1,
        },
        state=RunState.DONE,
        result=run.result,
    )
    with pytest.raises(personal.CardRefused, match=r"simulated steps.*within 120 s"):
        personal.card_request(user=alice, run=labs_api.run_data(long.pk))
    assert messages == [] and simulated == [] and not PersonalCardRequest.objects.exists()
