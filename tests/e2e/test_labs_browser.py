"""The paged-KV lab in headless Chromium, with a real Celery worker behind the page.

Also writes screenshots of a finished run and a finished sweep at phone and laptop widths to
var/screenshots/ (git-ignored), for a person to look at.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.e2e.conftest import LAPTOP, PHONE, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.worker]

SHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"
CHART_DRAWN = "sel => { const c = document.querySelector(sel); return !!(c && Chart.getChart(c)); }"


def _prediction(page, key: str):
    return page.locator(f'#prediction [data-key="{key}"] dd')


def _no_sideways_scroll(page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    viewport = page.viewport_size["width"]
    wide = page.evaluate(
        """(limit) => [...document.querySelectorAll('body *')]
            .filter((e) => e.getBoundingClientRect().right > limit + 1)
            .slice(0, 5)
            .map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${Math.round(
                e.getBoundingClientRect().right)}px`)""",
        viewport,
    )
    assert width <= viewport, f"the page scrolls sideways: {width}px in {viewport}px: {wide}"


def _shoot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for label, size in (("laptop", LAPTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.evaluate("window.scrollTo(0, 0)")  # else the sticky nav lands mid-page
        # Charts resize on a later frame (sooner or later, by how busy the machine is): wait
        # until the page fits, then check it.
        # An arrow function: a bare expression would be eval()ed, which the CSP refuses.
        try:
            page.wait_for_function(
                "() => document.documentElement.scrollWidth <= window.innerWidth"
            )
        except PlaywrightTimeoutError:
            pass  # the assertion below names what sticks out
        _no_sideways_scroll(page)
        page.screenshot(path=str(SHOTS / f"{name}-{label}.png"), full_page=True)
        if label == "phone":  # a tall phone page, also cut into screens a person can read
            height = page.evaluate("document.documentElement.scrollHeight")
            for i in range(0, min(height, 6 * size["height"]), size["height"]):
                clip = {"x": 0, "y": i, "width": size["width"], "height": size["height"]}
                part = SHOTS / f"{name}-{label}-{i // size['height'] + 1}.png"
                page.screenshot(path=str(part), full_page=True, clip=clip)


def test_block_size_updates_the_prediction_then_a_run_draws_its_charts(page, celery_worker):
    sign_up(page, "kvlearner")
    page.wait_for_url("**/quiz/")
    page.goto("/labs/paged-kv/")
    page.get_by_role("heading", name="Paged KV and block size").wait_for()
    blocks = _prediction(page, "blocks_per_seq")
    wasted = _prediction(page, "slots_wasted_per_seq")
    assert blocks.inner_text() == "63 blocks"  # 700 + 300 tokens at block_size 16
    assert wasted.inner_text() == "8 slots"

    page.select_option("#id_block_size", "256")
    page.wait_for_function(
        "() => document.querySelector('#prediction [data-key=blocks_per_seq] dd')"
        ".textContent === '4 blocks'"
    )
    assert wasted.inner_text() == "24 slots"
    # A bad value gets the parser's message in the panel, without a reload.
    page.fill("#id_prompt_tokens", "-5")
    page.locator("#prediction").get_by_text("prompt_tokens must be a whole number").wait_for()
    page.fill("#id_prompt_tokens", "700")
    blocks.wait_for()

    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/labs/runs/*/")
    page.locator("table.results").wait_for(timeout=60_000)  # swapped in by polling
    assert page.locator(".state").first.inner_text().lower() == "done"
    for chart in ("ttft", "itl", "throughput", "queues", "kv"):
        page.wait_for_function(CHART_DRAWN, arg=f'canvas[data-chart="{chart}"]')
    caption = page.locator("table.results caption").inner_text()
    assert "simulated · " in caption  # the short badge; the long form is one click away
    # Two clocks on one page: the worker's wall clock for the run, the simulator's for the axis.
    assert "s of wall-clock time to simulate" in page.locator(".run-took").inner_text()
    axis = page.evaluate(
        "Chart.getChart(document.querySelector('canvas[data-chart=\"kv\"]'))"
        ".options.scales.x.title.text"
    )
    assert axis == "simulated time in the run (s), not wall-clock"
    ttft = page.locator("table.results tr", has_text="TTFT, mean")
    assert re.fullmatch(r"[\d.]+ m?s", ttft.locator("td.measured").inner_text())
    # 64 requests on a pool that holds 16 at full length but admits 21 on their prompts: they
    # are preempted mid-decode, which the formulas do not follow, and the row says so.
    assert ttft.locator("td.predicted").inner_text() == "not covered"
    assert "preempted" in ttft.inner_text()
    kv = page.locator("table.results tr", has_text="KV usage, peak")
    assert re.fullmatch(r"[\d.]+%", kv.locator("td.measured").inner_text())
    settings_box = page.locator(".settings-box")
    settings_box.locator("summary").click()
    assert "256" in settings_box.inner_text()
    _shoot(page, "lab-run")


def test_a_sweep_from_the_batching_lab_charts_measured_and_predicted(page, celery_worker):
    sign_up(page, "sweeper")
    page.wait_for_url("**/quiz/")
    page.goto("/labs/batching/")
    page.locator("summary", has_text="Sweep one setting").click()
    page.select_option("#id_sweep_field", "max_num_seqs")
    page.fill("#id_sweep_values", "1, 4, 16, 32")
    page.fill("#id_num_prompts", "64")
    _shoot(page, "lab-form")
    page.set_viewport_size(LAPTOP)
    page.get_by_role("button", name="Run sweep").click()
    page.wait_for_url("**/labs/sweeps/*/")
    try:
        page.get_by_text("4 of 4 done").wait_for(timeout=90_000)
    except Exception:
        print(page.locator("main").inner_text(), celery_worker.log()[-3000:])
        raise
    for index in range(2):
        page.wait_for_function(CHART_DRAWN, arg=f'canvas[data-metric="{index}"]')
    datasets = page.evaluate(
        "() => Chart.getChart(document.querySelector('canvas[data-metric=\"0\"]'))"
        ".data.datasets.map(d => d.label)"
    )
    assert datasets == ["measured (simulated on CPU)", "predicted"]
    _shoot(page, "sweep")
    # History lists the sweep (its runs live on its page) and the lab index the backends.
    page.goto("/labs/runs/")
    page.get_by_role("heading", name="Sweeps").wait_for()
    _shoot(page, "history")
    page.goto("/labs/")
    _shoot(page, "labs-index")
