"""The deck as files (docs/content-format.md): parse and validate, and write back byte for byte.

Plain Python, no ORM: `services.content_load` and `selectors.content_snapshot` move these
dataclasses in and out of the database. The writer is hand-made rather than `yaml.dump`, so the
files keep the authors' layout (keys in the documented order, flow lists, `|` blocks) and a round
trip of a well-formed file is an exact copy.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# Lab preset ids belong to the labs pages; they may carry a decimal ("...-util-0.5").
PRESET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
KINDS = ("numeric", "choice", "recall")
CARD_KEYS = (
    "slug",
    "deck",
    "kind",
    "tags",
    "source",
    "parent",
    "prompt",
    "answer",
    "numeric",
    "choice",
    "steps",
    "explanation",
    "follow_up",
    "related",
    "lab_preset",
    "check",
)
DECK_KEYS = ("slug", "title", "description")


class ContentError(Exception):
    """One bad file or field; the message names both."""


@dataclass
class OptionSpec:
    text: str
    correct: bool
    why: str = ""


@dataclass
class CardSpec:
    slug: str
    deck: str
    kind: str
    prompt: str
    answer: str
    tags: list[str] = field(default_factory=list)
    source: str = ""
    parent: str | None = None
    numeric_value: float | None = None
    numeric_unit: str = ""
    numeric_tolerance: float | None = None
    choice: list[OptionSpec] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    explanation: str = ""
    follow_up_question: str = ""
    follow_up_answer: str = ""
    related: list[str] = field(default_factory=list)
    lab_preset: str = ""
    check: dict[str, Any] | None = None


@dataclass
class DeckSpec:
    slug: str
    title: str
    description: str = ""


@dataclass
class ContentTree:
    decks: list[DeckSpec]
    cards: list[CardSpec]


# --- Reading -------------------------------------------------------------------------------------


def _load_yaml(path: Path, label: str) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ContentError(f"{label}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        hint = ""
        if problem == "mapping values are not allowed here":
            hint = ' (a value containing ": " must be in double quotes)'
        raise ContentError(f"{label}: not valid YAML{where}: {problem}{hint}") from None


def _text(data: dict[str, Any], key: str, label: str, *, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise ContentError(f"{label}: field '{key}' is required")
        return ""
    if not isinstance(value, str):
        raise ContentError(f"{label}: field '{key}' must be text, got {type(value).__name__}")
    if required and not value.strip():
        raise ContentError(f"{label}: field '{key}' must not be empty")
    return value


def _slug(value: Any, label: str, key: str, pattern: re.Pattern[str] = SLUG_RE) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ContentError(
            f"{label}: field '{key}' must be a slug (lowercase letters, digits, hyphens), "
            f"got {value!r}"
        )
    return value


def _slug_list(data: dict[str, Any], key: str, label: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ContentError(f"{label}: field '{key}' must be a list of slugs")
    slugs = [_slug(item, label, key) for item in value]
    if len(set(slugs)) != len(slugs):
        raise ContentError(f"{label}: field '{key}' lists a slug twice")
    return slugs


def _number(value: Any, label: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContentError(f"{label}: field '{key}' must be a number, got {value!r}")
    return float(value)


def _mapping(data: Any, label: str, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ContentError(f"{label}: field '{key}' must be a mapping")
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise ContentError(
            f"{label}: field '{key}' has unknown key '{unknown[0]}' (allowed: {', '.join(allowed)})"
        )
    return data


def parse_card(data: Any, label: str, *, expected_slug: str) -> CardSpec:
    """Validate one card file's data; raise ContentError naming the file and the field."""
    if not isinstance(data, dict):
        raise ContentError(f"{label}: a card file must be a YAML mapping")
    unknown = [k for k in data if k not in CARD_KEYS]
    if unknown:
        raise ContentError(f"{label}: unknown field '{unknown[0]}'")
    slug = _slug(data.get("slug"), label, "slug")
    if slug != expected_slug:
        raise ContentError(
            f"{label}: field 'slug' is {slug!r} but the file name says {expected_slug!r}"
        )
    kind = data.get("kind")
    if kind not in KINDS:
        raise ContentError(f"{label}: field 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    card = CardSpec(
        slug=slug,
        deck=_slug(data.get("deck"), label, "deck"),
        kind=kind,
        prompt=_text(data, "prompt", label, required=True),
        answer=_text(data, "answer", label, required=True),
        tags=_slug_list(data, "tags", label),
        source=_text(data, "source", label),
        explanation=_text(data, "explanation", label),
        related=_slug_list(data, "related", label),
    )
    if data.get("parent") is not None:
        card.parent = _slug(data["parent"], label, "parent")
        if card.parent == slug:
            raise ContentError(f"{label}: field 'parent' names the card itself")
    if slug in card.related:
        raise ContentError(f"{label}: field 'related' names the card itself")
    if data.get("lab_preset") is not None:
        card.lab_preset = _slug(data["lab_preset"], label, "lab_preset", PRESET_RE)

    steps = data.get("steps")
    if steps is not None:
        if not isinstance(steps, list) or not all(isinstance(s, str) and s for s in steps):
            raise ContentError(f"{label}: field 'steps' must be a list of non-empty text items")
        card.steps = list(steps)

    if data.get("follow_up") is not None:
        follow = _mapping(data["follow_up"], label, "follow_up", ("question", "answer"))
        card.follow_up_question = _text(follow, "question", f"{label}: follow_up", required=True)
        card.follow_up_answer = _text(follow, "answer", f"{label}: follow_up", required=True)

    numeric = data.get("numeric")
    if kind == "numeric":
        if numeric is None:
            raise ContentError(f"{label}: field 'numeric' is required for kind: numeric")
        numeric = _mapping(numeric, label, "numeric", ("value", "unit", "tolerance"))
        card.numeric_value = _number(numeric.get("value"), label, "numeric.value")
        card.numeric_unit = _text(numeric, "unit", f"{label}: numeric")
        card.numeric_tolerance = _number(numeric.get("tolerance", 0), label, "numeric.tolerance")
        if card.numeric_tolerance < 0:
            raise ContentError(f"{label}: field 'numeric.tolerance' must be 0 or more")
    elif numeric is not None:
        raise ContentError(f"{label}: field 'numeric' is only for kind: numeric")

    choice = data.get("choice")
    if kind == "choice":
        if not isinstance(choice, list) or not 2 <= len(choice) <= 6:
            raise ContentError(f"{label}: field 'choice' must list 2 to 6 options")
        for number, raw in enumerate(choice, start=1):
            where = f"choice[{number}]"
            option = _mapping(raw, label, where, ("text", "correct", "why"))
            correct = option.get("correct")
            if not isinstance(correct, bool):
                raise ContentError(f"{label}: field '{where}.correct' must be true or false")
            card.choice.append(
                OptionSpec(
                    text=_text(option, "text", f"{label}: {where}", required=True),
                    correct=correct,
                    why=_text(option, "why", f"{label}: {where}"),
                )
            )
        if sum(o.correct for o in card.choice) != 1:
            raise ContentError(f"{label}: field 'choice' must have exactly one correct option")
    elif choice is not None:
        raise ContentError(f"{label}: field 'choice' is only for kind: choice")

    if data.get("check") is not None:
        card.check = parse_check(data["check"], label)
    return card


def parse_check(data: Any, label: str) -> dict[str, Any]:
    """A card's predictor check: either a key of the prediction for some lab params, or a named
    formula of labs.prediction.predict applied to given numbers (for inputs no lab parameter
    sets)."""
    check = _mapping(data, label, "check", ("key", "params", "formula", "args"))
    by_key = isinstance(check.get("key"), str) and isinstance(check.get("params", {}), dict)
    by_formula = isinstance(check.get("formula"), str) and isinstance(check.get("args"), dict)
    if by_key == by_formula:
        raise ContentError(
            f"{label}: field 'check' needs either a text 'key' and a 'params' mapping, "
            "or a text 'formula' and an 'args' mapping"
        )
    return check


def parse_decks(data: Any, label: str) -> list[DeckSpec]:
    if not isinstance(data, list) or not data:
        raise ContentError(f"{label}: must be a list of decks (slug, title, description)")
    decks: list[DeckSpec] = []
    for number, raw in enumerate(data, start=1):
        where = f"{label}: deck {number}"
        item = _mapping(raw, label, f"deck {number}", DECK_KEYS)
        deck = DeckSpec(
            slug=_slug(item.get("slug"), where, "slug"),
            title=_text(item, "title", where, required=True),
            description=_text(item, "description", where),
        )
        if any(d.slug == deck.slug for d in decks):
            raise ContentError(f"{where}: field 'slug' repeats {deck.slug!r}")
        decks.append(deck)
    return decks


def _preset_slugs(root: Path) -> set[str] | None:
    """Slugs in content/labs/presets.yaml, or None while that file does not exist yet."""
    path = root / "labs" / "presets.yaml"
    if not path.exists():
        return None
    data = _load_yaml(path, str(path))
    if not isinstance(data, list):
        raise ContentError(f"{path}: must be a list of presets")
    return {item["slug"] for item in data if isinstance(item, dict) and "slug" in item}


def read_tree(root: Path) -> ContentTree:
    """Read and cross-check the whole deck; any problem raises ContentError before anything is
    written."""
    decks_path = root / "decks.yaml"
    if not decks_path.exists():
        raise ContentError(f"{decks_path}: file not found (is --path the content folder?)")
    decks = parse_decks(_load_yaml(decks_path, str(decks_path)), str(decks_path))
    cards: list[CardSpec] = []
    for path in sorted((root / "cards").glob("*.yaml")):
        label = str(path)
        card = parse_card(_load_yaml(path, label), label, expected_slug=path.stem)
        cards.append(card)

    deck_slugs = {d.slug for d in decks}
    card_slugs = {c.slug for c in cards}
    presets = _preset_slugs(root)
    for card in cards:
        label = str(root / "cards" / f"{card.slug}.yaml")
        if card.deck not in deck_slugs:
            raise ContentError(f"{label}: field 'deck' names unknown deck {card.deck!r}")
        if card.parent and card.parent not in card_slugs:
            raise ContentError(f"{label}: field 'parent' names unknown card {card.parent!r}")
        missing = [slug for slug in card.related if slug not in card_slugs]
        if missing:
            raise ContentError(f"{label}: field 'related' names unknown card {missing[0]!r}")
        if card.lab_preset and presets is not None and card.lab_preset not in presets:
            raise ContentError(
                f"{label}: field 'lab_preset' names {card.lab_preset!r}, "
                "which is not in labs/presets.yaml"
            )
    return ContentTree(decks=decks, cards=cards)


# --- Writing -------------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    # JSON string syntax is valid YAML double-quoted syntax; keep non-ASCII as is.
    return json.dumps(text, ensure_ascii=False)


def _plain_ok(text: str, *, flow: bool = False) -> bool:
    """Whether `text` reads back as the same string when written without quotes."""
    if not text or text != text.strip() or "\n" in text:
        return False
    probe = f"k: [{text}]" if flow else f"k: {text}"
    try:
        loaded = yaml.safe_load(probe)
    except yaml.YAMLError:
        return False
    return loaded == {"k": [text] if flow else text}


def _scalar(value: Any, *, flow: bool = False, quote: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v, flow=True) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{k}: {_scalar(v, flow=True)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    text = str(value)
    return text if not quote and _plain_ok(text, flow=flow) else _quoted(text)


def _block(text: str, indent: str) -> str:
    """A literal block (`|`) under a key at `indent`; chomping keeps trailing newlines exact."""
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    # YAML guesses the indentation from the first line, so one that starts with a space needs it
    # said explicitly (relative to the key's indentation).
    width = "2" if body.startswith(" ") else ""
    lines = [f"{indent}  {line}" if line else "" for line in body.split("\n")]
    lines += [""] * max(trailing - 1, 0)
    return f"|{width}{chomp}\n" + "\n".join(lines)


def _field(
    key: str, value: Any, indent: str = "", *, lead: str | None = None, quote: bool = False
) -> str:
    """`key: value` in a mapping indented by `indent`; `lead` replaces the indent on the first line
    (for the first key of a list item: `  - text: ...`)."""
    start = indent if lead is None else lead
    if isinstance(value, str) and "\n" in value:
        return f"{start}{key}: {_block(value, indent)}"
    return f"{start}{key}: {_scalar(value, quote=quote)}"


def _list_item(value: str, indent: str, *, quote: bool) -> str:
    if "\n" in value:
        return f"{indent}- {_block(value, indent)}"
    return f"{indent}- {_scalar(value, quote=quote)}"


def render_card(card: CardSpec) -> str:
    """One card file, keys in the documented order; optional sections only when set."""
    out = [
        _field("slug", card.slug),
        _field("deck", card.deck),
        _field("kind", card.kind),
        _field("tags", card.tags),
    ]
    if card.source:
        out.append(_field("source", card.source, quote=True))
    out.append(_field("parent", card.parent))
    out.append(_field("prompt", card.prompt))
    out.append(_field("answer", card.answer))
    if card.kind == "numeric":
        out.append("numeric:")
        out.append(_field("value", card.numeric_value, "  "))
        out.append(_field("unit", card.numeric_unit, "  "))
        out.append(_field("tolerance", card.numeric_tolerance, "  "))
    if card.kind == "choice":
        out.append("choice:")
        for option in card.choice:
            out.append(_field("text", option.text, "    ", lead="  - "))
            out.append(_field("correct", option.correct, "    "))
            if option.why:
                out.append(_field("why", option.why, "    "))
    if card.steps:
        out.append("steps:")
        out.extend(_list_item(step, "  ", quote=True) for step in card.steps)
    if card.explanation:
        out.append(_field("explanation", card.explanation))
    if card.follow_up_question:
        out.append("follow_up:")
        out.append(_field("question", card.follow_up_question, "  "))
        out.append(_field("answer", card.follow_up_answer, "  "))
    if card.related:
        out.append(_field("related", card.related))
    if card.lab_preset:
        out.append(_field("lab_preset", card.lab_preset))
    if card.check is not None:
        out.append("check:")
        out.extend(_field(k, v, "  ") for k, v in card.check.items())
    return "\n".join(out) + "\n"


def render_decks(decks: list[DeckSpec]) -> str:
    out: list[str] = []
    for deck in decks:
        out.append(_field("slug", deck.slug, "  ", lead="- "))
        out.append(_field("title", deck.title, "  "))
        if deck.description:
            out.append(_field("description", deck.description, "  "))
    return "\n".join(out) + "\n"


def write_tree(
    tree: ContentTree, root: Path, *, retired: AbstractSet[str] = frozenset()
) -> list[Path]:
    """Write decks.yaml and one file per card; remove the files of `retired` cards.

    Files whose text is unchanged are not rewritten. Returns the paths that changed.
    """
    changed: list[Path] = []
    (root / "cards").mkdir(parents=True, exist_ok=True)
    wanted = {root / "decks.yaml": render_decks(tree.decks)}
    for card in tree.cards:
        wanted[root / "cards" / f"{card.slug}.yaml"] = render_card(card)
    for path, text in wanted.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for slug in sorted(retired):
        path = root / "cards" / f"{slug}.yaml"
        if path.exists():
            path.unlink()
            changed.append(path)
    return changed
