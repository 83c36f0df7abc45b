"""Run calls at the same moment, each in its own thread and so on its own database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections


def race(*calls: Callable[[], object]) -> list[object]:
    """Run each call in its own thread (so its own connection), released together. Returns each
    call's result, or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(i: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # no deadline: a hang is pytest-timeout's to report
    return results
