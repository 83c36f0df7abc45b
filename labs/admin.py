"""Staff edit lab questions here (the rest of labs is run by learners and workers); `manage.py
export_content` writes the edits back to content/labs/questions/."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from config.admin_delete import BoundedDeleteMixin
from labs.questions.models import LabQuestion
from labs.questions.spec import KEYS, QuestionError, from_data


class LabQuestionForm(forms.ModelForm):
    """Checked as `load_content` checks a question file: every point must run, small enough to
    simulate ahead of time; a refusal names the field."""

    class Meta:
        model = LabQuestion
        # A question file's fields, in its order; the two mappings as JSON text.
        fields = [
            *(f"{k}_json" if k in ("settings", "neighbours") else k for k in KEYS),
            "is_active",
        ]
        widgets = {
            "settings_json": forms.Textarea(attrs={"rows": 6}),
            "neighbours_json": forms.Textarea(attrs={"rows": 6}),
        }

    def _json(self, name: str, kind: type) -> Any:
        raw = self.cleaned_data.get(name) or ""
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"{name} must be JSON: {exc.msg} (line {exc.lineno})"
            ) from None
        if not isinstance(value, kind):
            raise forms.ValidationError(f"{name} must be a JSON {kind.__name__}")
        return value

    def clean_settings_json(self) -> str:
        return json.dumps(self._json("settings_json", dict), ensure_ascii=False)

    def clean_neighbours_json(self) -> str:
        return json.dumps(self._json("neighbours_json", list), ensure_ascii=False)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        data = {k: cleaned.get(k) for k in KEYS if k not in ("settings", "neighbours")}
        data["slug"] = cleaned.get("slug") or (self.instance.slug if self.instance else "")
        data["settings"] = json.loads(cleaned["settings_json"])
        data["neighbours"] = json.loads(cleaned["neighbours_json"])
        try:
            from_data(data, "this question")
        except QuestionError as exc:
            field = _field_of(str(exc))
            self.add_error(field, str(exc).removeprefix("this question: "))
        return cleaned


def _field_of(message: str) -> str | None:
    """The form field a checking message names ("field 'neighbours[2]' ..." -> neighbours_json)."""
    for name in (*KEYS, "neighbours", "settings"):
        if f"field '{name}" in message:
            return {"settings": "settings_json", "neighbours": "neighbours_json"}.get(name, name)
    return None


@admin.register(LabQuestion)
class LabQuestionAdmin(BoundedDeleteMixin, admin.ModelAdmin):
    form = LabQuestionForm
    list_display = [
        "slug",
        "lab",
        "figure",
        "topic",
        "is_active",
        "edited_since_load",
        "updated_at",
    ]
    list_filter = ["lab", "is_active", "edited_since_load"]
    search_fields = ["slug", "title"]
    readonly_fields = ["edited_since_load", "created_at", "updated_at"]

    def get_readonly_fields(
        self, request: HttpRequest, obj: LabQuestion | None = None
    ) -> list[str]:
        # Its slug is its file's name in content/: renamed here, the next load would bring the
        # old one back beside it.
        return self.readonly_fields if obj is None else ["slug", *self.readonly_fields]

    def save_model(self, request: HttpRequest, obj: LabQuestion, form: Any, change: bool) -> None:
        # load_content keeps the edit (and reports it) until export_content writes it to
        # content/ or a forced load discards it.
        obj.edited_since_load = True
        super().save_model(request, obj, form, change)
