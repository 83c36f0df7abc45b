"""Study documents in the seeds' format become inactive draft cards for staff to review.

The format, line by line (paragraphs are single lines; blank lines only separate them):

- a question: a line ending in "?", a numbered line ("12. What is ...?") outside a worked answer,
  or a bullet ("- ...") that is not an option; inside a question list ("49 questions from 8
  pages", whose count is checked) every line is a question, "Name 3 ways ..." included;
- a worked answer: "Answer: <short answer>", then numbered steps "1. ...", "2. ...", then
  "Follow-up: <question>? <answer>" (its question is implied, so the draft's prompt is left for
  staff to write);
- multiple choice: a question line, options "- A ...", "- B ..." (A, B, C ... in order), then
  "Answer: <letter>. ..." and one line of explanation;
- "Related questions": the bullets after it are questions related to the multiple-choice one;
- any other line (a title, a note) is not a card.

`parse_document` is plain Python and raises `DocumentError` naming the line; `document_import`
writes every draft in one transaction, so a bad document leaves nothing behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils.text import slugify

from config.uploads import over_limit_text
from quiz.admin_forms import MAX_OPTIONS
from quiz.models import Card, CardRelation, ChoiceOption, Deck

# Every draft costs a few queries in the one request that imports them: 100,000 questions took
# 219 s. A study document holds tens; more is refused, with the line where the limit is passed.
MAX_DRAFTS = 2_000

_ANSWER = re.compile(r"^Answer:\s*(.*)$", re.IGNORECASE)
_FOLLOW_UP = re.compile(r"^Follow-?up:\s*(.*)$", re.IGNORECASE)
_NUMBERED = re.compile(r"^(\d+)[.)]\s+(.+)$")
_OPTION = re.compile(r"^[-*]\s*([A-H])[.)]?\s+(.+)$")
_BULLET = re.compile(r"^[-*]\s+(.+)$")
_LIST_HEADER = re.compile(r"^(\d+)\s+questions\b", re.IGNORECASE)
_RELATED = re.compile(r"related questions", re.IGNORECASE)
_CHOICE_ANSWER = re.compile(r"^([A-H])\b[.)]?\s*(.*)$")


class DocumentError(ValueError):
    """A line the importer cannot make sense of; nothing was imported."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}")


@dataclass
class DraftOption:
    text: str
    correct: bool = False


@dataclass
class Draft:
    """One card to be: `line` is where it starts in the document."""

    line: int
    kind: str  # "recall" or "choice"
    prompt: str
    answer: str = ""
    steps: list[str] = field(default_factory=list)
    explanation: str = ""
    options: list[DraftOption] = field(default_factory=list)
    parent_line: int | None = None  # a follow-up's worked answer
    related_line: int | None = None  # a related question's multiple-choice card


def _split_follow_up(text: str) -> tuple[str, str]:
    question, mark, answer = text.partition("? ")
    if not mark:
        return text.strip(), ""
    return question.strip() + "?", answer.strip()


class _Parser:
    def __init__(self) -> None:
        self.drafts: list[Draft] = []
        self.worked: Draft | None = None  # the worked answer still taking steps
        self.stem: Draft | None = None  # a question that may still get options
        self.choice: Draft | None = None  # the last multiple-choice card (for related ones)
        self.explain: Draft | None = None  # the choice card whose explanation comes next
        self.related = False
        self.list_header: tuple[int, int, int] | None = None  # (line, declared, drafts before)

    def question(self, line: int, text: str, *, stem: bool = False) -> None:
        self.close_stem(line)
        self.worked = None
        draft = Draft(line=line, kind="recall", prompt=text)
        if self.related and self.choice is not None:
            draft.related_line = self.choice.line
        self.drafts.append(draft)
        self.stem = draft if stem else None

    def close_stem(self, line: int) -> None:
        """Options must end with an answer line before anything else starts."""
        if self.stem is not None and self.stem.options:
            raise DocumentError(
                self.stem.line,
                f"the question has options {', '.join('ABCDEFGH'[: len(self.stem.options)])} "
                f"but no 'Answer: <letter>' line before line {line}",
            )
        self.stem = None

    def feed(self, number: int, text: str) -> None:
        if self.explain is not None:
            draft, self.explain = self.explain, None
            if not (_BULLET.match(text) or _RELATED.search(text) or text.endswith("?")):
                draft.explanation = text
                return
        if match := _LIST_HEADER.match(text):
            if self.list_header is not None or self.drafts:
                raise DocumentError(number, "a question-list header must come before any question")
            self.list_header = (number, int(match.group(1)), len(self.drafts))
            return
        if self.stem is not None and (match := _OPTION.match(text)):
            letter, option = match.groups()
            if len(self.stem.options) >= MAX_OPTIONS:
                raise DocumentError(
                    number, f"option {letter}: a question has at most {MAX_OPTIONS} options (A-F)"
                )
            expected = "ABCDEFGH"[len(self.stem.options)]
            if letter != expected:
                raise DocumentError(number, f"option {letter} where option {expected} was due")
            self.stem.options.append(DraftOption(option.strip()))
            return
        if match := _ANSWER.match(text):
            self.answer(number, match.group(1).strip())
            return
        if match := _FOLLOW_UP.match(text):
            self.follow_up(number, match.group(1).strip())
            return
        if (match := _NUMBERED.match(text)) and self.worked is not None:
            self.step(number, int(match.group(1)), match.group(2).strip())
            return
        if _RELATED.search(text):
            self.close_stem(number)
            self.related = True
            return
        if match := _BULLET.match(text):
            self.question(number, match.group(1).strip())
            return
        if match := _NUMBERED.match(text):
            self.question(number, match.group(2).strip(), stem=True)
            return
        if text.endswith("?") or self.list_header is not None:
            self.question(number, text, stem=True)
            return
        # A title or a note: not a card. It still ends a worked answer's steps.
        self.close_stem(number)
        self.worked = None

    def answer(self, number: int, text: str) -> None:
        stem = self.stem
        if stem is not None and stem.options:
            match = _CHOICE_ANSWER.match(text)
            letters = "ABCDEFGH"[: len(stem.options)]
            if not match or match.group(1) not in letters:
                raise DocumentError(
                    number, f"the answer must start with one of the options' letters ({letters})"
                )
            if len(stem.options) < 2:
                raise DocumentError(stem.line, "a multiple-choice question needs 2+ options")
            stem.kind = "choice"
            stem.options["ABCDEFGH".index(match.group(1))].correct = True
            stem.answer = match.group(2).strip() or stem.options[0].text
            self.stem, self.choice, self.explain, self.related = None, stem, stem, False
            return
        if not text:
            raise DocumentError(number, "'Answer:' needs the short answer on the same line")
        self.close_stem(number)
        # The seeds give worked answers without their questions: staff write the prompt.
        draft = Draft(line=number, kind="recall", prompt="", answer=text)
        self.drafts.append(draft)
        self.worked = draft

    def step(self, number: int, index: int, text: str) -> None:
        worked = self.worked
        assert worked is not None
        if index != len(worked.steps) + 1:
            raise DocumentError(number, f"step {index} where step {len(worked.steps) + 1} was due")
        worked.steps.append(text)

    def follow_up(self, number: int, text: str) -> None:
        parent = self.worked
        if parent is None:
            raise DocumentError(number, "a follow-up must come after the worked answer it follows")
        question, answer = _split_follow_up(text)
        if not question:
            raise DocumentError(number, "'Follow-up:' needs a question on the same line")
        self.drafts.append(
            Draft(
                line=number, kind="recall", prompt=question, answer=answer, parent_line=parent.line
            )
        )
        self.worked = None

    def finish(self, last_line: int) -> list[Draft]:
        self.close_stem(last_line + 1)
        if self.list_header is not None:
            line, declared, before = self.list_header
            found = len(self.drafts) - before
            if found != declared:
                raise DocumentError(
                    line, f"the header promises {declared} questions, found {found}"
                )
        if not self.drafts:
            raise DocumentError(1, "no questions, worked answers or multiple choice found")
        return self.drafts


def parse_document(text: str) -> list[Draft]:
    """Every card the document holds, in document order.

    Raises:
        DocumentError: the first line that breaks the format, by number.
    """
    parser = _Parser()
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if line:
            parser.feed(number, line)
            if len(parser.drafts) > MAX_DRAFTS:
                raise DocumentError(
                    number,
                    f"a document may hold at most {MAX_DRAFTS:,} questions; split it in parts",
                )
    return parser.finish(len(lines))


def decode_upload(upload: UploadedFile) -> str:
    """The uploaded file as text, or DocumentError saying why not. Its size is checked before
    it is read."""
    limit = settings.UPLOAD_MAX_BYTES
    if upload.size is None or upload.size > limit:
        raise DocumentError(1, over_limit_text(upload.size or limit + 1, limit))
    data = upload.read(limit + 1)
    if len(data) > limit:  # a size the upload misreported
        raise DocumentError(1, over_limit_text(len(data), limit))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DocumentError(line, "the file must be UTF-8 text") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise DocumentError(line, "the file holds a NUL character; it must be plain UTF-8 text")
    return text


DRAFT_PREFIX = "draft-"
# A published card's slug: the first words of its prompt, short enough to read in a link.
PUBLISHED_SLUG_CHARS = 60


def draft_slug(name: str, line: int) -> str:
    stem = slugify(name.rsplit(".", 1)[0].replace("_", "-"))[:80] or "document"
    return f"{DRAFT_PREFIX}{stem}-l{line}"


def is_draft(card: Card) -> bool:
    """An imported card not yet published: inactive, shared, still named by its source line.
    Its slug may change until it is published (nothing in content/ names it yet)."""
    return card.owner_id is None and not card.is_active and card.slug.startswith(DRAFT_PREFIX)


def published_slug(card: Card, taken: set[str]) -> str:
    """A name from the card's own words ("how-many-blocks-does-a-1-000-token-sequence-take"),
    cut at a word, with -2, -3 ... when another card has it."""
    words = slugify(card.title.replace("\u2026", "").replace("_", " ")).split("-")
    stem = ""
    for word in words:
        if len(stem) + len(word) + 1 > PUBLISHED_SLUG_CHARS:
            break
        stem = f"{stem}-{word}" if stem else word
    stem = stem or slugify(card.kind) or "card"
    slug, n = stem, 2
    while slug in taken:
        slug, n = f"{stem}-{n}", n + 1
    return slug


class PublishRefused(ValueError):
    """Cards that cannot be published yet, with the reason for each."""

    def __init__(self, reasons: dict[str, str]) -> None:
        super().__init__("; ".join(f"{slug}: {why}" for slug, why in reasons.items()))
        self.reasons = reasons


@transaction.atomic
def publish_drafts(cards: list[Card]) -> list[Card]:
    """Give each draft a real slug (the one staff typed, or one from its prompt) and make it
    active. Marked as edited in the admin, so load_content keeps it until export_content writes
    it to content/. All or nothing.

    Raises:
        PublishRefused: a card that is not a draft, or has no prompt or answer to show.
    """
    reasons: dict[str, str] = {}
    for card in cards:
        if card.is_active or card.owner_id is not None:
            reasons[card.slug] = "not an unpublished draft (only inactive shared cards publish)"
        elif not card.prompt.strip() or not card.answer.strip():
            reasons[card.slug] = "write its prompt and answer first"
    if reasons:
        raise PublishRefused(reasons)
    taken = set(Card.objects.values_list("slug", flat=True))
    for card in cards:
        if card.slug.startswith(DRAFT_PREFIX):
            taken.discard(card.slug)
            card.slug = published_slug(card, taken)
        taken.add(card.slug)
        card.is_active = True
        card.edited_since_load = True
        card.save(update_fields=["slug", "is_active", "edited_since_load", "updated_at"])
    return cards


@transaction.atomic
def document_import(*, deck: Deck, name: str, text: str) -> list[Card]:
    """Parse `text` and create one inactive draft card per question, each naming its source
    line ("<name>:<line>"). All or nothing.

    Raises:
        DocumentError: a malformed line, or a draft that already exists (imported before).
    """
    drafts = parse_document(text)
    by_line: dict[int, Card] = {}
    name = name.replace("\x00", "")  # a file name is not checked as the text is
    source_name = name[:180]
    slugs = {draft_slug(name, draft.line): draft.line for draft in drafts}
    taken = set(Card.objects.filter(slug__in=list(slugs)).values_list("slug", flat=True))
    if taken:
        slug = min(taken, key=slugs.__getitem__)
        raise DocumentError(
            slugs[slug], f"the draft {slug} already exists: was this document imported before?"
        )
    for draft in drafts:
        slug = draft_slug(name, draft.line)
        card = Card.objects.create(
            deck=deck,
            slug=slug,
            kind=draft.kind,
            prompt=draft.prompt,
            answer=draft.answer,
            steps=draft.steps,
            explanation=draft.explanation,
            source=f"{source_name}:{draft.line}",
            is_active=False,
            parent=by_line.get(draft.parent_line) if draft.parent_line else None,
        )
        ChoiceOption.objects.bulk_create(
            ChoiceOption(card=card, text=option.text, is_correct=option.correct, position=i)
            for i, option in enumerate(draft.options)
        )
        if draft.related_line is not None:
            other = by_line[draft.related_line]
            CardRelation.objects.bulk_create(
                [
                    CardRelation(from_card=other, to_card=card, position=len(by_line)),
                    CardRelation(from_card=card, to_card=other, position=0),
                ]
            )
        by_line[draft.line] = card
    return list(by_line.values())
