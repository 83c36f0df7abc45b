"""load_content and export_content: upsert by slug, retire, idempotence, round trip, bad files."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from quiz.models import Card, CardRelation, CardTag, ChoiceOption, Deck, Tag
from tests.quiz.factories import at, make_card, review

pytestmark = pytest.mark.django_db

DECKS = """\
- slug: llm-serving
  title: LLM serving
  description: KV cache, batching, scheduling.
"""

CARDS = {
    "kv-bytes": """\
slug: kv-bytes
deck: llm-serving
kind: numeric
tags: [paged-attention, kv-memory]
source: "001_seed.txt#q1"
parent: null
prompt: |
  Llama 3 8B has **32 layers**, 8 KV heads and a head dimension of 128.

  How many KiB of KV cache does one token need in BF16?
answer: 128 KiB per token
numeric:
  value: 128
  unit: KiB
  tolerance: 0.5
steps:
  - "2 (K and V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 131,072 bytes."
  - "131,072 / 1,024 = 128 KiB."
explanation: |
  GQA keeps the KV heads at 8, which is what makes the cache small.
follow_up:
  question: What happens with an FP8 KV cache?
  answer: It halves to 64 KiB per token.
related: [paging-why, gqa-recall]
lab_preset: kv-dtype-llama3-8b
check:
  key: kv_bytes_per_token
  params: {model: llama-3-8b, kv_dtype: auto}
""",
    "paging-why": """\
slug: paging-why
deck: llm-serving
kind: choice
tags: [paged-attention]
parent: null
prompt: |
  Why does vLLM allocate KV in blocks?
answer: "To stop reserving memory for tokens that never exist: waste is at most one block."
choice:
  - text: Allocate KV in small fixed-size blocks as the sequence grows.
    correct: true
  - text: Lower max_tokens to 1,024.
    correct: false
    why: Raises concurrency but truncates legitimate long outputs.
  - text: "Use a bigger GPU: more HBM."
    correct: false
    why: Costs money and still wastes the same fraction.
steps:
  - "Contiguous reservation pays for max_tokens up front."
related: [kv-bytes]
""",
    "gqa-recall": """\
slug: gqa-recall
deck: llm-serving
kind: recall
tags: [kv-memory]
parent: kv-bytes
prompt: |
  What does grouped-query attention share?
answer: Key/value heads, across groups of query heads.
related: [kv-bytes]
""",
}


@pytest.fixture
def content(tmp_path: Path) -> Path:
    return write_deck(tmp_path / "content")


def write_deck(root: Path) -> Path:
    """DECKS and CARDS as a content folder at `root`."""
    (root / "cards").mkdir(parents=True)
    (root / "decks.yaml").write_text(DECKS, encoding="utf-8")
    for slug, text in CARDS.items():
        (root / "cards" / f"{slug}.yaml").write_text(text, encoding="utf-8")
    return root


def load(root: Path) -> str:
    out = io.StringIO()
    call_command("load_content", path=str(root), stdout=out)
    return out.getvalue()


def snapshot() -> dict[str, list]:
    """Every row the loader writes, with its timestamps."""
    return {
        "decks": list(Deck.objects.order_by("pk").values_list("pk", "updated_at")),
        "cards": list(Card.objects.order_by("pk").values_list("pk", "updated_at", "is_active")),
        "options": list(ChoiceOption.objects.order_by("pk").values()),
        "tags": list(CardTag.objects.order_by("pk").values()),
        "relations": list(CardRelation.objects.order_by("pk").values()),
        "tag_names": list(Tag.objects.order_by("pk").values()),
    }


def test_it_loads_every_field_of_the_three_kinds(content):
    assert "3 created" in load(content)
    kv = Card.objects.get(slug="kv-bytes")
    assert (kv.kind, kv.numeric_value, kv.numeric_unit, kv.numeric_tolerance) == (
        "numeric",
        128.0,
        "KiB",
        0.5,
    )
    assert kv.prompt.startswith("Llama 3 8B has **32 layers**") and kv.prompt.endswith("BF16?\n")
    assert kv.steps[1] == "131,072 / 1,024 = 128 KiB."
    assert kv.follow_up_answer == "It halves to 64 KiB per token."
    assert kv.check_spec == {
        "key": "kv_bytes_per_token",
        "params": {"model": "llama-3-8b", "kv_dtype": "auto"},
    }
    assert [ct.tag.slug for ct in kv.card_tags.all()] == ["paged-attention", "kv-memory"]
    assert (kv.lab_preset, kv.source) == ("kv-dtype-llama3-8b", "001_seed.txt#q1")
    choice = Card.objects.get(slug="paging-why")
    assert [(o.is_correct, o.why) for o in choice.options.all()][1] == (
        False,
        "Raises concurrency but truncates legitimate long outputs.",
    )
    assert Card.objects.get(slug="gqa-recall").parent == kv


def test_it_links_related_cards_both_ways(content):
    load(content)
    pairs = set(CardRelation.objects.values_list("from_card__slug", "to_card__slug"))
    assert ("kv-bytes", "gqa-recall") in pairs and ("gqa-recall", "kv-bytes") in pairs
    assert all((b, a) in pairs for a, b in pairs)


def test_it_changes_nothing_when_loaded_twice(content):
    load(content)
    first = snapshot()
    assert "0 created, 0 updated, 0 retired" in load(content)
    assert snapshot() == first


def test_it_updates_by_slug_and_keeps_the_review_history(content, alice):
    load(content)
    card = Card.objects.get(slug="gqa-recall")
    review(alice, card, 3, at(2026, 6, 1, 9))
    path = content / "cards" / "gqa-recall.yaml"
    path.write_text(path.read_text().replace("What does", "Which heads does"), encoding="utf-8")
    assert "1 updated" in load(content)
    card.refresh_from_db()
    assert card.prompt.startswith("Which heads does") and card.review_logs.count() == 1


def test_it_retires_a_removed_card_and_keeps_its_history(content, alice):
    load(content)
    card = Card.objects.get(slug="gqa-recall")
    review(alice, card, 3, at(2026, 6, 1, 9))
    (content / "cards" / "gqa-recall.yaml").unlink()
    for slug in ("kv-bytes", "paging-why"):
        path = content / "cards" / f"{slug}.yaml"
        path.write_text(path.read_text().replace(", gqa-recall]", "]"), encoding="utf-8")
    assert "1 retired" in load(content)
    card.refresh_from_db()
    assert not card.is_active and card.review_logs.count() == 1


def test_it_exports_files_identical_to_the_ones_it_loaded(content, tmp_path):
    load(content)
    out = tmp_path / "exported"
    call_command("export_content", path=str(out), stdout=io.StringIO())
    assert (out / "decks.yaml").read_text() == DECKS
    for slug, text in CARDS.items():
        assert (out / "cards" / f"{slug}.yaml").read_text(encoding="utf-8") == text, slug


def test_it_writes_admin_edits_back_as_a_small_diff(content):
    load(content)
    Card.objects.filter(slug="gqa-recall").update(answer="Keys and values.")
    call_command("export_content", path=str(content), stdout=io.StringIO())
    text = (content / "cards" / "gqa-recall.yaml").read_text()
    assert text == CARDS["gqa-recall"].replace(
        "Key/value heads, across groups of query heads.", "Keys and values."
    )
    assert (content / "cards" / "kv-bytes.yaml").read_text() == CARDS["kv-bytes"]


def test_it_removes_the_file_of_a_retired_card_on_export(content):
    load(content)
    Card.objects.filter(slug="gqa-recall").update(is_active=False)
    call_command("export_content", path=str(content), stdout=io.StringIO())
    assert not (content / "cards" / "gqa-recall.yaml").exists()
    assert "gqa-recall" not in (content / "cards" / "kv-bytes.yaml").read_text()


@pytest.mark.parametrize(
    ("slug", "old", "new", "message"),
    [
        ("kv-bytes", "kind: numeric", "kind: essay", "field 'kind' must be one of"),
        ("kv-bytes", "  value: 128", "  value: lots", "field 'numeric.value' must be a number"),
        ("paging-why", "    correct: true", "    correct: false", "exactly one correct option"),
        ("gqa-recall", "related: [kv-bytes]", "related: [nope]", "field 'related' names unknown"),
        ("gqa-recall", "parent: kv-bytes", "parent: nope", "field 'parent' names unknown"),
        ("gqa-recall", "answer: Key/value", "answer: Key: value", "not valid YAML (line 8)"),
        ("gqa-recall", "slug: gqa-recall", "slug: other", "field 'slug' is 'other'"),
        ("gqa-recall", "prompt: |", "promt: |", "unknown field 'promt'"),
        ("kv-bytes", "deck: llm-serving", "deck: cooking", "field 'deck' names unknown deck"),
    ],
)
def test_it_rejects_a_bad_file_with_one_line_exit_2_and_writes_nothing(
    content, slug, old, new, message
):
    path = content / "cards" / f"{slug}.yaml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1), encoding="utf-8")
    with pytest.raises(CommandError) as excinfo:
        load(content)
    assert excinfo.value.returncode == 2
    text = str(excinfo.value)
    assert "\n" not in text and str(path) in text and message in text
    assert not Card.objects.exists() and not Deck.objects.exists()


def test_it_leaves_the_database_untouched_when_a_later_file_is_bad(content):
    load(content)
    before = snapshot()
    good = content / "cards" / "kv-bytes.yaml"
    good.write_text(good.read_text().replace("128 KiB per token", "Changed"), encoding="utf-8")
    bad = content / "cards" / "paging-why.yaml"
    bad.write_text(bad.read_text().replace("kind: choice", "kind: 3"), encoding="utf-8")
    with pytest.raises(CommandError):
        load(content)
    assert snapshot() == before


def test_it_checks_lab_presets_when_the_presets_file_exists(content):
    (content / "labs").mkdir()
    (content / "labs" / "presets.yaml").write_text("- slug: other-preset\n  lab: sandbox\n")
    with pytest.raises(CommandError, match="field 'lab_preset' names 'kv-dtype-llama3-8b'"):
        load(content)


def test_it_exits_2_when_the_folder_is_not_a_deck(tmp_path):
    with pytest.raises(CommandError, match="decks.yaml: file not found") as excinfo:
        load(tmp_path)
    assert excinfo.value.returncode == 2


def test_it_retires_a_card_that_only_the_database_has(content):
    # A card that exists only in the database (made in the admin) is retired on load, not deleted.
    stray = make_card(slug="admin-only")
    load(content)
    stray.refresh_from_db()
    assert not stray.is_active
