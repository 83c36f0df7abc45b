"""Start a real Celery worker process against the test database and broker (never eager mode)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.db import connection

from config.celery import app

ROOT = Path(__file__).resolve().parent.parent


def test_database_url() -> str:
    """The URL of the database the tests use right now, for a child process."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"


def purge(queues: list[str]) -> None:
    """Drop messages left by an earlier run so a new worker does not run stale tasks."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in queues:
            # A queue that does not exist yet has nothing to purge.
            with contextlib.suppress(Exception):
                channel.queue_purge(queue)


@dataclass
class WorkerProcess:
    process: subprocess.Popen
    log_path: Path
    name: str
    queues: list[str]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group, as an OOM killer or a lost machine would."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


# The test process's shared worker (conftest's sim_worker): a test that starts a worker of its own
# on the same queues stops it first, or the shared one would take that worker's tasks.
_shared: list[WorkerProcess] = []


def stop_shared(queues: list[str] | None = None) -> None:
    """Stop the shared worker (on any of `queues`, or on any queue)."""
    for other in _shared:
        if other.alive() and (queues is None or set(other.queues) & set(queues)):
            other.stop()


def start_worker(
    queues: list[str],
    *,
    pool: str = "solo",
    concurrency: int = 1,
    extra_env: dict[str, str] | None = None,
    ready_timeout_s: float = 180.0,
    as_deployed: bool = False,
    purge_first: bool = True,
    shared: bool = False,
) -> WorkerProcess:
    """`as_deployed` starts it as the README does: gossip and mingle on, under
    config/supervise.py, which starts it again if it exits by itself. `purge_first=False` keeps
    the messages already waiting, for a worker that comes back to them. `shared` marks the test
    process's shared worker, which any other worker on one of its queues stops first."""
    stop_shared(queues)
    if purge_first:
        purge(queues)
    name = f"test-{uuid.uuid4().hex[:8]}"
    log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the child's lifetime
        prefix=f"{name}-", suffix=".log", delete=False
    )
    env = {**os.environ, "DATABASE_URL": test_database_url(), **(extra_env or {})}
    cmd = [
        *([sys.executable, str(ROOT / "config" / "supervise.py")] if as_deployed else []),
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "-Q",
        ",".join(queues),
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        "--hostname",
        f"{name}@%h",
        "--loglevel=INFO",
        *([] if as_deployed else ["--without-gossip", "--without-mingle"]),
    ]
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
    )
    worker = WorkerProcess(process=process, log_path=Path(log_file.name), name=name, queues=queues)
    if shared:
        _shared.append(worker)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if not worker.alive():
            raise RuntimeError(f"worker exited at start-up:\n{worker.log()}")
        if " ready." in worker.log():
            return worker
        time.sleep(0.2)
    worker.kill()
    raise RuntimeError(f"worker not ready after {ready_timeout_s}s:\n{worker.log()}")
