"""A 12-point sweep of the benchmark case, end to end: the sandbox lab's sweep form, a real Celery
worker started as `make run` starts it (prefork, two processes, on the default broker), and the
sweep page polled as its htmx status partial until every point is done. Target: under 10 s on a
quiet machine.

What is timed: from the POST of the sweep form to the poll that returns the finished page (286).
Each point's landing time is its `finished_at` relative to the POST. The worker's start-up is not
timed (a deployment keeps it running).

Not part of the default run. Run it with
    .venv/bin/pytest tests/benchmarks/bench_sweep.py -s
"""

from __future__ import annotations

import os
import time

import pytest
from django.urls import reverse

from labs.models import RunState, Sweep
from tests.worker import start_worker

HTMX = {"HTTP_HX_REQUEST": "true"}
VALUES = "32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 320, 384"
FORM = {
    "backend": "sim",
    "num_prompts": "1000",
    "prompt_tokens": "1024",
    "output_tokens": "256",
    "max_num_seqs": "256",
    "sweep_field": "max_num_seqs",
    "sweep_values": VALUES,
}


@pytest.fixture
def sim_worker(transactional_db):
    worker = start_worker(["default", "labs.sim"], pool="prefork", concurrency=2)
    yield worker
    worker.stop()


def test_a_12_point_sweep_end_to_end(sim_worker, alice_client, alice):
    load = os.getloadavg()[0]
    start = time.perf_counter()
    response = alice_client.post(reverse("labs:sweep-create", args=["sandbox"]), FORM)
    assert response.status_code == 302, response.content.decode()[:2000]
    sweep = Sweep.objects.get(owner=alice)
    url = sweep.get_absolute_url()
    polls = 0
    while True:
        polls += 1
        page = alice_client.get(url, **HTMX)
        if page.status_code == 286:
            break
        assert time.perf_counter() - start < 300, "the sweep did not finish in 5 minutes"
        time.sleep(0.1)
    total = time.perf_counter() - start
    runs = list(sweep.runs.order_by("finished_at"))
    assert [r.state for r in runs] == [RunState.DONE] * 12
    posted_at = sweep.created_at
    print(
        f"\n12-point sweep of max_num_seqs ({VALUES}), 1,000 requests of 1,024 in / 256 out each:"
    )
    print(f"  POST to finished page: {total:.2f} s ({polls} polls; load average {load:.1f})")
    for run in runs:
        landed = (run.finished_at - posted_at).total_seconds()
        took = (run.finished_at - run.started_at).total_seconds()
        simulated = run.result.get("simulated_s") or 0
        print(
            f"  max_num_seqs {run.params['max_num_seqs']:>4}: landed at {landed:5.2f} s, "
            f"ran {took:.2f} s on {run.worker}, simulated {simulated:.0f} s"
        )
    assert total > 0
