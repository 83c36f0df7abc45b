"""The lab form is generated from PARAM_FIELDS and validates only through parse_lab_params.

The hypothesis test posts random and hostile values to every lab endpoint: the answer is a 400
with messages naming fields, never a 500, and nothing is saved or enqueued.
"""

from __future__ import annotations

from unittest import mock

import pytest
from django import forms
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labs.forms import LabParamsForm
from labs.models import LabRun, Sweep, WorkerHeartbeat
from labs.parameters.params import FIELDS_BY_NAME, PARAM_FIELDS, ParamError, parse_lab_params
from labs.parameters.presets import LABS
from labs.runs import queueing
from tests.budget import examples
from tests.conftest import make_user
from tests.labs.factories import make_heartbeat

SANDBOX = LABS["sandbox"]


def test_the_form_has_one_optional_text_field_per_parameter():
    form = LabParamsForm(lab=SANDBOX)
    for f in PARAM_FIELDS:
        field = form.fields[f.name]
        assert isinstance(field, forms.CharField) and not field.required
        if f.name != "max_concurrency":  # the lab pages say what an empty one means there
            assert f.help in field.help_text
    block = form.fields["block_size"].widget
    assert [c[0] for c in block.choices] == [str(2**i) for i in range(9)]
    assert form.fields["num_prompts"].widget.attrs["max"] == "1000000"


@pytest.mark.parametrize(
    "data",
    [
        {"block_size": "24", "acceptance": "1", "gpu": "tpu-v9"},
        {"model": "custom", "layers": "32"},
        {"max_tokens": "10", "output_tokens": "300"},
        {"prompt_tokens": "1e400", "seed": "-1", "chunked_prefill": "maybe"},
    ],
)
def test_form_errors_are_exactly_the_parsers_messages(data):
    with pytest.raises(ParamError) as parsed:
        parse_lab_params(data)
    form = LabParamsForm(data=data, lab=SANDBOX)
    assert not form.is_valid()
    shown = {name: errors[0] for name, errors in form.errors.items()}
    assert shown == parsed.value.errors


def test_empty_fields_take_the_defaults():
    form = LabParamsForm(data={"block_size": "", "model": " "}, lab=SANDBOX)
    assert form.is_valid(), form.errors
    assert form.params.engine.block_size == FIELDS_BY_NAME["block_size"].default


# -- hostile input ---------------------------------------------------------------------------------

NAMES = [f.name for f in PARAM_FIELDS]
ODD_TEXT = [
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "-0",
    "0x10",
    "１６",
    "16.5",
    "1_000",
    "true",
    "None",
    "null",
    "[]",
    "{}",
    "custom",
    "<script>alert(1)</script>",
    "' OR 1=1 --",
    "\x00",
    "9" * 5000,
    "Ⅻ",
]
hostile_value = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=40),
)


@st.composite
def bad_value(draw: st.DrawFn) -> tuple[str, str]:
    """A field and a value it can never accept."""
    f = draw(st.sampled_from(PARAM_FIELDS))
    if f.kind == "bool":
        return f.name, draw(st.sampled_from(["maybe", "2", "-1", "yes please"]))
    if f.kind == "choice":
        return f.name, draw(st.sampled_from(["zzz", "h100 sxm", "none;drop", "0"]))
    too_big = str(int(f.maximum or 0) * 10 + 7)
    below = str(int(f.minimum or 0) - 1 - draw(st.integers(0, 10**9)))
    overflow = [] if f.inf_means_unset else ["1e999"]  # request_rate: inf means "all at once"
    return f.name, draw(st.sampled_from([too_big, below, "lots", "1.2.3", *overflow]))


hostile_posts = st.tuples(
    st.sampled_from(["run", "sweep", "predict"]),
    st.sampled_from(list(LABS)),
    st.dictionaries(
        st.sampled_from([*NAMES, "backend", "sweep_field", "sweep_values", "not_a_field"]),
        hostile_value,
        max_size=10,
    ),
    bad_value(),
)


@pytest.fixture
def learner(db):
    return make_user("hostile")


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(post=hostile_posts)
def test_hostile_posts_get_400_with_field_messages_and_nothing_runs(client, learner, post):
    endpoint, lab, data, (bad_field, bad) = post
    if not WorkerHeartbeat.objects.exists():
        make_heartbeat("sim")  # a worker is up: only validation can refuse
    client.force_login(learner)
    data = {**data, bad_field: bad}
    with mock.patch.object(queueing, "_enqueue") as enqueue:
        if endpoint == "predict":
            response = client.get(reverse("labs:lab-predict", args=[lab]), data)
        else:
            url = reverse(
                "labs:run-create" if endpoint == "run" else "labs:sweep-create", args=[lab]
            )
            response = client.post(url, data)
    assert response.status_code == 400, (endpoint, data)
    html = response.content.decode()
    assert bad_field in html  # the message names the field
    assert "must" in html or "required" in html
    enqueue.assert_not_called()
    assert not LabRun.objects.exists() and not Sweep.objects.exists()
