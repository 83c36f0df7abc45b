"""A `.env` file is read at start; `.env.example` copied to `.env` keeps the embedded defaults."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import load_env_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / ".env.example"

# Every setting (repr), plus which of the example's variables ended up in the environment.
DUMP = """
import json, os
from django.conf import settings
names = sorted(n for n in dir(settings) if n.isupper() and n != "ENV_FILE")
values = {n: repr(getattr(settings, n)) for n in names}
print(json.dumps({
    "settings": json.loads(json.dumps(values).replace(f"test-db-{os.getpid()}", "test-db-PID")),
    "env_file": str(settings.ENV_FILE),
    "environ": {n: os.environ[n] for n in json.loads(os.environ["SS_NAMES"]) if n in os.environ},
}))
"""


def example_names() -> list[str]:
    """Every variable .env.example mentions, set or commented out."""
    pattern = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=", re.MULTILINE)
    return sorted(set(pattern.findall(EXAMPLE.read_text())))


def child_env(env_file: str, **extra: str) -> dict[str, str]:
    # The child starts from nothing the example names (CI sets DATABASE_URL, for one).
    names = example_names()
    env = {k: v for k, v in os.environ.items() if k not in names and k != "ENV_FILE"}
    env.update(
        ENV_FILE=env_file,
        DJANGO_SETTINGS_MODULE="config.settings",
        SS_NAMES=json.dumps(names),
        **extra,
    )
    return env


def settings_of(env_file: str, **extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", DUMP],
        cwd=ROOT,
        env=child_env(env_file, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_it_reads_a_dot_env_file(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text(
        "DEBUG=0\n"
        "SECRET_KEY=a-production-secret-from-the-dot-env-file-0123456789\n"
        "ALLOWED_HOSTS=school.example.com   # a comment after the value\n"
        "TIME_ZONE=Europe/Paris\n"
        "LABS_SWEEP_MAX_VALUES=7\n"
    )
    dumped = settings_of(str(env_file))
    settings = dumped["settings"]
    assert dumped["env_file"] == str(env_file)
    assert settings["DEBUG"] == "False"
    assert settings["SECRET_KEY"] == repr("a-production-secret-from-the-dot-env-file-0123456789")
    assert settings["ALLOWED_HOSTS"] == repr(["school.example.com"])
    assert settings["TIME_ZONE"] == repr("Europe/Paris")
    assert settings["LABS_SWEEP_MAX_VALUES"] == "7"


def test_it_lets_the_environment_win_over_the_dot_env_file(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("TIME_ZONE=Europe/Paris\nLABS_SWEEP_MAX_VALUES=7\n")
    settings = settings_of(str(env_file), TIME_ZONE="Asia/Tokyo")["settings"]
    assert settings["TIME_ZONE"] == repr("Asia/Tokyo")
    assert settings["LABS_SWEEP_MAX_VALUES"] == "7"


# The environment's own choices (which win over the file) as a production host sets them, so
# the defaults that only apply there (HTTPS, PostgreSQL, Redis) are compared too.
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "a-production-secret-set-in-the-environment-0123456789",
    "ALLOWED_HOSTS": "school.example.com",
    "DATABASE_URL": "postgres://school@db.example.com:5432/school",
    "CELERY_BROKER_URL": "redis://cache.example.com:6379/0",
}


@pytest.mark.parametrize("environment", [{}, PRODUCTION], ids=["embedded", "production"])
def test_it_starts_the_embedded_defaults_from_a_copy_of_the_example(tmp_path, environment):
    copied = tmp_path / ".env"
    shutil.copy(EXAMPLE, copied)
    with_copy = settings_of(str(copied), **environment)
    without = settings_of("", **environment)
    # The copy was read (its set lines reached the environment), and changed no setting.
    assert with_copy["env_file"] == str(copied)
    assert without["env_file"] == "None"
    assert with_copy["environ"]["LABS_RUN_STALE_S"] == "60"
    assert set(without["environ"]) == set(environment)
    changed = {
        name: (without["settings"].get(name), value)
        for name, value in with_copy["settings"].items()
        if without["settings"].get(name) != value
    }
    assert changed == {}
    # And the app starts on it.
    if environment:
        return
    check = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=child_env(str(copied)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr


def test_it_reads_dot_env_beside_manage_py_unless_env_file_says_otherwise(tmp_path, monkeypatch):
    default = tmp_path / ".env"
    default.write_text("SS_TEST_DOT_ENV_VALUE=from-the-file\n")
    monkeypatch.delenv("ENV_FILE", raising=False)
    # setenv then delenv, so that the value the file sets is removed after the test.
    monkeypatch.setenv("SS_TEST_DOT_ENV_VALUE", "placeholder")
    monkeypatch.delenv("SS_TEST_DOT_ENV_VALUE")
    assert load_env_file(default) == default
    assert os.environ["SS_TEST_DOT_ENV_VALUE"] == "from-the-file"

    monkeypatch.delenv("SS_TEST_DOT_ENV_VALUE")
    monkeypatch.setenv("ENV_FILE", "")
    assert load_env_file(default) is None
    assert "SS_TEST_DOT_ENV_VALUE" not in os.environ


def test_it_needs_no_dot_env_file(tmp_path, monkeypatch):
    monkeypatch.delenv("ENV_FILE", raising=False)
    assert load_env_file(tmp_path / ".env") is None


def test_it_refuses_an_env_file_that_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("ENV_FILE", str(tmp_path / "missing.env"))
    with pytest.raises(ImproperlyConfigured, match="ENV_FILE"):
        load_env_file(tmp_path / ".env")


def test_git_ignores_the_env_file_the_readme_asks_for():
    """README says `cp .env.example .env`; its secrets must not be committed by `git add .`."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".env is not in .gitignore"
    example = subprocess.run(["git", "check-ignore", "-q", ".env.example"], cwd=ROOT, check=False)
    assert example.returncode == 1, ".env.example must stay tracked"
