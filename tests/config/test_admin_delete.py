"""The admin's delete pages count a big delete instead of loading it, and delete it in batches
(config/admin_delete.py); an action's forged selection is a message, not a 500."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from config import admin_delete
from quiz.models import Card, ReviewLog
from tests.conftest import make_user
from tests.quiz.factories import make_card

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 3, 1, 9, tzinfo=dt.UTC)


@pytest.fixture
def staff_client(client):
    client.force_login(make_user("staff", is_staff=True, is_superuser=True))
    return client


def _log(user, cards: list[Card], reviews: int) -> None:
    ReviewLog.objects.bulk_create(
        ReviewLog(
            user=user,
            card=cards[i % len(cards)],
            rating=3,
            kind=ReviewLog.Kind.REVIEW,
            reviewed_at=NOW - dt.timedelta(minutes=i),
            study_date=(NOW - dt.timedelta(minutes=i)).date(),
            duration_ms=1000,
            state_before={},
            token=f"{user.pk}-{i}",
        )
        for i in range(reviews)
    )


@contextmanager
def _review_logs_loaded() -> Iterator[list[int]]:
    """How many ReviewLog rows were turned into objects inside the block."""
    loaded = [0]

    def count(**_: object) -> None:
        loaded[0] += 1

    post_init.connect(count, sender=ReviewLog, weak=False)
    try:
        yield loaded
    finally:
        post_init.disconnect(count, sender=ReviewLog)


def test_a_learner_with_a_big_log_is_counted_and_deleted_without_loading_a_review(
    staff_client, monkeypatch
):
    monkeypatch.setattr(admin_delete, "BATCH", 100)
    learner = make_user("learner")
    cards = [make_card() for _ in range(3)]
    reviews = admin_delete.LIST_LIMIT * 3
    _log(learner, cards, reviews)
    url = reverse("admin:auth_user_delete", args=[learner.pk])

    with _review_logs_loaded() as loaded:
        page = staff_client.get(url)
    html = page.content.decode()
    assert page.status_code == 200
    assert loaded[0] == 0  # Django's page loads every one of them
    assert f"Review logs: {reviews}" in html.replace(",", "")
    assert "too many to list here" in html and "User: learner" in html

    with _review_logs_loaded() as loaded, CaptureQueriesContext(connection) as queries:
        done = staff_client.post(url, {"post": "yes"})
    assert done.status_code == 302
    assert loaded[0] == 0
    assert not ReviewLog.objects.filter(user_id=learner.pk).exists()
    assert not type(learner).objects.filter(pk=learner.pk).exists()
    # Batches of BATCH rows by key, not one statement for the lot (then Django's own delete of
    # the user finds none left).
    batches = [q["sql"] for q in queries if q["sql"].startswith('DELETE FROM "quiz_reviewlog"')]
    assert sum('"quiz_reviewlog"."id" <=' in sql for sql in batches) == reviews // 100


def test_a_small_delete_is_listed_row_by_row_as_django_lists_it(staff_client):
    learner = make_user("learner")
    card = make_card()
    _log(learner, [card], 2)
    html = staff_client.get(reverse("admin:quiz_card_delete", args=[card.pk])).content.decode()
    assert html.count("Review log:") == 2 and "too many to list" not in html


def test_select_all_posts_back_select_all_and_deletes_the_filtered_rows(staff_client):
    learner = make_user("learner")
    cards = [make_card() for _ in range(3)]
    _log(learner, cards, admin_delete.LIST_LIMIT + 50)
    other = make_card(deck=None, slug="kept-card")
    url = reverse("admin:quiz_card_changelist") + "?q=card-"
    selection = {"action": "delete_selected", "select_across": "1", "index": "0"}
    selection["_selected_action"] = str(cards[0].pk)

    page = staff_client.post(url, selection)
    html = page.content.decode()
    assert page.status_code == 200
    assert 'name="select_across" value="1"' in html
    assert html.count('name="_selected_action"') == 1

    staff_client.post(url, {**selection, "post": "yes"})
    assert not Card.objects.filter(pk__in=[c.pk for c in cards]).exists()
    assert Card.objects.filter(pk=other.pk).exists()
    assert not ReviewLog.objects.exists()


def test_a_big_delete_selected_writes_one_history_entry(staff_client):
    learner = make_user("learner")
    _log(learner, [make_card()], admin_delete.LIST_LIMIT + 1)
    url = reverse("admin:quiz_reviewlog_changelist")
    pk = ReviewLog.objects.values_list("pk", flat=True).first()
    post = {"action": "delete_selected", "select_across": "1", "index": "0", "post": "yes"}
    staff_client.post(url, {**post, "_selected_action": str(pk)})
    assert not ReviewLog.objects.exists()
    entry = LogEntry.objects.get()
    assert entry.object_repr == f"{admin_delete.LIST_LIMIT + 1} review logs (one bulk delete)"


@pytest.mark.parametrize(
    "field, value", [("_selected_action", "²"), ("_selected_action", "x1"), ("index", "²")]
)
def test_a_forged_selection_is_a_message_not_a_500(staff_client, field, value):
    card = make_card()
    url = reverse("admin:quiz_card_changelist")
    post = {"action": "delete_selected", "index": "0", "_selected_action": "1", field: value}
    response = staff_client.post(url, post, follow=True)
    assert response.status_code == 200
    assert "written in 0-9" in response.content.decode()
    assert Card.objects.filter(pk=card.pk).exists()


def test_every_admin_page_of_the_site_deletes_within_bounds():
    unbounded = [
        model.__name__
        for model, model_admin in admin.site._registry.items()
        if not isinstance(model_admin, admin_delete.BoundedDeleteMixin)
    ]
    assert unbounded == []
    assert admin.site.get_action("delete_selected") is admin_delete.delete_selected
