"""Lab questions between content/labs/questions/*.yaml and the database, both ways.

`load_content` reads them with the deck (questions_read, questions_load) and `export_content`
writes them back (questions_export). As for cards (docs/content-format.md): a question saved in
the admin is marked `edited_since_load`, and a load leaves it as it is, reported as a conflict,
until the files agree again (after an export) or the load is forced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction

from labs.parameters.presets import LABS
from labs.questions.models import LabQuestion
from labs.questions.spec import Question, QuestionError, as_data, from_data, load_question
from labs.questions.spec import render_question as render

MIN_PER_LAB = 2


def questions_dir(root: Path) -> Path:
    return root / "labs" / "questions"


def questions_read(root: Path) -> list[Question] | None:
    """Every question file under `root` (the content folder), checked; at least MIN_PER_LAB
    questions for every lab. None when the folder has no labs/questions/ (a deck alone).

    Raises:
        QuestionError: the first bad file or field, named; nothing is written.
    """
    folder = questions_dir(root)
    if not folder.is_dir():
        return None
    questions = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise QuestionError(f"{path}: not UTF-8 text") from None
        questions.append(load_question(text, str(path), expected_slug=path.stem))
    counts = {slug: 0 for slug in LABS}
    for q in questions:
        counts[q.lab] += 1
    short = [(lab, n) for lab, n in counts.items() if n < MIN_PER_LAB]
    if short:
        lab, n = short[0]
        raise QuestionError(
            f"{folder}: the {lab} lab has {n} question{'s' if n != 1 else ''}; every lab needs "
            f"at least {MIN_PER_LAB}"
        )
    return questions


def _values(q: Question) -> dict[str, Any]:
    data = as_data(q)
    return {
        "lab": data["lab"],
        "title": data["title"],
        "figure": data["figure"],
        "topic": data["topic"],
        "preset": data["preset"],
        "varies": data["varies"],
        "prompt": data["prompt"],
        "settings_json": json.dumps(data["settings"], ensure_ascii=False),
        "neighbours_json": json.dumps(data["neighbours"], ensure_ascii=False),
        "is_active": True,
    }


@dataclass
class QuestionsLoaded:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # edited in the admin: left as they are
    overwritten: list[str] = field(default_factory=list)  # the same, replaced (force)


@transaction.atomic
def questions_load(questions: list[Question], *, force: bool = False) -> QuestionsLoaded:
    """Upsert the questions by slug and retire those no file has; a question edited in the admin
    that differs from its file is kept (a conflict) unless `force`. Loading twice writes nothing
    the second time."""
    report = QuestionsLoaded()
    rows = {row.slug: row for row in LabQuestion.objects.all()}
    files = {q.slug for q in questions}
    for q in questions:
        values = _values(q)
        row = rows.get(q.slug)
        if row is None:
            LabQuestion.objects.create(slug=q.slug, **values)
            report.created.append(q.slug)
            continue
        differs = any(getattr(row, k) != v for k, v in values.items())
        if row.edited_since_load and differs and not force:
            report.conflicts.append(q.slug)
            continue
        if row.edited_since_load and differs:
            report.overwritten.append(q.slug)
        if differs or row.edited_since_load:
            for name, value in values.items():
                setattr(row, name, value)
            row.edited_since_load = False
            row.save()
            if differs:
                report.updated.append(q.slug)
    for slug, row in sorted(rows.items()):
        if slug in files or not row.is_active:
            continue
        if row.edited_since_load and not force:
            report.conflicts.append(slug)
            continue
        row.is_active = False
        row.edited_since_load = False
        row.save(update_fields=["is_active", "edited_since_load", "updated_at"])
        report.retired.append(slug)
    return report


def questions_edited() -> list[str]:
    """Slugs of the questions edited in the admin since the last load (a load keeps them)."""
    return list(
        LabQuestion.objects.filter(edited_since_load=True)
        .order_by("slug")
        .values_list("slug", flat=True)
    )


def question_of(row: LabQuestion) -> Question:
    """A row as a checked question (as its file would load).

    Raises:
        QuestionError: the row holds what no file could (it is checked on every admin save).
    """
    return from_data(row.data(), f"question {row.slug}")


def questions_export(root: Path) -> list[Path]:
    """Write every active question to its file, remove retired ones' files. Unchanged files are
    not rewritten. Returns the paths that changed."""
    rows = list(LabQuestion.objects.order_by("slug"))
    if not rows:
        return []  # none loaded: the folder, if any, is not this database's to empty
    folder = questions_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    changed = []
    for row in rows:
        path = folder / f"{row.slug}.yaml"
        if not row.is_active:
            if path.exists():
                path.unlink()
                changed.append(path)
            continue
        text = render(question_of(row))
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed
