"""A lab worker outlives its broker: Redis stopped and started under a running worker, and
restarted empty with runs queued (none of them lost: the reaper sends their turns again).

These start their own redis-server (never the machine's shared one) on a port of their own,
with an append-only file so a restart keeps the queued messages, as a production Redis would
(one that lost the file starts empty).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.urls import reverse

from labs.models import LabRun, RunState, WorkerHeartbeat
from tests.labs.runs.test_tasks import ENDLESS, WATCHABLE, state_of, wait_for
from tests.labs.test_views import _point_broker_at
from tests.worker import WorkerProcess, start_worker

# Some 20 s of simulation on an idle machine: still running when Redis stops.
LONG = {**ENDLESS, "num_prompts": "12000"}

pytestmark = [
    # An outage takes minutes of waiting for reconnections: `make test-deep`. One Redis port for
    # the module, so its tests share one test process.
    pytest.mark.deep,
    pytest.mark.xdist_group("own-redis"),
    pytest.mark.worker,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed"),
]
PORT = 6396  # a Redis of its own; the machine's shared Redis on 6379 is never touched
LOST_S = 10


@dataclass
class OwnRedis:
    port: int
    folder: Path
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, 30, 0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None

    def restart_empty(self) -> None:
        """Stopped, its append-only file gone, started: a Redis that lost what it held."""
        self.stop()
        for path in self.folder.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        self.start()

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False


@pytest.fixture
def own_redis(monkeypatch) -> Iterator[OwnRedis]:
    with tempfile.TemporaryDirectory(prefix="redis-h6-") as folder:
        redis = OwnRedis(PORT, Path(folder))
        redis.start()
        try:
            yield from _yield_pointed(monkeypatch, redis)
        finally:
            redis.stop()


def _yield_pointed(monkeypatch, redis: OwnRedis) -> Iterator[OwnRedis]:
    import ast

    from tests.config.test_env_file import settings_of

    options = settings_of("", CELERY_BROKER_URL=redis.url)["settings"][
        "CELERY_BROKER_TRANSPORT_OPTIONS"
    ]
    from config.celery import app

    saved = app.conf.result_backend
    app.conf.result_backend = redis.url
    app._local.__dict__.pop("backend", None)  # Celery keeps the backend it made per thread
    try:
        for _ in _point_broker_at(monkeypatch, redis.url, ast.literal_eval(options)):
            yield redis
    finally:
        app.conf.result_backend = saved
        app._local.__dict__.pop("backend", None)


@pytest.fixture(params=["prefork", "solo"])
def redis_worker(request, transactional_db, own_redis) -> Iterator[WorkerProcess]:
    # As the README starts it: gossip and mingle on; prefork with two processes.
    worker = start_worker(
        ["labs.sim", "default"],
        pool=request.param,
        concurrency=2 if request.param == "prefork" else 1,
        as_deployed=True,
        extra_env={
            "CELERY_BROKER_URL": own_redis.url,
            "CELERY_RESULT_BACKEND": own_redis.url,
            # Reaping lost turns within seconds rather than a minute, beating every 2 s.
            "LABS_QUEUED_LOST_S": str(LOST_S),
            "LABS_WORKER_HEARTBEAT_S": "2",
        },
    )
    yield worker
    worker.stop()


def test_redis_stopped_and_started_under_a_running_worker(
    own_redis, redis_worker, alice_client, alice
):
    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), LONG)
    assert response.status_code == 302, response.content.decode()[:2000]
    run = LabRun.objects.get(owner=alice)
    wait_for(lambda: LabRun.objects.filter(pk=run.pk, progress__gt=0).exists())

    own_redis.stop()
    time.sleep(15)  # a few of the worker's reconnection attempts fail
    assert redis_worker.alive(), redis_worker.log()[-3000:]
    own_redis.start()
    redis_back = time.monotonic()

    wait_for(lambda: state_of(run.pk) in {RunState.DONE, RunState.FAILED}, 300, 0.5)
    run.refresh_from_db()
    assert run.state == RunState.DONE or run.error, "a failed run says why"
    assert redis_worker.alive(), redis_worker.log()[-3000:]
    # The worker still serves (once it is back online, if it had to be started again): a new run
    # submitted after the outage finishes.
    online = WorkerHeartbeat.objects.online().filter(hostname__startswith=redis_worker.name)
    wait_for(online.exists, 180, 0.5)
    small = {**WATCHABLE, "num_prompts": "3"}
    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), small)
    assert response.status_code == 302, response.content.decode()[:2000]
    second = LabRun.objects.exclude(pk=run.pk).get(owner=alice)
    wait_for(lambda: state_of(second.pk) == RunState.DONE, 120, 0.2)
    served_after_s = time.monotonic() - redis_back
    log = redis_worker.log()
    restarted = log.count("supervise: the worker exited")
    print(
        f"run across the outage: {run.state} {run.error[:200]}; worker restarted {restarted}x; "
        f"a new run done {served_after_s:.0f} s after Redis returned"
    )
    # The worker rode out the outage itself (no exit, no supervisor's restart gap: that gap was
    # 30 s of backoff and more), so labs were served again soon after Redis returned. The limit
    # is generous, for a busy machine; it is not a speed check.
    assert "Unrecoverable error" not in log, log[-5000:]
    assert restarted == 0, log[-5000:]
    assert served_after_s < 120, log[-5000:]


def test_redis_restarted_empty_loses_no_queued_run(
    own_redis, redis_worker, alice_client, alice, settings
):
    """Two long runs keep the worker busy (both prefork processes) while three short ones wait
    with their turns in Redis, which restarts empty. A run queued afterwards sends a turn,
    which runs the oldest waiting; the others' turns, lost, are sent again once the worker has
    been idle LOST_S: every run is run, none failed as lost."""
    settings.LABS_NEW_LEARNER_MAX_ACTIVE = 6
    url = reverse("labs:run-create", args=["sandbox"])
    small = {**WATCHABLE, "num_prompts": "3"}
    for data in (LONG, LONG, small, small, small):
        response = alice_client.post(url, data)
        assert response.status_code == 302, response.content.decode()[:2000]
    wait_for(lambda: LabRun.objects.filter(owner=alice, progress__gt=0).exists())

    own_redis.restart_empty()
    online = WorkerHeartbeat.objects.online().filter(hostname__startswith=redis_worker.name)
    wait_for(online.exists, 180, 0.5)
    response = alice_client.post(url, small)
    assert response.status_code == 302, response.content.decode()[:2000]

    runs = LabRun.objects.filter(owner=alice)
    wait_for(lambda: not runs.filter(state__in=[RunState.QUEUED, RunState.RUNNING]).exists(), 600)
    failed = list(runs.exclude(state=RunState.DONE).values_list("pk", "state", "error"))
    resent = runs.filter(turn_resent_at__isnull=False).count()
    print(f"after Redis restarted empty: {resent} of {runs.count()} runs sent a turn again")
    assert failed == [], redis_worker.log()[-5000:]
    # How many turns Redis took with it depends on how many the worker had already reserved;
    # where it took some, the runs left without one got one again (the reaper's unit tests
    # check who gets one). None was failed either way.
    assert redis_worker.alive(), redis_worker.log()[-3000:]
