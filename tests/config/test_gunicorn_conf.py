"""gunicorn.conf.py: gunicorn accepts it, and it chooses threaded workers with a bounded timeout."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gunicorn_accepts_the_config_file():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--check-config",
            "-c",
            "gunicorn.conf.py",
            "config.wsgi",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WEB_CONCURRENCY": "2"},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_uses_threads_and_a_timeout_and_reads_the_environment(monkeypatch):
    monkeypatch.setenv("GUNICORN_THREADS", "6")
    conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    assert conf["worker_class"] == "gthread" and conf["threads"] == 6
    assert 0 < conf["timeout"] <= 60
    # A recycle resets clients mid-request on kept-alive connections: off unless asked for.
    assert conf["max_requests"] == 0
    monkeypatch.setenv("GUNICORN_MAX_REQUESTS", "5000")
    assert runpy.run_path(str(ROOT / "gunicorn.conf.py"))["max_requests"] == 5000
