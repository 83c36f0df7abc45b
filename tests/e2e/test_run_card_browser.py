"""A run becomes a card: finish a batching run on a real worker, make a card from it (the worker
makes it while My cards watches), then meet it in Today's quiz, answer it and read its worked
steps; once the day's new cards are used up, the made-card message says when the next one comes.
In Debian's Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from quiz import personal
from quiz.models import Card
from tests.e2e.conftest import PHONE, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.worker]

PANEL = "#quiz-panel"
SHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


def _fits_a_phone(page, shot: str) -> None:
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(200)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{page.url} scrolls sideways on a phone: {width}px"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / shot), full_page=True)


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

    # Make a card from it: the worker makes it while My cards watches; then, on Today's quiz,
    # it is the first card.
    page.get_by_role("button", name="Make a card from this").click()
    page.wait_for_url("**/quiz/mine/?request=*")
    page.locator(".made-card[data-state=done]").wait_for(timeout=60_000)
    assert "It comes today" in page.locator(".made-card").inner_text()
    page.locator(".made-card").get_by_role("link", name="Today's quiz").click()
    page.wait_for_url("**/quiz/")
    page.wait_for_selector("html[data-quiz=ready]", state="attached")
    page.wait_for_selector(f'{PANEL}[data-side="question"][data-kind="numeric"]')
    prompt = page.locator(f"{PANEL} .quiz-prompt").inner_text()
    assert "Your run: llama-3-8b on h100-sxm, max_num_seqs 64" in prompt
    assert measured_text in prompt
    assert "128 requests of 512 prompt + 128 output tokens, 128 in flight" in prompt
    assert "predict the output tokens/s at max_num_seqs 128." in prompt

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
    _fits_a_phone(page, "run-card-answer-phone.png")


def _finish_run(page, max_num_seqs: int) -> None:
    page.goto("/labs/batching/")
    page.fill("#id_max_num_seqs", str(max_num_seqs))
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/labs/runs/*/")
    page.locator("table.results").wait_for(timeout=60_000)


def _make_card(page) -> str:
    """Press "Make a card from this"; the made-card message once the worker has made it."""
    page.get_by_role("button", name="Make a card from this").click()
    page.wait_for_url("**/quiz/mine/?request=*")
    made = page.locator(".made-card[data-state=done]")
    made.wait_for(timeout=60_000)
    return made.inner_text()


def test_my_cards_lists_made_cards_and_says_when_they_come(page, celery_worker):
    sign_up(page, "cardkeeper")
    page.wait_for_url("**/quiz/")
    # One new card a day.
    page.goto("/quiz/settings/")
    page.fill("#id_new_per_day", "1")
    page.get_by_role("button", name="Save").click()

    _finish_run(page, 16)
    message = _make_card(page)
    assert "It comes today, before the deck's new cards." in message
    listed = page.locator(".my-card")
    assert listed.count() == 1
    assert listed.first.locator(".my-card-when").inner_text() == "today"

    # Study it: today's one new card is used.
    page.locator(".made-card").get_by_role("link", name="Today's quiz").click()
    page.wait_for_selector(f'{PANEL}[data-side="question"][data-kind="numeric"]')
    page.fill("#answer-value", "1")
    page.keyboard.press("Enter")
    page.wait_for_selector(f'{PANEL}[data-side="answer"]')
    page.get_by_role("button", name="Good").click()
    page.wait_for_selector(f'{PANEL}:not([data-side="answer"])')

    # A second card now waits for tomorrow, and the message says when, not "today".
    _finish_run(page, 32)
    message = _make_card(page)
    card = Card.objects.filter(owner__username="cardkeeper").order_by("-id").first()
    coming = next(
        c for c in personal.my_cards(user=card.owner, now=timezone.now()) if c.card == card
    )
    assert not coming.today and coming.when.endswith("from 04:00")
    assert "No new card is left for it today (your limit is 1 a day)" in message
    assert f"so it comes on {coming.when}, when new cards are next available." in message
    assert "It comes today" not in message
    # My cards lists both, the new one first with the date it comes.
    assert page.locator(".my-card").count() == 2
    newest = page.locator(".my-card").first
    assert newest.get_attribute("data-slug") == card.slug
    assert newest.locator(".my-card-when").inner_text() == coming.when
    # Stats links to My cards; the page fits a phone.
    page.goto("/quiz/stats/")
    page.get_by_role("link", name="My cards").click()
    page.wait_for_url("**/quiz/mine/")
    assert page.locator(".my-card").count() == 2
    _fits_a_phone(page, "my-cards-phone.png")
