"""The shared deck as an Anki package (.apkg), built with genanki.

Plain Python over the content specs (`selectors.content_snapshot`), no ORM, so the export holds
exactly what `export_content` writes: the deck's active cards. A learner's own download adds
their cards made from runs (`selectors.personal_export`, deck "Your runs"); their prediction
cards cannot be fixed notes (each showing asks a setting chosen then, graded against a
simulation), and the stats page says they are left out and why.

Ids are derived from slugs, not from the clock: the same card always becomes the note with the
same GUID and the same note id, so importing a newer export into Anki updates the notes already
there instead of adding duplicates.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import itertools
import re
import sqlite3
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import genanki
from django.utils.html import strip_tags

from quiz import numeric
from quiz.content import CardSpec, ContentTree
from quiz.templatetags.quiz_tags import num, render_markdown, with_unit

# Fixed once: Anki matches a note type by id, so changing it would fork every learner's notes.
MODEL_ID = 1_607_392_319
FIELDS = (
    "Slug",
    "Kind",
    "Prompt",
    "Options",
    "Answer",
    "Numeric",
    "Reasons",
    "Steps",
    "Explanation",
    "FollowUp",
    "Source",
)

_FRONT = """<div class="prompt">{{Prompt}}</div>
{{#Options}}<div class="options">{{Options}}</div>{{/Options}}"""
_BACK = """{{FrontSide}}
<hr id="answer">
<div class="answer">{{Answer}}</div>
{{#Numeric}}<p class="numeric">{{Numeric}}</p>{{/Numeric}}
{{#Reasons}}<h4>Every option</h4>{{Reasons}}{{/Reasons}}
{{#Steps}}<h4>Worked steps</h4>{{Steps}}{{/Steps}}
{{#Explanation}}<h4>Why</h4>{{Explanation}}{{/Explanation}}
{{#FollowUp}}<h4>Follow-up</h4>{{FollowUp}}{{/FollowUp}}
{{#Source}}<p class="source">{{Source}}</p>{{/Source}}"""
_CSS = """.card { font-family: system-ui, sans-serif; font-size: 18px; text-align: left;
  color: #1d2430; background: #fff; line-height: 1.45; }
.options ol { list-style: upper-alpha; }
.numeric { font-weight: 600; }
.source { color: #667; font-size: 13px; }"""

MODEL = genanki.Model(
    MODEL_ID,
    "Serving School card",
    fields=[{"name": name} for name in FIELDS],
    templates=[{"name": "Card", "qfmt": _FRONT, "afmt": _BACK}],
    css=_CSS,
    sort_field_index=FIELDS.index("Prompt"),
)


def _stable_int(text: str, *, bits: int = 52) -> int:
    # Below 2**53 so the id survives JavaScript (Anki's web views) untouched; never 0.
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % (2**bits - 1) + 1


def note_id_for(slug: str) -> int:
    return _stable_int(f"serving-school-note:{slug}")


def guid_for(slug: str) -> str:
    return genanki.guid_for("serving-school", slug)


def deck_id_for(slug: str) -> int:
    return _stable_int(f"serving-school-deck:{slug}", bits=40)


class _StableNote(genanki.Note):
    """A note whose id comes from its card's slug (genanki numbers notes from the clock), and
    whose modification time is the card's last edit (genanki stamps the export time).

    Anki updates an existing note (same GUID) only when the incoming one is newer, so an edited
    card updates the learner's note and an unchanged one is left alone.
    """

    def __init__(self, *, note_id: int, modified: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.note_id = note_id
        self.modified = modified

    def write_to_db(self, cursor: Any, timestamp: float, deck_id: int, id_gen: Iterator[int]):
        # genanki takes the note id first from id_gen, then one id per card.
        ids = itertools.chain([self.note_id], id_gen)
        stamp = self.modified if self.modified is not None else timestamp
        return super().write_to_db(cursor, stamp, deck_id, ids)


def _md(text: str) -> str:
    return render_markdown(text) if text else ""


def _options(card: CardSpec) -> str:
    if not card.choice:
        return ""
    items = "".join(f"<li>{_md(option.text)}</li>" for option in card.choice)
    return f"<ol>{items}</ol>"


def _reasons(card: CardSpec) -> str:
    """Every option with its letter, right or wrong, and why."""
    if not card.choice:
        return ""
    rows = []
    for letter, option in zip("ABCDEFGH", card.choice, strict=False):
        verdict = "right" if option.correct else "wrong"
        why = _md(option.why) if option.why else ""
        rows.append(f"<li><b>{letter} ({verdict})</b>: {_md(option.text)}{why}</li>")
    return f"<ul>{''.join(rows)}</ul>"


def numeric_text(card: CardSpec) -> str:
    """'21× (±5 %)', '1,748 slots (±10 slots)': the answer and how close an answer must be, in
    the app's own units and words and by its own grading rule (quiz/numeric.py)."""
    if card.numeric_value is None:
        return ""
    text = with_unit(num(card.numeric_value), card.numeric_unit)
    tolerance = numeric.tolerance_text(
        card.numeric_value, card.numeric_tolerance, card.prompt, card.numeric_unit, card.answer
    )
    if tolerance:
        text += f" ({tolerance})"
    return html.escape(text)


# "001_ff1e534f04acf2ef.txt#q11": the study document a card was drafted from. The app never
# shows it to a learner, so neither does the export.
_INTERNAL_SOURCE = re.compile(r"^[\w.-]+\.\w{1,5}([#:]\S*)?$")


def learner_source(source: str) -> str:
    """The card's source as a learner may read it: '' for an internal file name."""
    source = source.strip()
    return "" if _INTERNAL_SOURCE.match(source) else html.escape(source)


def deck_name(title: str) -> str:
    """'Serving School::<title>' as plain text: no markup, and no '::' (Anki would read it as
    a sub-deck)."""
    plain = strip_tags(title).replace("<", "").replace(">", "")
    plain = " ".join(plain.replace("::", ":").split())
    return f"Serving School::{plain or 'deck'}"


def deck_description(description: str) -> str:
    """Anki shows a deck's description as HTML: the text, escaped, its line breaks kept."""
    return html.escape(description).replace("\n", "<br>")


def _steps(card: CardSpec) -> str:
    if not card.steps:
        return ""
    return "<ol>" + "".join(f"<li>{_md(step)}</li>" for step in card.steps) + "</ol>"


def _follow_up(card: CardSpec) -> str:
    if not card.follow_up_question:
        return ""
    return _md(card.follow_up_question) + _md(card.follow_up_answer)


def card_fields(card: CardSpec) -> list[str]:
    """The note's fields, in FIELDS order, as HTML."""
    values = {
        "Slug": html.escape(card.slug),
        "Kind": card.kind,
        "Prompt": _md(card.prompt),
        "Options": _options(card),
        "Answer": _md(card.answer),
        "Numeric": numeric_text(card),
        "Reasons": _reasons(card),
        "Steps": _steps(card),
        "Explanation": _md(card.explanation),
        "FollowUp": _follow_up(card),
        "Source": learner_source(card.source),
    }
    return [values[name] for name in FIELDS]


def build_package(
    tree: ContentTree, modified: Mapping[str, float] | None = None
) -> genanki.Package:
    """One Anki deck per deck of the tree, one note per card, tags kept. `modified` gives each
    card's last edit (Unix seconds) by slug."""
    modified = modified or {}
    decks: dict[str, genanki.Deck] = {}
    for deck in tree.decks:
        decks[deck.slug] = genanki.Deck(
            deck_id_for(deck.slug),
            deck_name(deck.title),
            description=deck_description(deck.description),
        )
    for card in tree.cards:
        note = _StableNote(
            note_id=note_id_for(card.slug),
            model=MODEL,
            fields=card_fields(card),
            tags=list(card.tags),
            guid=guid_for(card.slug),
            modified=modified.get(card.slug),
        )
        decks[card.deck].add_note(note)
    return genanki.Package([d for d in decks.values() if d.notes])


def write_apkg(
    tree: ContentTree, out: str | Path | BinaryIO, modified: Mapping[str, float] | None = None
) -> int:
    """Write the package to a path or a binary file object; returns the number of notes.

    Not genanki's `write_to_file`: it leaves its SQLite file behind in the temp directory, one
    per download. The .apkg is that file zipped as collection.anki2, with an empty media map.
    """
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="apkg-") as tmp:
        db_path = Path(tmp) / "collection.anki2"
        with contextlib.closing(sqlite3.connect(db_path)) as conn:
            build_package(tree, modified).write_to_db(
                conn.cursor(), now, itertools.count(int(now * 1000))
            )
            conn.commit()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as apkg:
            apkg.write(db_path, "collection.anki2")
            apkg.writestr("media", "{}")
    return len(tree.cards)


def deck_apkg(out: str | Path | BinaryIO, *, user: Any = None) -> int:
    """The shared deck as it is in the database (what `export_content` writes), as an .apkg;
    with `user`, their own cards made from runs too."""
    from quiz.selectors import card_edit_times, content_snapshot, personal_export

    tree, _ = content_snapshot()
    if user is not None:
        own = personal_export(user=user)
        if own.deck is not None:
            tree = ContentTree(decks=[*tree.decks, own.deck], cards=[*tree.cards, *own.cards])
    return write_apkg(tree, out, card_edit_times(user=user))
