"""Lab pages in headless Chromium: a setting a lab does not show never refuses a value; the
run page names its preset and the time it was worked on; the deck's cards by their titles."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from labs.models import LabRun, RunState
from labs.parameters.presets import load_presets
from labs.runs import reaping
from tests.e2e.conftest import PHONE, sign_up
from tests.labs.factories import make_heartbeat, make_run
from tests.quiz.factories import make_card

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _predicted(page, key: str) -> str:
    return page.locator(f'#prediction [data-key="{key}"] dd').inner_text()


@pytest.mark.parametrize("lab", ["batching", "speculative"])
def test_a_long_output_in_a_lab_without_max_tokens_predicts_and_runs(page, lab):
    make_heartbeat("sim")  # a sim worker seen online; the queued run is not executed here
    sign_up(page, f"long-{lab}")
    page.wait_for_url("**/quiz/")
    page.goto(f"/labs/{lab}/")
    assert page.locator("#id_max_tokens").count() == 0  # the lab does not show it
    page.fill("#id_output_tokens", "1000")
    page.wait_for_function(
        "() => !document.querySelector('#prediction .errorlist')"
        " && document.querySelector('#prediction [data-key] dd') !== null"
    )
    assert "max_tokens" not in page.locator("#prediction").inner_text()
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/labs/runs/*/")
    run = LabRun.objects.get()
    assert run.params["output_tokens"] == 1000 and run.params["max_tokens"] >= 1000


def test_the_run_page_names_its_preset_and_counts_only_the_time_it_was_worked_on(page):
    sign_up(page, "run-reader")
    page.wait_for_url("**/quiz/")
    preset = load_presets()["block-waste-1000-tokens"]
    started = timezone.now() - timedelta(seconds=78)
    run = make_run(
        get_user_model().objects.get(username="run-reader"),
        lab="paged-kv",
        preset=preset.slug,
        state=RunState.RUNNING,
        started_at=started,
        heartbeat_at=started + timedelta(seconds=6),
        worker="sim@gone",
    )
    reaping.run_reap_stale(run_ids=[run.pk])  # the worker was killed 72 s ago
    page.goto(run.get_absolute_url())
    meta = page.locator(".run-meta")
    assert meta.get_by_role("link", name=preset.title).count() == 1
    assert preset.slug not in meta.inner_text()
    took = page.locator(".run-took").inner_text()
    assert took == "worked on for 6.0 s of wall-clock time before its worker stopped"


def test_from_the_deck_lists_cards_by_title(page):
    make_card(
        slug="draft-000-36de575bee6c4e63-l3",
        prompt="How many **blocks** does a 1,000-token sequence take?\n\nMore text.",
        lab_preset="block-waste-1000-tokens",
    )
    sign_up(page, "deck-reader")
    page.wait_for_url("**/quiz/")
    page.goto("/labs/paged-kv/")
    box = page.locator("section[aria-labelledby=cards-h]")
    link = box.get_by_role("link", name="How many blocks does a 1,000-token sequence take?")
    assert link.count() == 1
    assert "draft-000" not in box.inner_text()
    page.set_viewport_size(PHONE)  # a title is longer than a slug: it wraps, nothing sticks out
    page.wait_for_function("() => document.documentElement.scrollWidth <= window.innerWidth")


def test_the_live_prediction_sends_only_the_settings_and_concurrency_says_requests(page):
    sign_up(page, "predictor")
    page.wait_for_url("**/quiz/")
    page.goto("/labs/batching/")
    help_text = page.locator(".field", has=page.locator("#id_concurrency")).locator(".helptext")
    assert "requests in flight" in help_text.inner_text()
    assert "sequences decoding" not in help_text.inner_text()
    with page.expect_request(lambda r: "/predict/" in r.url) as sent:
        page.fill("#id_concurrency", "16")
    url = sent.value.url
    assert "concurrency=16" in url
    for name in ("csrfmiddlewaretoken", "sweep_field", "sweep_values"):
        assert f"{name}=" not in url, url


def test_history_says_just_now_for_a_run_made_this_minute(page):
    sign_up(page, "historian")
    page.wait_for_url("**/quiz/")
    make_run(get_user_model().objects.get(username="historian"), lab="paged-kv")
    page.goto("/labs/runs/")
    when = page.locator("td[data-label=When]").first.inner_text()
    assert when == "just now"
    assert "0 minutes" not in page.locator("main").inner_text()
