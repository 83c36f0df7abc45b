"""Quiz pages. Each view parses input, calls one service or selector and renders the page, or its
`#quiz-panel` partial for htmx. The forms are real, so everything also works without JavaScript."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.middleware import HtmxDetails

from labs import api as labs_api
from labs.api import RunData
from quiz import personal, prediction_asks, scheduling, selectors, services
from quiz.anki import deck_apkg
from quiz.forms import AnswerForm, GradeForm, LearnerSettingsForm
from quiz.models import Card, LearnerSettings, PersonalCardRequest, Showing

RATING_NAMES = {1: "Again", 2: "Hard", 3: "Good", 4: "Easy"}
TODAY = "quiz/today.html"


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _now() -> dt.datetime:
    # The server's clock, always: a browser's clock must not choose the review time.
    return timezone.now()


def _grade_buttons(showing: Showing, tz: ZoneInfo, hour: int) -> list[dict[str, Any]]:
    suggested = services.suggested_rating(showing)
    # The study day the outcomes were computed on (it may not be the one the reveal falls in
    # just after a change of zone or rollover hour: scheduling.Context.day_floor).
    day = (showing.outcomes.get(services.CONTEXT_KEY) or {}).get("day")
    today = dt.date.fromisoformat(day) if day else None
    buttons = []
    for rating, name in RATING_NAMES.items():
        outcome = scheduling.CardState.from_json(showing.outcomes[str(rating)])
        buttons.append(
            {
                "rating": rating,
                "name": name,
                "interval": scheduling.interval_label(
                    outcome, showing.revealed_at, tz, hour, today
                ),
                "suggested": rating == suggested,
            }
        )
    return buttons


def _card_context(card: Card, showing: Showing, day: selectors.StudyDay) -> dict[str, Any]:
    by_id = {option.pk: option for option in card.options.all()}
    # The showing's own order; an option deleted since is simply left out.
    options = [by_id[pk] for pk in showing.option_order if pk in by_id]
    chosen = None
    if showing.answer and card.kind == Card.Kind.CHOICE:
        chosen = "ABCDEF".index(showing.answer[0])
    context: dict[str, Any] = {
        "card": card,
        "showing": showing,
        "lettered": list(zip("ABCDEF", options, strict=False)),
        "chosen_index": chosen,
        "side": "answer" if showing.revealed_at else "question",
    }
    if showing.revealed_at:
        context["buttons"] = _grade_buttons(showing, day.tz, day.rollover_hour)
        context["your_number"] = personal.your_number(user_id=showing.user_id, card=card)
    if card.kind == Card.Kind.PREDICTION:
        context.update(prediction_asks.today_context(card, showing, context))
    return context


def _render_panel(
    request: HtmxHttpRequest, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    template = f"{TODAY}#quiz-panel" if request.htmx else TODAY
    return render(request, template, context, status=status)


def _panel(
    request: HtmxHttpRequest,
    *,
    notice: str = "",
    card_id: int | None = None,
    showing: Showing | None = None,
    errors: list[str] | None = None,
    status: int = 200,
    settings: LearnerSettings | None = None,
) -> HttpResponse:
    """Today's panel: the counts and the next card (or `card_id`, or `showing` as it stands)."""
    now = _now()
    # One queue per request, and no next card to pick when the card to show is already known.
    queue = selectors.queue_today(
        user=request.user,
        now=now,
        settings=settings,
        pick_next=showing is None and card_id is None,
    )
    context: dict[str, Any] = {
        "queue": queue,
        "notice": notice,
        "errors": errors or [],
        # Reviews logged today answer "can undo" without a query; else one from before the
        # rollover may still be in its grace period.
        "undo": queue.reviewed_today > 0
        or selectors.undo_available(user=request.user, day=queue.day, now=now),
        "side": "done",
    }
    # The card to show: the showing's (never null), else the one asked for, else the next.
    card_id = showing.card_id if showing is not None else card_id or queue.next_card_id
    if card_id:
        card = _card_of(showing) or selectors.card_for_quiz(card_id=card_id)
        if showing is None:
            showing = services.showing_open(
                user=request.user, card=card, now=now, new=queue.next_is_new
            )
        context.update(_card_context(card, showing, queue.day))
    elif queue.next_learning_due:
        context["comes_back"] = queue.next_learning_due.astimezone(queue.day.tz)
    return _render_panel(request, context, status=status)


def _card_of(showing: Showing | None) -> Card | None:
    """The card a service already read for this showing (it came with it), so that a request
    reads its card once; None when it came without."""
    if showing is not None and Showing.card.is_cached(showing):
        return showing.card
    return None


def _own_showing(request: HttpRequest, token: str) -> Showing:
    try:
        return selectors.showing_get(user=request.user, token=token)
    except Showing.DoesNotExist:
        raise Http404("No such card showing for you.") from None


@require_GET
@login_required
@never_cache  # Back from a lab must fetch today's panel again, not show a cached old card
def today(request: HtmxHttpRequest) -> HttpResponse:
    return _panel(request)


@require_POST
@login_required
def answer_submit(request: HtmxHttpRequest, token: str) -> HttpResponse:
    """Reveal the answer side: judge the learner's answer and fix the four intervals."""
    form = AnswerForm(request.POST)
    if not form.is_valid():
        showing = _own_showing(request, token)
        errors = [e for field_errors in form.errors.values() for e in field_errors]
        return _panel(request, showing=showing, errors=errors, status=400)
    settings = selectors.learner_settings_get(user=request.user)
    try:
        showing = services.showing_reveal(
            user=request.user, token=token, answer=form.answer(), now=_now(), settings=settings
        )
    except Showing.DoesNotExist:
        raise Http404("No such card showing for you.") from None
    except ValidationError as exc:
        showing = _own_showing(request, token)
        return _panel(request, showing=showing, errors=exc.messages, status=400)
    except services.QuizConflict as exc:
        return _panel(request, notice=str(exc), status=409)
    return _panel(request, showing=showing, settings=settings)


@require_POST
@login_required
def review_grade(request: HtmxHttpRequest, token: str) -> HttpResponse:
    form = GradeForm(request.POST)
    if not form.is_valid():
        showing = _own_showing(request, token)
        return _panel(request, showing=showing, errors=form.errors["rating"], status=400)
    settings = selectors.learner_settings_get(user=request.user)
    try:
        result = services.review_grade(
            user=request.user,
            token=token,
            rating=form.cleaned_data["rating"],
            now=_now(),
            settings=settings,
        )
    except Showing.DoesNotExist:
        raise Http404("No such card showing for you.") from None
    except services.ShowingExpired as exc:
        showing = services.showing_reveal(
            user=request.user, token=token, answer=services.Answer(), now=_now(), refresh=True
        )
        return _panel(request, showing=showing, notice=str(exc), status=409)
    except services.QuizConflict as exc:
        return _panel(request, notice=str(exc), status=409)
    notice = ""
    if result.became_leech:
        notice = (
            f"“{result.log.card.slug}” has lapsed {scheduling.LEECH_THRESHOLD}+ times: it is now "
            "tagged leech and suspended. Open it from Stats to read it again and unsuspend it."
        )
    if not request.htmx:
        if notice:
            messages.warning(request, notice)
        return redirect("quiz:today")  # POST-redirect-GET: a refresh cannot grade again
    return _panel(request, notice=notice, settings=settings)


@require_POST
@login_required
def review_undo(request: HtmxHttpRequest) -> HttpResponse:
    try:
        card_id = services.review_undo(user=request.user, now=_now())
    except services.NothingToUndo as exc:
        return _panel(request, notice=str(exc), status=409)
    if not request.htmx:
        messages.info(request, "Undone: the card is back in today's queue.")
        return redirect("quiz:today")
    return _panel(request, card_id=card_id, notice="Undone: here is that card again.")


@require_GET
@login_required
def card_detail(request: HttpRequest, slug: str) -> HttpResponse:
    try:
        card, state = selectors.card_detail_get(slug=slug, user=request.user)
    except Card.DoesNotExist:
        raise Http404("No such card.") from None
    context: dict[str, Any] = {
        "card": card,
        "state": state,
        "your_number": personal.your_number(user_id=request.user.pk, card=card),
    }
    if state and state.last_review:
        zone = ZoneInfo(selectors.learner_settings_get(user=request.user).time_zone)
        context["due_local"] = state.due.astimezone(zone)
    return render(request, "quiz/card_detail.html", context)


@require_POST
@login_required
def card_unsuspend(request: HttpRequest, slug: str) -> HttpResponse:
    try:
        card, _ = selectors.card_detail_get(slug=slug, user=request.user)
    except Card.DoesNotExist:
        raise Http404("No such card.") from None
    services.card_unsuspend(user=request.user, card=card)
    messages.success(request, "Unsuspended: the card comes back when it is due.")
    return redirect("quiz:card-detail", slug=slug)


def _card_from(request: HttpRequest, run: RunData) -> HttpResponse:
    try:
        made = personal.card_request(user=request.user, run=run)
    except personal.CardRefused as exc:
        messages.error(request, str(exc))
        return redirect(run.sweep.url if run.sweep else run.url)
    return redirect(f"{reverse('quiz:my-cards')}?request={made.pk}")


@require_POST
@login_required
def card_from_run(request: HttpRequest, pk: int) -> HttpResponse:
    """ "Make a card from this" on a finished run: queued on the lab worker, watched on My cards."""
    return _card_from(request, labs_api.run_get_for_owner(user=request.user, pk=pk))


@require_GET
@login_required
def my_cards(request: HtmxHttpRequest) -> HttpResponse:
    """The learner's personal cards and when each comes; `?request=N` also shows how the making
    of a card is going (polled while the lab worker makes it)."""
    made = None
    raw = request.GET.get("request", "")
    if raw:
        # ASCII only: "²".isdigit() is true but int("²") raises.
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            return HttpResponseBadRequest(
                "?request= must be a card request number (digits 0-9, at most 18); "
                f"got {raw[:40]!r}.",
                content_type="text/plain; charset=utf-8",
            )
        try:
            made = personal.card_request_get(user=request.user, pk=int(raw))
        except PersonalCardRequest.DoesNotExist:
            raise Http404("No such card request.") from None
    now = _now()
    context = {
        "made": made,
        "made_message": (
            personal.made_message(user=request.user, card=made.card, now=now)
            if made is not None and made.card is not None
            else ""
        ),
        "cards": personal.my_cards(user=request.user, now=now),
    }
    if request.htmx:
        html = render_to_string("quiz/my_cards.html#my-cards", context, request=request)
        in_flight = made is not None and made.in_flight
        # 286 tells htmx to stop polling once the card is made or refused.
        return HttpResponse(html, status=200 if in_flight else 286)
    return render(request, "quiz/my_cards.html", context)


@require_POST
@login_required
def card_from_sweep(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = labs_api.sweep_get_for_owner(user=request.user, pk=pk)
    try:
        run = personal.sweep_card_run(sweep)
    except personal.CardRefused as exc:
        messages.error(request, str(exc))
        return redirect(sweep.url)
    return _card_from(request, run)


@require_POST
@login_required
def card_retire(request: HttpRequest, slug: str) -> HttpResponse:
    """A learner retires one of their own personal cards; the deck's cards are staff's."""
    if not personal.card_retire(user=request.user, slug=slug):
        raise Http404("No such card of yours.")
    messages.success(request, "Retired: the card will not come back.")
    return redirect("quiz:today")


@require_GET
@login_required
def stats(request: HttpRequest) -> HttpResponse:
    data = selectors.stats_for(user=request.user, now=_now())
    own = selectors.personal_export_counts(user=request.user)
    context = {"stats": data, "chart_data": data.chart_data(), "anki_own": own}
    return render(request, "quiz/stats.html", context)


@require_GET
@login_required
def anki_export(request: HttpRequest) -> HttpResponse:
    """The shared deck as an .apkg download (`manage.py export_anki`'s file), with the learner's
    own cards made from runs."""
    buffer = io.BytesIO()
    deck_apkg(buffer, user=request.user)
    response = HttpResponse(buffer.getvalue(), content_type="application/octet-stream")
    response["Content-Disposition"] = 'attachment; filename="serving-school.apkg"'
    return response


@require_http_methods(["GET", "POST"])
@login_required
def settings_edit(request: HttpRequest) -> HttpResponse:
    current = selectors.learner_settings_get(user=request.user)
    form = LearnerSettingsForm(request.POST or None, instance=current)
    workload = selectors.workload_estimate(user=request.user, settings=current, now=timezone.now())
    form.show_workload(workload, current.new_per_day)
    if request.method == "POST":
        if form.is_valid():
            services.learner_settings_update(user=request.user, now=_now(), **form.cleaned_data)
            messages.success(request, "Settings saved.")
            return redirect("quiz:settings-edit")
        return render(request, "quiz/settings_edit.html", {"form": form}, status=400)
    return render(request, "quiz/settings_edit.html", {"form": form})
