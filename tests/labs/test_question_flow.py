"""Predict, then run, end to end in one process (the browser test drives the same path with a real
worker): the question page keeps the formulas hidden, a commit queues the run (a pair for a
ratio) with the prediction, the finished run grades it within the band and the quiz records the
grade as a review of the learner's card of the question; the question's points are simulated
ahead of time, and Today's quiz asks at a neighbouring point graded against them."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from labs.models import LabRun, RunState
from labs.questions import services as questions
from labs.questions.bands import AGAIN, GOOD, HARD
from labs.questions.content import questions_load, questions_read
from labs.questions.models import Prediction, QuestionSimulation
from labs.runs import execution
from quiz.models import Card, PredictionAsk, ReviewLog, ReviewState
from tests.labs.factories import make_heartbeat

SPEEDUP = "batching-speedup-max-num-seqs-8"
TTFT = "batching-ttft-behind-max-num-seqs"
pytestmark = pytest.mark.django_db


@pytest.fixture
def loaded(db):
    return questions_load(questions_read(Path(settings.BASE_DIR) / "content"))


def _run_all(prediction: Prediction) -> Prediction:
    """Run the prediction's runs on the simulator here, as the worker would (claim, run, and
    tell the listeners), and read the prediction again."""
    for run in (prediction.run, prediction.baseline):
        if run is not None:
            execution.run_execute(run_id=run.pk, hostname="test@here")
    return Prediction.objects.get(pk=prediction.pk)


def _graded_and_due(owner) -> tuple[Prediction, Card]:
    """A TTFT prediction committed, run and graded, its card made due now."""
    make_heartbeat("sim")
    question = questions.question_get(TTFT)
    prediction = questions.prediction_request(
        owner=owner, question=question, at=0, value=50, backend="sim"
    )
    graded = _run_all(prediction)
    card = Card.objects.get(owner=owner, kind=Card.Kind.PREDICTION)
    ReviewState.objects.filter(user=owner, card=card).update(due=timezone.now())
    return graded, card


def test_the_question_page_hides_the_formulas_until_commit_or_skip(alice_client, loaded):
    page = alice_client.get(reverse("labs:question-detail", args=["batching", SPEEDUP]))
    html = page.content.decode()
    assert page.status_code == 200
    assert "Your prediction" in html and "Commit and run" in html
    # The live prediction panel and its figures are not on it.
    assert 'id="prediction"' not in html and "Throughput vs batch 1" not in html
    skip = page.context["skip_url"]
    lab = alice_client.get(skip)
    assert lab.status_code == 200
    assert 'id="prediction"' in lab.content.decode()
    assert "Throughput vs batch 1" in lab.content.decode()
    # The skip link opens the lab at the question's settings.
    assert "max_num_seqs=8" in skip and "concurrency=8" in skip


def test_commit_queues_the_pair_a_ratio_needs_and_grades_it(alice, alice_client, loaded):
    make_heartbeat("sim")
    url = reverse("labs:question-run", args=["batching", SPEEDUP])
    response = alice_client.post(url, {"value": "6.5", "at": "0", "backend": "sim"})
    prediction = Prediction.objects.get(owner=alice)
    assert response.status_code == 302 and response["Location"] == prediction.run.get_absolute_url()
    question = questions.question_get(SPEEDUP)
    assert prediction.run.params == question.points[0]
    assert prediction.baseline.params["concurrency"] == 1
    assert prediction.baseline.params["max_concurrency"] == 1
    assert {k: v for k, v in prediction.baseline.params.items() if k not in (
        "concurrency", "max_concurrency", "num_prompts", "context_tokens")} == {
        k: v for k, v in prediction.run.params.items() if k not in (
            "concurrency", "max_concurrency", "num_prompts", "context_tokens")}  # fmt: skip

    graded = _run_all(prediction)
    assert graded.state == Prediction.State.GRADED
    top, bottom = (LabRun.objects.get(pk=r) for r in (graded.run_id, graded.baseline_id))
    measured = top.result["output_tokens_per_s"] / bottom.result["output_tokens_per_s"]
    assert graded.measured == pytest.approx(measured)
    within = abs(6.5 / measured - 1) <= graded.band
    factor2 = 0.5 <= 6.5 / measured <= 2
    assert graded.rating == (GOOD if within else HARD if factor2 else AGAIN)
    assert graded.band_words and graded.grade_words

    # The quiz recorded it: the learner's card of the question, reviewed with that rating.
    card = Card.objects.get(owner=alice, kind=Card.Kind.PREDICTION)
    log = ReviewLog.objects.get(user=alice, card=card)
    assert log.rating == graded.rating
    assert log.answer == "6.5×"
    assert ReviewState.objects.get(user=alice, card=card).reps == 1
    assert graded.reported_at is not None
    mine = alice_client.get(reverse("quiz:my-cards")).content.decode()
    assert "Predict: Output tok/s at max_num_seqs 8, as a multiple of batch 1" in mine

    # The run page sets the three figures side by side, with the grade and the band.
    page = alice_client.get(top.get_absolute_url()).content.decode()
    assert "Your prediction" in page and "6.5×" in page and escape(graded.band_words) in page
    assert f"{measured:.3g}×" in page

    # Its points were queued for simulation on the lab worker, one per point.
    sims = QuestionSimulation.objects.filter(question=SPEEDUP)
    assert sorted(sims.values_list("at", flat=True)) == [0, 1, 2, 3]
    assert set(sims.values_list("state", flat=True)) == {"queued"}


def test_a_bad_figure_is_refused_and_nothing_is_queued(alice, alice_client, loaded):
    make_heartbeat("sim")
    url = reverse("labs:question-run", args=["batching", TTFT])
    for bad, says in (("", "must be a number"), ("-3", "positive"), ("1e400", "positive")):
        response = alice_client.post(url, {"value": bad, "at": "0"})
        assert response.status_code == 400
        assert says in response.content.decode()
    assert not Prediction.objects.exists() and not LabRun.objects.exists()
    # No worker online: refused, nothing saved.
    from labs.models import WorkerHeartbeat

    WorkerHeartbeat.objects.all().delete()
    response = alice_client.post(url, {"value": "300", "at": "0"})
    assert response.status_code == 503
    assert not Prediction.objects.exists() and not LabRun.objects.exists()


def test_a_failed_run_leaves_the_prediction_ungraded_and_unreviewed(alice, loaded):
    make_heartbeat("sim")
    question = questions.question_get(TTFT)
    prediction = questions.prediction_request(
        owner=alice, question=question, at=0, value=300, backend="sim"
    )
    LabRun.objects.filter(pk=prediction.run_id).update(state=RunState.FAILED, error="x")
    prediction.refresh_from_db()
    assert questions.prediction_grade(prediction).state == Prediction.State.VOID
    assert not ReviewLog.objects.exists()


def test_today_asks_at_a_neighbouring_point_graded_against_the_stored_simulation(
    alice, alice_client, loaded
):
    _, card = _graded_and_due(alice)
    # Simulate the points as the lab worker would.
    for sim in QuestionSimulation.objects.filter(question=TTFT):
        assert questions._sim_claim(sim.pk, "test")
        questions._sim_execute(sim.pk)
    sims = {s.at: s for s in QuestionSimulation.objects.filter(question=TTFT)}
    assert all(s.state == "done" and s.measured > 0 for s in sims.values())

    page = alice_client.get(reverse("quiz:today"))
    html = page.content.decode()
    assert page.context["card"].pk == card.pk
    ask = PredictionAsk.objects.get(showing__card=card)
    at = ask.asked["at"]
    assert at == 1  # the first neighbour on the first ask
    assert ask.asked["measured"] == pytest.approx(sims[at].measured)
    assert f"at <strong data-ask-changed>{ask.asked['changed']}</strong>" in html
    assert ask.asked["changed"] == "max_num_seqs 32"

    # Answer within the band: Good is graded and suggested.
    exact = f"{sims[at].measured:.1f}"
    token = page.context["showing"].token
    response = alice_client.post(reverse("quiz:answer-submit", args=[token]), {"value": exact})
    assert response.status_code == 200
    buttons = response.context["buttons"]
    assert [b["rating"] for b in buttons if b["suggested"]] == [GOOD]
    answer_html = response.content.decode()
    assert "data-grade>Good<" in answer_html and "Run it" in answer_html
    assert response.context["run_url"].endswith(f"?at={at}")
    # Kept with the learner's predictions, for the instincts page.
    kept = Prediction.objects.get(owner=alice, source=Prediction.Source.QUIZ)
    assert (kept.at, kept.rating, kept.value) == (at, GOOD, float(exact))


def test_hard_and_again_are_suggested_from_the_band(alice, alice_client, loaded):
    graded, card = _graded_and_due(alice)
    # Nothing simulated yet: asked at the question's own settings, against the learner's run.
    page = alice_client.get(reverse("quiz:today"))
    ask = PredictionAsk.objects.get(showing__card=card)
    assert ask.asked["source"] == "run" and ask.asked["at"] == 0
    assert ask.asked["measured"] == pytest.approx(graded.measured)
    token = page.context["showing"].token
    hard = f"{graded.measured * 1.7:.1f}"
    response = alice_client.post(reverse("quiz:answer-submit", args=[token]), {"value": hard})
    assert [b["rating"] for b in response.context["buttons"] if b["suggested"]] == [HARD]
    assert response.context["showing"].correct is None
    # Grading with the suggested button reviews the card as any card.
    alice_client.post(reverse("quiz:review-grade", args=[token]), {"rating": str(HARD)})
    assert ReviewLog.objects.filter(user=alice, card=card).count() == 2


def test_an_answer_undone_and_given_again_is_kept_once(alice, alice_client, loaded):
    _, card = _graded_and_due(alice)
    for value in ("100", "120"):
        page = alice_client.get(reverse("quiz:today"))
        token = page.context["showing"].token
        alice_client.post(reverse("quiz:answer-submit", args=[token]), {"value": value})
        alice_client.post(reverse("quiz:review-grade", args=[token]), {"rating": "1"})
        if value == "100":
            alice_client.post(reverse("quiz:review-undo"))
    kept = Prediction.objects.filter(owner=alice, source=Prediction.Source.QUIZ)
    assert list(kept.values_list("value", flat=True)) == [120.0]


def test_the_lab_worker_takes_a_questions_simulations_in_turn(alice, loaded):
    question = questions.question_get(TTFT)
    assert questions.simulations_ensure(question, requested_by=alice) == 4
    # Asked again while queued: nothing more is queued.
    assert questions.simulations_ensure(question, requested_by=alice) == 0
    for _ in range(4):
        assert "question simulation" in execution.run_next(queue="labs.sim", hostname="w@here")
    done = QuestionSimulation.objects.filter(question=TTFT, state="done")
    assert done.count() == 4
    assert all(s.measured > 0 and s.band > 0 and s.where for s in done)
    # One that lost its worker long ago is queued again.
    lost = done.first()
    QuestionSimulation.objects.filter(pk=lost.pk).update(
        state="running", started_at=timezone.now() - questions.RUNNING_STALE * 2
    )
    assert questions.simulations_ensure(question, requested_by=alice) == 1


def test_a_preset_with_a_question_offers_it(alice_client, loaded):
    page = alice_client.get(reverse("labs:lab-detail", args=["speculative"]), {
        "preset": "speculation-k3-batch-128"})  # fmt: skip
    html = page.content.decode()
    url = reverse("labs:question-detail", args=["speculative", "speculation-speedup-batch-128"])
    assert f'This preset has a question: <a href="{url}">' in html


def test_on_a_real_engine_the_band_is_the_devices_run_to_run_spread(alice, loaded):
    from tests.labs.factories import make_run

    question = questions.question_get(TTFT)
    params = question.points[0]
    where = "vLLM 0.33.0 on NVIDIA H100"

    def done(ttft_s: float) -> LabRun:
        result = {"ttft_s": {"p50": ttft_s}, "output_tokens_per_s": 1000.0}
        return make_run(
            alice, lab="batching", backend="vllm", params=params, state=RunState.DONE,
            result=result, where=where, predicted={},
        )  # fmt: skip

    done(0.300)
    done(0.330)
    prediction = Prediction.objects.create(
        owner=alice, question=TTFT, topic="scheduling", figure="ttft_p50", value=320,
        run=done(0.310),
    )  # fmt: skip
    graded = questions.prediction_grade(prediction)
    # Median 310 ms; the farthest, 330 ms, is 6.5% from it: the band.
    assert graded.band == pytest.approx(0.02 / 0.31)
    assert graded.band_words.endswith(
        "this device's run-to-run spread over 3 runs of these settings"
    )
    assert graded.rating == GOOD  # 320 is 3.2% from 310
