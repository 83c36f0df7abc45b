"""Start-up checks: can we reach the database and the broker named in the environment?

A bad DATABASE_URL or CELERY_BROKER_URL must fail at start-up with the variable and the address,
not as a traceback inside the first request.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, connection


class PreflightError(RuntimeError):
    pass


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def database_address() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite file {db['NAME']}"
    return f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db.get('NAME')}"


def check_database() -> None:
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (DatabaseError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PreflightError(
            f"DATABASE_URL: cannot connect to {database_address()} "
            f"({_redact(settings.DATABASE_URL)}): {reason}"
        ) from None
    finally:
        connection.close()


def check_broker(timeout_s: float = 3.0) -> None:
    url = settings.CELERY_BROKER_DISPLAY
    if settings.BROKER_DIR is not None:
        folder = Path(settings.BROKER_DIR)
        try:
            for sub in ("queue", "control", "processed", "results"):
                (folder / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PreflightError(
                f"CELERY_BROKER_URL: cannot use broker folder {folder}: {exc.strerror}"
            ) from None
        return
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        parts = urlsplit(url)
        raise PreflightError(
            f"CELERY_BROKER_URL: cannot reach Redis at {parts.hostname}:{parts.port or 6379} "
            f"({_redact(url)}): {exc}"
        ) from None
    finally:
        client.close()
