"""The deck as an Anki package: opened and imported by Anki's own Python library (`anki`)."""

from __future__ import annotations

import datetime as dt
import io
import sqlite3
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from quiz.anki import FIELDS, numeric_text
from quiz.models import Card, Deck
from quiz.selectors import content_snapshot
from quiz.templatetags.quiz_tags import unit_symbol
from tests.quiz.factories import make_card


@pytest.fixture
def anki_collection():
    # Skipped only where Anki's library cannot be installed; the dev extra installs it.
    return pytest.importorskip(
        "anki.collection", reason="the anki package is not installed (pip install anki)"
    )


@pytest.fixture
def deck(db, anki_collection):
    call_command("load_content", stdout=io.StringIO())
    return content_snapshot()[0]


def _export(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    call_command("export_anki", "--out", str(out), stdout=io.StringIO())
    return out


def _import(collection_path: Path, apkg: Path):
    from anki.collection import Collection, ImportAnkiPackageOptions, ImportAnkiPackageRequest

    col = Collection(str(collection_path))
    # Anki's defaults: update a note (same GUID) when the incoming one is newer.
    options = ImportAnkiPackageOptions(with_scheduling=False)
    col.import_anki_package(ImportAnkiPackageRequest(package_path=str(apkg), options=options))
    return col


def _notes_by_slug(col) -> dict[str, object]:
    notes = {}
    for note_id in col.find_notes(""):
        note = col.get_note(note_id)
        notes[note["Slug"]] = note
    return notes


def _package_note_ids(apkg: Path) -> dict[str, int]:
    """Note id by GUID, read straight from the package's SQLite file."""
    with zipfile.ZipFile(apkg) as zf:
        data = zf.read("collection.anki2")
    db_path = apkg.with_suffix(".anki2")
    db_path.write_bytes(data)
    with sqlite3.connect(db_path) as conn:
        return dict(conn.execute("SELECT guid, id FROM notes").fetchall())


def test_it_imports_every_card_of_the_deck_with_its_fields(deck, tmp_path):
    apkg = _export(tmp_path, "deck.apkg")
    col = _import(tmp_path / "learner.anki2", apkg)
    try:
        notes = _notes_by_slug(col)
        assert set(notes) == {card.slug for card in deck.cards}
        assert len(deck.cards) >= 70
        for spec in deck.cards:
            note = notes[spec.slug]
            assert list(note.keys()) == list(FIELDS)
            assert note["Kind"] == spec.kind
            assert note["Prompt"].strip(), spec.slug
            assert note["Answer"].strip(), spec.slug
            assert sorted(note.tags) == sorted(spec.tags), spec.slug
            if spec.steps:
                assert note["Steps"].count("<li>") >= len(spec.steps), spec.slug
            if spec.kind == "choice":
                # Every option, with whether it is right and why.
                assert note["Reasons"].count("<li>") == len(spec.choice), spec.slug
                for option in spec.choice:
                    if option.why:
                        first_words = option.why.split()[0]
                        assert first_words in note["Reasons"], spec.slug
                assert "(right)" in note["Reasons"]
            if spec.kind == "numeric":
                assert note["Numeric"] == numeric_text(spec)
                assert unit_symbol(spec.numeric_unit) in note["Numeric"]
                if spec.numeric_tolerance:
                    assert "±" in note["Numeric"]
        # The back template shows the worked answer: Anki renders it on the answer side.
        card = col.get_card(col.find_cards(f'"Slug:{deck.cards[0].slug}"')[0])
        assert "Worked steps" in card.answer() or not deck.cards[0].steps
    finally:
        col.close()


def test_it_keeps_note_ids_so_a_reimport_updates_instead_of_duplicating(deck, tmp_path):
    first = _export(tmp_path, "first.apkg")
    # An edit a minute later, between the two exports: the re-import updates that note in place.
    card = Card.objects.filter(is_active=True).order_by("slug").first()
    Card.objects.filter(pk=card.pk).update(
        answer="An edited answer, from the second export.",
        updated_at=card.updated_at + dt.timedelta(minutes=1),
    )
    second = _export(tmp_path, "second.apkg")

    assert _package_note_ids(first) == _package_note_ids(second)

    col = _import(tmp_path / "learner.anki2", first)
    try:
        ids_before = set(col.find_notes(""))
        col.close()
        col = _import(tmp_path / "learner.anki2", second)
        notes = _notes_by_slug(col)
        assert set(col.find_notes("")) == ids_before
        assert len(notes) == len(deck.cards)
        assert "An edited answer" in notes[card.slug]["Answer"]
    finally:
        col.close()


def test_it_leaves_retired_cards_out(deck, tmp_path):
    retired = Card.objects.filter(is_active=True).order_by("slug").first()
    retired.is_active = False
    retired.save()
    ids = _package_note_ids(_export(tmp_path, "deck.apkg"))
    assert len(ids) == len(deck.cards) - 1


def test_stats_offers_the_download_and_it_is_an_apkg(alice_client):
    make_card("numeric", slug="kv-bytes", tags=("kv-memory",))
    page = alice_client.get(reverse("quiz:stats"))
    assert reverse("quiz:anki-export").encode() in page.content
    response = alice_client.get(reverse("quiz:anki-export"))
    assert response.status_code == 200
    assert "serving-school.apkg" in response["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(response.content)) as zf:
        assert "collection.anki2" in zf.namelist()


def test_anonymous_visitors_cannot_download(client, db):
    response = client.get(reverse("quiz:anki-export"))
    assert response.status_code == 302


def test_a_learners_card_reads_as_the_app_does_without_internal_file_names(deck, tmp_path):
    col = _import(tmp_path / "learner.anki2", _export(tmp_path, "deck.apkg"))
    try:
        notes = _notes_by_slug(col)
        # The app says "21×" and, for a "roughly what factor" question, accepts 20× and 22×.
        speedup = notes["batch32-speedup-llama3-8b-h100"]
        assert speedup["Numeric"] == "21\u00d7 (\u00b15\u00a0%)"
        app_card = Card.objects.get(slug="batch32-speedup-llama3-8b-h100")
        assert app_card.tolerance_text == "\u00b15\u00a0%"
        assert app_card.numeric_accepts(20) and app_card.numeric_accepts(22)
        assert not app_card.numeric_accepts(19)
        for card_id in col.find_cards(""):
            card = col.get_card(card_id)
            back = card.answer()
            assert ".txt#" not in back and ".txt" not in card.note()["Source"], card.note()["Slug"]
            assert " x (" not in back
    finally:
        col.close()


def test_the_deck_title_and_description_are_escaped(deck, tmp_path):
    Deck.objects.filter(slug="llm-serving").update(
        title="<b>LLM</b> serving & more::hidden",
        description="<script>alert(1)</script>\nSecond line & more.",
    )
    col = _import(tmp_path / "learner.anki2", _export(tmp_path, "deck.apkg"))
    try:
        names = {d.name for d in col.decks.all_names_and_ids()}
        assert "Serving School::LLM serving & more:hidden" in names
        exported = col.decks.by_name("Serving School::LLM serving & more:hidden")
        assert exported["desc"] == (
            "&lt;script&gt;alert(1)&lt;/script&gt;<br>Second line &amp; more."
        )
    finally:
        col.close()
