"""The database side of lab questions (imported by labs.models, so they belong to the labs app).

- `LabQuestion`: a question file's fields (content/labs/questions), editable in the admin and
  written back by `export_content`;
- `Prediction`: one figure a learner committed to, before a run (source "lab") or in the quiz
  (source "quiz"), graded against what was measured;
- `QuestionSimulation`: a point of a question simulated ahead of time on the lab worker, which the
  quiz grades its asks against. Shared by every learner: it depends only on the question's
  settings (its `key`), so an edited question simulates again.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from config.choices import TextChoices


class LabQuestion(models.Model):
    slug = models.SlugField(max_length=120, unique=True)
    lab = models.SlugField(max_length=40)
    title = models.CharField(max_length=200)
    figure = models.CharField(max_length=40, help_text="labs/questions/figures.py FIGURES key")
    topic = models.SlugField(max_length=60)
    preset = models.CharField(max_length=120, blank=True, help_text="a preset's slug")
    varies = models.CharField(max_length=80, blank=True, help_text="what neighbours vary")
    prompt = models.TextField(blank=True, help_text="Markdown.")
    # JSON as text, not JSONField: PostgreSQL's jsonb reorders keys, and export must not.
    settings_json = models.TextField(help_text="The question's lab settings, as JSON.")
    neighbours_json = models.TextField(help_text="A JSON list of settings, each over settings.")
    is_active = models.BooleanField(default=True)
    edited_since_load = models.BooleanField(
        default=False, help_text="Changed in the admin since content/ was last loaded."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["lab", "slug"]

    def __str__(self) -> str:
        return self.slug

    def data(self) -> dict[str, Any]:
        """The fields as a question file has them (labs.questions.spec.as_data)."""
        return {
            "slug": self.slug,
            "lab": self.lab,
            "title": self.title,
            "figure": self.figure,
            "topic": self.topic,
            "preset": self.preset,
            "varies": self.varies,
            "prompt": self.prompt,
            "settings": json.loads(self.settings_json or "{}"),
            "neighbours": json.loads(self.neighbours_json or "[]"),
        }


class Prediction(models.Model):
    class Source(TextChoices):
        LAB = "lab", "before a run"
        QUIZ = "quiz", "in the quiz"

    class State(TextChoices):
        WAITING = "waiting", "waiting for the run"
        GRADED = "graded", "graded"
        VOID = "void", "not graded"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    question = models.SlugField(max_length=120)
    topic = models.SlugField(max_length=60)
    figure = models.CharField(max_length=40)
    at = models.PositiveSmallIntegerField(default=0, help_text="0: the question's settings")
    changed = models.JSONField(default=dict, blank=True, help_text="what the point changes")
    varies = models.JSONField(null=True, blank=True, help_text="the varied setting's value")
    value = models.FloatField(help_text="the learner's figure, in the figure's unit")
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.LAB)
    state = models.CharField(max_length=8, choices=State.choices, default=State.WAITING)
    run = models.ForeignKey(
        "labs.LabRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    baseline = models.ForeignKey(
        "labs.LabRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    simulation = models.ForeignKey(
        "labs.QuestionSimulation", null=True, blank=True, on_delete=models.SET_NULL
    )
    token = models.CharField(max_length=64, blank=True, help_text="the quiz's ask it answers")
    measured = models.FloatField(null=True, blank=True)
    formulas = models.FloatField(null=True, blank=True)
    band = models.FloatField(null=True, blank=True, help_text="relative")
    band_words = models.CharField(max_length=300, blank=True)
    rating = models.PositiveSmallIntegerField(null=True, blank=True)
    grade_words = models.CharField(max_length=400, blank=True)
    where = models.CharField(max_length=200, blank=True)
    error = models.CharField(max_length=400, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    graded_at = models.DateTimeField(null=True, blank=True)
    # When the grade was handed to the quiz (labs.hooks.prediction_graded): once.
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "state"], name="labs_prediction_owner_state")]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "token"], condition=~Q(token=""), name="labs_prediction_token"
            )
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}: {self.question}@{self.at} = {self.value:g} ({self.state})"


class QuestionSimulation(models.Model):
    class State(TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    question = models.SlugField(max_length=120)
    at = models.PositiveSmallIntegerField()
    key = models.CharField(max_length=64, help_text="hash of the settings simulated")
    params = models.JSONField()
    baseline = models.JSONField(null=True, blank=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    measured = models.FloatField(null=True, blank=True, help_text="in the figure's unit")
    formulas = models.FloatField(null=True, blank=True)
    band = models.FloatField(null=True, blank=True)
    band_words = models.CharField(max_length=300, blank=True)
    where = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    # Whose graded prediction asked for it: its turn on the lab queue is theirs (labs.runs.turns).
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["question", "key"], name="labs_question_sim_key")
        ]

    def __str__(self) -> str:
        return f"{self.question}@{self.at} ({self.state})"
