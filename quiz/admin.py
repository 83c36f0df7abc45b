"""Staff edit decks and cards here; `manage.py export_content` writes the edits back to content/."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.safestring import SafeString

from config.admin_delete import BoundedDeleteMixin
from quiz import documents
from quiz.admin_forms import (
    MAX_OPTIONS,
    CardAdminForm,
    ChoiceOptionForm,
    ChoiceOptionFormSet,
    DeckAdminForm,
    SafeAutocompleteMixin,
)
from quiz.models import (
    PERSONAL_DECK,
    Card,
    CardRelation,
    CardTag,
    ChoiceOption,
    Deck,
    LearnerSettings,
    ReviewLog,
    ReviewState,
    Tag,
)


def _slug_fixed_once_saved(readonly: list[str], obj: Deck | Card | None) -> list[str]:
    """A saved deck's or card's slug is its name in content/ (the file load_content upserts by),
    so it is not edited here: a slug renamed in the admin would come back from the files as a
    second deck or card on the next load. Rename it in content/ instead."""
    return readonly if obj is None else ["slug", *readonly]


@admin.register(Deck)
class DeckAdmin(BoundedDeleteMixin, admin.ModelAdmin):
    form = DeckAdminForm
    list_display = ["slug", "title", "active_cards", "edited_since_load", "updated_at"]
    list_filter = ["edited_since_load"]
    search_fields = ["slug", "title"]
    readonly_fields = ["edited_since_load", "created_at", "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Deck | None = None) -> list[str]:
        return _slug_fixed_once_saved(self.readonly_fields, obj)

    def save_model(self, request: HttpRequest, obj: Deck, form, change: bool) -> None:
        # As for cards: load_content keeps the edit (and reports it) until it is exported or
        # discarded with --force. The learners' own-runs deck is not in content/.
        obj.edited_since_load = obj.slug != PERSONAL_DECK
        super().save_model(request, obj, form, change)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Deck]:
        active = Count("cards", filter=Q(cards__is_active=True))
        return super().get_queryset(request).annotate(_active=active)

    @admin.display(description="cards", ordering="_active")
    def active_cards(self, deck: Deck) -> int:
        return deck._active


@admin.register(Tag)
class TagAdmin(BoundedDeleteMixin, admin.ModelAdmin):
    search_fields = ["slug"]
    list_display = ["slug"]


class ChoiceOptionInline(admin.TabularInline):
    model = ChoiceOption
    form = ChoiceOptionForm
    formset = ChoiceOptionFormSet
    extra = 0
    max_num = MAX_OPTIONS
    fields = ["position", "text", "is_correct", "why"]
    ordering = ["position", "id"]


class CardTagInline(SafeAutocompleteMixin, admin.TabularInline):
    model = CardTag
    extra = 0
    fields = ["position", "tag"]
    autocomplete_fields = ["tag"]
    verbose_name = "tag"


class CardRelationInline(SafeAutocompleteMixin, admin.TabularInline):
    model = CardRelation
    fk_name = "from_card"
    extra = 0
    fields = ["position", "to_card"]
    autocomplete_fields = ["to_card"]
    verbose_name = "related card"
    verbose_name_plural = "related cards (load_content links them both ways)"


class ImportDocumentForm(forms.Form):
    deck = forms.ModelChoiceField(
        queryset=Deck.objects.exclude(slug=PERSONAL_DECK), empty_label=None
    )
    document = forms.FileField(help_text="A .txt file in the seeds' format, UTF-8, up to 1 MB.")


@admin.register(Card)
class CardAdmin(SafeAutocompleteMixin, BoundedDeleteMixin, admin.ModelAdmin):
    change_list_template = "admin/quiz/card/change_list.html"
    form = CardAdminForm
    list_display = [
        "slug",
        "deck",
        "kind",
        "tag_list",
        "lab_preset",
        "is_active",
        "edited_since_load",
        "updated_at",
    ]
    list_filter = ["deck", "kind", "tags", "is_active", "edited_since_load"]
    search_fields = ["slug", "prompt", "answer", "source"]
    list_select_related = ["deck"]
    readonly_fields = ["preview", "edited_since_load", "created_at", "updated_at"]
    autocomplete_fields = ["parent"]
    inlines = [ChoiceOptionInline, CardTagInline, CardRelationInline]
    fieldsets = [
        (None, {"fields": ["slug", "deck", "kind", "is_active", "source", "parent"]}),
        ("Question and answer", {"fields": ["prompt", "answer", "steps", "explanation"]}),
        ("Follow-up", {"fields": ["follow_up_question", "follow_up_answer"]}),
        ("Numeric", {"fields": ["numeric_value", "numeric_unit", "numeric_tolerance"]}),
        ("Links", {"fields": ["lab_preset", "check_json"]}),
        ("Preview (as saved)", {"fields": ["preview"]}),
        (None, {"fields": ["edited_since_load", "created_at", "updated_at"]}),
    ]

    actions = ["publish_drafts"]

    def get_readonly_fields(self, request: HttpRequest, obj: Card | None = None) -> list[str]:
        # An imported draft is in no file yet: staff may name it before publishing it.
        if obj is not None and documents.is_draft(obj):
            return list(self.readonly_fields)
        return _slug_fixed_once_saved(self.readonly_fields, obj)

    @admin.action(description="Publish selected drafts (a real slug from the prompt, active)")
    def publish_drafts(self, request: HttpRequest, queryset: QuerySet[Card]) -> None:
        cards = list(queryset.order_by("pk"))
        try:
            documents.publish_drafts(cards)
        except documents.PublishRefused as exc:
            self.message_user(request, f"Nothing was published. {exc}", messages.ERROR)
            return
        names = ", ".join(card.slug for card in cards)
        self.message_user(
            request,
            f"Published {len(cards)} card(s): {names}. Run export_content to write them to "
            "content/.",
            messages.SUCCESS,
        )

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # After the inlines, so an options-only edit counts too. load_content keeps this card
        # (and reports it) until the edit is exported or discarded with --force.
        # Personal cards are not in content/, so there is nothing to protect them from.
        Card.objects.filter(pk=form.instance.pk, owner__isnull=True).update(edited_since_load=True)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Card]:
        return super().get_queryset(request).prefetch_related("card_tags__tag")

    def get_urls(self) -> list:
        view = self.admin_site.admin_view(self.import_document)
        url = path("import-document/", view, name="quiz_card_import_document")
        return [url, *super().get_urls()]

    def import_document(self, request: HttpRequest) -> HttpResponse:
        """Upload a study document; its questions become inactive drafts (all or nothing)."""
        if not self.has_add_permission(request):
            return redirect("admin:quiz_card_changelist")
        form = ImportDocumentForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["document"]
            try:
                text = documents.decode_upload(upload)
                cards = documents.document_import(
                    deck=form.cleaned_data["deck"], name=upload.name, text=text
                )
            except documents.DocumentError as exc:
                form.add_error("document", f"{upload.name}, {exc}. Nothing was imported.")
            else:
                messages.success(
                    request, f"{len(cards)} draft cards from {upload.name}: review, then publish."
                )
                return redirect(reverse("admin:quiz_card_changelist") + "?is_active__exact=0")
        context = {**self.admin_site.each_context(request), "form": form, "title": "Import"}
        status = 400 if form.errors else 200
        return render(request, "admin/quiz/card/import_document.html", context, status=status)

    @admin.display(description="tags")
    def tag_list(self, card: Card) -> str:
        return ", ".join(ct.tag.slug for ct in card.card_tags.all())

    @admin.display(description="rendered")
    def preview(self, card: Card) -> SafeString:
        if card.pk is None:
            return SafeString("Save the card to see it rendered.")
        return SafeString(render_to_string("quiz/_card_preview.html", {"card": card}))


class ReviewStateForm(forms.ModelForm):
    """Carries the version the staff member saw: saving over a grade made since is refused
    (ReviewState.save bumps the version and checks it), so a showing open before the edit (or
    a suspension) can no longer be graded either."""

    class Meta:
        model = ReviewState
        fields = [
            "user",
            "card",
            "state",
            "step",
            "stability",
            "difficulty",
            "due",
            "last_review",
            "lapses",
            "reps",
            "suspended",
            "leech",
            "version",
        ]
        widgets = {"version": forms.HiddenInput}

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.instance.pk is not None:
            now = ReviewState.objects.filter(pk=self.instance.pk).values_list("version", flat=True)
            if cleaned.get("version") != now.first():
                raise forms.ValidationError(
                    "The learner graded or undid this card since you opened it: reload the page"
                    " to edit the current state."
                )
        return cleaned


@admin.register(ReviewState)
class ReviewStateAdmin(BoundedDeleteMixin, admin.ModelAdmin):
    form = ReviewStateForm
    list_display = ["user", "card", "state", "due", "stability", "lapses", "suspended", "leech"]
    list_filter = ["state", "suspended", "leech"]
    search_fields = ["user__username", "card__slug"]
    list_select_related = ["user", "card"]
    raw_id_fields = ["user", "card"]

    def save_model(
        self, request: HttpRequest, obj: ReviewState, form: forms.ModelForm, change: bool
    ) -> None:
        # A save that changes nothing writes nothing: the form's times drop the microseconds
        # (so saving would change them), and any write invalidates the learner's open card.
        if change and not form.has_changed():
            return
        super().save_model(request, obj, form, change)


@admin.register(ReviewLog)
class ReviewLogAdmin(BoundedDeleteMixin, admin.ModelAdmin):
    list_display = ["reviewed_at", "user", "card", "rating", "kind", "correct", "duration_ms"]
    list_filter = ["rating", "kind", "correct"]
    search_fields = ["user__username", "card__slug"]
    list_select_related = ["user", "card"]
    date_hierarchy = "reviewed_at"

    # The history is evidence for scheduling and stats: read it, do not edit it here.
    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(LearnerSettings)
class LearnerSettingsAdmin(BoundedDeleteMixin, admin.ModelAdmin):
    list_display = ["user", "time_zone", "rollover_hour", "new_per_day", "reviews_per_day"]
    search_fields = ["user__username"]
    raw_id_fields = ["user"]
