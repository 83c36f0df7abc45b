"""Lab settings in headless Chromium: a setting a lab does not show never refuses a value."""

from __future__ import annotations

import pytest

from labs.models import LabRun
from tests.e2e.conftest import sign_up
from tests.labs.factories import make_heartbeat

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
