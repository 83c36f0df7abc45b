"""Staff edit cards in the admin: inline options, filters by deck/kind/tag, a rendered preview."""

from __future__ import annotations

import datetime as dt
import io
from html.parser import HTMLParser
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from quiz.admin_forms import StepsWidget
from quiz.models import PERSONAL_DECK, Card, Deck
from tests.conftest import make_user
from tests.quiz.factories import make_card
from tests.quiz.test_content import CARDS, load, write_deck

pytestmark = pytest.mark.django_db


@pytest.fixture
def content(tmp_path):
    return write_deck(tmp_path / "content")


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


# --- Edits that survive load_content and export as small diffs (issue 14) ------------------------


def _as_browser_posts(response) -> dict[str, Any]:
    """The change form's current values as a browser posts them (textareas with CRLF)."""
    forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        forms += [inline.formset.management_form, *inline.formset.forms]
    data: dict[str, Any] = {}
    for form in forms:
        for bound in form:
            value = bound.value()
            if isinstance(bound.field.widget, StepsWidget):
                for i, step in enumerate(value or []):
                    data[f"{bound.html_name}_{i}"] = step.replace("\n", "\r\n")
            elif isinstance(value, bool):
                if value:
                    data[bound.html_name] = "on"
            elif value is not None:
                data[bound.html_name] = str(value).replace("\n", "\r\n")
    return data


def _admin_edit(client, slug: str, /, model: type[Card | Deck] = Card, **changes: str):
    obj = model.objects.get(slug=slug)
    url = reverse(f"admin:quiz_{model._meta.model_name}_change", args=[obj.pk])
    data = _as_browser_posts(client.get(url))
    data.update(changes)
    return client.post(url, data)


def test_it_exports_only_the_field_edited_in_the_admin(staff_client, content):
    load(content)
    for slug in ("kv-bytes", "paging-why"):
        response = _admin_edit(staff_client, slug, answer="A new answer.")
        assert response.status_code == 302, response.context["adminform"].form.errors
    call_command("export_content", path=str(content), stdout=io.StringIO())
    for slug in ("kv-bytes", "paging-why"):
        old_answer = next(line for line in CARDS[slug].splitlines() if line.startswith("answer: "))
        expected = CARDS[slug].replace(old_answer, "answer: A new answer.")
        assert (content / "cards" / f"{slug}.yaml").read_text(encoding="utf-8") == expected
    assert (content / "cards" / "gqa-recall.yaml").read_text(encoding="utf-8") == CARDS[
        "gqa-recall"
    ]


def test_it_keeps_an_admin_edit_through_load_content_and_reports_it(staff_client, content):
    load(content)
    assert _admin_edit(staff_client, "kv-bytes", answer="Edited.").status_code == 302
    assert Card.objects.get(slug="kv-bytes").edited_since_load

    output = load(content)  # what `make run` and `make test` do
    card = Card.objects.get(slug="kv-bytes")
    assert card.answer == "Edited." and card.edited_since_load
    assert "1 kept (edited in the admin)" in output and "conflict: kv-bytes" in output

    out = io.StringIO()
    call_command("load_content", path=str(content), force=True, stdout=out)
    card.refresh_from_db()
    assert card.answer == "128 KiB per token" and not card.edited_since_load
    assert "overwritten (--force): kv-bytes" in out.getvalue()


@pytest.mark.parametrize(
    ("model", "slug", "field"),
    [(Card, "gqa-recall", "answer"), (Deck, "llm-serving", "description")],
)
def test_it_clears_the_mark_once_the_edit_is_exported(staff_client, content, model, slug, field):
    load(content)
    _admin_edit(staff_client, slug, model=model, **{field: "Edited."})
    call_command("export_content", path=str(content), stdout=io.StringIO())
    output = load(content)
    edited = model.objects.get(slug=slug)
    assert getattr(edited, field) == "Edited." and not edited.edited_since_load
    assert "0 kept" in output and "0 deck(s) kept" in output and "conflict" not in output


def test_it_keeps_a_card_made_in_the_admin_that_the_files_lack(staff_client, content):
    load(content)
    data = {
        "slug": "admin-made",
        "deck": Card.objects.get(slug="kv-bytes").deck_id,
        "kind": "recall",
        "is_active": "on",
        "prompt": "Q?",
        "answer": "A.",
    }
    for prefix in ("options", "card_tags", "relations_out"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    response = staff_client.post(reverse("admin:quiz_card_add"), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    output = load(content)
    assert Card.objects.get(slug="admin-made").is_active
    assert "conflict: admin-made" in output
    # A new card's slug is checked as load_content checks a file name.
    response = staff_client.post(reverse("admin:quiz_card_add"), {**data, "slug": "Bad_Slug"})
    assert response.status_code == 200
    assert "lowercase letters" in " ".join(response.context["adminform"].form.errors["slug"])


def test_it_edits_worked_steps_one_row_per_step(staff_client, content):
    load(content)
    card = Card.objects.get(slug="kv-bytes")
    html = staff_client.get(reverse("admin:quiz_card_change", args=[card.pk])).content.decode()
    assert '<label for="id_steps_0">Step 1</label>' in html
    assert 'name="steps_1"' in html and 'name="steps_3"' in html  # two steps + two empty rows
    assert "js/admin-steps.js" in html
    response = _admin_edit(
        staff_client,
        "kv-bytes",
        steps_0="First.",
        steps_1="",
        steps_2="Third,\r\non two lines.",
        steps_3="",
    )
    assert response.status_code == 302
    card.refresh_from_db()
    assert card.steps == ["First.", "Third,\non two lines."]


def test_a_steps_row_whose_number_is_not_ascii_digits_is_ignored(staff_client, content):
    # "steps_²" passes str.isdigit() but int("²") raises: once a 500 on the admin's save.
    load(content)
    response = _admin_edit(
        staff_client, "kv-bytes", steps_0="First.", steps_1="", **{"steps_²": "x", "steps_①": "y"}
    )
    assert response.status_code == 302
    card = Card.objects.get(slug="kv-bytes")
    assert card.steps[0] == "First." and "x" not in card.steps and "y" not in card.steps


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("5", "must be a list of text items, one per step; got a number"),
        ("[1, 2]", "step 1 must be non-empty text; got a number"),
        ('[["a"]]', "step 1 must be non-empty text; got a list"),
        ("null", "must be a list of text items, one per step; got null"),
        ("[oops", "not valid JSON"),
        # Nested 5,000 deep: once a 500 (Python's recursion ran out in the JSON decoder).
        ("[" * 5000 + "]" * 5000, "nested more than 32 levels deep"),
        ('["a\\u0000b"]', "step 1 contains a NUL character"),
    ],
)
def test_it_refuses_steps_that_are_not_a_list_of_text(staff_client, raw, message):
    card = make_card()
    url = reverse("admin:quiz_card_change", args=[card.pk])
    data = {k: v for k, v in _as_browser_posts(staff_client.get(url)).items()}
    data = {k: v for k, v in data.items() if not k.startswith("steps_")}
    data["steps"] = raw
    response = staff_client.post(url, data)
    assert response.status_code == 200
    assert message in str(response.context["adminform"].form.errors["steps"])
    card.refresh_from_db()
    assert card.steps == ["Step one.", "Step two."]


def _with_options(data: dict[str, Any], options: list[tuple[str, bool]]) -> dict[str, Any]:
    data = {k: v for k, v in data.items() if not k.startswith("options-")}
    data.update({"options-TOTAL_FORMS": str(len(options)), "options-INITIAL_FORMS": "0"})
    for i, (text, correct) in enumerate(options):
        data.update({f"options-{i}-text": text, f"options-{i}-position": str(i)})
        if correct:
            data[f"options-{i}-is_correct"] = "on"
    return data


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([(f"Option {n}", n == 0) for n in range(7)], "needs 2 to 6 options"),
        ([("Only", True)], "needs 2 to 6 options"),
        ([("One", True), ("Two", True)], "exactly one option correct; 2 are marked"),
    ],
)
def test_it_refuses_choice_options_the_quiz_cannot_show(staff_client, options, message):
    card = make_card("recall", slug="to-choice")
    url = reverse("admin:quiz_card_change", args=[card.pk])
    data = _with_options(_as_browser_posts(staff_client.get(url)), options)
    data["kind"] = "choice"
    response = staff_client.post(url, data)
    assert response.status_code == 200
    errors = [
        str(e)
        for inline in response.context["inline_admin_formsets"]
        for e in inline.formset.non_form_errors()
    ]
    assert any(message in e for e in errors), errors
    card.refresh_from_db()
    assert card.kind == "recall" and not card.options.exists()


@pytest.mark.parametrize(
    ("kind", "changes", "field", "message"),
    [
        ("numeric", {"numeric_value": ""}, "numeric_value", "needs its numeric value"),
        ("numeric", {"numeric_value": "lots"}, "numeric_value", "Enter a number"),
        ("recall", {"numeric_value": "3"}, "numeric_value", "Only numeric cards"),
        ("recall", {"check_json": "{oops"}, "check_json", "not valid JSON"),
        ("recall", {"check_json": "[1]"}, "check_json", "must be a mapping"),
        ("recall", {"check_json": '{"key": 5}'}, "check_json", "needs either a text 'key'"),
        ("recall", {"follow_up_question": "Why?"}, "follow_up_answer", "both a question"),
    ],
)
def test_it_refuses_a_bad_numeric_answer_check_or_follow_up(
    staff_client, kind, changes, field, message
):
    card = make_card(kind)
    response = _admin_edit(staff_client, card.slug, **changes)
    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors[field])
    assert not Card.objects.get(pk=card.pk).edited_since_load


def test_it_lists_the_kept_cards_for_make_run(staff_client, content):
    load(content)
    quiet = io.StringIO()
    call_command("load_content", kept=True, stdout=quiet)
    assert quiet.getvalue() == ""
    _admin_edit(staff_client, "gqa-recall", answer="Edited.")
    load(content)
    out = io.StringIO()
    call_command("load_content", kept=True, stdout=out)
    assert "conflict: gqa-recall" in out.getvalue() and "export_content" in out.getvalue()


def test_it_leaves_drafts_and_personal_cards_out_of_the_conflicts(staff_client, content, alice):
    load(content)
    draft = make_card(slug="imported-draft", is_active=False)  # e.g. from a study document
    mine = make_card(slug="alices-own", owner=alice)
    for card in (draft, mine):
        response = _admin_edit(staff_client, card.slug, answer="Edited.")
        assert response.status_code == 302, response.context["adminform"].form.errors
    assert not Card.objects.get(pk=mine.pk).edited_since_load
    output = load(content)
    assert "conflict" not in output
    draft.refresh_from_db()
    assert draft.answer == "Edited." and not draft.is_active


def test_it_does_not_offer_the_learners_own_runs_deck_for_a_shared_card(staff_client, content):
    load(content)
    personal = Deck.objects.create(slug=PERSONAL_DECK, title="Your runs")
    slug = "kv-bytes"
    assert _admin_edit(staff_client, slug, answer="Edited.").status_code == 302  # the form works
    response = _admin_edit(staff_client, slug, deck=str(personal.pk))
    assert response.status_code == 200  # the form is shown again with the error
    assert "Select a valid choice" in response.content.decode()
    assert Card.objects.get(slug=slug).deck.slug != PERSONAL_DECK


# --- A deck's title and description, edited in the admin, survive load_content too --------------


def test_it_keeps_an_admin_edit_of_a_deck_through_load_content_and_reports_it(
    staff_client, content
):
    load(content)
    response = _admin_edit(staff_client, "llm-serving", model=Deck, title="Serving LLMs")
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Deck.objects.get(slug="llm-serving").edited_since_load

    output = load(content)  # what `make run` and `manage.py prepare` do
    deck = Deck.objects.get(slug="llm-serving")
    assert deck.title == "Serving LLMs" and deck.edited_since_load
    assert "1 deck(s) kept (edited in the admin)" in output
    assert "conflict: deck llm-serving" in output
    kept = io.StringIO()
    call_command("load_content", kept=True, stdout=kept)
    assert "conflict: deck llm-serving" in kept.getvalue()

    # Handed back to the files as a card is: --force loads the file over the edit.
    out = io.StringIO()
    call_command("load_content", path=str(content), force=True, stdout=out)
    deck.refresh_from_db()
    assert deck.title == "LLM serving" and not deck.edited_since_load
    assert "overwritten (--force): deck llm-serving" in out.getvalue()
    assert "0 deck(s) kept" in load(content)


def test_it_marks_a_deck_only_when_the_admin_saves_it(staff_client, content):
    load(content)
    url = reverse("admin:quiz_deck_change", args=[Deck.objects.get(slug="llm-serving").pk])
    assert "edited_since_load" not in staff_client.get(url).context["adminform"].form.fields
    response = _admin_edit(staff_client, "llm-serving", model=Deck, title="")
    assert response.status_code == 200  # refused: a deck needs a title
    assert not Deck.objects.get(slug="llm-serving").edited_since_load
    # The learners' own-runs deck is not in content/: nothing to protect it from.
    Deck.objects.create(slug=PERSONAL_DECK, title="Your runs")
    response = _admin_edit(staff_client, PERSONAL_DECK, model=Deck, title="Runs")
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert not Deck.objects.get(slug=PERSONAL_DECK).edited_since_load


@pytest.mark.parametrize(("model", "slug"), [(Deck, "llm-serving"), (Card, "kv-bytes")])
def test_a_saved_slug_is_read_only_so_a_load_never_brings_the_old_one_back(
    staff_client, content, model, slug
):
    load(content)
    obj = model.objects.get(slug=slug)
    url = reverse(f"admin:quiz_{model._meta.model_name}_change", args=[obj.pk])
    page = staff_client.get(url)
    assert "slug" not in page.context["adminform"].form.fields
    assert slug in page.content.decode()  # shown, as text
    response = _admin_edit(staff_client, slug, model=model, slug="renamed-in-the-admin")
    assert response.status_code == 302
    obj.refresh_from_db()
    assert obj.slug == slug
    load(content)
    assert model.objects.filter(slug=slug).count() == 1
    assert not model.objects.filter(slug="renamed-in-the-admin").exists()
    # A new one still takes its slug in the admin.
    add_page = staff_client.get(reverse(f"admin:quiz_{model._meta.model_name}_add"))
    assert "slug" in add_page.context["adminform"].form.fields


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("steps_0", "Step\x00one.", "step 1 contains a NUL character"),
        ("check_json", "[" * 5000 + "]" * 5000, "nested more than 32 levels deep"),
        ("prompt", "What\x00?", "Null characters are not allowed"),
    ],
)
def test_nul_and_deep_json_in_the_card_editor_are_form_errors(staff_client, field, value, message):
    card = make_card()
    url = reverse("admin:quiz_card_change", args=[card.pk])
    data = {**_as_browser_posts(staff_client.get(url)), field: value}
    response = staff_client.post(url, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    name = "steps" if field.startswith("steps") else field
    assert message in str(errors[name])
    card.refresh_from_db()
    assert card.steps == ["Step one.", "Step two."] and "\x00" not in card.prompt


@pytest.mark.parametrize("value", [":", "1e309", "-1", "x" * 300, "9" * 30])
def test_a_parent_that_is_no_card_is_a_form_error_not_a_500(staff_client, value):
    card = make_card()
    url = reverse("admin:quiz_card_change", args=[card.pk])
    data = {**_as_browser_posts(staff_client.get(url)), "parent": value}
    response = staff_client.post(url, data)
    assert response.status_code == 200
    assert "parent" in response.context["adminform"].form.errors


# --- A learner's review state (issue 61) ---------------------------------------------------------


class _FormValues(HTMLParser):
    """The values a browser posts for a rendered admin change form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button"):
            if a.get("type") != "checkbox" or "checked" in a:
                self.data[name] = a.get("value") or ("on" if a.get("type") == "checkbox" else "")
        elif tag == "select":
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select] = a.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def test_saving_a_learners_state_unchanged_in_the_admin_leaves_undo_possible(staff_client, alice):
    # The save truncated the times to whole seconds and bumped the version: undo was refused.
    from quiz import services
    from quiz.models import ReviewLog, ReviewState
    from tests.quiz.factories import at, review

    card = make_card()
    answered = at(2026, 6, 1, 9) + dt.timedelta(microseconds=123_456)
    review(alice, card, 3, answered)
    state = ReviewState.objects.get(user=alice, card=card)
    url = reverse("admin:quiz_reviewstate_change", args=[state.pk])
    form = _FormValues()
    form.feed(staff_client.get(url).content.decode())
    assert "due_0" in form.data and "version" in form.data
    assert staff_client.post(url, form.data).status_code == 302
    saved = ReviewState.objects.get(pk=state.pk)
    assert (saved.last_review, saved.version) == (state.last_review, state.version)
    services.review_undo(user=alice, now=answered + dt.timedelta(minutes=1))
    assert not ReviewLog.objects.exists()
