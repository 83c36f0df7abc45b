"""The site's 500 handler: while the database is away (a restart, maintenance) a learner gets a
maintenance page, 503 with Retry-After, instead of the bare "Server Error (500)"."""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views import defaults

RETRY_AFTER_S = 5
# SQLSTATE classes of a lost or refused connection: 08 connection exception, 57 operator
# intervention (shutting down, starting up). Others (a lock timeout, 55P03) are the query's.
_AWAY_CLASSES = ("08", "57")
# SQLite's words for the same (its errors carry no SQLSTATE).
_SQLITE_AWAY = ("unable to open database", "database is locked", "disk i/o error")


def database_away(exc: BaseException | None) -> bool:
    """Whether `exc` says the database cannot be reached now, rather than a query being wrong."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.__cause__
    if isinstance(exc, InterfaceError):
        return True  # the connection is closed or broken
    sqlstate = getattr(cause, "sqlstate", None)
    if type(cause).__module__.startswith("psycopg"):
        # No SQLSTATE: the client could not connect or lost the server mid-query.
        return sqlstate is None or sqlstate[:2] in _AWAY_CLASSES
    return any(words in str(exc).lower() for words in _SQLITE_AWAY)


def server_error(request: HttpRequest) -> HttpResponse:
    if database_away(sys.exception()):
        # Rendered without the request: its context (the user, the session) needs the database.
        try:
            html = render_to_string("maintenance.html", {"retry_after_s": RETRY_AFTER_S})
        except Exception:  # noqa: BLE001 - e.g. no static manifest yet: still say it plainly
            html = f"The site cannot reach its database just now. Try again in {RETRY_AFTER_S} s."
        response = HttpResponse(html, status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        response["Cache-Control"] = "no-store"
        return response
    return defaults.server_error(request)
