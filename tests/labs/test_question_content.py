"""Lab questions between content/ and the database: load_content loads them with the deck (a bad
file refuses the whole load, naming file and field), the admin edits them under the same checks,
a load keeps an admin edit until export_content writes it back."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from labs.questions.models import LabQuestion
from quiz.models import Card
from tests.conftest import make_user

CONTENT = Path(settings.BASE_DIR) / "content"
SLUG = "batching-ttft-behind-max-num-seqs"
pytestmark = pytest.mark.django_db


@pytest.fixture
def content(tmp_path):
    root = tmp_path / "content"
    shutil.copytree(CONTENT, root)
    return root


def _load(root: Path, *args: str) -> str:
    out = StringIO()
    call_command("load_content", "--path", str(root), *args, stdout=out)
    return out.getvalue()


def test_load_content_loads_the_questions_with_the_deck(content):
    said = _load(content)
    files = sorted(p.stem for p in (content / "labs" / "questions").glob("*.yaml"))
    assert sorted(LabQuestion.objects.values_list("slug", flat=True)) == files
    assert f"{len(files)} lab questions: {len(files)} created" in said
    assert f"{len(files)} lab questions: 0 created, 0 updated" in _load(content)


def test_a_bad_question_file_refuses_the_load_naming_file_and_field(content):
    path = content / "labs" / "questions" / f"{SLUG}.yaml"
    path.write_text(path.read_text().replace("max_num_seqs: 64", "max_num_seqs: 0"))
    with pytest.raises(CommandError) as caught:
        _load(content)
    assert f"{path}: field 'neighbours[3]' cannot run: max_num_seqs" in str(caught.value)
    # Nothing was written: not the deck, not the questions.
    assert not LabQuestion.objects.exists() and not Card.objects.exists()


def test_an_admin_edit_is_kept_by_a_load_until_exported(content, client):
    _load(content)
    staff = make_user("staff", is_staff=True, is_superuser=True)
    client.force_login(staff)
    row = LabQuestion.objects.get(slug=SLUG)
    url = reverse("admin:labs_labquestion_change", args=[row.pk])
    form = {
        "lab": row.lab,
        "title": "Median TTFT with 64 in flight and max_num_seqs 16",
        "figure": row.figure,
        "topic": row.topic,
        "preset": "",
        "varies": row.varies,
        "prompt": row.prompt,
        "settings_json": row.settings_json,
        "neighbours_json": row.neighbours_json,
        "is_active": "on",
    }
    # A neighbour that cannot run is refused, naming it.
    bad = {**form, "neighbours_json": json.dumps([{"max_num_seqs": 0}])}
    refused = client.post(url, bad)
    assert refused.status_code == 200
    assert "field &#x27;neighbours[1]&#x27; cannot run" in refused.content.decode()
    assert client.post(url, form).status_code == 302
    row.refresh_from_db()
    assert row.edited_since_load and row.title.startswith("Median TTFT with 64 in flight")

    said = _load(content)
    assert f"conflict: question {SLUG}" in said
    assert LabQuestion.objects.get(slug=SLUG).title == row.title

    call_command("export_content", "--path", str(content), stdout=StringIO())
    text = (content / "labs" / "questions" / f"{SLUG}.yaml").read_text()
    assert "title: Median TTFT with 64 in flight and max_num_seqs 16\n" in text
    _load(content)
    assert not LabQuestion.objects.get(slug=SLUG).edited_since_load
    # The other files were written back unchanged.
    for path in (CONTENT / "labs" / "questions").glob("*.yaml"):
        if path.stem != SLUG:
            assert (content / "labs" / "questions" / path.name).read_text() == path.read_text()
