import pytest

from tests.e2e.conftest import PHONE, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_learner_signs_up_and_lands_on_today(page):
    sign_up(page, "newcomer")
    page.wait_for_url("**/quiz/")
    assert page.locator("h1").first.inner_text().startswith("Today")
    assert page.locator("nav").get_by_text("newcomer").is_visible()


def test_the_nav_fits_a_phone(page):
    page.set_viewport_size(PHONE)
    sign_up(page, "phoneuser")
    page.wait_for_url("**/quiz/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"page scrolls sideways on a phone: {width}px"
    tops = set()
    for label in ("Today's quiz", "Labs", "Stats"):
        link = page.get_by_role("link", name=label)
        assert link.is_visible()
        tops.add(round(link.bounding_box()["y"]))
    assert len(tops) == 1, f"the section links wrap onto {len(tops)} lines: {sorted(tops)}"
