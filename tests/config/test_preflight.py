"""Bad configuration stops start-up with the variable and the address, not a traceback."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(args, **env):
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60
    )


def test_unreachable_database_names_the_variable_and_address():
    result = run(["manage.py", "preflight"], DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere")
    assert result.returncode == 2
    assert "DATABASE_URL" in result.stderr
    assert "127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_broker_names_the_variable_and_address():
    result = run(["manage.py", "preflight"], CELERY_BROKER_URL="redis://127.0.0.1:1/0")
    assert result.returncode == 2
    assert "CELERY_BROKER_URL" in result.stderr
    assert "127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_unsupported_broker_scheme_is_refused_by_name():
    result = run(["manage.py", "check"], CELERY_BROKER_URL="amqp://guest@127.0.0.1//")
    assert result.returncode == 2
    assert "CELERY_BROKER_URL must be redis://" in result.stderr


def test_worker_refuses_to_start_without_its_database():
    result = run(
        ["-m", "celery", "-A", "config", "worker", "-Q", "labs.sim", "--pool=solo"],
        DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere",
    )
    assert result.returncode == 2
    assert "DATABASE_URL: cannot connect to 127.0.0.1:1/nowhere" in result.stderr


def test_production_settings_pass_check_deploy():
    result = run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="school.example.com",
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_production_without_a_secret_is_refused():
    env = {"DEBUG": "0"}
    result = run(["manage.py", "check"], **env, SECRET_KEY="")
    assert result.returncode == 2
    assert "SECRET_KEY must be set" in result.stderr


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_boolean_names_the_variable(value):
    result = run(["manage.py", "check"], DEBUG=value)
    assert result.returncode == 2
    assert "DEBUG must be one of" in result.stderr


def test_a_broker_socket_timeout_a_worker_could_not_wait_with_is_refused():
    result = run(
        ["manage.py", "check"],
        CELERY_BROKER_URL="redis://127.0.0.1:6379/0",
        CELERY_BROKER_SOCKET_TIMEOUT_S="1",
    )
    assert result.returncode == 2
    assert "CELERY_BROKER_SOCKET_TIMEOUT_S must be at least 2 (seconds), got 1" in result.stderr
