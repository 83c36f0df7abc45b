"""The "Your FSRS parameters" page with a finished fit, on a phone and a laptop."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from quiz import optimizer, scheduling
from quiz.models import ParameterFit
from tests.e2e.conftest import LAPTOP, PHONE, sign_up
from tests.quiz.synthetic_learners import true_parameters

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def finished_fit(username: str) -> ParameterFit:
    fitted = true_parameters("forgetful")
    rows = zip(
        optimizer.workload(scheduling.DEFAULT_PARAMETERS, deck_size=300, new_per_day=20),
        optimizer.workload(fitted, deck_size=300, new_per_day=20),
        strict=True,
    )
    return ParameterFit.objects.create(
        user=get_user_model().objects.get(username=username),
        status=ParameterFit.Status.DONE,
        progress=100,
        created_at=timezone.now(),
        finished_at=timezone.now(),
        reviews=1234,
        parameters=fitted,
        evaluation={
            "training": {
                "current": {"log_loss": 0.51, "rmse": 0.16},
                "fitted": {"log_loss": 0.47, "rmse": 0.14},
            },
            "held_out": {
                "current": {"log_loss": 0.50, "rmse": 0.15},
                "fitted": {"log_loss": 0.48, "rmse": 0.14},
            },
            "held_out_reviews": 400,
            "wins": True,
            "current_is_default": True,
            "workload": [{"retention": a["retention"], "current": a, "fitted": b} for a, b in rows],
        },
        intervals=optimizer.interval_table(scheduling.DEFAULT_PARAMETERS, fitted, 0.9),
    )


def test_a_learner_uses_a_fit_and_goes_back_on_a_phone_and_a_laptop(page):
    sign_up(page)
    finished_fit("learner")
    for viewport in (PHONE, LAPTOP):
        page.set_viewport_size(viewport)
        page.goto("/quiz/parameters/")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], f"the page scrolls sideways at {viewport}: {width}px"
    page.click("text=Use these parameters")
    page.wait_for_selector("text=scheduled with the fitted parameters")
    assert page.is_visible("text=These parameters are in use.")
    page.click("text=Go back to the previous parameters")
    page.wait_for_selector("text=Back to your previous parameters.")
    assert page.is_visible("text=default parameters")
