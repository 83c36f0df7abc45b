"""`manage.py prepare` (run by make setup): preflight, migrate, load the deck, one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def prepare(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    # Its own SQLite file and broker folder; no .env.
    drop = {"DATABASE_URL", "CELERY_BROKER_URL"}
    full_env = {k: v for k, v in os.environ.items() if k not in drop}
    full_env.update(VAR_DIR=str(tmp_path), ENV_FILE="", **env)
    return subprocess.run(
        [sys.executable, "manage.py", "prepare"],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_it_checks_migrates_and_loads_the_deck_then_does_nothing_new(tmp_path):
    first = prepare(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "database and broker reachable" in first.stdout
    assert "Applying quiz.0001_initial... OK" in first.stdout
    assert "cards in 1 deck(s)" in first.stdout
    assert " 0 created" not in first.stdout

    again = prepare(tmp_path)
    assert again.returncode == 0, again.stderr
    assert "No migrations to apply." in again.stdout
    assert " 0 created" in again.stdout


def test_it_stops_before_migrating_when_the_database_is_unreachable(tmp_path):
    result = prepare(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere")
    assert result.returncode == 2
    assert "DATABASE_URL" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Applying" not in result.stdout
