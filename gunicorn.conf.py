"""gunicorn settings for production: `gunicorn config.wsgi` reads this file from the working
directory (or pass `-c gunicorn.conf.py`). Every value can be overridden from the environment.

Why these numbers (README, "Operating"):
- A quiz or lab request is a few ms of CPU, mostly Python holding the GIL; a log-in is a PBKDF2
  hash of ~0.3 s of CPU that runs outside the GIL. One process per core keeps both cores busy;
  a few threads per process (gthread) let quick requests go on while one thread hashes or waits
  on PostgreSQL, where a sync worker would sit blocked. config/throttle.py lets one hash at a
  time per process (LOGIN_HASH_CONCURRENCY), so a burst of log-ins queues instead of taking
  every thread.
- timeout 30 s: nothing in the web process is long any more (lab runs are in the workers and the
  submit path is O(1)); a stuck worker is recycled instead of holding a slot.
"""

from __future__ import annotations

import multiprocessing
import os


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = _int("WEB_CONCURRENCY", multiprocessing.cpu_count())
worker_class = "gthread"
threads = _int("GUNICORN_THREADS", 4)
timeout = _int("GUNICORN_TIMEOUT", 30)
graceful_timeout = _int("GUNICORN_GRACEFUL_TIMEOUT", 30)
keepalive = _int("GUNICORN_KEEPALIVE", 5)
# No recycling by default: a worker that restarts closes its kept-alive connections, and a client
# sending on one at that moment gets a reset (3 failed POSTs in 6,000 requests in the load test).
# Set GUNICORN_MAX_REQUESTS if a slow leak ever shows; the jitter spreads the restarts.
max_requests = _int("GUNICORN_MAX_REQUESTS", 0)
max_requests_jitter = _int("GUNICORN_MAX_REQUESTS_JITTER", 500)
# The heartbeat file on tmpfs: a busy disk must not make the arbiter think a worker hung.
_SHM = "/dev/shm"  # noqa: S108 - gunicorn's own heartbeat files, not user data
worker_tmp_dir = _SHM if os.path.isdir(_SHM) else None
backlog = _int("GUNICORN_BACKLOG", 512)
