"""Every number the deck asks for is the predictor's number.

For each card file with a `check:` block (docs/content-format.md), the card's stored
`numeric.value` must equal `predict(parse_lab_params(params)).as_dict()[key]`, converted from the
predictor's base unit (bytes, seconds, tokens, ratio, ...) into the card's unit, within the card's
tolerance. A card whose number is typed in wrong, or a predictor formula that drifts from the
worked answers, fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

import labs.prediction.predict
from labs.parameters.params import parse_lab_params
from labs.prediction.predict import predict
from quiz.content import CardSpec, read_tree

CONTENT = Path(settings.BASE_DIR) / "content"

# One unit of the card's `unit`, in the predictor's base unit.
UNIT_SIZE: dict[str, float] = {
    "bytes": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "s": 1,
    "ms": 1e-3,
    "tokens": 1,
    "slots": 1,
    "blocks": 1,
    "sequences": 1,
    "replicas": 1,
    "GPUs": 1,
    "x": 1,
    "%": 0.01,
    "tokens/s": 1,
}

# Numeric cards whose number the predictor cannot compute from lab parameters, and why. Any other
# numeric card must carry a check.
UNCHECKED: set[str] = set()

CARDS = read_tree(CONTENT).cards
CHECKED = [c for c in CARDS if c.check is not None]


def predicted_base(check: dict, where: str) -> float:
    """The predictor's number for a `check` block ({key, params} or {formula, args}), in its base
    unit (bytes, seconds, tokens, ratio, ...). `where` names the card in failure messages."""
    if "formula" in check:
        # A public formula of the predictor applied to numbers the question gives.
        name = check["formula"]
        formula = getattr(labs.prediction.predict, name, None)
        assert callable(formula) and not name.startswith("_"), f"{where}: no formula {name!r}"
        key, value = name, formula(**check["args"])
    else:
        result = predict(parse_lab_params(check["params"])).as_dict()
        key = check["key"]
        assert key in result, f"{where}: the predictor has no key {key!r}"
        value = result[key]
    assert isinstance(value, int | float), f"{where}: {key} is {value!r} for these params"
    return value


def predicted_in_card_unit(card: CardSpec) -> float:
    assert card.check is not None
    value = predicted_base(card.check, card.slug)
    assert card.numeric_unit in UNIT_SIZE, f"{card.slug}: unit {card.numeric_unit!r} unknown"
    return value / UNIT_SIZE[card.numeric_unit]


def agrees(card: CardSpec, stored: float) -> bool:
    assert card.numeric_tolerance is not None
    return abs(stored - predicted_in_card_unit(card)) <= card.numeric_tolerance + 1e-9


def test_it_has_checks_to_run():
    assert len(CHECKED) >= 15


@pytest.mark.parametrize("card", CHECKED, ids=[c.slug for c in CHECKED])
def test_it_stores_the_predicted_value(card: CardSpec):
    assert card.kind == "numeric", f"{card.slug}: only numeric cards carry a check"
    assert card.numeric_value is not None
    predicted = predicted_in_card_unit(card)
    assert agrees(card, card.numeric_value), (
        f"{card.slug}: stored {card.numeric_value} {card.numeric_unit}, predictor gives "
        f"{predicted:.6g} {card.numeric_unit} ({card.check.get('key') or card.check['formula']}), "
        f"tolerance "
        f"{card.numeric_tolerance}"
    )


@pytest.mark.parametrize("card", CHECKED, ids=[c.slug for c in CHECKED])
def test_it_rejects_a_wrong_stored_value(card: CardSpec):
    # The same comparison fails once the stored number is off by more than the tolerance.
    assert card.numeric_value is not None and card.numeric_tolerance is not None
    off = 2 * card.numeric_tolerance + 0.1 * max(abs(card.numeric_value), 1)
    assert not agrees(card, card.numeric_value + off)
    assert not agrees(card, card.numeric_value - off)


def test_it_checks_every_numeric_card_the_predictor_can_compute():
    numeric = {c.slug for c in CARDS if c.kind == "numeric"}
    unchecked = {c.slug for c in CARDS if c.kind == "numeric" and c.check is None}
    assert numeric >= UNCHECKED, UNCHECKED - numeric
    assert unchecked == UNCHECKED


# Wrong answers a card's explanation warns about, as the predictor computes them: the card's
# tolerance must not accept them.
MISTAKES: dict[str, dict] = {
    # E2E with TPOT counted for all n tokens instead of n - 1: the formula for n + 1 tokens.
    "e2e-latency-from-ttft-tpot": {
        "formula": "e2e_time_s",
        "args": {"ttft_s": 0.3, "tpot_s": 0.025, "output_tokens": 401},
    },
}


@pytest.mark.parametrize("slug", sorted(MISTAKES))
def test_it_rejects_the_mistake_a_card_warns_about(slug: str):
    (card,) = [c for c in CARDS if c.slug == slug]
    mistake = predicted_base(MISTAKES[slug], slug) / UNIT_SIZE[card.numeric_unit]
    assert not agrees(card, mistake), f"{slug}: the tolerance accepts the mistake {mistake}"
    assert agrees(card, card.numeric_value)
