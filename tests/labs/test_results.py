"""How the lab pages write numbers (labs.results.format_value)."""

from __future__ import annotations

import pytest

from labs.results import format_value


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (1, "seqs", "1 seq"),
        (2, "seqs", "2 seqs"),
        (1.0, "tokens", "1 token"),
        (1, "blocks", "1 block"),
        (1, "GPUs", "1 GPU"),
        (0, "seqs", "0 seqs"),
        (1, "tok/s", "1 tok/s"),
    ],
)
def test_it_writes_one_of_a_count_in_the_singular(value, unit, text):
    assert format_value(value, unit) == text
