"""One set of scheduling rules: the fast path (runs of decode steps, steady steps) gives the run
that scheduling every step on its own gives (`step_by_step=True`), on random lab forms.

The scheduler and the fast path apply the same rules (labs/sim/rules.py); a rule changed or added
in one of them only makes the two runs differ, and a draw below that reaches it fails, naming its
seed and form. Draws are seeded (seed i draws form i), so a failure reproduces with
`pytest 'tests/labs/sim/test_equivalence.py::test_the_fast_path_runs_as_step_by_step[17]'`.
`make test` runs a tenth of the draws (tests/budget.py), `make test-deep` all of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from labs.backends.base import RunRecord
from labs.sim.lab import build_simulator
from labs.sim.simulator import Simulator
from tests.budget import examples
from tests.labs.sim.helpers import assert_same_breakdown, assert_same_record
from tests.labs.sim.lab_forms import LabDraw, draw_lab

DRAWS = examples(300)
# The draws `make test` takes (the first of the full count).
FIRST_DRAWS = 30


def draw(seed: int) -> LabDraw:
    return draw_lab(np.random.default_rng([59, seed]))


def run(lab: LabDraw, *, step_by_step: bool) -> tuple[Simulator, RunRecord]:
    sim = build_simulator(lab.params, device=lab.device)
    sim.step_by_step = step_by_step
    return sim, sim.run()


@pytest.mark.parametrize("seed", range(DRAWS))
def test_the_fast_path_runs_as_step_by_step(seed):
    lab = draw(seed)
    fast_sim, fast = run(lab, step_by_step=False)
    slow_sim, slow = run(lab, step_by_step=True)
    assert slow_sim.num_skipped_steps == slow_sim.num_steady_steps == 0
    try:
        assert_same_record(fast, slow)
        # Token times are the same floats, not merely close: both add the same step times in
        # the same order.
        for a, b in zip(fast.requests, slow.requests, strict=True):
            assert np.array_equal(a.chunks.times_s, b.chunks.times_s), a.req_id
            assert a.finish_s == b.finish_s, a.req_id
        assert_same_breakdown(fast_sim, fast, slow_sim, slow)
    except AssertionError as error:
        where = f"draw {seed}: {lab.form}" + (f", device {lab.device}" if lab.device else "")
        raise AssertionError(f"{where}\n{error}") from error
    assert fast_sim.scheduler.pool.num_used_blocks == slow_sim.scheduler.pool.num_used_blocks == 0


def test_the_draws_reach_every_way_of_stepping_and_every_regime():
    # A comparison can only catch a rule that its draws reach: the draws of `make test` take
    # both fast ways and go through preemption, prefix-cache hits, speculation (drafting every
    # step and at a calibrated share), contiguous KV, prompts whole without chunked prefill,
    # and arrivals by rate and by concurrency.
    seen: dict[str, int] = {}

    def count(name: str, happened: object) -> None:
        seen[name] = seen.get(name, 0) + bool(happened)

    for seed in range(min(DRAWS, FIRST_DRAWS)):
        lab = draw(seed)
        sim, record = run(lab, step_by_step=False)
        engine, work = lab.params.engine, lab.params.workload
        count("decode runs", sim.num_skipped_steps)
        count("steady steps", sim.num_steady_steps)
        count("preemptions", record.counters.preemptions)
        count("prefix-cache hits", record.counters.prefix_cache_hits)
        count("speculation", record.counters.spec_drafts)
        count("draft share below 1", engine.spec_tokens and engine.draft_share < 1)
        count("contiguous", engine.kv_allocation == "contiguous")
        count("no chunked prefill", not engine.chunked_prefill)
        count("request rate", work.request_rate)
        count("concurrency cap", work.max_concurrency)
        count("front end", lab.device and lab.device.frontend_cpu_s)
    assert all(seen.values()), f"no draw reached: {[n for n, c in seen.items() if not c]}"
