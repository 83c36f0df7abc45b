"""A run becomes a card: finish a batching run on a real worker, make a card from it, then meet
it in Today's quiz, answer it and read its worked steps, in Debian's Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from quiz.models import Card
from tests.e2e.conftest import PHONE, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.worker]

PANEL = "#quiz-panel"
SHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


def test_a_finished_run_becomes_a_card_in_todays_quiz(page, celery_worker):
    sign_up(page, "runlearner")
    page.wait_for_url("**/quiz/")

    # Finish a run: batching at max_num_seqs 64 with 128 requests in flight.
    page.goto("/labs/batching/")
    page.get_by_role("heading", name="Batch size and latency").wait_for()
    page.fill("#id_max_num_seqs", "64")
    page.fill("#id_concurrency", "128")
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/labs/runs/*/")
    page.locator("table.results").wait_for(timeout=60_000)
    measured = page.locator("table.results tr", has_text="Output tokens/s")
    measured_text = measured.locator("td.measured").inner_text()  # e.g. "5,719 tok/s"

    # Make a card from it: back on Today's quiz, it is the first card.
    page.get_by_role("button", name="Make a card from this").click()
    page.wait_for_url("**/quiz/")
    page.wait_for_selector("html[data-quiz=ready]", state="attached")
    page.wait_for_selector(f'{PANEL}[data-side="question"][data-kind="numeric"]')
    prompt = page.locator(f"{PANEL} .quiz-prompt").inner_text()
    assert "Your run: llama-3-8b on h100-sxm, max_num_seqs 64" in prompt
    assert measured_text in prompt
    assert "Predict the output tokens/s at max_num_seqs 128." in prompt

    # Answer it with the fixed answer (what the simulator gave at max_num_seqs 128).
    card = Card.objects.get(owner__username="runlearner")
    page.fill("#answer-value", f"{card.numeric_value:.0f}")
    page.keyboard.press("Enter")
    page.wait_for_selector(f'{PANEL}[data-side="answer"][data-kind="numeric"]')
    verdict = page.locator(f"{PANEL} .numeric-result").inner_text()
    assert "within ±" in verdict

    # Its worked steps: the run's own number, the predictor at both settings, the answer.
    steps = page.locator(f"{PANEL} ol.steps li")
    assert steps.count() >= 3
    assert steps.first.inner_text().startswith(f"Your run #{card.source.split()[-1]}")
    assert measured_text.split()[0] in steps.first.inner_text()
    assert "Predictor" in page.locator(f"{PANEL} ol.steps").inner_text()
    assert page.get_by_role("button", name="Retire this card").is_visible()

    # The answer side fits a phone.
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(200)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the card scrolls sideways on a phone: {width}px"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "run-card-answer-phone.png"), full_page=True)
