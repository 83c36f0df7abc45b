"""A personal card made by a real `celery worker` process on the lab queue (never eager mode)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from quiz import personal
from quiz.models import Card, PersonalCardRequest
from tests.labs.runs.test_tasks import wait_for
from tests.quiz.test_personal import finished_run

pytestmark = [pytest.mark.worker]


def test_the_lab_worker_makes_the_card_and_the_web_only_watches(
    celery_worker, alice_client, alice, monkeypatch
):
    def no_simulation_here(*_args, **_kwargs):
        raise AssertionError("the web process simulated")

    monkeypatch.setattr(personal, "_simulate", no_simulation_here)  # this process only
    run = finished_run(alice, max_num_seqs=16, concurrency=64)
    response = alice_client.post(reverse("quiz:card-from-run", args=[run.pk]))
    request = PersonalCardRequest.objects.get(owner=alice)
    assert response["Location"] == f"{reverse('quiz:my-cards')}?request={request.pk}"

    def polled():
        poll = alice_client.get(response["Location"], HTTP_HX_REQUEST="true")
        return poll if poll.status_code == 286 else None

    html = wait_for(polled).content.decode()
    request.refresh_from_db()
    card = Card.objects.get(owner=alice)
    assert request.state == "done" and request.card == card, request.error
    assert f"Your card from run #{run.pk} is made." in html
    # The worker process simulated and made it.
    assert f"card request {request.pk} made card {card.pk}" in celery_worker.log()
    assert "What the run measured: at max_num_seqs 32" in card.explanation
