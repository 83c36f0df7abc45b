"""Predict, then run, in Debian's Chromium with a real lab worker: commit a figure to a lab
question, run it, read the grade beside the formulas' figure and the measurement, find the
question in My cards, meet it when due in Today's quiz at a neighbouring setting (graded against
the simulation the worker stored) and answer it. Also: the instincts page over a fixture of
predictions, and a run page's waterfalls from predicted to measured. Screenshots go to
$SHOTS_DIR (default var/screenshots/predict)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from labs.questions.content import questions_load, questions_read
from labs.questions.models import Prediction, QuestionSimulation
from quiz.models import Card, ReviewLog, ReviewState
from tests.e2e.conftest import LAPTOP, PHONE, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.worker]

PANEL = "#quiz-panel"
SHOTS = Path(os.environ.get("SHOTS_DIR") or Path(settings.BASE_DIR) / "var/screenshots/predict")
QUESTION = "batching-ttft-behind-max-num-seqs"


def _shot(page, name: str, *, width: dict = PHONE, element=None) -> None:
    """Screenshot at `width`; on a phone the page must not scroll sideways."""
    page.set_viewport_size(width)
    page.wait_for_timeout(250)
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width["width"], f"{page.url} scrolls sideways at {width['width']}px: {scroll}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    if element is not None:
        # Clipped from the whole page, so the sticky top bar does not cover the element.
        page.evaluate("window.scrollTo(0, 0)")
        box = element.bounding_box()
        page.screenshot(path=str(SHOTS / name), full_page=True, clip=box)
    else:
        page.screenshot(path=str(SHOTS / name), full_page=True)


def _load_questions() -> None:
    questions_load(questions_read(Path(settings.BASE_DIR) / "content"))


def _wait(condition, what: str, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s  # a limit for a busy machine, not a speed check
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_predict_run_graded_then_asked_again_at_a_neighbour(page, celery_worker):
    _load_questions()
    sign_up(page, "predictor")
    page.wait_for_url("**/quiz/")

    # The lab offers its questions; a question's page hides the formulas' figures.
    page.goto("/labs/batching/")
    box = page.locator(".questions-box")
    assert box.get_by_role("heading", name="Predict, then run").is_visible()
    _shot(page, "0-lab-questions-phone.png", element=box)
    page.set_viewport_size(LAPTOP)
    page.locator(f"[data-question={QUESTION}]").click()
    page.wait_for_url(f"**/labs/batching/questions/{QUESTION}/")
    assert page.locator("#prediction").count() == 0  # the live "Predicted" panel
    assert page.get_by_text("Commit and run").is_visible()
    page.fill("#predict-value", "400")
    _shot(page, "1-question-phone.png")
    page.set_viewport_size(LAPTOP)
    page.get_by_role("button", name="Commit and run").click()

    # The run page grades it once the worker has run it: yours, the formulas', measured.
    page.wait_for_url("**/labs/runs/*/")
    graded = page.locator(".prediction-result[data-prediction=graded]")
    graded.wait_for(timeout=90_000)
    prediction = Prediction.objects.get(owner__username="predictor")
    figures = graded.locator(".side-by-side").inner_text()
    assert "Yours\n400 ms" in figures
    assert "The formulas" in figures and "Simulated" in figures
    grade = graded.locator("[data-grade]").inner_text()
    assert grade == {1: "Again", 2: "Hard", 3: "Good"}[prediction.rating]
    assert "Band: ±" in graded.inner_text()
    _shot(page, "2-graded-run-phone.png", element=graded)

    # The quiz has it: a card of the learner's own, in My cards, reviewed once.
    card = Card.objects.get(owner__username="predictor", kind=Card.Kind.PREDICTION)
    assert ReviewLog.objects.get(card=card).rating == prediction.rating
    page.goto("/quiz/mine/")
    listed = page.locator(f'.my-card[data-slug="{card.slug}"]')
    assert "Predict: Median TTFT with 64 requests in flight and max_num_seqs 16" in (
        listed.inner_text()
    )

    # The worker simulates the question's points ahead of time, in turn with the runs.
    _wait(
        lambda: QuestionSimulation.objects.filter(question=QUESTION, state="done").count() == 4,
        "the question's simulations",
    )
    # Due: as if its learning step had passed.
    ReviewState.objects.filter(card=card).update(due=timezone.now())
    neighbour = QuestionSimulation.objects.get(question=QUESTION, at=1)

    page.goto("/quiz/")
    page.wait_for_selector("html[data-quiz=ready]", state="attached")
    page.wait_for_selector(f'{PANEL}[data-side="question"][data-kind="prediction"]')
    ask = page.locator(f"{PANEL} .prediction-ask").inner_text()
    assert "Predict the median TTFT at max_num_seqs 32, everything else as" in ask
    _shot(page, "3-asked-at-neighbour-phone.png")

    # Answer with the stored simulation's figure: Good, and "run it" opens that point.
    page.fill("#answer-value", f"{neighbour.measured:.0f}")
    page.keyboard.press("Enter")
    page.wait_for_selector(f'{PANEL}[data-side="answer"][data-kind="prediction"]')
    result = page.locator(f"{PANEL} .prediction-result")
    assert result.locator("[data-grade]").inner_text() == "Good"
    assert f"{neighbour.measured:,.0f} ms" in result.locator("[data-measured]").inner_text()
    run_it = result.get_by_role("link", name="Run it")
    assert run_it.get_attribute("href").endswith(f"/labs/batching/questions/{QUESTION}/?at=1")
    assert page.locator(f"{PANEL} [data-suggested]").get_attribute("data-rating") == "3"
    _shot(page, "4-answered-phone.png")

    # The suggested grade (Space) reviews it as any card.
    page.keyboard.press("Space")
    page.wait_for_selector(f'{PANEL}:not([data-side="answer"])')
    assert ReviewLog.objects.filter(card=card).count() == 2
    assert ReviewState.objects.get(card=card).reps == 2


def _instinct_fixture(user) -> int:
    """24 graded predictions over four questions: this learner carries speculation's batch-1
    speedup to large batches, and is near the band elsewhere."""
    rows = []

    def add(question, topic, figure, at, varies, value, measured, band, rating, source="quiz"):
        rows.append(
            Prediction(
                owner=user, question=question, topic=topic, figure=figure, at=at,
                varies=varies, value=value, measured=measured, band=band, rating=rating,
                band_words=f"±{band:.0%}", source=source, state=Prediction.State.GRADED,
                graded_at=timezone.now(),
            )
        )  # fmt: skip

    spec = "speculation-speedup-batch-128"
    for at, conc, yours, measured in (
        (0, 128, 1.9, 1.07), (1, 64, 1.85, 1.28), (2, 32, 1.5, 1.45), (3, 16, 1.6, 1.56),
        (0, 128, 1.8, 1.07), (1, 64, 1.9, 1.28), (2, 32, 1.4, 1.45), (3, 16, 1.55, 1.56),
    ):  # fmt: skip
        add(spec, "speculative-decoding", "spec_speedup", at, conc, yours, measured, 0.19, 2)
    one = "speculation-speedup-batch-1"
    for at, k, yours, measured in ((0, 3, 1.9, 1.89), (1, 2, 1.7, 1.79), (2, 5, 2.1, 1.91)):
        add(one, "speculative-decoding", "spec_speedup", at, k, yours, measured, 0.19, 3)
    ttft = "batching-ttft-behind-max-num-seqs"
    for at, seqs, yours, measured in (
        (0, 16, 900, 3233), (1, 32, 700, 1328), (2, 8, 2000, 6685), (3, 64, 300, 410),
        (0, 16, 2500, 3233), (1, 32, 1200, 1328),
    ):  # fmt: skip
        add(ttft, "scheduling", "ttft_p50", at, seqs, yours, measured, 0.12, 1, "lab")
    speed = "batching-speedup-max-num-seqs-8"
    for at, seqs, yours, measured in (
        (0, 8, 7.5, 7.1), (1, 4, 4.0, 3.8), (2, 32, 22, 20.4), (3, 64, 33, 29.7),
        (0, 8, 6.9, 7.1), (1, 4, 3.9, 3.8), (2, 32, 16, 20.4),
    ):  # fmt: skip
        add(speed, "batching", "batch_speedup_vs_batch1", at, seqs, yours, measured, 0.19, 3)
    Prediction.objects.bulk_create(rows)
    return len(rows)


def test_instincts_page_shows_where_the_model_is_off(page, live_server):
    _load_questions()
    sign_up(page, "instinctive")
    page.wait_for_url("**/quiz/")
    user = get_user_model().objects.get(username="instinctive")
    assert _instinct_fixture(user) >= 20

    page.goto("/labs/instincts/")
    topics = page.locator(".instinct-topic")
    assert topics.count() == 3
    spec = page.locator('.instinct-topic[data-topic="speculative-decoding"]')
    reading = spec.locator("[data-reading]").inner_text()
    assert reading.startswith(
        "You overestimate speculation's speedup at large batch (concurrency 64 to 128): 4 of "
        "your 4 predictions there were above the band"
    )
    assert spec.locator("[data-share]").inner_text() == "7 of 11"
    # Where the points lean no way, nothing is claimed; where all lean, no end is named.
    assert page.locator('.instinct-topic[data-topic="batching"] [data-reading-none]').count() == 1
    scheduling = page.locator('.instinct-topic[data-topic="scheduling"] [data-reading]')
    assert scheduling.inner_text().startswith(
        "You underestimate the median TTFT: 5 of your 6 predictions were below the band"
    )
    # The scatter is drawn (log axes, y = x and the band) on a canvas per topic.
    page.wait_for_function(
        "() => [...document.querySelectorAll('canvas[data-instinct]')]"
        ".every(c => window.Chart && window.Chart.getChart(c))"
    )
    _shot(page, "5-instincts-laptop.png", width=LAPTOP)
    _shot(page, "5-instincts-phone.png")


def test_run_page_waterfalls_from_predicted_to_measured(page, celery_worker):
    sign_up(page, "waterfaller")
    page.wait_for_url("**/quiz/")
    page.goto("/labs/preset/batching-concurrency-sweep-200/")
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/labs/runs/*/")
    page.locator("table.results").wait_for(timeout=90_000)
    for label, shot in (("TTFT, mean", "ttft"), ("Output tokens/s", "throughput")):
        waterfall = page.locator(f'[data-waterfall="{label}"]')
        bars = waterfall.locator(".wf-row .wf-label").all_inner_texts()
        assert bars[0] == "predicted by the formulas" and bars[-1] == "measured"
        assert len(bars) >= 4
        assert waterfall.locator(".wf-short").inner_text().startswith(("+", "−"))
        assert "the largest part:" in waterfall.locator(".wf-short").inner_text()
        # The full reading is one click away.
        full = waterfall.locator("details.wf-text")
        assert not full.locator("p").is_visible()
        full.locator("summary").click()
        assert full.locator("p").is_visible()
        row = page.locator("table.results tr", has=waterfall)
        _shot(page, f"6-waterfall-{shot}-laptop.png", width=LAPTOP, element=row)
        _shot(page, f"6-waterfall-{shot}-phone.png", element=row)
