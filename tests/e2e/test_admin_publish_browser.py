"""Staff publish imported drafts in the admin, in headless Chromium: each gets a real slug."""

from __future__ import annotations

import pytest

from quiz.documents import document_import
from quiz.models import Card
from tests.conftest import make_user
from tests.quiz.factories import make_deck

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_staff_publish_drafts_and_the_deck_shows_their_real_names(page):
    make_user("editor", is_staff=True, is_superuser=True)
    text = "How many blocks does a 1,000-token sequence take at block_size 16?\n\nWhat is TTFT?\n"
    drafts = document_import(deck=make_deck(), name="000_36de575bee6c4e63.txt", text=text)
    Card.objects.filter(pk__in=[c.pk for c in drafts]).update(answer="Staff wrote this.")
    page.goto("/admin/login/")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "a-long-passphrase-1")
    page.click("input[type=submit]")
    page.goto("/admin/quiz/card/?is_active__exact=0")
    for card in drafts:
        page.check(f"input.action-select[value='{card.pk}']")
    page.select_option("select[name=action]", "publish_drafts")
    page.click("button[name=index]")
    message = page.locator(".messagelist .success").inner_text()
    assert "Published 2 card(s)" in message
    names = ["how-many-blocks-does-a-1000-token-sequence-take-at-block", "what-is-ttft"]
    assert sorted(Card.objects.filter(is_active=True).values_list("slug", flat=True)) == sorted(
        names
    )
    page.goto(f"/quiz/cards/{names[1]}/")
    assert page.locator("h1").inner_text() == names[1]
