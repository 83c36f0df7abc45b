"""Grading, undo and leeches against the real database, with explicit (frozen) clocks."""

from __future__ import annotations

import datetime as dt

import pytest
from django.forms.models import model_to_dict
from django.urls import reverse

from quiz import services
from quiz.models import FsrsState, ReviewLog, ReviewState, Showing
from tests.conftest import make_user
from tests.quiz.factories import at, make_card, make_review_state, review, show

pytestmark = pytest.mark.django_db
NOW = at(2026, 6, 1, 9)


def _row(user, card) -> dict:
    return model_to_dict(ReviewState.objects.get(user=user, card=card))


def test_it_grades_once_when_the_same_token_is_posted_twice(alice):
    card = make_card()
    showing = show(alice, card, NOW)
    first = services.review_grade(user=alice, token=showing.token, rating=3, now=NOW)
    state_after_first = _row(alice, card)
    second = services.review_grade(
        user=alice, token=showing.token, rating=1, now=NOW + dt.timedelta(seconds=1)
    )
    assert second.replayed and second.log.pk == first.log.pk and second.log.rating == 3
    assert ReviewLog.objects.count() == 1
    assert _row(alice, card) == state_after_first


def test_it_refuses_a_grade_from_a_second_tab_after_the_first_graded(alice):
    card = make_card()
    tab_one = show(alice, card, NOW)
    # A reload reuses the open showing; a second tab opened the same way holds another token
    # for the same state version.
    Showing.objects.create(user=alice, card=card, token="tab-two", created_at=NOW, state_version=0)
    services.showing_reveal(user=alice, token="tab-two", answer=services.Answer(), now=NOW)
    services.review_grade(user=alice, token=tab_one.token, rating=3, now=NOW)
    with pytest.raises(services.QuizConflict):
        services.review_grade(user=alice, token="tab-two", rating=4, now=NOW)
    assert ReviewLog.objects.count() == 1


def test_it_refuses_to_grade_before_the_answer_is_shown(alice):
    showing = services.showing_open(user=alice, card=make_card(), now=NOW)
    with pytest.raises(services.QuizConflict):
        services.review_grade(user=alice, token=showing.token, rating=3, now=NOW)


def test_it_refuses_ratings_outside_one_to_four(alice):
    showing = show(alice, make_card(), NOW)
    for rating in (0, 5, -1):
        with pytest.raises(ValueError):
            services.review_grade(user=alice, token=showing.token, rating=rating, now=NOW)
    assert not ReviewLog.objects.exists()


def test_it_never_finds_another_learners_showing(alice, bob):
    showing = show(alice, make_card(), NOW)
    with pytest.raises(Showing.DoesNotExist):
        services.review_grade(user=bob, token=showing.token, rating=3, now=NOW)
    with pytest.raises(Showing.DoesNotExist):
        services.showing_reveal(user=bob, token=showing.token, answer=services.Answer(), now=NOW)
    assert not ReviewLog.objects.exists()


def test_it_recomputes_stale_outcomes_instead_of_applying_them(alice):
    showing = show(alice, make_card(), NOW)
    later = NOW + services.REVEAL_TTL + dt.timedelta(seconds=1)
    with pytest.raises(services.ShowingExpired):
        services.review_grade(user=alice, token=showing.token, rating=3, now=later)
    fresh = services.showing_reveal(
        user=alice, token=showing.token, answer=services.Answer(), now=later, refresh=True
    )
    assert fresh.revealed_at == later
    log = services.review_grade(user=alice, token=showing.token, rating=3, now=later).log
    assert log.reviewed_at == later


@pytest.mark.parametrize("rating", [2, 3, 4])
def test_a_press_after_the_rollover_applies_the_interval_the_button_showed(alice, rating):
    # 34 of 66 presses past the rollover applied another interval than the button's (Easy
    # labelled 16d gave 27d): the outcomes were silently recomputed at the press.
    from quiz import scheduling
    from quiz.selectors import learner_settings_get

    card = make_card()
    make_review_state(alice, card, due=at(2026, 6, 1, 2), last_review=at(2026, 5, 20, 9))
    before = _row(alice, card)
    revealed, pressed = at(2026, 6, 1, 3, 59), at(2026, 6, 1, 4, 1)  # the rollover is 04:00
    showing = show(alice, card, revealed)
    with pytest.raises(services.ShowingExpired, match="study day changed"):
        services.review_grade(user=alice, token=showing.token, rating=rating, now=pressed)
    assert _row(alice, card) == before and not ReviewLog.objects.exists()

    shown = services.showing_reveal(
        user=alice, token=showing.token, answer=services.Answer(), now=pressed, refresh=True
    )
    context = services.learner_context(learner_settings_get(user=alice))
    hour, tz = context.rollover_hour, context.tz
    outcome = scheduling.CardState.from_json(shown.outcomes[str(rating)])
    label = scheduling.interval_label(outcome, shown.revealed_at, tz, hour)
    press = pressed + dt.timedelta(seconds=20)
    services.review_grade(user=alice, token=showing.token, rating=rating, now=press)
    applied = ReviewState.objects.get(user=alice, card=card)
    assert scheduling.interval_label(_state(applied), press, tz, hour) == label


def _state(state: ReviewState):
    return services._state_columns(state)


def test_it_undoes_a_review_restoring_every_column_exactly(alice):
    card = make_card()
    make_review_state(
        alice, card, due=NOW, stability=12.345678, difficulty=6.54321, lapses=3, reps=9
    )
    before = _row(alice, card)
    review(alice, card, 1, NOW + dt.timedelta(minutes=3))  # a lapse changes everything
    assert _row(alice, card)["state"] == FsrsState.RELEARNING

    card_id = services.review_undo(user=alice, now=NOW + dt.timedelta(minutes=4))
    assert card_id == card.pk
    after = _row(alice, card)
    assert after.pop("version") == before.pop("version") + 2  # bumped, so old showings are stale
    assert after == before
    assert not ReviewLog.objects.exists()


def test_it_undoes_a_new_cards_first_review_back_to_new(alice):
    card = make_card()
    services.showing_open(user=alice, card=card, now=NOW)
    before = _row(alice, card)
    review(alice, card, 3, NOW)
    services.review_undo(user=alice, now=NOW)
    after = _row(alice, card)
    after.pop("version"), before.pop("version")
    assert after == before and after["last_review"] is None


def test_it_undoes_the_latest_review_only_and_then_says_nothing_is_left(alice):
    first, second = make_card(), make_card()
    review(alice, first, 3, NOW)
    review(alice, second, 3, NOW + dt.timedelta(seconds=5))
    assert services.review_undo(user=alice, now=NOW) == second.pk
    assert services.review_undo(user=alice, now=NOW) == first.pk
    with pytest.raises(services.NothingToUndo):
        services.review_undo(user=alice, now=NOW)


def test_undo_refuses_to_drop_a_staff_edit_made_after_the_answer_and_says_so(alice):
    # Undoing an answer made before a staff edit silently wiped the edit.
    card = make_card()
    review(alice, card, 3, NOW)
    edited = ReviewState.objects.get(user=alice, card=card)
    edited.due, edited.stability = NOW + dt.timedelta(days=40), 33.0
    edited.save()  # as the admin saves it (the version moves on)
    staff_state = _row(alice, card)
    with pytest.raises(services.UndoRefused, match="changed after it \\(by staff"):
        services.review_undo(user=alice, now=NOW + dt.timedelta(minutes=1))
    assert _row(alice, card) == staff_state and ReviewLog.objects.count() == 1


def test_undo_chain_takes_back_a_new_cards_two_answers_one_after_the_other(alice):
    # The undo chain: New -> Good -> Good -> undo -> undo was 302 then 409 ("changed after it by
    # staff"), since undo bumped the version and the earlier answer wanted the one it left.
    card = make_card()
    services.showing_open(user=alice, card=card, now=NOW)
    new = _row(alice, card)
    review(alice, card, 3, NOW)
    after_first = _row(alice, card)
    review(alice, card, 3, NOW + dt.timedelta(minutes=10))
    assert services.review_undo(user=alice, now=NOW + dt.timedelta(minutes=11)) == card.pk
    assert _without_version(_row(alice, card)) == _without_version(after_first)
    assert services.review_undo(user=alice, now=NOW + dt.timedelta(minutes=12)) == card.pk
    assert _without_version(_row(alice, card)) == _without_version(new)
    assert not ReviewLog.objects.exists()


def test_undo_chain_walks_back_through_cards_a_b_a_in_order(alice):
    a, b = make_card(), make_card()
    review(alice, a, 3, NOW)
    review(alice, b, 1, NOW + dt.timedelta(minutes=1))
    review(alice, a, 3, NOW + dt.timedelta(minutes=11))
    undone = [services.review_undo(user=alice, now=NOW + dt.timedelta(minutes=12)) for _ in "aba"]
    assert undone == [a.pk, b.pk, a.pk]
    # Back to new: last_review empty, no reps, no log.
    for card in (a, b):
        state = ReviewState.objects.get(user=alice, card=card)
        assert (state.last_review, state.reps) == (None, 0)
    assert not ReviewLog.objects.exists()


def test_undo_refuses_after_the_learner_unsuspends_a_card_the_answer_made_a_leech(alice):
    card = make_card()
    make_review_state(alice, card, due=NOW, lapses=7)
    review(alice, card, 1, NOW)  # the eighth lapse: suspended as a leech
    services.card_unsuspend(user=alice, card=card)
    with pytest.raises(services.UndoRefused, match="suspending or unsuspending"):
        services.review_undo(user=alice, now=NOW)
    assert ReviewState.objects.get(user=alice, card=card).suspended is False


def test_undo_after_staff_deleted_the_learners_state_is_refused_with_a_message(alice):
    # Was a 500 (ReviewState.DoesNotExist).
    card = make_card()
    review(alice, card, 3, NOW)
    ReviewState.objects.filter(user=alice, card=card).delete()
    with pytest.raises(services.UndoRefused, match="progress on this card was reset by staff"):
        services.review_undo(user=alice, now=NOW)
    assert ReviewLog.objects.count() == 1


def _without_version(row: dict) -> dict:
    return {name: value for name, value in row.items() if name != "version"}


def test_it_does_not_undo_someone_elses_review(alice, bob):
    review(alice, make_card(), 3, NOW)
    with pytest.raises(services.NothingToUndo):
        services.review_undo(user=bob, now=NOW)
    assert ReviewLog.objects.filter(user=alice).count() == 1


def test_it_tags_and_suspends_a_leech_at_the_eighth_lapse(alice):
    card = make_card()
    make_review_state(alice, card, due=NOW, lapses=7)
    showing = show(alice, card, NOW)
    result = services.review_grade(user=alice, token=showing.token, rating=1, now=NOW)
    assert result.became_leech
    state = ReviewState.objects.get(user=alice, card=card)
    assert (state.lapses, state.leech, state.suspended) == (8, True, True)
    # Undo takes the leech back too.
    services.review_undo(user=alice, now=NOW)
    state.refresh_from_db()
    assert (state.lapses, state.leech, state.suspended) == (7, False, False)


def test_it_does_not_count_again_on_a_learning_card_as_a_lapse(alice):
    card = make_card()
    review(alice, card, 1, NOW)
    assert ReviewState.objects.get(user=alice, card=card).lapses == 0


def test_it_records_the_answer_correctness_and_a_clamped_duration(alice):
    card = make_card("numeric")
    showing = services.showing_open(user=alice, card=card, now=NOW)
    later = NOW + dt.timedelta(minutes=5)
    services.showing_reveal(
        user=alice,
        token=showing.token,
        answer=services.Answer(number=128.4, raw="128.4"),
        now=later,
    )
    log = services.review_grade(user=alice, token=showing.token, rating=3, now=later).log
    assert (log.answer, log.correct, log.duration_ms) == ("128.4", True, 60_000)
    assert log.state_before["last_review"] is None and log.state_before["lapses"] == 0


def test_it_judges_choices_and_numbers(alice):
    choice = make_card("choice")
    wrong = choice.options.get(text="Wrong one")
    showing = show(alice, choice, NOW, option_id=wrong.pk)
    assert showing.correct is False and showing.answer.endswith("Wrong one")
    assert services.suggested_rating(showing) == 1
    numeric = make_card("numeric")
    assert show(alice, numeric, NOW, number=129.0, raw="129").correct is False
    assert services.suggested_rating(show(alice, make_card(), NOW)) == 3


def test_it_rejects_an_option_from_another_card(alice):
    from django.core.exceptions import ValidationError

    card, other = make_card("choice"), make_card("choice")
    showing = services.showing_open(user=alice, card=card, now=NOW)
    with pytest.raises(ValidationError):
        services.showing_reveal(
            user=alice,
            token=showing.token,
            answer=services.Answer(option_id=other.options.first().pk),
            now=NOW,
        )


def test_it_keeps_the_first_answer_when_revealed_twice(alice):
    card = make_card("numeric")
    first = show(alice, card, NOW, number=128.0, raw="128")
    again = services.showing_reveal(
        user=alice, token=first.token, answer=services.Answer(number=1.0, raw="1"), now=NOW
    )
    assert (again.answer, again.correct, again.outcomes) == ("128", True, first.outcomes)


def test_it_shuffles_options_per_showing_and_keeps_the_order_on_reload(alice):
    card = make_card("choice")
    orders = set()
    for minute in range(12):
        showing = services.showing_open(
            user=alice, card=card, now=NOW + dt.timedelta(minutes=minute)
        )
        assert services.showing_open(user=alice, card=card, now=NOW).token == showing.token
        orders.add(tuple(showing.option_order))
        Showing.objects.filter(pk=showing.pk).update(used_at=NOW)  # next one is a new showing
    assert sorted(orders.pop()) == sorted(card.options.values_list("pk", flat=True))
    assert len(orders) >= 1  # 12 shuffles of 3 options: a second order is all but certain


def test_a_card_taken_for_new_still_reuses_its_open_showing(alice):
    """`new` (the queue's guess that the card has no state) makes the state first; when one was
    there already (shown before, never answered), the open showing is reused as without it."""
    card = make_card("choice")
    first = services.showing_open(user=alice, card=card, now=NOW, new=True)
    assert ReviewState.objects.filter(user=alice, card=card).count() == 1
    again = services.showing_open(user=alice, card=card, now=NOW, new=True)
    assert again.token == first.token and again.option_order == first.option_order
    assert Showing.objects.filter(user=alice, card=card).count() == 1
    assert again.card is card  # the page renders the card it was given, not a second read


def test_a_showing_opens_when_the_state_another_request_made_is_deleted_meanwhile(
    alice, monkeypatch
):
    card = make_card()
    real = services._open_showing
    calls = []

    def racing(**kwargs):
        found = real(**kwargs)
        calls.append(found)
        if len(calls) == 1:  # another request makes the state: this one's insert conflicts
            make_review_state(alice, card, due=NOW)
        elif len(calls) == 2:  # ... and it is deleted before this one reads it back
            assert found is not None
            ReviewState.objects.filter(user=alice, card=card).delete()
            return None
        return found

    monkeypatch.setattr(services, "_open_showing", racing)
    showing = services.showing_open(user=alice, card=card, now=NOW)
    state = ReviewState.objects.get(user=alice, card=card)
    assert len(calls) == 2 and showing.card_id == card.pk
    assert showing.state_version == state.version and state.state == FsrsState.LEARNING


def test_a_reveal_judges_an_option_added_since_this_process_read_the_card(alice, settings):
    from quiz import selectors
    from quiz.models import Card, ChoiceOption

    settings.QUIZ_CARD_CACHE_S = 60
    selectors.card_cache_clear()
    card = make_card("choice")
    selectors.card_for_quiz(card_id=card.pk)  # this process's copy, before the edit
    # Staff add an option through another process: no signal clears this one's copy.
    (added,) = ChoiceOption.objects.bulk_create(
        [ChoiceOption(card=card, text="Added later", is_correct=True, position=9)]
    )
    fresh = Card.objects.prefetch_related("options").get(pk=card.pk)
    showing = services.showing_open(user=alice, card=fresh, now=NOW)  # shown with the new option
    revealed = services.showing_reveal(
        user=alice, token=showing.token, answer=services.Answer(option_id=added.pk), now=NOW
    )
    assert revealed.correct is True and revealed.answer.endswith("Added later")
    selectors.card_cache_clear()


def test_a_pick_of_an_option_removed_since_the_showing_is_a_clear_refusal(alice):
    from django.core.exceptions import ValidationError

    from quiz.models import ChoiceOption

    card = make_card("choice")
    showing = services.showing_open(user=alice, card=card, now=NOW)
    gone = card.options.order_by("id").first().pk
    ChoiceOption.objects.filter(pk=gone).delete()
    with pytest.raises(ValidationError) as info:
        services.showing_reveal(
            user=alice, token=showing.token, answer=services.Answer(option_id=gone), now=NOW
        )
    assert "removed from this card" in str(info.value)


# --- Staff edits of a review state (issue 28) -------------------------------------------------


def _admin_post(client, state, **changes):
    """The ReviewState change form as the admin page posts it, with the version it was opened at."""
    values = {
        "user": state.user_id,
        "card": state.card_id,
        "state": state.state,
        "step": "" if state.step is None else state.step,
        "stability": state.stability or "",
        "difficulty": state.difficulty or "",
        "due_0": state.due.strftime("%Y-%m-%d"),
        "due_1": state.due.strftime("%H:%M:%S"),
        "last_review_0": state.last_review.strftime("%Y-%m-%d") if state.last_review else "",
        "last_review_1": state.last_review.strftime("%H:%M:%S") if state.last_review else "",
        "lapses": state.lapses,
        "reps": state.reps,
        "version": state.version,
        **changes,
    }
    for flag in ("suspended", "leech"):
        if values.pop(flag, getattr(state, flag)):
            values[flag] = "on"
    url = reverse("admin:quiz_reviewstate_change", args=[state.pk])
    return client.post(url, values)


@pytest.fixture
def staff_client(client):
    client.force_login(make_user("staff", is_staff=True, is_superuser=True))
    return client


def test_a_staff_edit_after_the_showing_wins_over_its_grade(alice, staff_client):
    card = make_card()
    make_review_state(alice, card, due=NOW, stability=10.0)
    showing = show(alice, card, NOW)
    state = ReviewState.objects.get(user=alice, card=card)
    response = _admin_post(staff_client, state, stability="42.5")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ReviewState.objects.get(pk=state.pk).version == state.version + 1
    with pytest.raises(services.QuizConflict):
        services.review_grade(user=alice, token=showing.token, rating=3, now=NOW)
    assert ReviewState.objects.get(pk=state.pk).stability == 42.5
    assert not ReviewLog.objects.exists()


def test_a_card_suspended_in_the_admin_after_it_was_shown_cannot_be_graded(alice, staff_client):
    card = make_card()
    make_review_state(alice, card, due=NOW)
    showing = show(alice, card, NOW)
    state = ReviewState.objects.get(user=alice, card=card)
    assert _admin_post(staff_client, state, suspended=True).status_code == 302
    with pytest.raises(services.QuizConflict, match="suspended"):
        services.review_grade(user=alice, token=showing.token, rating=3, now=NOW)
    assert not ReviewLog.objects.exists()


def test_a_staff_edit_opened_before_a_grade_is_refused_not_saved_over_it(alice, staff_client):
    card = make_card()
    make_review_state(alice, card, due=NOW, stability=10.0)
    opened = ReviewState.objects.get(user=alice, card=card)  # the page the staff member has open
    review(alice, card, 3, NOW)
    graded = ReviewState.objects.get(pk=opened.pk)
    response = _admin_post(staff_client, opened, stability="1.0")
    assert response.status_code == 200 and "since you opened it" in response.content.decode()
    assert ReviewState.objects.get(pk=opened.pk).stability == graded.stability
    with pytest.raises(ReviewState.Changed):
        opened.save()  # the model refuses too, whoever calls it
