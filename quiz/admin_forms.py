"""Admin forms for the deck: every field checked as load_content would check its file.

Anything the admin saves must export to a file that loads again, and must not break a learner's
page, so bad input becomes a form error naming the field (never a 500 on save or on a quiz page).
Text keeps its exact whitespace (a textarea's CRLF becomes LF) so an export changes only the field
that was edited.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib.admin.widgets import AutocompleteSelect
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.utils.html import format_html, format_html_join

from quiz.content import PRESET_RE, SLUG_RE, ContentError, parse_check
from quiz.models import PERSONAL_DECK, Card, ChoiceOption, Deck

MAX_OPTIONS = 6  # the quiz letters options A to F
EMPTY_STEP_ROWS = 2


def normalise_newlines(text: str) -> str:
    """Browsers send textarea text with CRLF line ends; the files (and the database) use LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


if TYPE_CHECKING:
    from django.forms import BaseForm as _MixedInto  # the checker's view; a plain mixin at run time
else:
    _MixedInto = object


class ExactTextMixin(_MixedInto):
    """Keep multi-line text exactly as typed: no stripping (a trailing newline is part of a `|`
    block in the file), and LF line ends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            if isinstance(field, forms.CharField) and isinstance(field.widget, forms.Textarea):
                field.strip = False

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for name, value in cleaned.items():
            if isinstance(value, str):
                cleaned[name] = normalise_newlines(value)
        return cleaned


MAX_JSON_DEPTH = 32


def json_loads_bounded(text: str) -> Any:
    """json.loads for what staff type: nesting deeper than MAX_JSON_DEPTH (which no card needs,
    and which would exhaust Python's recursion) is a ValueError saying so, like bad JSON."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
        elif char in "]}":
            depth -= 1
    return json.loads(text)


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", int: "a number", float: "a number", str: "text"}.get(
        type(value), "a list" if isinstance(value, list) else "a mapping"
    )


def _rows_for(text: str) -> int:
    """Enough textarea rows to show a step whole on a phone (about 40 characters a line)."""
    return max(2, min(10, sum(len(line) // 40 + 1 for line in text.split("\n"))))


class StepsWidget(forms.Widget):
    """One textarea per worked step (plus empty rows to add more); works without JavaScript.

    Rows are posted as `<name>_0`, `<name>_1`, ...; an empty row is dropped on save. A raw JSON
    list posted as `<name>` (a script, an older form) is still read, and validated like the rows.
    """

    class Media:
        js = ["js/admin-steps.js"]
        css = {"all": ["css/admin-steps.css"]}

    def format_value(self, value: Any) -> list[str]:
        if isinstance(value, str):  # raw JSON redisplayed after an error, or stored JSON text
            try:
                value = json_loads_bounded(value)
            except ValueError:
                return [value]
        if isinstance(value, list):
            return [item if isinstance(item, str) else json.dumps(item) for item in value]
        return [] if value is None else [json.dumps(value)]

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer=None):
        base_id = (attrs or {}).get("id") or f"id_{name}"
        steps = self.format_value(value) + [""] * EMPTY_STEP_ROWS
        rows = format_html_join(
            "",
            '<li><label for="{0}_{1}">Step {2}</label>'
            '<textarea name="{3}_{1}" id="{0}_{1}" rows="{5}" cols="80">\n{4}</textarea></li>',
            ((base_id, i, i + 1, name, text, _rows_for(text)) for i, text in enumerate(steps)),
        )
        return format_html(
            '<fieldset class="steps-editor" id="{}" data-name="{}" data-base-id="{}">'
            "<legend>Worked steps, one per row (Markdown)</legend><ol>{}</ol>"
            '<p class="steps-help">Empty rows are dropped when you save; save to get more rows.</p>'
            "</fieldset>",
            base_id,
            name,
            base_id,
            rows,
        )

    def id_for_label(self, id_: str) -> str:
        # Each row has its own label and the rows their legend; the admin's label names no one box.
        return ""

    def _row_keys(self, data: Any, name: str) -> list[str]:
        prefix = f"{name}_"
        numbers = sorted(
            int(k[len(prefix) :])
            for k in data
            # ASCII only: "²".isdigit() is true but int("²") raises.
            if k.startswith(prefix) and k[len(prefix) :].isascii() and k[len(prefix) :].isdigit()
        )
        return [f"{prefix}{n}" for n in numbers]

    def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
        keys = self._row_keys(data, name)
        if keys:
            return [data.get(key, "") for key in keys]
        return data.get(name)

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        return not self._row_keys(data, name) and name not in data


class StepsField(forms.Field):
    widget = StepsWidget
    default_error_messages = {
        "invalid": "Worked steps must be a list of text items, one per step; got %(got)s.",
        "json": "Worked steps: not valid JSON (%(problem)s); give a list of text items.",
        "item": "Worked steps: step %(number)s must be non-empty text; got %(got)s.",
        "nul": "Worked steps: step %(number)s contains a NUL character, which cannot be "
        "stored; remove it.",
    }

    def to_python(self, value: Any) -> list[str]:
        return self._without_nul(self._steps(value))

    def _without_nul(self, steps: list[str]) -> list[str]:
        for number, step in enumerate(steps, start=1):
            if "\x00" in step:
                raise ValidationError(
                    self.error_messages["nul"], code="nul", params={"number": number}
                )
        return steps

    def _steps(self, value: Any) -> list[str]:
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            # From the rows: empty rows are dropped.
            return [normalise_newlines(item) for item in value if item.strip()]
        if value in (None, ""):
            return []
        if isinstance(value, str):
            try:
                value = json_loads_bounded(value)
            except ValueError as exc:
                raise ValidationError(
                    self.error_messages["json"], code="json", params={"problem": str(exc)}
                ) from None
        if not isinstance(value, list):
            raise ValidationError(
                self.error_messages["invalid"], code="invalid", params={"got": _kind_of(value)}
            )
        for number, item in enumerate(value, start=1):
            if not isinstance(item, str) or not item.strip():
                got = "empty text" if isinstance(item, str) else _kind_of(item)
                raise ValidationError(
                    self.error_messages["item"],
                    code="item",
                    params={"number": number, "got": got},
                )
        return [normalise_newlines(item) for item in value]

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (initial or [])
        except ValidationError:
            return True


class CardAdminForm(ExactTextMixin, forms.ModelForm):
    steps = StepsField(required=False, label="Worked steps")

    class Meta:
        model = Card
        fields = [
            "slug",
            "deck",
            "kind",
            "is_active",
            "source",
            "parent",
            "prompt",
            "answer",
            "steps",
            "explanation",
            "follow_up_question",
            "follow_up_answer",
            "numeric_value",
            "numeric_unit",
            "numeric_tolerance",
            "lab_preset",
            "check_json",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The learners' own-runs deck is not for shared cards: export and the Anki package
        # leave that deck out, so a shared card moved there would break them.
        if "deck" in self.fields and self.instance.owner_id is None:
            self.fields["deck"].queryset = Deck.objects.exclude(slug=PERSONAL_DECK)
        # A prediction card is a learner's own, made by the quiz from a lab question; the deck's
        # files have no such kind.
        if "kind" in self.fields and self.instance.kind != Card.Kind.PREDICTION:
            self.fields["kind"].choices = [
                c for c in self.fields["kind"].choices if c[0] != Card.Kind.PREDICTION
            ]

    def clean_slug(self) -> str:
        slug = self.cleaned_data["slug"]
        if not SLUG_RE.match(slug):
            raise ValidationError("Slug: lowercase letters, digits and single hyphens only.")
        return slug

    def clean_lab_preset(self) -> str:
        preset = self.cleaned_data["lab_preset"]
        if preset and not PRESET_RE.match(preset):
            raise ValidationError("Lab preset: a preset's slug (lowercase, digits, . _ -).")
        return preset

    def clean_check_json(self) -> str:
        text = self.cleaned_data["check_json"].strip()
        if not text:
            return ""
        try:
            data = json_loads_bounded(text)
        except ValueError as exc:
            raise ValidationError(f"Check: not valid JSON ({exc}).") from None
        try:
            parse_check(data, "Check")
        except ContentError as exc:
            raise ValidationError(str(exc)) from None
        # Control characters (a NUL too) stay escaped in the stored text.
        return json.dumps(data, ensure_ascii=False)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        kind = cleaned.get("kind")
        numeric = ("numeric_value", "numeric_unit", "numeric_tolerance")
        if kind == Card.Kind.NUMERIC:
            if cleaned.get("numeric_value") is None and "numeric_value" not in self.errors:
                self.add_error("numeric_value", "A numeric card needs its numeric value.")
            if cleaned.get("numeric_tolerance") is None and "numeric_tolerance" not in self.errors:
                cleaned["numeric_tolerance"] = 0.0
        elif kind:
            for name in numeric:
                if cleaned.get(name) not in (None, ""):
                    self.add_error(name, "Only numeric cards have a numeric answer; clear it.")
        question, answer = cleaned.get("follow_up_question"), cleaned.get("follow_up_answer")
        if bool((question or "").strip()) != bool((answer or "").strip()):
            self.add_error("follow_up_answer", "A follow-up needs both a question and an answer.")
        return cleaned


class ChoiceOptionForm(ExactTextMixin, forms.ModelForm):
    class Meta:
        model = ChoiceOption
        fields = ["position", "text", "is_correct", "why"]


class ChoiceOptionFormSet(BaseInlineFormSet):
    """The card's options as the quiz needs them: 2 to 6 for a multiple-choice card (letters A
    to F), exactly one correct; none on other kinds."""

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        kept = [
            form
            for form in self.forms
            if form.cleaned_data.get("text", "").strip() and not self._should_delete_form(form)
        ]
        kind = self.instance.kind
        if kind != Card.Kind.CHOICE:
            if kept:
                raise ValidationError(
                    "Only multiple-choice cards have options: delete them or change the kind."
                )
            return
        if not 2 <= len(kept) <= MAX_OPTIONS:
            raise ValidationError(
                f"A multiple-choice card needs 2 to {MAX_OPTIONS} options (the quiz letters them "
                f"A to F); this one has {len(kept)}."
            )
        correct = sum(bool(form.cleaned_data.get("is_correct")) for form in kept)
        if correct != 1:
            raise ValidationError(f"Mark exactly one option correct; {correct} are marked.")


class DeckAdminForm(ExactTextMixin, forms.ModelForm):
    class Meta:
        model = Deck
        fields = ["slug", "title", "description"]


class RedisplaySafeAutocomplete(AutocompleteSelect):
    """Django's autocomplete widget, which looks the posted value up to redisplay it after an
    error: a value that is no key (":", "1e309") or an integer no 64-bit column holds made that
    lookup raise, a 500. Such values are left out of the lookup; the field's own error still
    names them."""

    def optgroups(self, name: str, value: list[str], attr: dict[str, Any] | None = None):
        to_field = self.field.remote_field.model._meta.get_field(self.field.remote_field.field_name)
        keys = []
        for item in value:
            try:
                key = to_field.to_python(item)
            except ValidationError:
                continue
            if isinstance(key, int) and not -(2**63) <= key < 2**63:
                continue
            keys.append(item)
        return super().optgroups(name, keys, attr)


class SafeAutocompleteMixin:
    """For a ModelAdmin or inline: its autocomplete fields use RedisplaySafeAutocomplete."""

    def formfield_for_foreignkey(self, db_field: Any, request: Any, **kwargs: Any) -> Any:
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):  # type: ignore[attr-defined]
            kwargs["widget"] = RedisplaySafeAutocomplete(
                db_field,
                self.admin_site,  # type: ignore[attr-defined]
                using=kwargs.get("using"),
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]
