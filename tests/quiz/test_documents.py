"""Study documents become inactive draft cards: the three seed files are the fixtures.

Expected counts are written out from the seed files (tests/quiz/fixtures/), not taken from the
parser: 7 worked answers each with a follow-up; 49 questions; 1 multiple-choice question and 6
related questions.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from quiz.documents import (
    DocumentError,
    PublishRefused,
    document_import,
    parse_document,
    publish_drafts,
)
from quiz.models import Card
from tests.conftest import make_user
from tests.quiz.factories import make_deck

FIXTURES = Path(__file__).parent / "fixtures"
WORKED = "000_36de575bee6c4e63.txt"
QUESTIONS = "001_ff1e534f04acf2ef.txt"
CHOICE = "003_069e362ba7a89ee1.txt"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def _line(name: str, number: int) -> str:
    return _read(name).splitlines()[number - 1].strip()


@pytest.fixture
def imported(db) -> dict[str, list[Card]]:
    deck = make_deck()
    return {
        name: document_import(deck=deck, name=name, text=_read(name))
        for name in (WORKED, QUESTIONS, CHOICE)
    }


def test_it_turns_the_three_seeds_into_70_inactive_drafts(imported):
    assert sum(len(cards) for cards in imported.values()) == 70
    assert Card.objects.count() == 70
    assert not Card.objects.filter(is_active=True).exists()
    # Every draft names the line it came from, and that line holds its text.
    for name, cards in imported.items():
        for card in cards:
            file, number = card.source.rsplit(":", 1)
            assert file == name
            line = _line(name, int(number))
            assert (card.prompt and card.prompt[:20] in line) or card.answer[:20] in line


def test_it_attaches_the_worked_answers_with_their_steps_and_follow_ups(imported):
    text = _read(WORKED)
    answer_lines = [i for i, line in enumerate(text.splitlines(), 1) if line.startswith("Answer:")]
    cards = imported[WORKED]
    worked = [c for c in cards if c.parent_id is None]
    follow_ups = [c for c in cards if c.parent_id is not None]
    assert len(worked) == 7 and len(follow_ups) == 7
    assert [int(c.source.rsplit(":", 1)[1]) for c in worked] == answer_lines
    for card in worked:
        # The answer line's text, and every numbered step under it, in order.
        assert card.answer == _line(WORKED, int(card.source.rsplit(":", 1)[1]))[len("Answer: ") :]
        assert len(card.steps) in (3, 4)
        assert all(step and not re.match(r"^\d+\.", step) for step in card.steps)
    first = worked[0]
    assert first.steps[0].startswith("1,000 tokens ÷ 16 = 62.5")
    assert {c.parent_id for c in follow_ups} == {c.pk for c in worked}
    fu = next(c for c in follow_ups if c.parent_id == first.pk)
    assert fu.prompt.endswith("how many prompt blocks do they need?")
    assert fu.answer.startswith("Still 44")


def test_it_keeps_every_listed_question(imported):
    cards = imported[QUESTIONS]
    questions = [line for line in _read(QUESTIONS).splitlines()[1:] if line.strip()]
    assert [c.prompt for c in cards] == questions
    assert "Name 3 ways to improve TTFT." in questions  # a question without "?"


def test_it_builds_the_multiple_choice_card_and_links_its_related_questions(imported):
    choice, *related = imported[CHOICE]
    assert choice.kind == Card.Kind.CHOICE and len(related) == 6
    options = list(choice.options.order_by("position"))
    assert [o.text[:8] for o in options] == ["Lower ma", "Allocate", "Quantize", "Add tens"]
    assert [o.is_correct for o in options] == [False, True, False, False]
    assert choice.explanation.startswith("Worst-case contiguous reservation wastes over 90%")
    linked = set(choice.relations_out.values_list("to_card_id", flat=True))
    assert linked == {c.pk for c in related}
    assert related[1].prompt.startswith("A 70B-class model (80 layers")  # not an "option A"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("Title\n\nAnswer: 42\n\n1. first\n3. third\n", 6, "step 3 where step 2 was due"),
        ("Follow-up: Why? Because.\n", 1, "after the worked answer"),
        ("Which one?\n- A yes\n- B no\n\nWhat next?\n", 1, "no 'Answer: <letter>' line"),
        ("Which one?\n- A yes\n- C no\nAnswer: A\n", 3, "option C where option B was due"),
        ("Which one?\n- A yes\n- B no\nAnswer: D. never\n", 4, "one of the options' letters (AB)"),
        ("3 questions from 1 page\n\nOne?\n\nTwo?\n", 1, "promises 3 questions, found 2"),
        ("Just a title\n", 1, "no questions"),
        (
            "Which one?\n" + "".join(f"- {c} x\n" for c in "ABCDEFGHA") + "Answer: A\n",
            8,
            "at most 6 options (A-F)",
        ),
    ],
)
def test_it_names_the_line_of_a_malformed_document(text, line, words):
    with pytest.raises(DocumentError) as caught:
        parse_document(text)
    assert caught.value.line == line
    assert words in str(caught.value) and str(caught.value).startswith(f"line {line}:")


def test_a_malformed_document_imports_nothing(db):
    # Fine questions first, then a broken multiple choice: none of them may be left behind.
    text = _read(QUESTIONS).replace("49 questions", "50 questions", 1)
    with pytest.raises(DocumentError, match="line 1: the header promises 50"):
        document_import(deck=make_deck(), name=QUESTIONS, text=text)
    broken = _read(CHOICE).replace("Answer: B.", "Answer: E.")
    with pytest.raises(DocumentError, match="line 7"):
        document_import(deck=make_deck(), name=CHOICE, text=broken)
    assert Card.objects.count() == 0


def test_it_refuses_to_import_the_same_document_twice(db):
    deck = make_deck()
    document_import(deck=deck, name=CHOICE, text=_read(CHOICE))
    with pytest.raises(DocumentError, match="already exists"):
        document_import(deck=deck, name=CHOICE, text=_read(CHOICE))
    assert Card.objects.count() == 7


@pytest.fixture
def staff_client(client, db):
    client.force_login(make_user("staff", is_staff=True, is_superuser=True))
    return client


def _upload(name: str, data: bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="text/plain")


def test_staff_import_a_document_from_the_card_list(staff_client):
    deck = make_deck()
    changelist = staff_client.get(reverse("admin:quiz_card_changelist")).content.decode()
    url = reverse("admin:quiz_card_import_document")
    assert url in changelist and "Import a study document" in changelist
    assert staff_client.get(url).status_code == 200
    response = staff_client.post(
        url, {"deck": deck.pk, "document": _upload(WORKED, _read(WORKED).encode())}, follow=True
    )
    assert response.status_code == 200
    assert "14 draft cards from" in response.content.decode()
    assert Card.objects.filter(is_active=False, deck=deck).count() == 14


def test_staff_see_the_line_of_a_malformed_upload_and_nothing_is_imported(staff_client):
    deck = make_deck()
    url = reverse("admin:quiz_card_import_document")
    bad = _read(WORKED).replace("2. Contiguous", "4. Contiguous").encode()
    response = staff_client.post(url, {"deck": deck.pk, "document": _upload("bad.txt", bad)})
    html = response.content.decode()
    assert response.status_code == 400
    assert "line 6: step 4 where step 2 was due" in html and "Nothing was imported" in html
    not_utf8 = staff_client.post(
        url, {"deck": deck.pk, "document": _upload("x.txt", b"What?\n\xff\xfe")}
    )
    assert (
        not_utf8.status_code == 400
        and "line 2: the file must be UTF-8" in not_utf8.content.decode()
    )
    assert Card.objects.count() == 0


def test_non_staff_cannot_import(client, db):
    client.force_login(make_user("learner"))
    url = reverse("admin:quiz_card_import_document")
    response = client.post(url, {"document": _upload(WORKED, b"What?\n")})
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert Card.objects.count() == 0


class _CountingInput:
    """A request body that counts what is read from it (and holds nothing)."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        self.read_bytes += max(size, 0)
        return b"\0" * max(size, 0)

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


def test_a_200_mib_upload_is_refused_from_its_length_before_a_byte_is_read(staff_client):
    # It was read whole (7.6 s, 756 MiB peak) before the size check, which said "1,000,001 bytes".
    body = _CountingInput()
    response = staff_client.generic(
        "POST",
        reverse("admin:quiz_card_import_document"),
        data=b"-",
        content_type="multipart/form-data; boundary=BoUnDaRy",
        CONTENT_LENGTH=str(200 * 2**20),
        **{"wsgi.input": body},
    )
    assert response.status_code == 413
    assert body.read_bytes == 0
    text = response.content.decode()
    assert "the file is 209.7 MB; a file may be 1 MB at most" in text
    assert "Nothing was read or imported" in text


@pytest.mark.parametrize(
    ("size", "said"),
    [(1_000_001, "more than 1 MB"), (1_060_000, "1.1 MB")],
)
def test_a_document_over_the_limit_is_refused_in_megabytes(staff_client, size, said):
    url = reverse("admin:quiz_card_import_document")
    upload = _upload("big.txt", b"Why?\n" * (size // 5) + b"x" * (size % 5))
    response = staff_client.post(url, {"deck": make_deck().pk, "document": upload})
    html = response.content.decode()
    assert response.status_code == 400
    assert f"big.txt, line 1: the file is {said}; a file may be 1 MB at most." in html
    assert f"{size:,}" not in html and Card.objects.count() == 0


# -- publishing: a draft gets a real slug ---------------------------------------------------------


def test_publishing_drafts_names_them_from_their_prompts_and_keeps_their_links(imported):
    choice, *related = imported[CHOICE]
    follow_up = next(c for c in imported[WORKED] if c.prompt.startswith("Two samples (n = 2)"))
    published = publish_drafts([choice, follow_up])
    for card in published:
        card.refresh_from_db()
        assert not card.slug.startswith("draft-") and len(card.slug) <= 60
        assert card.is_active and card.edited_since_load
    assert follow_up.slug == "two-samples-n-2-from-the-same-prompt-how-many-prompt-blocks"
    # Related links follow the card by id, whatever its name.
    assert set(choice.relations_out.values_list("to_card_id", flat=True)) == {c.pk for c in related}


def _answered_drafts(text: str) -> list[Card]:
    cards = document_import(deck=make_deck(), name="doc.txt", text=text)
    Card.objects.filter(pk__in=[c.pk for c in cards]).update(answer="Staff wrote this.")
    return [Card.objects.get(pk=c.pk) for c in cards]


def test_a_published_name_taken_by_another_card_gets_a_number(db):
    published = publish_drafts(_answered_drafts("Why page KV?\n\nWhy page KV?\n"))
    assert [c.slug for c in published] == ["why-page-kv", "why-page-kv-2"]


def test_publishing_refuses_a_draft_without_a_prompt_and_publishes_nothing(imported):
    worked = imported[WORKED]
    empty = next(c for c in worked if not c.prompt.strip())  # a worked answer's implied question
    with pytest.raises(PublishRefused) as refused:
        publish_drafts([worked[0], empty])
    assert refused.value.reasons == {empty.slug: "write its prompt and answer first"}
    assert not Card.objects.filter(is_active=True).exists()


def test_staff_publish_drafts_from_the_card_list_and_may_name_one_first(staff_client):
    first, second = _answered_drafts("Why page KV?\n\nWhat is TTFT?\n")
    page = staff_client.get(reverse("admin:quiz_card_change", args=[first.pk]))
    assert "slug" in page.context["adminform"].form.fields  # a draft may be named
    response = staff_client.post(
        reverse("admin:quiz_card_changelist"),
        {"action": "publish_drafts", "_selected_action": [first.pk, second.pk]},
        follow=True,
    )
    assert "Published 2 card(s): why-page-kv, what-is-ttft" in response.content.decode()
    assert set(Card.objects.filter(is_active=True).values_list("slug", flat=True)) == {
        "why-page-kv",
        "what-is-ttft",
    }
    page = staff_client.get(reverse("admin:quiz_card_change", args=[first.pk]))
    assert "slug" not in page.context["adminform"].form.fields  # published: fixed again
    again = staff_client.post(
        reverse("admin:quiz_card_changelist"),
        {"action": "publish_drafts", "_selected_action": [first.pk]},
        follow=True,
    )
    assert "Nothing was published. why-page-kv: not an unpublished draft" in again.content.decode()


def test_a_nul_byte_is_refused_with_its_line_and_nothing_is_imported(staff_client):
    deck = make_deck()
    url = reverse("admin:quiz_card_import_document")
    data = b"What is a block?\nAnswer: 16 tokens\nWhat\x00 else?\n"
    response = staff_client.post(url, {"deck": deck.pk, "document": _upload("nul.txt", data)})
    assert response.status_code == 400
    assert "line 3: the file holds a NUL character" in response.content.decode()
    assert Card.objects.count() == 0


def test_a_document_with_too_many_questions_is_refused_before_anything_is_written(db):
    from quiz import documents

    text = "\n".join(f"Question number {i}?" for i in range(documents.MAX_DRAFTS + 5))
    with pytest.raises(documents.DocumentError) as info:
        documents.document_import(deck=make_deck(), name="big.txt", text=text)
    assert info.value.line == documents.MAX_DRAFTS + 1
    assert f"at most {documents.MAX_DRAFTS:,} questions" in str(info.value)
    assert Card.objects.count() == 0


def test_a_document_imported_twice_names_its_first_draft(db):
    from quiz import documents

    deck = make_deck()
    text = "Intro line\nFirst question?\nSecond question?\n"
    assert len(documents.document_import(deck=deck, name="twice.txt", text=text)) == 2
    with pytest.raises(documents.DocumentError, match="line 2: the draft draft-twice-l2 already"):
        documents.document_import(deck=deck, name="twice.txt", text=text)
