"""Fuzz every form and every path with hypothesis: no input may produce a server error.

Values are drawn from any Unicode text (NUL and surrogate-free control characters included),
numbers far outside every range, and the fields' own names; paths get arbitrary, percent-encoded
segments. The number of examples per test is FUZZ_EXAMPLES: by default 60 in `make test-deep` and
a tenth of that in `make test` (tests/budget.py); `FUZZ_EXAMPLES=1000` for a longer run. The
module prints how many inputs and requests ran (`pytest -s`).
"""

from __future__ import annotations

import os
from unittest import mock
from urllib.parse import quote

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.models import WorkerHeartbeat
from labs.parameters.params import FIELDS_BY_NAME
from labs.parameters.presets import LABS, load_presets
from labs.runs import queueing
from tests.budget import examples
from tests.conftest import make_user
from tests.labs.factories import make_heartbeat, make_run
from tests.quiz.factories import make_card

pytestmark = pytest.mark.django_db
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", examples(60)))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text a form may receive: anything, some of it shaped like numbers, booleans or slugs.
NUMBERISH = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["inf", "-inf", "nan", "1e309", "0x10", "1_000", "", " ", "\x00", "٣"]),
)
TEXT = st.one_of(st.text(max_size=80), NUMBERISH, st.sampled_from(["true", "on", "../../admin"]))
# What staff may paste: the above, JSON nested thousands deep, NUL escapes, a very long line.
STAFF_TEXT = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "[" * 5000 + "]" * 5000,
            '{"a": ' * 3000 + "1" + "}" * 3000,
            '["a\\u0000b"]',
            '{"key": "ttft_s", "params": {"block_size": -1}}',
            "x" * 200_000,
            "-1",
            "NaN",
        ]
    ),
)
SEGMENT = st.one_of(
    st.text(min_size=1, max_size=40).map(lambda s: quote(s, safe="")),
    st.sampled_from(["%00", "..", "%2e%2e", "%2F", "-1", "99999999999999999999", "a%00b"]),
)


SENT = {"requests": 0, "examples": 0}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\nfuzz: {SENT['examples']} inputs, {SENT['requests']} requests, no server error")


class Counter:
    def __init__(self) -> None:
        SENT["examples"] += 1

    def check(self, response) -> None:
        SENT["requests"] += 1
        assert response.status_code < 500, (response.status_code, response.content[:500])


@pytest.fixture
def world(db, settings):
    """A learner with a card on screen, a lab run, a live sim worker and no broker."""
    # Hashing is not what is fuzzed: MD5 keeps thousands of log-ins and password changes quick.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()
    user = make_user("fuzzer")
    client = Client(raise_request_exception=True)
    client.force_login(user)
    for kind in ("choice", "numeric", "recall"):
        make_card(kind)
    make_heartbeat("sim")
    run = make_run(user)
    with mock.patch.object(queueing, "_enqueue"):
        yield client, run
    cache.clear()


def _form(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    known = st.dictionaries(st.sampled_from(names), TEXT, max_size=len(names))
    extra = st.dictionaries(st.text(max_size=20), TEXT, max_size=3)
    return st.tuples(known, extra).map(lambda pair: {**pair[1], **pair[0]})


LAB_FIELDS = [*FIELDS_BY_NAME, "backend", "preset", "sweep_field", "sweep_values"]


@FUZZ
@given(lab=st.sampled_from(sorted(LABS)), data=_form(LAB_FIELDS), sweep=st.booleans())
def test_lab_forms(world, lab, data, sweep):
    client, _ = world
    counter = Counter()
    # The worker stays online however long the run takes (a refusal for no worker is a 503).
    WorkerHeartbeat.objects.update(last_seen=timezone.now())
    counter.check(client.get(f"/labs/{lab}/predict/", data))
    counter.check(client.get(f"/labs/{lab}/", data))
    counter.check(client.post(f"/labs/{lab}/{'sweeps' if sweep else 'runs'}/", data))


QUIZ_FIELDS = ["option", "value", "rating", "time_zone", "rollover_hour", "new_per_day"]
QUIZ_FIELDS += ["reviews_per_day", "desired_retention"]


@FUZZ
@given(data=_form(QUIZ_FIELDS), token=st.one_of(SEGMENT, st.just("")))
def test_quiz_forms(world, data, token):
    client, _ = world
    counter = Counter()
    html = client.get("/quiz/").content.decode()
    real = html.split("/quiz/answer/")[1].split("/")[0] if "/quiz/answer/" in html else "x"
    for path_token in (real, token or real):
        counter.check(client.post(f"/quiz/answer/{path_token}/", data))
        counter.check(client.post(f"/quiz/grade/{path_token}/", data))
    counter.check(client.post("/quiz/undo/", data))
    counter.check(client.post("/quiz/settings/", data))


@FUZZ
@given(data=_form(["username", "password", "password1", "password2", "next"]))
def test_account_forms(world, data):
    _, _ = world
    counter = Counter()
    anonymous = Client(raise_request_exception=True)
    counter.check(anonymous.post("/accounts/login/", data))
    counter.check(anonymous.post("/accounts/signup/", data))
    counter.check(anonymous.get("/accounts/login/", data))
    counter.check(anonymous.post("/admin/login/", data))


@pytest.fixture
def staff(world):
    client, run = world
    staff_client = Client(raise_request_exception=True)
    staff_client.force_login(make_user("fuzz-staff", is_staff=True, is_superuser=True))
    return staff_client, run


CARD_FIELDS = [
    "slug", "deck", "kind", "is_active", "source", "parent", "prompt", "answer", "steps",
    "steps_0", "steps_1", "steps_99", "explanation", "follow_up_question", "follow_up_answer",
    "numeric_value", "numeric_unit", "numeric_tolerance", "lab_preset", "check_json",
    "options-TOTAL_FORMS", "options-INITIAL_FORMS", "options-0-text", "options-0-is_correct",
    "options-0-position", "card_tags-TOTAL_FORMS", "card_tags-INITIAL_FORMS",
    "relations_out-TOTAL_FORMS", "relations_out-INITIAL_FORMS", "_save",
]  # fmt: skip


def _staff_form(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(names), STAFF_TEXT, max_size=len(names))


@FUZZ
@given(data=_staff_form(CARD_FIELDS), document=st.binary(max_size=2000), name=TEXT)
def test_staff_forms(staff, data, document, name):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from quiz.models import Card, Deck

    client, _ = staff
    counter = Counter()
    card = Card.objects.filter(owner=None).first()
    counter.check(client.post("/admin/quiz/card/add/", data))
    counter.check(client.post(f"/admin/quiz/card/{card.pk}/change/", data))
    upload = SimpleUploadedFile((name or "doc").replace("/", "_")[:100] or "doc", document)
    deck = Deck.objects.first()
    counter.check(
        client.post(
            "/admin/quiz/card/import-document/",
            {"deck": data.get("deck", deck.pk), "document": upload},
        )
    )
    Card.objects.filter(is_active=False, slug__startswith="draft-").delete()


@FUZZ
@given(data=_form(["old_password", "new_password1", "new_password2", "format", "deck"]))
def test_learner_account_and_export_forms(world, data):
    client, run = world
    counter = Counter()
    counter.check(client.post("/accounts/password/", data))
    counter.check(client.get("/quiz/stats/", data))
    counter.check(client.get("/quiz/stats/anki/", data))
    counter.check(client.post(f"/quiz/from-run/{run.pk}/", data))


PATHS = [
    "/quiz/cards/{}/",
    "/quiz/cards/{}/unsuspend/",
    "/quiz/cards/{}/retire/",
    "/quiz/from-run/{}/",
    "/quiz/from-sweep/{}/",
    "/admin/quiz/card/{}/change/",
    "/admin/{}/",
    "/quiz/answer/{}/",
    "/quiz/grade/{}/",
    "/labs/{}/",
    "/labs/{}/predict/",
    "/labs/{}/runs/",
    "/labs/{}/sweeps/",
    "/labs/preset/{}/",
    "/labs/runs/{}/",
    "/labs/runs/{}/cancel/",
    "/labs/sweeps/{}/",
    "/labs/sweeps/{}/cancel/",
    "/{}",
    "/accounts/{}/",
]


@FUZZ
@given(
    template=st.sampled_from(PATHS),
    segment=SEGMENT,
    query=_form(["a", "b", "preset", "next", "block_size"]),
    method=st.sampled_from(["get", "post"]),
)
def test_paths(world, template, segment, query, method):
    client, _ = world
    counter = Counter()
    url = template.format(segment)
    counter.check(getattr(client, method)(url, query))
    counter.check(client.get("/labs/runs/compare/", query))


def test_every_preset_and_lab_path_is_covered():
    # The fuzzed templates name every URL with a parameter; a new one must be added above.
    from django.urls import get_resolver

    patterns = {str(p.pattern) for p in get_resolver().url_patterns}
    assert {"quiz/", "labs/", "accounts/signup/"} <= patterns
    assert load_presets()  # presets exist to be looked up by the fuzzed preset values
