"""The suite never shares a folder, database or broker with a `make run` in the same checkout
(tests/settings.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
APP_VAR = ROOT / "var"

SHOW = """
import json
from django.conf import settings
print(json.dumps({
    "var_dir": str(settings.VAR_DIR),
    "broker": settings.CELERY_BROKER_URL,
    "broker_dir": str(settings.BROKER_DIR),
    "test_db": settings.DATABASES["default"].get("TEST", {}).get("NAME"),
}))
"""


def _is_under(path: Path | str, folder: Path | str) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def test_this_suite_keeps_its_files_outside_the_apps_var_folder():
    assert not _is_under(settings.VAR_DIR, APP_VAR)
    assert _is_under(settings.VAR_DIR, tempfile.gettempdir())
    if settings.BROKER_DIR is not None:
        assert _is_under(settings.BROKER_DIR, settings.VAR_DIR)
    test_db = settings.DATABASES["default"].get("TEST", {}).get("NAME")
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        assert _is_under(test_db, settings.VAR_DIR)


def _settings_in_a_fresh_process(tmp_path: Path, env_file: str, **env: str) -> dict:
    base = {
        k: v
        for k, v in os.environ.items()
        # Without DATABASE_URL (CI's PostgreSQL pass sets it): the embedded default's SQLite
        # file is what must live in the suite's folder.
        # Nor this suite's own markers (its folders, the broker it was given, its xdist
        # process): the child starts as a suite of its own would.
        if k not in {"VAR_DIR", "CELERY_BROKER_URL", "DATABASE_URL", "PYTEST_XDIST_WORKER"}
        and not k.startswith("SERVING_SCHOOL_TESTS")
    }
    full_env = {**base, "DJANGO_SETTINGS_MODULE": "tests.settings", "ENV_FILE": env_file, **env}
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup()\n{SHOW}"],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_suite_ignores_the_apps_folder_and_broker_from_the_env_file(tmp_path):
    """A .env that points the app at a folder and a Redis broker: the suite takes neither."""
    app_folder = tmp_path / "app-var"
    dot_env = tmp_path / ".env"
    dot_env.write_text(f"VAR_DIR={app_folder}\nCELERY_BROKER_URL=redis://127.0.0.1:6379/15\n")
    shown = _settings_in_a_fresh_process(tmp_path, str(dot_env))
    assert not _is_under(shown["var_dir"], app_folder)
    assert not _is_under(shown["var_dir"], APP_VAR)
    assert shown["broker"] == "filesystem://"
    assert _is_under(shown["broker_dir"], shown["var_dir"])
    assert _is_under(shown["test_db"], shown["var_dir"])
    # The folder is the suite's own and is removed when its process ends.
    assert not Path(shown["var_dir"]).exists()


def test_a_broker_named_on_the_command_line_is_used_as_given(tmp_path):
    """CI names its Redis on the command line; that one is the suite's to use."""
    shown = _settings_in_a_fresh_process(tmp_path, "", CELERY_BROKER_URL="redis://127.0.0.1:6379/7")
    assert shown["broker"] == "redis://127.0.0.1:6379/7"
    assert not _is_under(shown["var_dir"], APP_VAR)


def test_a_process_the_suite_starts_keeps_the_suites_folder(tmp_path):
    """A worker started by a test sees the same folder (and so the same broker) as the test."""
    env = {
        "SERVING_SCHOOL_TESTS_VAR_DIR": str(settings.VAR_DIR),
        "VAR_DIR": str(settings.VAR_DIR),
    }
    shown = _settings_in_a_fresh_process(tmp_path, "", **env)
    assert Path(shown["var_dir"]) == Path(settings.VAR_DIR)


def test_each_xdist_process_gets_a_folder_and_a_redis_database_of_its_own(tmp_path):
    """`make test` runs two test processes: one's purge or worker must never touch the other's
    tasks, so each has its own filesystem broker or, on a Redis named on the command line, its
    own database of that Redis."""
    redis = "redis://127.0.0.1:6379/0"
    gw0 = _settings_in_a_fresh_process(tmp_path, "", PYTEST_XDIST_WORKER="gw0")
    gw1 = _settings_in_a_fresh_process(tmp_path, "", PYTEST_XDIST_WORKER="gw1")
    assert gw0["broker"] == gw1["broker"] == "filesystem://"
    assert gw0["broker_dir"] != gw1["broker_dir"]
    assert _is_under(gw1["broker_dir"], gw1["var_dir"])
    on_redis = [
        _settings_in_a_fresh_process(tmp_path, "", PYTEST_XDIST_WORKER=w, CELERY_BROKER_URL=redis)
        for w in ("gw0", "gw1")
    ]
    assert [s["broker"] for s in on_redis] == [
        "redis://127.0.0.1:6379/10",
        "redis://127.0.0.1:6379/11",
    ]


def test_the_app_hashes_passwords_with_pbkdf2_though_the_suite_does_not():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup()\n"
            "from django.contrib.auth.hashers import get_hasher\n"
            "print(get_hasher().algorithm)",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "ENV_FILE": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "pbkdf2_sha256"
    assert settings.PASSWORD_HASHERS == ["django.contrib.auth.hashers.MD5PasswordHasher"]
