"""Fitting FSRS parameters to a learner's log (quiz/optimizer.py, quiz/parameters.py)."""

from __future__ import annotations

import datetime as dt
import random
import time

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from quiz import optimizer, parameters, scheduling, selectors, services
from quiz.models import ParameterFit, ReviewLog
from tests.quiz.factories import at, make_card, review
from tests.quiz.synthetic_learners import review_log, true_parameters


def _split(log, seed):
    """Held-out reviews: all the reviews of a quarter of the cards."""
    cards = sorted({r.card_id for r in log})
    random.Random(seed).shuffle(cards)
    held = set(cards[: len(cards) // 4])
    return [r for r in log if r.card_id not in held], [r for r in log if r.card_id in held]


@pytest.mark.parametrize(("kind", "seed"), [("forgetful", 1), ("retentive", 2), ("steep", 3)])
def test_fitted_parameters_predict_held_out_reviews_better_than_the_defaults(kind, seed):
    log = review_log(kind, 1500, seed)
    train, held = _split(log, seed)
    fit = optimizer.fit(train, current=None, desired_retention=0.9)
    held_items = optimizer.training_items(held)
    defaults = optimizer.evaluate(scheduling.DEFAULT_PARAMETERS, held_items)
    fitted = optimizer.evaluate(fit.parameters, held_items)
    truth = optimizer.evaluate(true_parameters(kind), held_items)
    print(
        f"\n{kind}: {len(log)} reviews, {fit.reviews} training items, {len(held_items)} held out;"
        f" log loss defaults {defaults['log_loss']:.4f} fitted {fitted['log_loss']:.4f}"
        f" true {truth['log_loss']:.4f}; RMSE defaults {defaults['rmse']:.4f}"
        f" fitted {fitted['rmse']:.4f}"
    )
    assert fitted["log_loss"] < defaults["log_loss"]
    assert fit.fitted["log_loss"] < fit.current["log_loss"]  # in-sample, as the page shows
    assert fit.parameters != list(scheduling.DEFAULT_PARAMETERS)


def test_it_refuses_a_log_too_small_for_a_meaningful_fit():
    log = review_log("forgetful", 300, 4)
    with pytest.raises(optimizer.NotEnoughReviews, match="at least 512"):
        optimizer.fit(log, current=None, desired_retention=0.9)


def test_the_interval_table_shows_a_forgetful_learner_shorter_intervals():
    rows = optimizer.interval_table(
        scheduling.DEFAULT_PARAMETERS, true_parameters("forgetful"), 0.9
    )
    graduated = rows[1]
    assert graduated["path"] == "Good, Good" and graduated["fitted_s"] < graduated["current_s"]


def test_the_interval_table_includes_the_learning_steps():
    # It said a new card answered Good comes back in 2 days; the app gives it a 10-minute step.
    rows = {
        row["path"]: row
        for row in optimizer.interval_table(
            scheduling.DEFAULT_PARAMETERS, scheduling.DEFAULT_PARAMETERS, 0.9
        )
    }
    assert rows["Good"]["current"] == rows["Good"]["fitted"] == "10m"
    assert rows["Good"]["current_s"] == 600
    assert rows["Good, Again, Good"]["current"] == "10m"  # Again restarts the steps
    assert rows["Good, Good"]["current"].endswith("d") and rows["Easy"]["current"].endswith("d")


def test_the_workload_grows_with_desired_retention():
    rows = optimizer.workload(scheduling.DEFAULT_PARAMETERS, deck_size=200, new_per_day=20)
    per_day = [row["reviews_per_day"] for row in rows]
    assert [row["retention"] for row in rows] == [0.80, 0.85, 0.90, 0.95]
    assert per_day == sorted(per_day) and per_day[-1] > per_day[0] > 0


# --- Through the database -----------------------------------------------------------------------


def _store(user, log) -> None:
    """Write a synthetic log as the learner's (one card row per synthetic card)."""
    cards = {card_id: make_card() for card_id in sorted({r.card_id for r in log})}
    ReviewLog.objects.bulk_create(
        ReviewLog(
            user=user,
            card=cards[r.card_id],
            rating=r.rating,
            kind=ReviewLog.Kind.REVIEW,
            reviewed_at=dt.datetime.combine(r.study_date, dt.time(9), tzinfo=dt.UTC),
            study_date=r.study_date,
            duration_ms=5000,
            state_before={},
            token=f"synthetic-{i}",
        )
        for i, r in enumerate(log)
    )


@pytest.mark.django_db
def test_optimizing_below_the_threshold_is_refused_and_nothing_is_queued(alice, monkeypatch):
    sent = []
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", sent.append)
    _store(alice, review_log("forgetful", 200, 5))
    with pytest.raises(ValidationError, match="at least 512"):
        parameters.fit_start(user=alice)
    assert not ParameterFit.objects.exists() and not sent


@pytest.mark.django_db(transaction=True)
def test_a_fit_runs_then_its_parameters_are_used_logged_and_can_be_undone(
    alice, client, monkeypatch
):
    client.force_login(alice)
    sent = []
    monkeypatch.setattr(
        "quiz.tasks.fit_parameters_task.apply_async", lambda args: sent.append(args)
    )
    _store(alice, review_log("forgetful", 1200, 6))
    fit = parameters.fit_start(user=alice)
    assert sent == [[fit.pk]]
    with pytest.raises(ValidationError, match="already"):
        parameters.fit_start(user=alice)  # one at a time
    parameters.fit_run(fit_id=fit.pk)  # what the worker does
    fit.refresh_from_db()
    assert fit.status == "done" and fit.progress == 100 and len(fit.parameters) == 21
    assert fit.evaluation["fitted"]["log_loss"] < fit.evaluation["current"]["log_loss"]
    workload = fit.evaluation["workload"]
    assert [row["retention"] for row in workload] == [0.80, 0.85, 0.90, 0.95]
    # A forgetful learner needs more reviews than the defaults assume, at every retention.
    assert all(
        row["fitted"]["reviews_per_day"] > row["current"]["reviews_per_day"] for row in workload
    )
    page = client.get(reverse("quiz:parameters")).content.decode()
    assert "Use these parameters" in page and "Reviews a day now" in page

    parameters.parameters_use(user=alice, fit_id=fit.pk)
    card = make_card()
    log = review(alice, card, 3, at(2026, 9, 1, 9))
    assert log.parameters == fit.parameters  # the log records the parameters in force
    state = selectors.card_replayed(user=alice, card_id=card.pk)
    stored = services._state_columns(card.review_states.get(user=alice))
    assert state == stored
    expected = scheduling.outcomes(
        scheduling.new_card_state(log.reviewed_at),
        card_id=card.pk,
        now=log.reviewed_at,
        scheduler=scheduling.make_scheduler(0.9, parameters=fit.parameters),
        rollover_hour=4,
    )[3]
    assert (
        stored.stability
        == expected.stability
        != scheduling.outcomes(
            scheduling.new_card_state(log.reviewed_at),
            card_id=card.pk,
            now=log.reviewed_at,
            scheduler=scheduling.make_scheduler(0.9),
            rollover_hour=4,
        )[3].stability
    )

    parameters.parameters_revert(user=alice)
    assert selectors.learner_settings_get(user=alice).fsrs_parameters is None
    with pytest.raises(ValidationError, match="nothing to undo"):
        parameters.parameters_revert(user=alice)


@pytest.mark.django_db
def test_the_parameters_page_refuses_a_learner_with_too_few_reviews(alice_client, monkeypatch):
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    assert "Optimize my parameters" in page and "default parameters" in page
    response = alice_client.post(reverse("quiz:parameters-optimize"), follow=True)
    assert "at least 512" in response.content.decode()
    assert not ParameterFit.objects.exists()
    assert alice_client.post(reverse("quiz:parameters-use", args=[999])).status_code == 302
    response = alice_client.post(reverse("quiz:parameters-revert"), follow=True)
    assert "nothing to undo" in response.content.decode()


@pytest.mark.django_db
def test_a_learner_without_saved_settings_can_use_a_fit_and_go_back(alice):
    fitted = true_parameters("forgetful")
    fit = ParameterFit.objects.create(
        user=alice, status="done", created_at=at(2026, 6, 1, 9), parameters=fitted
    )
    parameters.parameters_use(user=alice, fit_id=fit.pk)
    assert selectors.learner_settings_get(user=alice).fsrs_parameters == fitted
    parameters.parameters_revert(user=alice)
    assert selectors.learner_settings_get(user=alice).fsrs_parameters is None


@pytest.mark.django_db(transaction=True)
def test_optimize_from_the_page_runs_on_a_real_worker(alice, alice_client, celery_worker):
    _store(alice, review_log("steep", 900, 7))
    response = alice_client.post(reverse("quiz:parameters-optimize"))
    assert response.status_code == 302
    fit = ParameterFit.objects.get(user=alice)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page = alice_client.get(reverse("quiz:parameters"))
        assert page.status_code == 200  # the page answers while the worker fits
        fit.refresh_from_db()
        if fit.status not in parameters.RUNNING:
            break
        time.sleep(0.2)
    assert fit.status == ParameterFit.Status.DONE, f"{fit.error}\n{celery_worker.log()}"
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    assert "Use these parameters" in page and f"on {fit.reviews} reviews" in page
