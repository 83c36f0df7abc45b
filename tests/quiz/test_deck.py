"""The deck in content/: loads into an empty database and covers every seed question.

The seed files are in tests/quiz/fixtures/; each card names the seed question it covers in
`source:` ("<seed file>#<question>"), and the expected question ids below are written out from
the seed files, not derived by the parser.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command

from labs.parameters.params import parse_lab_params
from labs.parameters.presets import LABS, load_presets
from quiz.models import Card, CardRelation

CONTENT = Path(settings.BASE_DIR) / "content"
PRESETS_FILE = CONTENT / "labs" / "presets.yaml"

SEED_000 = "000_36de575bee6c4e63.txt"
SEED_001 = "001_ff1e534f04acf2ef.txt"
SEED_003 = "003_069e362ba7a89ee1.txt"
# 7 worked answers and their 7 follow-ups; 49 questions; the multiple-choice question and its 6
# related questions.
EXPECTED_SOURCES = {
    SEED_000: {f"a{i}" for i in range(1, 8)} | {f"a{i}-followup" for i in range(1, 8)},
    SEED_001: {f"q{i}" for i in range(1, 50)},
    SEED_003: {"mcq"} | {f"r{i}" for i in range(1, 7)},
}
TAGS = {
    "paged-attention",
    "kv-memory",
    "batching",
    "scheduling",
    "chunked-prefill",
    "prefix-caching",
    "speculative-decoding",
    "quantization",
    "latency-metrics",
    "capacity-planning",
    "rag-long-context",
    "serving-engine",
}


@pytest.fixture
def deck(db):
    assert not Card.objects.exists()
    call_command("load_content", path=str(CONTENT), stdout=io.StringIO())
    return Card.objects.filter(is_active=True).prefetch_related("options", "tags")


def _presets_raw() -> list[dict]:
    return yaml.safe_load(PRESETS_FILE.read_text(encoding="utf-8"))


def test_it_loads_at_least_70_active_cards_of_all_three_kinds(deck):
    assert deck.count() >= 70
    assert {c.kind for c in deck} == {"numeric", "choice", "recall"}


def test_it_gives_every_card_an_answer_and_worked_steps(deck):
    for card in deck:
        assert card.prompt.strip(), card.slug
        assert card.answer.strip(), card.slug
        assert card.steps and all(s.strip() for s in card.steps), card.slug


def test_it_completes_each_kind(deck):
    for card in deck:
        if card.kind == "numeric":
            assert card.numeric_value is not None and card.numeric_unit, card.slug
            assert card.numeric_tolerance is not None, card.slug
        options = list(card.options.all())
        if card.kind == "choice":
            assert 2 <= len(options) <= 6, card.slug
            assert sum(o.is_correct for o in options) == 1, card.slug
            # A wrong option must say why it is wrong.
            assert all(o.why.strip() for o in options if not o.is_correct), card.slug
        else:
            assert not options, card.slug


def test_it_does_not_give_away_choice_answers_by_length():
    # A learner must not be able to pick the right option by choosing the longest one.
    offenders, choice_cards = [], 0
    for path in sorted((CONTENT / "cards").glob("*.yaml")):
        card = yaml.safe_load(path.read_text(encoding="utf-8"))
        if card["kind"] != "choice":
            continue
        choice_cards += 1
        right = [len(o["text"]) for o in card["choice"] if o.get("correct")]
        wrong = [len(o["text"]) for o in card["choice"] if not o.get("correct")]
        if right and wrong and right[0] > max(wrong):
            offenders.append(f"{card['slug']} ({right[0]} vs {max(wrong)} chars)")
    assert choice_cards
    assert len(offenders) <= 0.3 * choice_cards, (
        f"the correct option is the strictly longest in {len(offenders)} of {choice_cards} "
        f"choice cards (at most 30 %): " + ", ".join(offenders)
    )


def test_it_uses_only_the_documented_tags(deck):
    for card in deck:
        tags = {t.slug for t in card.tags.all()}
        assert tags, card.slug
        assert tags <= TAGS, (card.slug, tags - TAGS)


def test_it_links_related_cards_both_ways_without_broken_links(deck):
    assert CardRelation.objects.exists()
    pairs = set(CardRelation.objects.values_list("from_card__slug", "to_card__slug"))
    active = {c.slug for c in deck}
    for a, b in pairs:
        assert a in active and b in active, (a, b)
        assert (b, a) in pairs, f"{a} -> {b} has no link back"


def test_it_links_every_follow_up_to_its_parent(deck):
    by_slug = {c.slug: c for c in deck}
    follow_ups = [c for c in deck if c.source.endswith("-followup")]
    assert len(follow_ups) == 7
    for card in follow_ups:
        assert card.parent is not None, card.slug
        # The parent is the card of the worked answer the follow-up belongs to.
        assert card.parent.source == card.source.removesuffix("-followup"), card.slug
        assert card in by_slug[card.parent.slug].follow_ups.all()


def test_it_covers_every_seed_question(deck):
    covered: dict[str, set[str]] = defaultdict(set)
    for card in deck:
        if card.source:
            seed, _, question = card.source.partition("#")
            assert seed in EXPECTED_SOURCES, (card.slug, card.source)
            covered[seed].add(question)
    counts = {seed: len(questions) for seed, questions in covered.items()}
    assert counts == {SEED_000: 14, SEED_001: 49, SEED_003: 7}
    for seed, expected in EXPECTED_SOURCES.items():
        assert covered[seed] == expected, seed


def test_it_points_lab_presets_at_existing_presets(deck):
    slugs = {p["slug"] for p in _presets_raw()}
    used = {c.lab_preset for c in deck if c.lab_preset}
    assert used, "no card opens a lab"
    assert used <= slugs, used - slugs


def test_it_defines_presets_that_validate_and_name_a_lab():
    presets = _presets_raw()
    assert len({p["slug"] for p in presets}) == len(presets)
    for preset in presets:
        assert preset["lab"] in LABS, preset["slug"]
        assert preset.get("title"), preset["slug"]
        parse_lab_params(preset["params"])  # raises ParamError naming the bad field
    # The labs read them with each lab's defaults underneath; that must validate too.
    assert set(load_presets(PRESETS_FILE)) == {p["slug"] for p in presets}


def test_it_exports_back_to_the_same_files(deck, tmp_path):
    # Admin edits reach git through export_content: with no edits, the export is the deck itself.
    call_command("export_content", path=str(tmp_path), stdout=io.StringIO())
    for source in sorted((CONTENT / "cards").glob("*.yaml")):
        exported = tmp_path / "cards" / source.name
        assert exported.read_text() == source.read_text(), f"{source.name} changes on export"
    assert (tmp_path / "decks.yaml").read_text() == (CONTENT / "decks.yaml").read_text()
