"""The formulas against their own engine wherever a learner may click: settings drawn at random
across the whole lab form (labs/explanation/form_draws.py), each predicted (`lab predict`) and
simulated on the ideal profile (`lab run --backend sim --sim-profile ideal`), compared on TTFT
(mean and median), TPOT, output tokens/s and running sequences within 25%.

`make test` draws a tenth of the full count (tests/budget.py), `make test-deep` all of it; the
draws are seeded, so a failure reproduces. The issue's aim is 90% of draws within 25% on every
metric and at most 10% left unpredicted (`Prediction.uncovered`); FLOOR is the share this code
holds, below that aim, so the test fails on a regression and the strict xfail below fails (to
be raised) once the aim is reached. Neither tolerance is the thing tuned: 25% is the run page's.
"""

from __future__ import annotations

import pytest

from labs.explanation.form_draws import Tally, run_draws
from tests.budget import DEEP, examples

# One process computes the draws for every test here (they share the module's fixture). A
# thousand simulated runs take minutes of CPU, more than the suite's 300 s guard on a busy
# machine, so the deep count has a guard of its own.
pytestmark = [pytest.mark.xdist_group("form-draws"), pytest.mark.timeout(1800 if DEEP else 300)]

DRAWS = examples(1000)
SEED = 20260
AIM = 0.90
FLOOR = 0.75
UNPREDICTED_MOST = 0.10


@pytest.fixture(scope="module")
def tally() -> Tally:
    return Tally.of(run_draws(SEED, DRAWS))


def test_most_draws_across_the_form_agree_with_the_ideal_engine(tally: Tally):
    total = sum(tally.total.values())
    assert total == DRAWS
    agree = tally.total["agree"] / total
    assert agree >= FLOOR, tally.table()


def test_few_draws_are_left_unpredicted(tally: Tally):
    total = sum(tally.total.values())
    assert tally.total["unpredicted"] / total <= UNPREDICTED_MOST, tally.table()


def test_every_binding_limit_is_drawn(tally: Tally):
    """The draw reaches each regime the issue names, not only the easy ones."""
    seen = {name for name, counts in tally.by_limit.items() if sum(counts.values())}
    assert {"concurrency", "max_num_seqs", "rate below capacity"} <= seen, tally.table()
    if DRAWS >= 100:
        assert {"token budget", "KV pool", "rate above capacity"} <= seen, tally.table()


@pytest.mark.xfail(strict=True, reason="the issue's aim, not met yet: see FLOOR")
def test_the_aim_nine_in_ten_draws_agree(tally: Tally):
    total = sum(tally.total.values())
    assert tally.total["agree"] / total >= AIM, tally.table()
