"""Staff edit cards in the admin: inline options, filters by deck/kind/tag, a rendered preview."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.conftest import make_user
from tests.quiz.factories import make_card

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(make_user("staff", is_staff=True, is_superuser=True))
    return client


def test_it_lists_cards_filtered_by_deck_kind_and_tag(staff_client):
    kv = make_card("numeric", slug="kv-card", tags=("kv-memory",))
    make_card("recall", slug="batch-card", tags=("batching",))
    url = reverse("admin:quiz_card_changelist")
    html = staff_client.get(url, {"tags__id__exact": kv.card_tags.get().tag_id}).content.decode()
    assert "kv-card" in html and "batch-card" not in html
    html = staff_client.get(url, {"kind__exact": "recall"}).content.decode()
    assert "batch-card" in html and "kv-card" not in html
    html = staff_client.get(url, {"deck__id__exact": kv.deck_id, "q": "kv"}).content.decode()
    assert "kv-card" in html and "batch-card" not in html


def test_it_edits_a_card_with_options_inline_and_a_sanitised_preview(staff_client):
    card = make_card("choice", prompt="**Bold** <script>alert(1)</script>")
    response = staff_client.get(reverse("admin:quiz_card_change", args=[card.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert "options-0-text" in html and "card_tags-TOTAL_FORMS" in html
    assert "<strong>Bold</strong>" in html and "<script>alert(1)" not in html


def test_it_opens_the_other_quiz_admin_pages(staff_client):
    for name in ("deck", "tag", "reviewstate", "reviewlog", "learnersettings"):
        assert staff_client.get(reverse(f"admin:quiz_{name}_changelist")).status_code == 200
    assert staff_client.get(reverse("admin:quiz_card_add")).status_code == 200
