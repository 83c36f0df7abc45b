"""The quiz pages over HTTP: owner, other learner, anonymous, htmx, forged input, query counts."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from quiz import scheduling, selectors
from quiz.models import Card, ReviewLog, ReviewState, Showing
from tests.quiz.factories import make_card, make_settings

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


def token_in(response) -> str:
    match = re.search(r"/quiz/answer/([\w-]+)/", response.content.decode())
    assert match, "no card on the page"
    return match.group(1)


def open_card(client) -> str:
    return token_in(client.get(reverse("quiz:today")))


def reveal(client, token: str, **data) -> object:
    return client.post(reverse("quiz:answer-submit", args=[token]), data, **HX)


def grade(client, token: str, rating: object, **extra) -> object:
    return client.post(reverse("quiz:review-grade", args=[token]), {"rating": rating}, **extra)


def test_it_shows_the_first_card_with_counts(alice_client):
    make_card(prompt="What is **paged** attention?")
    response = alice_client.get(reverse("quiz:today"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<strong>paged</strong>" in html and 'data-side="question"' in html
    assert "<html" in html  # the full page for a normal request


def test_it_answers_htmx_with_the_panel_only(alice_client):
    make_card()
    response = alice_client.get(reverse("quiz:today"), **HX)
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="quiz-panel"') and "<html" not in html


def test_it_runs_a_card_from_question_to_grade_with_the_labels_it_applies(alice_client, alice):
    card = make_card("numeric")
    token = open_card(alice_client)
    response = reveal(alice_client, token, value="1,28")  # 128 with a thousands separator
    html = response.content.decode()
    assert response.status_code == 200 and 'data-side="answer"' in html
    showing = Showing.objects.get(token=token)
    good = scheduling.CardState.from_json(showing.outcomes["3"])
    label = scheduling.format_interval(good.due - showing.revealed_at)
    assert re.search(
        rf'grade-interval">{re.escape(label)}</span>\s*<span class="grade-name">Good', html
    )

    response = grade(alice_client, token, 3, **HX)
    assert response.status_code == 200
    state = ReviewState.objects.get(user=alice, card=card)
    assert state.due == good.due and ReviewLog.objects.get().correct is True


def test_it_redirects_after_a_plain_form_grade_so_a_refresh_cannot_regrade(alice_client):
    make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    response = grade(alice_client, token, 3)
    assert response.status_code == 302 and response["Location"] == reverse("quiz:today")
    assert grade(alice_client, token, 3).status_code == 302  # a replay: same result, no new log
    assert ReviewLog.objects.count() == 1


def test_it_works_as_plain_forms_without_javascript(alice_client):
    make_card("numeric")
    token = open_card(alice_client)
    url = reverse("quiz:answer-submit", args=[token])
    response = alice_client.post(url, {"value": "128"})
    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html and 'data-side="answer"' in html
    assert f'action="{reverse("quiz:review-grade", args=[token])}"' in html
    response = alice_client.post(reverse("quiz:review-undo"))
    assert response.status_code == 409  # nothing graded yet: a clear refusal, not an error page


def test_it_undoes_and_shows_that_card_again(alice_client, alice):
    card = make_card()
    make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    grade(alice_client, token, 4, **HX)
    response = alice_client.post(reverse("quiz:review-undo"), **HX)
    assert response.status_code == 200 and "Undone" in response.content.decode()
    assert Showing.objects.get(token=token_in(response)).card == card
    assert not ReviewLog.objects.exists()
    assert alice_client.post(reverse("quiz:review-undo"), **HX).status_code == 409


def test_a_card_retired_between_reveal_and_press_is_not_graded(alice_client, alice):
    # It was graded: a log and a schedule for a card no longer in the deck.
    card = make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    before = ReviewState.objects.get(user=alice, card=card)
    Card.objects.filter(pk=card.pk).update(is_active=False)  # as load_content retires it
    response = grade(alice_client, token, 3, **HX)
    assert response.status_code == 409
    assert "retired from the deck after it was shown, so it was not graded" in (
        response.content.decode()
    )
    assert not ReviewLog.objects.exists()
    assert ReviewState.objects.get(pk=before.pk).version == before.version


def test_undo_after_a_staff_edit_says_why_it_is_refused(alice_client, alice):
    card = make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    grade(alice_client, token, 3, **HX)
    state = ReviewState.objects.get(user=alice, card=card)
    state.stability = 50.0
    state.save()  # a staff edit
    response = alice_client.post(reverse("quiz:review-undo"), **HX)
    assert response.status_code == 409
    assert "cannot be undone: the card&#x27;s schedule was changed after it" in (
        response.content.decode()
    )
    assert ReviewState.objects.get(user=alice, card=card).stability == 50.0


# --- Another learner, anonymous, forged input ----------------------------------------------------


def test_another_learner_cannot_reveal_or_grade_alices_card(alice_client, bob):
    make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    bob_client = Client()
    bob_client.force_login(bob)
    assert reveal(bob_client, token).status_code == 404
    assert grade(bob_client, token, 3).status_code == 404
    assert bob_client.post(reverse("quiz:review-undo")).status_code == 409  # bob has none
    assert not ReviewLog.objects.exists()
    assert Showing.objects.get(token=token).used_at is None


def test_another_learner_sees_only_their_own_state_on_a_card_page(alice_client, bob):
    card = make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    grade(alice_client, token, 3)
    bob_client = Client()
    bob_client.force_login(bob)
    html = bob_client.get(reverse("quiz:card-detail", args=[card.slug])).content.decode()
    assert "You have not reviewed this card yet" in html
    html = alice_client.get(reverse("quiz:card-detail", args=[card.slug])).content.decode()
    assert "Next due" in html


@pytest.mark.parametrize(
    ("method", "name", "args"),
    [
        ("get", "quiz:today", []),
        ("post", "quiz:answer-submit", ["x" * 22]),
        ("post", "quiz:review-grade", ["x" * 22]),
        ("post", "quiz:review-undo", []),
        ("get", "quiz:stats", []),
        ("get", "quiz:settings-edit", []),
        ("get", "quiz:card-detail", ["any-card"]),
    ],
)
def test_anonymous_visitors_are_sent_to_log_in(client, method, name, args):
    response = getattr(client, method)(reverse(name, args=args))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("rating", ["0", "5", "-1", "good", "", "3.5"])
def test_it_answers_a_rating_outside_one_to_four_with_400(alice_client, rating):
    make_card()
    token = open_card(alice_client)
    reveal(alice_client, token)
    response = grade(alice_client, token, rating, **HX)
    assert response.status_code == 400
    assert "Rating must be 1 (Again)" in response.content.decode()
    assert not ReviewLog.objects.exists()


def test_it_answers_an_unknown_token_with_404(alice_client):
    make_card()
    assert reveal(alice_client, "no-such-token").status_code == 404
    assert grade(alice_client, "no-such-token", 3).status_code == 404


def test_it_answers_an_unknown_or_retired_card_page_with_404(alice_client):
    retired = make_card(is_active=False)
    assert alice_client.get(reverse("quiz:card-detail", args=["nope"])).status_code == 404
    assert alice_client.get(reverse("quiz:card-detail", args=[retired.slug])).status_code == 404
    response = alice_client.post(reverse("quiz:card-unsuspend", args=["nope"]))
    assert response.status_code == 404


def test_it_answers_a_forged_option_and_a_non_number_with_400(alice_client):
    make_card("choice")
    other = make_card("choice")
    token = open_card(alice_client)
    response = reveal(alice_client, token, option=other.options.first().pk)
    assert response.status_code == 400 and "not one of this card" in response.content.decode()
    assert reveal(alice_client, token, option="abc").status_code == 400
    assert Showing.objects.get(token=token).revealed_at is None


def test_it_answers_a_number_that_is_not_a_number_with_400(alice_client):
    make_card("numeric")
    token = open_card(alice_client)
    response = reveal(alice_client, token, value="about twelve")
    assert response.status_code == 400 and "Type a number" in response.content.decode()


def test_it_answers_grading_before_the_answer_with_409(alice_client):
    make_card()
    token = open_card(alice_client)
    response = grade(alice_client, token, 3, **HX)
    assert response.status_code == 409 and "Show the answer" in response.content.decode()


def test_it_refuses_posts_without_a_csrf_token(alice):
    make_card()
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    token = token_in(client.get(reverse("quiz:today")))
    assert client.post(reverse("quiz:answer-submit", args=[token])).status_code == 403
    assert grade(client, token, 3).status_code == 403
    assert client.post(reverse("quiz:review-undo")).status_code == 403
    assert client.post(reverse("quiz:settings-edit"), {"time_zone": "UTC"}).status_code == 403


def test_it_refuses_get_on_post_only_endpoints(alice_client):
    assert alice_client.get(reverse("quiz:review-undo")).status_code == 405
    assert alice_client.post(reverse("quiz:stats")).status_code == 405


# --- Settings ------------------------------------------------------------------------------------


def test_it_saves_valid_settings(alice_client, alice):
    response = alice_client.post(
        reverse("quiz:settings-edit"),
        {
            "time_zone": "Europe/Berlin",
            "rollover_hour": 5,
            "new_per_day": 10,
            "reviews_per_day": 100,
            "desired_retention": 0.85,
        },
    )
    assert response.status_code == 302
    assert alice.quiz_settings.time_zone == "Europe/Berlin"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("desired_retention", 0.99),
        ("desired_retention", 0.5),
        ("rollover_hour", 24),
        ("time_zone", "Mars/Olympus"),
        ("new_per_day", -1),
    ],
)
def test_it_refuses_settings_out_of_range_with_400(alice_client, field, value):
    data = {
        "time_zone": "UTC",
        "rollover_hour": 4,
        "new_per_day": 20,
        "reviews_per_day": 200,
        "desired_retention": 0.9,
    }
    data[field] = value
    response = alice_client.post(reverse("quiz:settings-edit"), data)
    assert response.status_code == 400


# --- Card parts rendered once per cached card ------------------------------------------------


def test_a_cached_card_renders_its_own_parts_once_and_an_edit_renews_them(alice, bob, settings):
    settings.QUIZ_CARD_CACHE_S = 60
    selectors.card_cache_clear()
    card = make_card(prompt="Why **pages**?", answer="Because of *fragmentation*.")
    clients = []
    for learner in (alice, bob):
        client = Client()
        client.force_login(learner)
        clients.append(client)
    first = reveal(clients[0], open_card(clients[0])).content.decode()
    assert "<strong>pages</strong>" in first and "<em>fragmentation</em>" in first
    cached = selectors.card_for_quiz(card_id=card.pk)
    assert cached._rendered_parts, "the card's parts are kept on the cached card"

    # Another learner gets the parts as rendered, not rendered again: changed in memory only,
    # the cached card still shows what it first rendered...
    cached.answer = "Changed in memory only."
    token = open_card(clients[1])
    second = reveal(clients[1], token).content.decode()
    assert "<em>fragmentation</em>" in second and "Changed in memory" not in second
    # ...while everything of the learner's is their own: the grade form carries bob's token.
    assert f"/quiz/grade/{token}/" in second and f"/quiz/grade/{token}/" not in first

    # An edit drops the cached card, and its parts with it.
    fresh = Card.objects.get(pk=card.pk)
    fresh.answer = "Edited in the *admin*."
    fresh.save()
    page = clients[1].get(reverse("quiz:card-detail", args=[card.slug])).content.decode()
    assert "<em>admin</em>" in page and "fragmentation" not in page
    selectors.card_cache_clear()


# --- Query counts --------------------------------------------------------------------------------


def _count_queries(client, n_cards: int) -> tuple[int, int, int]:
    for _ in range(n_cards):
        make_card("choice", tags=("kv-memory", "batching"))
    # As in a running server: each process holds the cards every learner reads.
    for card in Card.objects.all():
        selectors.card_for_quiz(card_id=card.pk)
    with CaptureQueriesContext(connection) as show_ctx:
        token = open_card(client)
    option = Showing.objects.get(token=token).option_order[0]
    with CaptureQueriesContext(connection) as reveal_ctx:
        assert reveal(client, token, option=option).status_code == 200
    with CaptureQueriesContext(connection) as grade_ctx:
        assert grade(client, token, 3, **HX).status_code == 200
    return len(show_ctx), len(reveal_ctx), len(grade_ctx)


def test_it_uses_the_same_few_queries_for_10_or_200_cards(alice, bob, settings):
    settings.QUIZ_CARD_CACHE_S = 60
    selectors.card_cache_clear()
    small_client, large_client = Client(), Client()
    small_client.force_login(alice)
    large_client.force_login(bob)
    small = _count_queries(small_client, 10)
    large = _count_queries(large_client, 190)  # bob's deck: the same 10 plus 190 more
    selectors.card_cache_clear()
    assert small == large, (small, large)
    show_n, reveal_n, grade_n = large
    # 6 to show: session, user, queue, undo check (no review yet today), the new card's state
    # and showing (made first: the queue says the card has no state yet). 8 to reveal: session,
    # user, savepoint, showing with state, its update, release, queue, undo check. 11 to grade
    # and show the next card: session, user, savepoint, showing with state, state update, log,
    # showing update, release, queue, the next card's state and showing. The queue is one
    # query, computed once per request, the settings come with the user and the showing with
    # its state; no next card is picked while one is on screen.
    assert show_n <= 6 and reveal_n <= 8 and grade_n <= 11, large


def test_each_request_reads_its_card_once_without_the_card_cache(alice_client, settings):
    """With the per-process card cache off (as under DEBUG), the card and its parts are read
    once per request: revealing hands the card it judged to the page it renders."""
    settings.QUIZ_CARD_CACHE_S = 0
    for _ in range(2):
        make_card("choice", tags=("kv-memory",))

    def card_reads(request) -> int:
        with CaptureQueriesContext(connection) as queries:
            response = request()
        assert response.status_code == 200
        # Each read of a card runs its options' prefetch once (and its tags' and relations').
        return sum('FROM "quiz_choiceoption"' in q["sql"] for q in queries.captured_queries)

    token = None

    def show():
        nonlocal token
        response = alice_client.get(reverse("quiz:today"), **HX)
        token = token_in(response)
        return response

    assert card_reads(show) == 1
    option = Showing.objects.get(token=token).option_order[0]
    assert card_reads(lambda: reveal(alice_client, token, option=option)) == 1
    assert card_reads(lambda: grade(alice_client, token, 3, **HX)) == 1  # the next card's


def test_it_labels_the_counters_new_learning_and_review(alice_client):
    make_card()
    html = alice_client.get(reverse("quiz:today")).content.decode()
    counts = html[html.index('class="quiz-counts"') : html.index("</p>", html.index("quiz-counts"))]
    for label in ("new", "learning", "review"):
        # Visible, not only for screen readers: "20 0 0" alone meant nothing to a new learner.
        assert f'<span class="count-label">{label}</span>' in counts
    assert '<span class="count-n">1</span>' in counts


def test_it_writes_a_multiple_as_the_cards_do(alice_client):
    # The card's prose writes "21×"; the box, the verdict and the answer say it the same way.
    make_card("numeric", numeric_value=21.0, numeric_unit="x", numeric_tolerance=0.5)
    token = open_card(alice_client)
    question = alice_client.get(reverse("quiz:today")).content.decode()
    assert '<span class="numeric-unit">×</span>' in question
    assert "Your answer, as a multiple (×)" in question
    answer = reveal(alice_client, token, value="12").content.decode()
    assert "You said <strong>12×</strong>" in answer and "the answer is 21×" in answer
    assert "12 x" not in answer and "21 x" not in answer


def test_it_keeps_a_space_between_a_number_and_a_word_unit(alice_client):
    make_card("numeric")  # 128 KiB
    answer = reveal(alice_client, open_card(alice_client), value="100").content.decode()
    assert "the answer is 128\u00a0KiB" in answer


def test_the_numeric_card_says_where_space_shows_the_answer(alice_client):
    # The box has the focus; Space there is a thousands separator once a digit is typed.
    make_card("numeric")
    html = alice_client.get(reverse("quiz:today")).content.decode()
    assert "<kbd>Space</kbd> in the empty box shows the answer" in html
    assert "<kbd>Space</kbd> shows the answer" not in html


def test_it_tells_the_browser_not_to_keep_todays_page(alice_client):
    # Back from a lab must fetch the panel again, not restore the card answered before leaving.
    make_card()
    response = alice_client.get(reverse("quiz:today"))
    assert "no-store" in response["Cache-Control"]


def test_the_settings_help_estimates_reviews_from_this_learners_deck(alice_client, alice):
    from quiz.scheduling import reviews_in_first_days

    for _ in range(79):
        make_card()
    make_settings(alice, new_per_day=20, desired_retention=0.9)
    html = alice_client.get(reverse("quiz:settings-edit")).content.decode()
    per_day = -(-79 * reviews_in_first_days(0.9, 30) // 30)
    assert (
        f"79 cards not started: at 20 a day they are all started in 4 days. About {per_day} "
        "reviews a day over the next 30 days"
    ) in html
    assert "about 200 reviews a day" not in html
    assert per_day < 79  # a 79-card deck cannot bring more reviews a day than it has cards
