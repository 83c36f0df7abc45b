"""While the database is away a page is a maintenance page, 503 with Retry-After, not a bare 500
(config/errors.py)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InterfaceError, OperationalError
from django.test import Client

from config import errors


def _raised_from(error: Exception, cause: BaseException) -> Exception:
    try:
        raise error from cause
    except Exception as exc:
        return exc


class _Away:
    """Stands for django.db.connection in config.views, raising `exc` at its first query."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def cursor(self):
        raise self.exc


def _healthz_raising(monkeypatch, exc: Exception):
    monkeypatch.setattr("config.views.connection", _Away(exc))
    return Client(raise_request_exception=False).get("/healthz")


@pytest.mark.parametrize(
    "exc",
    [
        _raised_from(OperationalError("refused"), psycopg.OperationalError("connection refused")),
        _raised_from(OperationalError("shutdown"), psycopg.errors.AdminShutdown("terminating")),
        InterfaceError("connection already closed"),
    ],
)
def test_a_database_away_is_a_maintenance_page_with_retry_after(monkeypatch, exc):
    response = _healthz_raising(monkeypatch, exc)
    assert response.status_code == 503
    assert response["Retry-After"] == str(errors.RETRY_AFTER_S)
    html = response.content.decode()
    assert "cannot reach its database" in html and 'name="viewport"' in html


@pytest.mark.parametrize(
    "exc",
    [
        _raised_from(OperationalError("lock"), psycopg.errors.LockNotAvailable("lock timeout")),
        RuntimeError("a bug"),
    ],
)
def test_other_errors_stay_a_500(monkeypatch, exc):
    assert _healthz_raising(monkeypatch, exc).status_code == 500


def test_the_maintenance_page_needs_nothing_that_could_be_missing(monkeypatch):
    # Without a static manifest (collectstatic not yet run) the page itself cannot render.
    def no_manifest(*args, **kwargs):
        raise ValueError("Missing staticfiles manifest entry for 'css/app.css'")

    monkeypatch.setattr(errors, "render_to_string", no_manifest)
    away = _raised_from(OperationalError("refused"), psycopg.OperationalError("refused"))
    response = _healthz_raising(monkeypatch, away)
    assert response.status_code == 503 and b"cannot reach its database" in response.content
