"""A lab question as a file (content/labs/questions/<slug>.yaml): parse and check it, resolve the
settings of each point it asks about, and write it back byte for byte.

Every point a question asks (its own settings, each neighbour, and for a ratio each one's baseline)
must be a run the lab accepts (labs.parameters.params) and small enough to simulate ahead of time
on the lab worker (labs.prediction.sizing.sim_steps): a bad file is refused, naming the file and
the field. No ORM.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from labs.parameters.params import (
    FIELDS_BY_NAME,
    ParamError,
    align_run_batch,
    follow_unshown,
    parse_lab_params,
)
from labs.parameters.presets import LABS, Lab, lab_initial, load_presets
from labs.prediction.sizing import sim_steps
from labs.questions.figures import FIGURES, Figure

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
KEYS = (
    "slug",
    "lab",
    "title",
    "figure",
    "topic",
    "preset",
    "varies",
    "prompt",
    "settings",
    "neighbours",
)
# One simulation of a point must stay well inside a lab worker's turn: at under 10 microseconds
# a simulated step (labs.prediction.sizing.sim_steps), this is about 5 s of one core.
MAX_SIM_STEPS = 500_000
MAX_NEIGHBOURS = 6


class QuestionError(ValueError):
    """One bad file or field; the message names both."""


@dataclass(frozen=True)
class Question:
    slug: str
    lab: str
    title: str  # "Output tok/s at max_num_seqs 8 as a multiple of batch 1"
    figure: str  # a key of FIGURES
    topic: str  # a deck topic tag: the instincts page groups by it
    settings: Mapping[str, Any]  # lab parameters over the lab's (and the preset's) numbers
    neighbours: tuple[Mapping[str, Any], ...]  # each over `settings`: what the quiz asks next
    prompt: str = ""  # Markdown: what to think about before answering
    preset: str = ""  # a preset whose page offers this question
    varies: str = ""  # what the neighbours vary, in words ("batch"), for the instincts page
    points: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)

    @property
    def the_figure(self) -> Figure:
        return FIGURES[self.figure]

    @property
    def the_lab(self) -> Lab:
        return LABS[self.lab]

    @property
    def paragraphs(self) -> list[str]:
        """The prompt's paragraphs, each with its wrapped lines joined (the file wraps them)."""
        return [" ".join(p.split()) for p in self.prompt.split("\n\n") if p.strip()]

    def given(self, at: int) -> dict[str, Any]:
        """The settings written for point `at` (0: the question's, i: neighbour i)."""
        if not 0 <= at <= len(self.neighbours):
            raise IndexError(f"question {self.slug} has no point {at}")
        return {**self.settings, **(self.neighbours[at - 1] if at else {})}

    def changed(self, at: int) -> dict[str, Any]:
        """What point `at` sets differently from the question's own settings."""
        return dict(self.neighbours[at - 1]) if at else {}


def _resolve(lab: Lab, preset: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The full settings a run at `given` uses, as the lab page would submit them."""
    base = load_presets().get(preset) if preset else None
    given = dict(given)
    if "concurrency" in given:
        # A point that sets the batch sets what the run keeps in flight with it, whatever a
        # preset it starts from keeps (labs.parameters.params.align_run_batch).
        given.setdefault("max_concurrency", given["concurrency"])
    values = align_run_batch(lab_initial(lab, base, given))
    return parse_lab_params(follow_unshown(values, {*lab.fields, "sim_profile"})).as_dict()


def point_params(question: Question, at: int) -> dict[str, Any]:
    """The run's settings at point `at` (every parameter, as a run stores them).

    Raises:
        ParamError: the point cannot run (a file checked at load never raises this).
    """
    return _resolve(question.the_lab, question.preset, question.given(at))


def baseline_params(question: Question, at: int) -> dict[str, Any] | None:
    """The baseline run's settings for a ratio figure at point `at`; None for other figures."""
    check = question.the_figure.ratio
    if check is None:
        return None
    given = {**question.given(at), **check.baseline, **check.quick}
    return _resolve(question.the_lab, question.preset, given)


# --- Reading -------------------------------------------------------------------------------------


def _text(data: Mapping[str, Any], key: str, label: str, *, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise QuestionError(f"{label}: field '{key}' is required")
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise QuestionError(f"{label}: field '{key}' must be non-empty text, got {value!r}")
    return value


def _slug(value: Any, label: str, key: str) -> str:
    if not isinstance(value, str) or not SLUG_RE.match(value):
        raise QuestionError(
            f"{label}: field '{key}' must be a slug (lowercase letters, digits, hyphens), "
            f"got {value!r}"
        )
    return value


def _settings(value: Any, label: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise QuestionError(f"{label}: field '{key}' must be a mapping of lab settings")
    for name, setting in value.items():
        if name not in FIELDS_BY_NAME:
            raise QuestionError(
                f"{label}: field '{key}.{name}' is not a lab setting (see labs.parameters.params)"
            )
        if isinstance(setting, dict | list):
            raise QuestionError(f"{label}: field '{key}.{name}' must be a single value")
    return dict(value)


def _check_point(question: Question, at: int, label: str) -> dict[str, Any]:
    where = "settings" if at == 0 else f"neighbours[{at}]"
    runs: list[tuple[str, Callable[[], dict[str, Any] | None]]] = [
        ("", lambda: point_params(question, at))
    ]
    if question.the_figure.ratio is not None:
        runs.append((" (its baseline run)", lambda: baseline_params(question, at)))
    params: dict[str, Any] = {}
    for what, resolve in runs:
        try:
            resolved = resolve()
        except ParamError as exc:
            raise QuestionError(f"{label}: field '{where}'{what} cannot run: {exc}") from None
        assert resolved is not None
        steps = sim_steps(parse_lab_params(resolved))
        if steps > MAX_SIM_STEPS:
            raise QuestionError(
                f"{label}: field '{where}'{what} is too large to simulate ahead of time: up to "
                f"{steps:,} simulated steps, at most {MAX_SIM_STEPS:,}; lower num_prompts or "
                "output_tokens"
            )
        params = params or resolved
    check = question.the_figure.ratio
    if check is not None and all(params.get(k) == v for k, v in check.baseline.items()):
        raise QuestionError(
            f"{label}: field '{where}' is its own baseline ({check.baseline_label}): "
            "the ratio would always be 1"
        )
    return params


def parse_question(data: Any, label: str, *, expected_slug: str | None = None) -> Question:
    """Validate one question file's data; raise QuestionError naming the file and the field."""
    if not isinstance(data, dict):
        raise QuestionError(f"{label}: a question file must be a YAML mapping")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise QuestionError(f"{label}: unknown field '{unknown[0]}' (allowed: {', '.join(KEYS)})")
    slug = _slug(data.get("slug"), label, "slug")
    if expected_slug is not None and slug != expected_slug:
        raise QuestionError(
            f"{label}: field 'slug' is {slug!r} but the file name says {expected_slug!r}"
        )
    lab = data.get("lab")
    if lab not in LABS:
        raise QuestionError(f"{label}: field 'lab' must be one of {', '.join(LABS)}, got {lab!r}")
    figure = data.get("figure")
    if figure not in FIGURES:
        raise QuestionError(
            f"{label}: field 'figure' must be one of {', '.join(FIGURES)}, got {figure!r}"
        )
    preset = data.get("preset") or ""
    if preset:
        found = load_presets().get(preset)
        if found is None or found.lab != lab:
            raise QuestionError(
                f"{label}: field 'preset' must name a preset of the {lab} lab in "
                f"labs/presets.yaml, got {preset!r}"
            )
    neighbours = data.get("neighbours")
    if not isinstance(neighbours, list) or not 1 <= len(neighbours) <= MAX_NEIGHBOURS:
        raise QuestionError(
            f"{label}: field 'neighbours' must list 1 to {MAX_NEIGHBOURS} mappings of lab "
            "settings (each over 'settings')"
        )
    question = Question(
        slug=slug,
        lab=lab,
        title=_text(data, "title", label, required=True),
        figure=figure,
        topic=_slug(data.get("topic"), label, "topic"),
        settings=_settings(data.get("settings"), label, "settings"),
        neighbours=tuple(
            _settings(n, label, f"neighbours[{i}]") for i, n in enumerate(neighbours, start=1)
        ),
        prompt=_text(data, "prompt", label),
        preset=preset,
        varies=_text(data, "varies", label),
    )
    points = [_check_point(question, at, label) for at in range(len(question.neighbours) + 1)]
    for at, params in enumerate(points[1:], start=1):
        if params == points[0] or params in points[1:at]:
            raise QuestionError(
                f"{label}: field 'neighbours[{at}]' asks a setting already asked; a neighbour "
                "must change a number"
            )
    return Question(**{**question.__dict__, "points": tuple(points)})


def load_question(text: str, label: str, *, expected_slug: str | None = None) -> Question:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise QuestionError(f"{label}: not valid YAML{where}") from None
    return parse_question(data, label, expected_slug=expected_slug)


# --- Writing -------------------------------------------------------------------------------------


def _scalar(value: Any, *, flow: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and math.isfinite(value) else repr(value)
    text = str(value)
    probe, wanted = (
        (f"k: {{a: {text}}}", {"k": {"a": text}}) if flow else (f"k: {text}", {"k": text})
    )
    try:
        plain = yaml.safe_load(probe) == wanted
    except yaml.YAMLError:
        plain = False
    return text if plain and text == text.strip() and text else json.dumps(text, ensure_ascii=False)


def _flow(mapping: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {_scalar(v, flow=True)}" for k, v in mapping.items()) + "}"


def _block(text: str) -> str:
    body = text.rstrip("\n")
    chomp = "-" if text == body else ("" if text == body + "\n" else "+")
    lines = [f"  {line}" if line else "" for line in body.split("\n")]
    return f"|{chomp}\n" + "\n".join(lines) + ("\n" * max(len(text) - len(body) - 1, 0))


def render_question(q: Question) -> str:
    """The question file, keys in the documented order; optional fields only when set."""
    out = [f"slug: {q.slug}", f"lab: {q.lab}", f"title: {_scalar(q.title)}"]
    out += [f"figure: {q.figure}", f"topic: {q.topic}"]
    if q.preset:
        out.append(f"preset: {q.preset}")
    if q.varies:
        out.append(f"varies: {_scalar(q.varies)}")
    if q.prompt:
        out.append(
            f"prompt: {_block(q.prompt)}" if "\n" in q.prompt else f"prompt: {_scalar(q.prompt)}"
        )
    out.append("settings:")
    out += [f"  {k}: {_scalar(v)}" for k, v in q.settings.items()]
    out.append("neighbours:")
    out += [f"  - {_flow(n)}" for n in q.neighbours]
    return "\n".join(out) + "\n"


def as_data(q: Question) -> dict[str, Any]:
    """The file's fields as plain data (what the database row stores)."""
    return {
        "slug": q.slug,
        "lab": q.lab,
        "title": q.title,
        "figure": q.figure,
        "topic": q.topic,
        "preset": q.preset,
        "varies": q.varies,
        "prompt": q.prompt,
        "settings": dict(q.settings),
        "neighbours": [dict(n) for n in q.neighbours],
    }


def from_data(data: Mapping[str, Any], label: str) -> Question:
    """`as_data` read back and checked as a file is."""
    clean = {k: v for k, v in data.items() if v not in ("", None) or k in ("settings",)}
    return parse_question(clean, label)


def setting_words(changed: Mapping[str, Any]) -> str:
    """'concurrency 128, max_concurrency 128' for the settings a point changes."""
    return ", ".join(f"{k} {_scalar(v)}" for k, v in changed.items())


def shown_settings(question: Question, params: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The lab's shown settings of a point, for a page that states what the run will use."""
    return [(name, params.get(name)) for name in question.the_lab.fields]


def questions_by_lab(questions: Sequence[Question]) -> dict[str, list[Question]]:
    found: dict[str, list[Question]] = {slug: [] for slug in LABS}
    for q in questions:
        found.setdefault(q.lab, []).append(q)
    return found
