"""The quiz's counters, stats charts and settings help say what is true, in headless Chromium."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import sign_up
from tests.e2e.test_quiz_browser import PANEL, grade_with, wait_for
from tests.quiz.factories import make_card

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_card_failed_with_again_shows_in_the_learning_counter_at_once(page):
    make_card("recall", prompt="Explain paged attention.")
    make_card("recall", prompt="Explain continuous batching.")
    sign_up(page, "again-learner")
    page.wait_for_url("**/quiz/")
    wait_for(page, "question", "recall")
    assert page.locator(f"{PANEL} .count-learning").inner_text().endswith("0")
    page.keyboard.press(" ")
    wait_for(page, "answer", "recall")
    grade_with(page, "1")  # Again: back in a minute, not due this instant
    wait_for(page, "question", "recall")
    assert "continuous batching" in page.locator(f"{PANEL} .quiz-prompt").inner_text()
    assert page.locator(f"{PANEL} .count-learning").inner_text().endswith("1")


def test_stats_say_when_there_is_no_retention_yet_and_label_todays_bar(page):
    sign_up(page, "new-stats")
    page.goto("/quiz/stats/")
    page.wait_for_function(
        "() => !!(window.Chart && Chart.getChart(document.getElementById('chart-reviews')))"
    )
    heading = page.get_by_role("heading", name="True retention")
    retention_card = page.locator(".chart-card", has=heading)
    assert "Not enough data yet" in retention_card.inner_text()
    assert retention_card.locator("canvas").count() == 0
    # Today's bar sits right above the last label, which says "today".
    ticks = page.evaluate(
        """() => {
          const chart = Chart.getChart(document.getElementById('chart-reviews'));
          const x = chart.scales.x;
          const last = x.ticks[x.ticks.length - 1];
          return {lastIndex: last.value, lastLabel: last.label, bars: chart.data.labels.length,
                  labelX: x.getPixelForValue(last.value),
                  barX: chart.getDatasetMeta(0).data[chart.data.labels.length - 1].x};
        }"""
    )
    assert ticks["lastLabel"] == "today"
    assert ticks["lastIndex"] == ticks["bars"] - 1
    assert abs(ticks["labelX"] - ticks["barX"]) < 1


def test_the_settings_help_counts_this_learners_deck(page):
    for n in range(5):
        make_card("recall", prompt=f"Question {n}?")
    sign_up(page, "settings-reader")
    page.goto("/quiz/settings/")
    help_text = page.locator(".helptext", has_text="cards not started").inner_text()
    assert help_text.startswith("5 cards not started: at 20 a day they are all started in 1 day.")
    assert "200" not in help_text
