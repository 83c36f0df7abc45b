"""Workers announce themselves with a heartbeat row; "online" means seen recently."""

from __future__ import annotations

import time

import pytest

from labs import workers
from labs.models import WorkerHeartbeat
from labs.selectors import backends_online
from tests.labs.factories import make_heartbeat


def test_a_worker_serves_the_backends_of_the_queues_it_consumes():
    assert workers.backends_for_queues(["labs.sim", "default"]) == ["sim"]
    assert workers.backends_for_queues(["labs.gpu"]) == ["vllm"]
    assert workers.backends_for_queues(["default"]) == []


@pytest.mark.django_db
def test_announce_creates_then_refreshes_one_row_per_backend():
    workers.announce("w1@box", ["sim"])
    first = WorkerHeartbeat.objects.get(hostname="w1@box")
    assert first.where == "simulated on CPU" and first.queue == "labs.sim"
    assert first.versions["python"] and first.versions["celery"]
    time.sleep(0.01)
    workers.announce("w1@box", ["sim"])
    again = WorkerHeartbeat.objects.get(hostname="w1@box")
    assert again.last_seen > first.last_seen and again.started_at == first.started_at


@pytest.mark.django_db
def test_online_means_seen_within_the_window(settings):
    settings.LABS_WORKER_ONLINE_S = 30
    make_heartbeat("sim", age_s=5)
    make_heartbeat("vllm", age_s=31)
    assert list(WorkerHeartbeat.objects.online().values_list("backend", flat=True)) == ["sim"]
    status = {b.backend: b for b in backends_online()}
    assert status["sim"].online and status["sim"].workers == 1
    assert not status["vllm"].online and status["vllm"].queue == "labs.gpu"


@pytest.mark.worker
def test_a_real_worker_announces_itself_and_leaves_when_stopped(celery_worker):
    # start_worker returns once the worker logs "ready", after the first heartbeat is written.
    beat = WorkerHeartbeat.objects.get(hostname__startswith=celery_worker.name)
    assert beat.backend == "sim" and beat.where == "simulated on CPU"
    assert beat.pid in {celery_worker.process.pid} or beat.pid
    assert WorkerHeartbeat.objects.online().filter(pk=beat.pk).exists()
    celery_worker.stop()
    assert not WorkerHeartbeat.objects.filter(hostname__startswith=celery_worker.name).exists()
