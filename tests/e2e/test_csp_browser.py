"""The pages work under the Content-Security-Policy header: the quiz (htmx swaps, keyboard
script), the stats charts and a lab (live prediction, a run's charts) with no CSP violation."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import sign_up
from tests.e2e.test_labs_browser import CHART_DRAWN
from tests.e2e.test_quiz_browser import PANEL, grade_with, small_deck, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.worker]

# Recorded from the page itself (an init script runs outside the page's CSP).
WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline')));
"""


def _violations(page, console: list[str]) -> list[str]:
    seen = page.evaluate("window.__csp || []")
    return seen + [m for m in console if "Content Security Policy" in m]


def test_quiz_stats_and_a_lab_work_under_the_csp_with_no_violation(page, celery_worker):
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.add_init_script(WATCH)
    small_deck()
    response = page.goto("/accounts/signup/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    sign_up(page, "csp-learner")
    page.wait_for_url("**/quiz/")

    # The quiz: an htmx reveal and grade, driven by static/js/quiz.js.
    wait_for(page, "question", "choice")
    number = page.locator(f"{PANEL} button.option", has_text="Right").get_attribute("data-option")
    page.keyboard.press(number)
    wait_for(page, "answer", "choice")
    grade_with(page, " ")
    wait_for(page, "question", "numeric")
    assert _violations(page, console) == []

    # Stats: Chart.js draws from a JSON block.
    page.goto("/quiz/stats/")
    page.wait_for_function(CHART_DRAWN, arg="canvas")
    assert _violations(page, console) == []

    # A lab: the prediction follows the form over htmx; a run draws its charts.
    page.goto("/labs/paged-kv/")
    page.select_option("#id_block_size", "256")
    page.wait_for_function(
        "() => document.querySelector('#prediction [data-key=blocks_per_seq] dd')"
        ".textContent === '4 blocks'"
    )
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/labs/runs/*/")
    page.locator("table.results").wait_for(timeout=60_000)
    page.wait_for_function(CHART_DRAWN, arg='canvas[data-chart="ttft"]')
    assert _violations(page, console) == []
