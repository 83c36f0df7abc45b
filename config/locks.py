"""A named lock held until the current transaction ends, for work that has no row to lock.

`transaction_lock("labs.queue-cap:labs.sim")` serialises the transactions that take it: on
PostgreSQL an advisory transaction lock keyed by the name's CRC-32; SQLite needs none, as its
IMMEDIATE transactions already take the one write lock at BEGIN.
"""

from __future__ import annotations

import zlib

from django.db import transaction


def transaction_lock(name: str) -> None:
    """Block until no other transaction holds `name`; released when this one ends."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [zlib.crc32(name.encode())])
