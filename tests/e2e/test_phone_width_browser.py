"""Every learner page fits a 390 px phone: nothing scrolls sideways, with the real deck loaded, a
finished run, a finished sweep and a history of runs behind the pages (Debian's Chromium).

The runs are executed in-process on the real simulator (as the worker would), so no Celery
worker is needed. Screenshots of each page at 390 px go to $SHOTS_DIR (default
var/screenshots/phone/), for a person to look at.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import NoReverseMatch, reverse

from labs.models import LabRun, RunState
from labs.parameters.presets import LABS, load_presets
from labs.runs import execution, queueing, submission
from quiz.models import Card
from tests.e2e.conftest import LAPTOP, PHONE, sign_up
from tests.labs.factories import make_heartbeat, make_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("SHOTS_DIR") or Path(settings.BASE_DIR) / "var/screenshots/phone")
PRESET = "batching-llama3-8b-h100-batch-32"
BASELINE = "batching-llama3-8b-h100-batch-1"
VLLM_ON_CPU = "vLLM 0.32.0 on CPU (Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz, 224 cores)"
# The widest elements sticking out past the viewport, named for the failure message.
WIDE = """(limit) => [...document.querySelectorAll('body *')]
    .filter((e) => e.getBoundingClientRect().right > limit + 1)
    .slice(-4)
    .map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${Math.round(
        e.getBoundingClientRect().right)}px`)"""


def _finish(run: LabRun) -> LabRun:
    assert execution.run_execute(run_id=run.pk, hostname="sim@e2e") == RunState.DONE, run.error
    run.refresh_from_db()
    return run


def _history(user) -> dict[str, object]:
    """Runs of two presets, a run of every lab, and a finished sweep."""
    make_heartbeat("sim")
    with mock.patch.object(queueing, "_enqueue"):  # run here, not through a broker
        runs = []
        for slug in (PRESET, BASELINE):  # the batch-32 card's two points: its ratio shows
            preset = load_presets()[slug]
            data = {**LABS[preset.lab].defaults, **preset.params}
            made = submission.run_request(
                owner=user, lab=preset.lab, backend="sim", data=data, preset=slug
            )
            runs.append(_finish(made))
        for slug, lab in LABS.items():
            made = submission.run_request(owner=user, lab=slug, backend="sim", data=lab.defaults)
            runs.append(_finish(made))
        sweep = submission.sweep_request(
            owner=user,
            lab="batching",
            backend="sim",
            data=LABS["batching"].defaults,
            field="max_num_seqs",
            raw_values="1, 8, 32",
        )
        for run in sweep.runs.all():
            _finish(run)
    # A run measured on a real engine, labelled as such a worker labels a CPU engine: a long
    # label of its own in history and compare.
    gpu_run = make_run(
        user,
        lab="batching",
        backend="vllm",
        params=runs[1].params,
        state=RunState.DONE,
        result=runs[1].result,
        where=VLLM_ON_CPU,
    )
    return {"run": runs[0], "other": gpu_run, "sweep": sweep}


def _overflow(page) -> str | None:
    """None if the page fits its viewport, else what sticks out."""
    # Charts resize on a later frame: give them until the page fits, then measure.
    try:
        page.wait_for_function(
            "() => document.scrollingElement.scrollWidth <= document.scrollingElement.clientWidth",
            timeout=3_000,
        )
    except Exception:  # noqa: BLE001 - the measurement below reports it
        pass
    width, client = page.evaluate(
        "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
    )
    if width <= client:
        return None
    return f"{width}px in {client}px: {page.evaluate(WIDE, client)}"


# Every page at phone width, about a minute: `make test-deep` (each browser test module also checks
# its own pages on a phone).
@pytest.mark.deep
def test_every_learner_page_fits_a_phone(page):
    call_command("load_content", stdout=io.StringIO())
    page.set_viewport_size(PHONE)
    SHOTS.mkdir(parents=True, exist_ok=True)
    wide: dict[str, str] = {}

    def check(url: str, name: str) -> None:
        page.goto(url)
        page.wait_for_load_state("load")
        found = _overflow(page)
        if found:
            wide[f"{url} at {page.viewport_size['width']} px"] = found
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    for url, name in (
        ("/", "home"),
        ("/accounts/login/", "login"),
        ("/accounts/signup/", "signup"),
    ):
        check(url, name)

    sign_up(page, "phonelearner")
    page.wait_for_url("**/quiz/")
    user = get_user_model().objects.get(username="phonelearner")
    made = _history(user)
    run, other, sweep = made["run"], made["other"], made["sweep"]

    pages = [
        ("/quiz/", "quiz-question"),
        ("/quiz/stats/", "stats"),
        ("/quiz/settings/", "settings"),
        ("/accounts/password/", "password"),
        ("/labs/", "labs"),
        ("/labs/runs/", "history"),
        (f"/labs/runs/compare/?a={other.pk}&b={run.pk}", "compare"),
        (run.get_absolute_url(), "run"),
        (sweep.get_absolute_url(), "sweep"),
        (f"/labs/preset/{PRESET}/", "preset"),
    ]
    pages += [(f"/labs/{slug}/", f"lab-{slug}") for slug in LABS]
    with contextlib.suppress(NoReverseMatch):  # "My cards", on branches that have it
        pages.append((reverse("quiz:my-cards"), "my-cards"))
    for url, name in pages:
        check(url, name)

    # The long provenance, opened under the run's badge, wraps within the screen.
    page.goto(run.get_absolute_url())
    page.locator("details.where summary").click()
    long = page.locator(".where-long")
    assert long.inner_text().startswith("simulated on CPU as H100 SXM (calibrated to ")
    found = _overflow(page)
    if found:
        wide["run page, provenance open"] = found
    page.screenshot(path=str(SHOTS / "run-provenance-open.png"))

    # The answer side of today's first card, then every card's own page (the preset's card
    # shows the learner's own number).
    page.goto("/quiz/")
    page.wait_for_selector("html[data-quiz=ready]", state="attached")
    panel = page.locator("#quiz-panel[data-side=question]")
    kind = panel.get_attribute("data-kind")
    if kind == "numeric":
        page.keyboard.type("1")
        page.keyboard.press("Enter")
    else:
        page.keyboard.press("1" if kind == "choice" else " ")
    page.wait_for_selector("#quiz-panel[data-side=answer]")
    found = _overflow(page)
    if found:
        wide["/quiz/ (answer side)"] = found
    page.screenshot(path=str(SHOTS / "quiz-answer.png"), full_page=True)
    for card in Card.objects.filter(is_active=True, owner=None).order_by("slug"):
        check(f"/quiz/cards/{card.slug}/", f"card-{card.slug}")

    # The pages this change touched, on a laptop too.
    page.set_viewport_size(LAPTOP)
    for url, name in pages[4:9] + [("/quiz/cards/batch32-speedup-llama3-8b-h100/", "card")]:
        check(url, f"laptop-{name}")

    assert re.search(r"You measured [\d.]+×", _card_text(page, "batch32-speedup-llama3-8b-h100"))
    assert not wide, "pages scroll sideways:\n" + "\n".join(
        f"{url}: {what}" for url, what in wide.items()
    )


def _card_text(page, slug: str) -> str:
    page.goto(f"/quiz/cards/{slug}/")
    return page.locator("main").inner_text()
