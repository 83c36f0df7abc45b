"""Decks, cards and each learner's review state and history.

FSRS state lives in real columns (not a blob), so "what is due for this learner" is one indexed
query.
py-fsrs has no "new" state: a card is new for a learner while `last_review` is NULL.
"""

from __future__ import annotations

import html
import json
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.html import strip_tags
from django.utils.text import Truncator

from config.choices import IntegerChoices, TextChoices
from quiz import numeric

# The deck of personal cards (quiz/personal.py): never written to content/ or exported.
PERSONAL_DECK = "my-runs"


class Deck(models.Model):
    slug = models.SlugField(max_length=80, unique=True)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    # As Card.edited_since_load: load_content keeps the admin's title and description until
    # content/ agrees again (after export_content) or a forced load replaces them.
    edited_since_load = models.BooleanField(
        default=False, help_text="Changed in the admin since content/ was last loaded."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.title


def personal_deck() -> Deck:
    """The deck of every learner's own cards (made from lab questions; quiz/personal.py makes
    its own, from runs, the same way)."""
    deck, _ = Deck.objects.get_or_create(
        slug=PERSONAL_DECK,
        defaults={"title": "Your runs", "description": "Cards made from your own lab runs."},
    )
    return deck


class Tag(models.Model):
    slug = models.SlugField(max_length=60, unique=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


TITLE_CHARS = 90


def card_title(prompt: str) -> str:
    """A prompt's first non-empty line, Markdown marks and tags dropped, cut at a word."""
    from quiz.templatetags.quiz_tags import render_markdown

    line = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "")
    text = strip_tags(render_markdown(line)) if line else ""
    text = " ".join(html.unescape(text).split())
    return Truncator(text).chars(TITLE_CHARS, truncate="\u2026")


class Card(models.Model):
    class Kind(TextChoices):
        CHOICE = "choice", "Multiple choice"
        NUMERIC = "numeric", "Numeric"
        RECALL = "recall", "Recall"
        # A lab question a learner predicted before a run (quiz/lab_questions.py): asked again
        # at a neighbouring setting. Only ever a personal card, made by the quiz.
        PREDICTION = "prediction", "Prediction"

    deck = models.ForeignKey(Deck, on_delete=models.PROTECT, related_name="cards")
    slug = models.SlugField(max_length=120, unique=True)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    prompt = models.TextField(help_text="Markdown.")
    answer = models.TextField(help_text="Markdown: the short answer, one or two lines.")
    steps = models.JSONField(
        default=list, blank=True, help_text="Worked steps: a list of Markdown."
    )
    explanation = models.TextField(blank=True, help_text="Markdown.")
    follow_up_question = models.TextField(blank=True)
    follow_up_answer = models.TextField(blank=True)
    # Ordered through models: the files list tags and related cards in the author's order, and
    # export must write them back in that order so a round trip leaves no diff.
    tags = models.ManyToManyField(Tag, through="CardTag", related_name="cards", blank=True)
    related = models.ManyToManyField(
        "self",
        through="CardRelation",
        through_fields=("from_card", "to_card"),
        symmetrical=True,
        blank=True,
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="follow_ups"
    )
    numeric_value = models.FloatField(null=True, blank=True)
    numeric_unit = models.CharField(max_length=30, blank=True)
    numeric_tolerance = models.FloatField(null=True, blank=True, help_text="Absolute, in the unit.")
    # JSON as text, not JSONField: PostgreSQL's jsonb reorders keys, and export must not.
    check_json = models.TextField(blank=True, help_text="The predictor check, as JSON.")
    lab_preset = models.CharField(max_length=120, blank=True, help_text="A preset's slug.")
    source = models.CharField(max_length=200, blank=True)
    is_active = models.BooleanField(default=True, help_text="Retired cards keep their history.")
    # A personal card (made from the learner's own lab run): only its owner studies it, and it
    # never enters the shared deck's files (its owner's Anki download adds it). NULL: a card of
    # the shared deck.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="personal_cards",
    )
    # Set by an admin save; load_content clears it once content/ agrees with the database again
    # (after export_content), and never overwrites or retires such a card unless forced.
    edited_since_load = models.BooleanField(
        default=False, help_text="Changed in the admin since content/ was last loaded."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(numeric_tolerance__isnull=True) | Q(numeric_tolerance__gte=0),
                name="quiz_card_tolerance_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def title(self) -> str:
        """The prompt's first line as plain text, short enough for a list of cards."""
        return card_title(self.prompt)

    @property
    def check_spec(self) -> dict[str, Any] | None:
        return json.loads(self.check_json) if self.check_json else None

    def numeric_accepts(self, value: float) -> bool:
        return numeric.answer_accepted(
            value, self.numeric_value, self.numeric_tolerance, self.prompt, self.answer
        )

    @property
    def tolerance_text(self) -> str:
        """How close an answer must be, as pages say it: '±0.5 KiB', '±5 %' (quiz/numeric.py)."""
        return numeric.tolerance_text(
            self.numeric_value,
            self.numeric_tolerance,
            self.prompt,
            self.numeric_unit,
            self.answer,
        )


class CardTag(models.Model):
    card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="card_tags")
    tag = models.ForeignKey(Tag, on_delete=models.CASCADE, related_name="card_tags")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["card", "position", "id"]
        constraints = [models.UniqueConstraint(fields=["card", "tag"], name="quiz_cardtag_unique")]

    def __str__(self) -> str:
        return f"{self.card_id}:{self.tag_id}"


class CardRelation(models.Model):
    from_card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="relations_out")
    to_card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="relations_in")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["from_card", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["from_card", "to_card"], name="quiz_relation_unique"),
            models.CheckConstraint(
                condition=~Q(from_card=models.F("to_card")), name="quiz_relation_not_self"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.from_card_id}->{self.to_card_id}"


class ChoiceOption(models.Model):
    card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="options")
    text = models.TextField(help_text="Markdown.")
    is_correct = models.BooleanField(default=False)
    why = models.TextField(blank=True, help_text="Why this option is wrong (Markdown).")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["card", "position", "id"]

    def __str__(self) -> str:
        return self.text[:60]


class FsrsState(IntegerChoices):
    # The values are fsrs.State's, so they can be passed straight to the scheduler.
    LEARNING = 1, "Learning"
    REVIEW = 2, "Review"
    RELEARNING = 3, "Relearning"


class ReviewState(models.Model):
    """One learner's FSRS state for one card. Created (as new) the first time the card is shown."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="review_states"
    )
    card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="review_states")
    state = models.PositiveSmallIntegerField(choices=FsrsState.choices, default=FsrsState.LEARNING)
    step = models.PositiveSmallIntegerField(null=True, blank=True, default=0)
    stability = models.FloatField(null=True, blank=True)
    difficulty = models.FloatField(null=True, blank=True)
    due = models.DateTimeField()
    last_review = models.DateTimeField(null=True, blank=True)
    lapses = models.PositiveIntegerField(default=0)
    reps = models.PositiveIntegerField(default=0)
    suspended = models.BooleanField(default=False)
    leech = models.BooleanField(
        default=False, help_text="Lapsed too often; tagged for this learner."
    )
    # Optimistic lock: every write bumps it, a grade computed from an older version is refused.
    version = models.PositiveIntegerField(default=0)

    class Changed(Exception):
        """The row's version moved on since this copy was read (a grade, undo or staff edit)."""

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "card"], name="quiz_reviewstate_user_card"),
        ]
        indexes = [models.Index(fields=["user", "due"], name="quiz_state_user_due")]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.card_id} {self.get_state_display()}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Every write bumps the version, an admin's included: a showing made before a staff edit
        (or a suspension) can no longer be graded, and an edit made from a copy that is out of
        date (the learner graded meanwhile) raises Changed instead of overwriting the grade."""
        if self._state.adding or kwargs.get("force_insert"):
            super().save(*args, **kwargs)
            return
        expected = self.version
        values = {
            f.attname: getattr(self, f.attname)
            for f in self._meta.concrete_fields
            if not f.primary_key and f.name != "version"
        }
        updated = ReviewState.objects.filter(pk=self.pk, version=expected).update(
            **values, version=expected + 1
        )
        if updated != 1:
            raise ReviewState.Changed(
                "This review state changed since it was read (the learner graded or undid it)."
            )
        self.version = expected + 1

    @property
    def is_new(self) -> bool:
        return self.last_review is None


class ReviewLog(models.Model):
    class Kind(IntegerChoices):
        # The state before the review (Anki revlog "type"); NEW counts against the new-card limit.
        NEW = 0, "New"
        LEARNING = 1, "Learning"
        REVIEW = 2, "Review"
        RELEARNING = 3, "Relearning"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="review_logs"
    )
    card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="review_logs")
    rating = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(4)]
    )
    kind = models.PositiveSmallIntegerField(choices=Kind.choices)
    reviewed_at = models.DateTimeField()
    # The learner's local date after the rollover, fixed at write time: DST or travel later
    # must not move a review to another day.
    study_date = models.DateField()
    duration_ms = models.PositiveIntegerField()
    answer = models.TextField(blank=True)
    correct = models.BooleanField(null=True)
    state_before = models.JSONField()
    token = models.CharField(max_length=64, unique=True)
    # What the outcome was computed with (scheduling.Context), so replay needs nothing else: the
    # learner's zone and rollover then, the desired retention, and the FSRS parameters in force
    # (NULL: fsrs's defaults).
    time_zone = models.CharField(max_length=64, default="UTC")
    rollover_hour = models.PositiveSmallIntegerField(default=4)
    desired_retention = models.FloatField(default=0.9)
    parameters = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-reviewed_at", "-id"]
        indexes = [
            models.Index(fields=["user", "study_date"], name="quiz_log_user_day"),
            models.Index(fields=["user", "-reviewed_at"], name="quiz_log_user_latest"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(rating__gte=1, rating__lte=4), name="quiz_log_rating_1_4"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.card_id} {self.rating} @ {self.reviewed_at:%Y-%m-%d %H:%M}"


class LearnerSettings(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quiz_settings"
    )
    time_zone = models.CharField(max_length=64, default="UTC", help_text="IANA zone.")
    rollover_hour = models.PositiveSmallIntegerField(
        default=4,
        validators=[MaxValueValidator(23)],
        help_text="The hour (local time) at which a new study day starts.",
    )
    new_per_day = models.PositiveSmallIntegerField(
        default=20, validators=[MaxValueValidator(999)], help_text="New cards a day."
    )
    reviews_per_day = models.PositiveSmallIntegerField(
        default=200, validators=[MaxValueValidator(9999)], help_text="Reviews a day."
    )
    desired_retention = models.FloatField(
        default=0.9,
        validators=[MinValueValidator(0.70), MaxValueValidator(0.97)],
        help_text="0.70 to 0.97; higher means more reviews.",
    )

    # FSRS parameters fitted to this learner's reviews (quiz/optimizer.py); NULL: fsrs's defaults.
    # The ones they replaced are kept so the learner can go back.
    fsrs_parameters = models.JSONField(null=True, blank=True)
    previous_parameters = models.JSONField(null=True, blank=True)
    parameters_changed_at = models.DateTimeField(null=True, blank=True)
    # The study day the learner was on when a change of zone or rollover hour would have put
    # them back on the day before: their day stays this one until the new settings reach it
    # (scheduling.Context.day_floor). Past dates mean nothing.
    day_floor = models.DateField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "learner settings"
        constraints = [
            models.CheckConstraint(
                condition=Q(desired_retention__gte=0.70, desired_retention__lte=0.97),
                name="quiz_settings_retention_range",
            ),
            models.CheckConstraint(
                condition=Q(rollover_hour__lte=23), name="quiz_settings_rollover_range"
            ),
        ]

    def __str__(self) -> str:
        return f"settings of {self.user_id}"


class Showing(models.Model):
    """One presentation of a card to a learner, named by a one-time token.

    The four outcomes are computed once, with the real (fuzzed) scheduler, when the answer is shown;
    grading applies the stored one, so each button's interval is exactly what happens.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="showings"
    )
    card = models.ForeignKey(Card, on_delete=models.CASCADE, related_name="showings")
    token = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    state_version = models.PositiveIntegerField()
    option_order = models.JSONField(default=list, blank=True)
    revealed_at = models.DateTimeField(null=True, blank=True)
    answer = models.TextField(blank=True)
    correct = models.BooleanField(null=True)
    outcomes = models.JSONField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "card", "used_at"], name="quiz_showing_open")]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.card_id} {self.token[:6]}"


class PersonalCardRequest(models.Model):
    """ "Make a card from this", in flight on the lab worker (quiz/personal.py).

    Making the card simulates the neighbouring setting, so it never runs in a web process: the
    row is the learner's lock (one in flight at a time, enforced by the database) and the page's
    progress; the worker fills in the card or the reason it could not be made."""

    class State(TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    IN_FLIGHT = (State.QUEUED, State.RUNNING)

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="card_requests"
    )
    run = models.ForeignKey("labs.LabRun", on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    card = models.ForeignKey(Card, null=True, blank=True, on_delete=models.SET_NULL)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When a worker claimed it: a request waits its turn on the lab queue for as long as the
    # learners before it take, and only the time since it started says its worker was lost.
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner"],
                condition=Q(state__in=["queued", "running"]),
                name="quiz_one_card_request_in_flight",
            ),
        ]

    def __str__(self) -> str:
        return f"card from run {self.run_id} for {self.owner_id}: {self.state}"

    @property
    def in_flight(self) -> bool:
        return self.state in self.IN_FLIGHT


class ParameterFit(models.Model):
    """One run of "Optimize my parameters": queued, running (with progress), then done or failed.
    The figures compare the fitted parameters with the ones in force, on the reviews the fit saw
    and on the latest ones, held out (quiz.optimizer)."""

    class Status(TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="parameter_fits"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    progress = models.PositiveSmallIntegerField(default=0, help_text="Percent.")
    stage = models.CharField(max_length=120, blank=True)
    created_at = models.DateTimeField()
    # When a worker took it, and when that worker last said it was still fitting (every
    # QUIZ_FIT_HEARTBEAT_S): a running fit silent for QUIZ_FIT_STALE_S lost its worker.
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    reviews = models.PositiveIntegerField(default=0)
    parameters = models.JSONField(null=True, blank=True)
    # {"training": {"current": {...}, "fitted": {...}}, "held_out": {...}, "held_out_reviews",
    # "wins", "workload"}, each figure log_loss and rmse; the interval table.
    evaluation = models.JSONField(null=True, blank=True)
    intervals = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"fit {self.pk} of {self.user_id}: {self.status}"


class PredictionAsk(models.Model):
    """What one showing of a lab-question card asks (quiz/lab_questions.py): the point, the
    figure it is graded against and its band, as labs.api gave them when the card was shown, so
    the answer is graded against what the learner saw. Then the learner's figure and its grade."""

    showing = models.OneToOneField(Showing, on_delete=models.CASCADE, related_name="ask")
    question = models.SlugField(max_length=120)
    asked = models.JSONField(help_text="labs.api.question_ask's plain data")
    value = models.FloatField(null=True, blank=True)
    rating = models.PositiveSmallIntegerField(null=True, blank=True)
    grade_words = models.CharField(max_length=400, blank=True)

    def __str__(self) -> str:
        return f"{self.question} in showing {self.showing_id}"
