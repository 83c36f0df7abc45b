"""A learner answers one card of each kind with the keyboard only, in Debian's Chromium."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PHONE, sign_up
from tests.quiz.factories import make_card

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PANEL = "#quiz-panel"


def small_deck() -> None:
    # New cards come in id order: choice, numeric, recall.
    make_card("choice", prompt="Which option is **right**?")
    make_card("numeric", prompt="How many KiB per token?")
    make_card("recall", prompt="Explain paged attention.")


def wait_for(page, side: str, kind: str | None = None) -> None:
    page.wait_for_selector("html[data-quiz=ready]", state="attached")
    selector = f'{PANEL}[data-side="{side}"]' + (f'[data-kind="{kind}"]' if kind else "")
    page.wait_for_selector(selector)


def grade_with(page, key: str) -> None:
    """Press a grade key and wait until the next card has replaced this one."""
    token = page.get_attribute(f"{PANEL} form.grade-bar", "action")
    page.keyboard.press(key)
    page.wait_for_function(
        'token => !document.querySelector(`form.grade-bar[action="${token}"]`)'
        " && document.querySelector('#quiz-panel').dataset.side !== 'answer'",
        arg=token,
    )


def test_it_answers_one_card_of_each_kind_with_the_keyboard(page):
    small_deck()
    sign_up(page, "keyboarder")
    page.wait_for_url("**/quiz/")
    page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page

    # Multiple choice: pick the right option by its number (options are shuffled).
    wait_for(page, "question", "choice")
    assert page.locator(f"{PANEL} .quiz-prompt strong").inner_text() == "right"
    number = page.locator(f"{PANEL} button.option", has_text="Right").get_attribute("data-option")
    page.keyboard.press(number)
    wait_for(page, "answer", "choice")
    assert page.locator(f"{PANEL} .option-result.is-correct.is-chosen").count() == 1
    assert page.locator(f"{PANEL} [data-suggested]").get_attribute("data-rating") == "3"
    interval = page.locator(f"{PANEL} [data-rating='3'] .grade-interval").inner_text()
    assert interval == "10m"
    grade_with(page, " ")  # Space on the answer side takes the suggested grade (Good)

    # Numeric: type into the box (focused for us), Enter checks.
    wait_for(page, "question", "numeric")
    page.keyboard.type("128.2")
    page.keyboard.press("Enter")
    wait_for(page, "answer", "numeric")
    verdict = page.locator(f"{PANEL} .numeric-result").inner_text().replace("\u00a0", " ")
    assert "within ±0.5 KiB of 128 KiB" in verdict
    grade_with(page, "3")

    # Recall: Space shows the answer, 4 grades Easy.
    wait_for(page, "question", "recall")
    page.keyboard.press(" ")
    wait_for(page, "answer", "recall")
    assert page.locator(f"{PANEL} .answer-text").inner_text().startswith("Answer")
    grade_with(page, "4")

    # The next card: the learning cards come back within the 20-minute learn-ahead window.
    wait_for(page, "question", "choice")
    assert page.locator(f"{PANEL} .count-learning").inner_text().endswith("2")

    # u undoes the last answer and shows that card again.
    page.keyboard.press("u")
    wait_for(page, "question", "recall")
    assert "Undone" in page.locator(f"{PANEL} .quiz-notice").inner_text()
    assert page.evaluate("window.__sameDocument") is True


def test_the_review_screen_fits_a_phone_on_both_sides(page):
    page.set_viewport_size(PHONE)
    make_card("choice", prompt="A long question " * 30)
    sign_up(page, "phonelearner")
    wait_for(page, "question", "choice")
    page.keyboard.press("2")
    wait_for(page, "answer", "choice")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the answer side scrolls sideways on a phone: {width}px"
    # A long prompt does not push the verdict below the fold after revealing.
    page.wait_for_function(
        "() => document.querySelector('[data-verdict]').getBoundingClientRect().top"
        " < innerHeight / 2"
    )
    # The grade buttons stay on screen while the worked answer scrolls.
    box = page.locator(f"{PANEL} .grade-buttons").bounding_box()
    assert box and box["y"] + box["height"] <= PHONE["height"]


def test_space_and_u_do_what_the_page_says_in_the_number_box(page):
    make_card("recall", prompt="Explain paged attention.")
    make_card("numeric", prompt="How many KiB per token?")
    sign_up(page, "boxkeys")
    wait_for(page, "question", "recall")
    page.keyboard.press(" ")
    wait_for(page, "answer", "recall")
    grade_with(page, "3")

    # The box has the focus (the page says so by putting the caret there): u still undoes.
    wait_for(page, "question", "numeric")
    page.wait_for_function(
        "() => document.activeElement && document.activeElement.id === 'answer-value'"
    )
    assert "<kbd>u</kbd>" in page.inner_html(f"{PANEL} [data-undo]")
    page.keyboard.press("u")
    wait_for(page, "question", "recall")
    assert "Undone" in page.locator(f"{PANEL} .quiz-notice").inner_text()
    page.keyboard.press(" ")
    wait_for(page, "answer", "recall")
    grade_with(page, "3")

    # After a digit, Space is a thousands separator and stays in the box...
    wait_for(page, "question", "numeric")
    page.keyboard.type("1 2")
    assert page.input_value("#answer-value") == "1 2"
    assert page.locator(f'{PANEL}[data-side="question"]').count() == 1
    # ...and in the empty box it shows the answer, as the hint under the card says.
    assert "in the empty box shows the answer" in page.locator(f"{PANEL} .keys").inner_text()
    page.fill("#answer-value", "")
    page.focus("#answer-value")
    page.keyboard.press(" ")
    wait_for(page, "answer", "numeric")
    assert "No answer given" in page.locator(f"{PANEL} .numeric-result").inner_text()


def test_back_from_a_lab_shows_the_current_card_not_the_one_answered(page):
    small_deck()  # choice, numeric, recall
    sign_up(page, "backbutton")
    wait_for(page, "question", "choice")
    number = page.locator(f"{PANEL} button.option", has_text="Right").get_attribute("data-option")
    page.keyboard.press(number)
    wait_for(page, "answer", "choice")
    grade_with(page, "3")
    wait_for(page, "question", "numeric")

    page.goto("/labs/")
    page.get_by_role("heading", name="Labs").first.wait_for()
    page.go_back()
    # The panel is today's as the server has it now, not the first page load's choice card.
    wait_for(page, "question")
    assert page.get_attribute(PANEL, "data-kind") == "numeric"


def test_the_stats_charts_follow_the_window_down_to_a_phone(page):
    sign_up(page, "chartwatcher")
    page.goto("/quiz/stats/")
    page.wait_for_function(
        "() => !!(window.Chart && Chart.getChart(document.getElementById('chart-reviews')))"
    )
    page.set_viewport_size(PHONE)
    # Charts resize on a later frame; wait until the page fits, then check every chart's width.
    page.wait_for_function("() => document.documentElement.scrollWidth <= window.innerWidth")
    overflowing = page.evaluate(
        """() => [...document.querySelectorAll('.chart-box canvas')].filter(c =>
            c.getBoundingClientRect().right
              > c.closest('.chart-card').getBoundingClientRect().right + 1
          ).map(c => c.id)"""
    )
    assert overflowing == []


def test_no_page_asks_for_a_file_that_is_missing(page):
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    make_card()
    sign_up(page, "iconlooker")
    for path in ("/quiz/", "/quiz/stats/", "/labs/"):
        page.goto(path)
        page.wait_for_load_state("load")
    icon = page.get_attribute('link[rel="icon"]', "href")
    assert icon and page.request.get(icon).status == 200
    assert page.request.get("/favicon.ico").status == 200  # follows the redirect to the icon
    assert missing == []
