"""Fitting FSRS parameters to a learner's log (quiz/optimizer.py, quiz/parameters.py)."""

from __future__ import annotations

import datetime as dt
import random
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.urls import reverse
from fsrs import Card as FsrsCard
from fsrs import Rating

from quiz import optimizer, parameters, scheduling, selectors, services
from quiz.models import LearnerSettings, ParameterFit, ReviewLog
from tests.quiz.factories import at, make_card, review, synthetic_review_rows
from tests.quiz.synthetic_learners import review_log, true_parameters
from tests.quiz.test_fitting import long_cards_log
from tests.worker import start_worker


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
    assert fit.training["fitted"]["log_loss"] < fit.training["current"]["log_loss"]
    assert fit.parameters != list(scheduling.DEFAULT_PARAMETERS)


def test_the_fit_is_judged_on_the_latest_reviews_which_it_did_not_see(monkeypatch):
    log = review_log("steep", 1500, 3)
    seen = []
    real = optimizer.fsrs_rs.FSRS.compute_parameters
    monkeypatch.setattr(
        optimizer.fsrs_rs.FSRS,
        "compute_parameters",
        lambda self, items: seen.append(len(items)) or real(self, items),
    )
    fit = optimizer.fit(log, current=None, desired_retention=0.9)
    train, held = optimizer.split_by_time(log)
    assert seen == [len(train)] == [fit.reviews]  # the fit saw only the earlier items
    assert fit.held_out_reviews == len(held) > 0
    assert len(train) + len(held) == len(optimizer.training_items(log))
    # fsrs-rs evaluates in f32 across threads: the same figures to about 1e-7, not to the bit.
    assert fit.held_out["fitted"] == pytest.approx(
        optimizer.evaluate(fit.parameters, held), rel=1e-5
    )
    defaults = optimizer.evaluate(scheduling.DEFAULT_PARAMETERS, held)
    assert fit.held_out["current"] == pytest.approx(defaults, rel=1e-5)
    print(
        f"\nsteep, seed 3: {fit.reviews} training items, {fit.held_out_reviews} held out; log loss"
        f" training fitted {fit.training['fitted']['log_loss']:.4f} defaults"
        f" {fit.training['current']['log_loss']:.4f}; held out fitted"
        f" {fit.held_out['fitted']['log_loss']:.4f} defaults {defaults['log_loss']:.4f}"
    )
    assert fit.wins and fit.held_out["fitted"]["log_loss"] < defaults["log_loss"]


def test_the_held_out_items_are_those_ending_in_the_latest_quarter_of_the_reviews():
    day = dt.date(2026, 3, 1)
    log = [optimizer.Review(1, 3, day + dt.timedelta(days=d)) for d in (0, 10, 20, 30)]
    log += [optimizer.Review(2, 3, day + dt.timedelta(days=d)) for d in (1, 2, 3, 4)]
    train, held = optimizer.split_by_time(log)
    # By time the last two of the eight reviews are card 1's on days 20 and 30.
    assert [len(item.reviews) for item in held] == [3, 4]
    assert [item.long_term_review_cnt() for item in held] == [2, 3]
    assert sorted(len(item.reviews) for item in train) == [2, 2, 3, 4]


def test_a_fit_that_loses_on_the_held_out_reviews_does_not_win():
    # This learner's fit beats the defaults on the reviews it saw and loses on the later ones.
    fit = optimizer.fit(review_log("retentive", 1500, 2), current=None, desired_retention=0.9)
    assert fit.training["fitted"]["log_loss"] < fit.training["current"]["log_loss"]
    assert fit.held_out["fitted"]["log_loss"] > fit.held_out["current"]["log_loss"]
    assert not fit.wins


def test_study_dates_going_back_and_forth_do_not_multiply_a_cards_items():
    # Time zones switched between reviews: the study date goes D+1, D, D+1, D... Each return to
    # D+1 counted as "a day later", giving an item per two reviews, each holding all before it.
    day = dt.date(2026, 3, 1)
    zigzag = [optimizer.Review(1, 3, day + dt.timedelta(days=i % 2)) for i in range(2000)]
    items = optimizer.training_items(zigzag)
    assert len(items) == 1 and len(items[0].reviews) == 2
    # A card reviewed every day for years: its items are bounded in length, so the total is
    # linear in its reviews.
    daily = [optimizer.Review(2, 3, day + dt.timedelta(days=i)) for i in range(2000)]
    items = optimizer.training_items(daily)
    assert len(items) == optimizer.MAX_CARD_REVIEWS - 1
    assert max(len(item.reviews) for item in items) == optimizer.MAX_CARD_REVIEWS


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


@pytest.mark.parametrize("retention", [0.7, 0.8, 0.85, 0.9, 0.95, 0.97])
@pytest.mark.parametrize("path", [("Good", "Good"), ("Easy",)])
def test_the_interval_table_counts_a_graduating_interval_in_days_as_fsrs_gives_it(retention, path):
    # "Good, Good" was a day short at every retention (Easy at 0.95): it counted the hours from
    # the press to the start of the due day. A new card graduating has nothing to convert, so
    # fsrs's own interval (whole days, no fuzz) is the oracle; Anki shows the same.
    fsrs = scheduling.make_scheduler(retention, fuzz=False)
    card, now = FsrsCard(card_id=1), dt.datetime(2026, 1, 5, 12, tzinfo=dt.UTC)
    for button in path:
        now = card.due
        card, _ = fsrs.review_card(card, Rating[button], now)
    expected = (card.due - now) / dt.timedelta(days=1)
    row = next(
        row
        for row in optimizer.interval_table(
            scheduling.DEFAULT_PARAMETERS, scheduling.DEFAULT_PARAMETERS, retention
        )
        if row["path"] == ", ".join(path)
    )
    assert row["current_s"] == expected * 86400 and row["current"] == scheduling.format_interval(
        dt.timedelta(days=expected)
    )


def test_the_workload_grows_with_desired_retention():
    rows = optimizer.workload(scheduling.DEFAULT_PARAMETERS, deck_size=200, new_per_day=20)
    per_day = [row["reviews_per_day"] for row in rows]
    assert [row["retention"] for row in rows] == [0.80, 0.85, 0.90, 0.95]
    assert per_day == sorted(per_day) and per_day[-1] > per_day[0] > 0


# --- Through the database -----------------------------------------------------------------------


def _store(user, log) -> None:
    """Write a synthetic log as the learner's (one card row per synthetic card)."""
    cards = {card_id: make_card().pk for card_id in sorted({r.card_id for r in log})}
    ReviewLog.objects.bulk_create(synthetic_review_rows(user, log, cards, "synthetic"))


@pytest.mark.django_db
def test_optimizing_below_the_threshold_is_refused_and_nothing_is_queued(alice, monkeypatch):
    sent = []
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", sent.append)
    _store(alice, review_log("forgetful", 200, 5))
    with pytest.raises(ValidationError, match="at least 512"):
        parameters.fit_start(user=alice)
    assert not ParameterFit.objects.exists() and not sent


@pytest.mark.django_db
def test_the_worker_refuses_a_log_with_too_few_usable_reviews(alice, monkeypatch):
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    log = review_log("forgetful", 600, 5)
    _store(alice, [optimizer.Review(r.card_id, r.rating, log[0].study_date) for r in log])
    fit = parameters.fit_start(user=alice)  # enough rows, all on one day: the worker finds out
    parameters.fit_run(fit_id=fit.pk)
    fit.refresh_from_db()
    assert fit.status == "failed" and "at least 512" in fit.error and "have 0" in fit.error


def _log_reads(queries) -> list[str]:
    return [q["sql"] for q in queries if "quiz_reviewlog" in q["sql"]]


@pytest.mark.django_db
def test_a_press_checks_for_a_fit_in_hand_first_and_reads_a_bounded_part_of_the_log(
    alice, monkeypatch
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    monkeypatch.setattr(parameters, "_reviews", lambda user_id: pytest.fail("read in the web"))
    _store(alice, review_log("forgetful", 1200, 6))
    with CaptureQueriesContext(connection) as queries:
        fit = parameters.fit_start(user=alice)
    reads = _log_reads(queries.captured_queries)
    assert reads and all("LIMIT 512" in sql for sql in reads)
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(ValidationError, match="already"),
    ):
        parameters.fit_start(user=alice)
    assert not _log_reads(queries.captured_queries)  # refused before the log is touched
    assert fit.reviews == 0  # counted by the worker


@pytest.mark.django_db
def test_a_fit_killed_mid_way_is_failed_and_a_new_press_starts_one(
    alice, alice_client, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(
        "quiz.tasks.fit_parameters_task.apply_async", lambda args: sent.append(args)
    )
    _store(alice, review_log("forgetful", 600, 8))
    now = dt.datetime.now(dt.UTC)
    limit = dt.timedelta(seconds=settings.QUIZ_FIT_TIME_LIMIT_S)
    # A worker OOM-killed or restarted mid-fit leaves its row running at 5%.
    dead = ParameterFit.objects.create(
        user=alice,
        status="running",
        progress=5,
        created_at=now - limit - dt.timedelta(minutes=5),
        started_at=now - limit - dt.timedelta(minutes=3),
    )
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    assert "worker stopped before the fit finished" in page and "Optimize my parameters" in page
    dead.refresh_from_db()
    assert dead.status == "failed"
    with django_capture_on_commit_callbacks(execute=True):
        fit = parameters.fit_start(user=alice)
    assert fit.pk != dead.pk and fit.status == "queued" and sent == [[fit.pk]]
    parameters.fit_run(fit_id=dead.pk)  # its message, redelivered, does not revive it
    dead.refresh_from_db()
    assert dead.status == "failed"


@pytest.mark.django_db
def test_a_fit_with_a_live_worker_or_lost_in_the_queue(alice, monkeypatch, settings):
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    # The web's own time limit says nothing of the fit worker's (which may allow hours).
    settings.QUIZ_FIT_TIME_LIMIT_S = 1
    _store(alice, review_log("forgetful", 600, 8))
    now = dt.datetime.now(dt.UTC)
    running = ParameterFit.objects.create(
        user=alice,
        status="running",
        created_at=now - dt.timedelta(hours=2),
        started_at=now - dt.timedelta(hours=2),
        heartbeat_at=now - dt.timedelta(seconds=settings.QUIZ_FIT_HEARTBEAT_S),
    )
    with pytest.raises(ValidationError, match="already"):
        parameters.fit_start(user=alice)  # a live fit is left alone
    running.status = "done"
    running.save()
    lost = ParameterFit.objects.create(
        user=alice,
        created_at=now - dt.timedelta(seconds=settings.QUIZ_FIT_QUEUED_STALE_S + 60),
    )
    assert parameters.fit_start(user=alice).pk != lost.pk
    lost.refresh_from_db()
    assert lost.status == "failed" and "No worker took" in lost.error


@pytest.mark.django_db
def test_a_killed_fit_workers_fit_is_released_within_a_minute(alice, alice_client, settings):
    assert settings.QUIZ_FIT_HEARTBEAT_S * 3 < settings.QUIZ_FIT_STALE_S < 60
    now = dt.datetime.now(dt.UTC)
    silent = dt.timedelta(seconds=settings.QUIZ_FIT_STALE_S + 1)
    fit = ParameterFit.objects.create(
        user=alice,
        status="running",
        progress=20,
        created_at=now - silent,
        started_at=now - silent,
        heartbeat_at=now - silent,
    )
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    fit.refresh_from_db()
    assert fit.status == "failed" and "worker stopped before the fit finished" in page


@pytest.mark.django_db(transaction=True)
def test_a_running_fit_beats_while_it_fits(alice, monkeypatch, settings):
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    settings.QUIZ_FIT_HEARTBEAT_S = 0.05
    _store(alice, review_log("forgetful", 600, 8))
    fit = parameters.fit_start(user=alice)
    beats = []

    def fitting_slowly(*args, **kwargs):
        deadline = time.monotonic() + 10
        while len(set(beats)) < 3 and time.monotonic() < deadline:
            beats.append(ParameterFit.objects.get(pk=fit.pk).heartbeat_at)
            time.sleep(0.02)
        raise ValueError("stopped by the test")

    monkeypatch.setattr(parameters.fitting, "run", fitting_slowly)
    parameters.fit_run(fit_id=fit.pk)
    assert len(set(beats)) >= 3  # the first beat at the start, then the side thread's


@pytest.mark.django_db
def test_a_fit_past_its_soft_time_limit_fails_and_says_so(alice, monkeypatch):
    from celery.exceptions import SoftTimeLimitExceeded

    def slow(*args, **kwargs):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    monkeypatch.setattr(parameters.fitting, "run", slow)
    _store(alice, review_log("forgetful", 600, 8))
    fit = parameters.fit_start(user=alice)
    parameters.fit_run(fit_id=fit.pk)
    fit.refresh_from_db()
    assert fit.status == "failed" and "took longer than" in fit.error


def test_the_fit_runs_on_its_own_queue_with_time_limits():
    from config import devrun
    from config.celery import app

    route = app.amqp.router.route({}, "quiz.fit_parameters", args=[1])
    assert route["queue"].name == "quiz.fit"
    task = parameters.fit_parameters_task
    assert task.soft_time_limit == settings.QUIZ_FIT_TIME_LIMIT_S < task.time_limit
    # `make run` starts a worker of its own for it, one fit at a time, so a fit started there
    # runs and never holds one of the lab worker's slots.
    workers = devrun.commands("127.0.0.1", 8000, Path(".venv"))
    queues = {
        name: argv[argv.index("-Q") + 1].split(",")
        for name, argv in workers.items()
        if "-Q" in argv
    }
    assert queues == {"lab worker": ["labs.sim", "default"], "fit worker": ["quiz.fit"]}
    assert "--concurrency=1" in workers["fit worker"]


@pytest.mark.django_db
def test_a_fit_past_its_memory_limit_fails_keeps_the_parameters_and_can_start_again(
    alice, alice_client, monkeypatch, settings
):
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    in_force = true_parameters("forgetful")
    LearnerSettings.objects.create(user=alice, fsrs_parameters=in_force)
    _store(alice, long_cards_log(10_000))
    settings.QUIZ_FIT_MEMORY_LIMIT_MB = 16  # the fit of this log needs more
    fit = parameters.fit_start(user=alice)
    parameters.fit_run(fit_id=fit.pk)  # what the worker does; it survives
    fit.refresh_from_db()
    assert fit.status == "failed" and not fit.parameters
    assert fit.error.startswith(
        "Fitting your reviews needed more memory than one fit may use (16 MB)"
    )
    assert selectors.learner_settings_get(user=alice).fsrs_parameters == in_force
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    assert "The last fit failed: Fitting your reviews needed more memory" in page
    assert "Optimize my parameters</button>" in page

    settings.QUIZ_FIT_MEMORY_LIMIT_MB = 2048
    again = parameters.fit_start(user=alice)
    parameters.fit_run(fit_id=again.pk)
    again.refresh_from_db()
    assert again.pk != fit.pk and again.status == "done", again.error


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
    assert fit.evaluation["wins"] and fit.reviews > 0
    held = fit.evaluation["held_out"]
    assert held["fitted"]["log_loss"] < held["current"]["log_loss"]
    workload = fit.evaluation["workload"]
    assert [row["retention"] for row in workload] == [0.80, 0.85, 0.90, 0.95]
    # A forgetful learner needs more reviews than the defaults assume, at every retention.
    assert all(
        row["fitted"]["reviews_per_day"] > row["current"]["reviews_per_day"] for row in workload
    )
    page = client.get(reverse("quiz:parameters")).content.decode()
    assert "Use these parameters" in page and "Reviews a day now" in page
    assert "latest reviews (held out)" in page and "same reviews" not in page

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
def test_a_fit_that_loses_on_the_latest_reviews_keeps_the_parameters_in_force(
    alice, alice_client, monkeypatch
):
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    _store(alice, review_log("retentive", 1500, 2))
    fit = parameters.fit_start(user=alice)
    parameters.fit_run(fit_id=fit.pk)
    fit.refresh_from_db()
    ev = fit.evaluation
    assert fit.status == "done" and not ev["wins"]
    assert ev["training"]["fitted"]["log_loss"] < ev["training"]["current"]["log_loss"]
    assert ev["held_out"]["fitted"]["log_loss"] > ev["held_out"]["current"]["log_loss"]
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    assert "Your parameters are kept" in page and "Use these parameters" not in page
    with pytest.raises(ValidationError, match="kept"):
        parameters.parameters_use(user=alice, fit_id=fit.pk)
    assert selectors.learner_settings_get(user=alice).fsrs_parameters is None


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
        user=alice,
        status="done",
        created_at=at(2026, 6, 1, 9),
        parameters=fitted,
        evaluation={"wins": True},
    )
    parameters.parameters_use(user=alice, fit_id=fit.pk)
    assert selectors.learner_settings_get(user=alice).fsrs_parameters == fitted
    parameters.parameters_revert(user=alice)
    assert selectors.learner_settings_get(user=alice).fsrs_parameters is None


@pytest.mark.django_db(transaction=True)
def test_optimize_from_the_page_runs_on_a_real_fit_worker(alice, alice_client):
    _store(alice, review_log("steep", 900, 7))
    worker = start_worker(["quiz.fit"])  # the fit's own queue, no lab queue
    try:
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
    finally:
        worker.stop()
    assert fit.status == ParameterFit.Status.DONE, f"{fit.error}\n{worker.log()}"
    page = alice_client.get(reverse("quiz:parameters")).content.decode()
    assert "Use these parameters" in page and f"on {fit.reviews} reviews" in page


@pytest.mark.django_db
def test_the_page_says_optimizing_only_while_the_fit_runs(alice, alice_client, monkeypatch):
    # "Optimizing on the worker" was a message above the fit's section, which the poll swaps
    # alone: it stayed above the finished result.
    monkeypatch.setattr("quiz.tasks.fit_parameters_task.apply_async", lambda args: None)
    _store(alice, review_log("forgetful", 600, 5))
    response = alice_client.post(reverse("quiz:parameters-optimize"), follow=True)
    page = response.content.decode()
    fit_section = page[page.index('id="fit"') : page.index("</section>", page.index('id="fit"'))]
    assert page.count("Optimizing on the worker") == 1 and "Optimizing on the worker" in fit_section
    parameters.fit_run(fit_id=ParameterFit.objects.get(user=alice).pk)
    polled = alice_client.get(reverse("quiz:parameters"), HTTP_HX_REQUEST="true").content.decode()
    assert "Optimizing on the worker" not in polled and "How your intervals change" in polled
