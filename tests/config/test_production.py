"""The production path: DEBUG=0 static files are collected (hashed, compressed) and served."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_collectstatic_succeeds_with_production_storage(tmp_path):
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "school.example.com",
        "VAR_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = (tmp_path / "staticfiles" / "staticfiles.json").read_text()
    for name in ("css/app.css", "vendor/htmx-2.0.11.min.js", "vendor/chart-4.6.1.umd.min.js"):
        assert f'"{name}"' in manifest
