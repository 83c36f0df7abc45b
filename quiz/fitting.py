"""A parameter fit in a process of its own, whose memory is capped (`python -m quiz.fitting`).

fsrs-rs is Rust: when an allocation fails it aborts the whole process, so a cap set inside the
Celery worker would kill the worker with the fit. The worker starts this module as a child
instead: the child caps its own address space (RLIMIT_AS, the process's total memory: the
interpreter, the log and fsrs-rs's training together) before it reads anything, and an
allocation past the cap ends only the child, which the worker reports as `OutOfMemory`.

The child also caps its CPU time (RLIMIT_CPU), so if its worker is killed mid-fit the orphan
stops too.

Protocol: stdin carries a JSON header line (the parameters in force, desired retention, new
cards a day) and then the log as packed ROW records, in the order made; the child reads all of
it, then writes JSON lines to stdout: {"progress": [percent, stage]} while it works, and last
{"result": {...}} or {"refused": message} (too few usable reviews, or a fit py-fsrs would not
take). The parent streams the log from the database in chunks, so it never holds the log
itself: the cap bounds all of the fit's memory.

Plain Python: no Django here (the child never imports it).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from quiz import optimizer, scheduling

logger = logging.getLogger(__name__)

MB = 1024 * 1024
# card_id, rating, study date (proleptic ordinal): 13 bytes a review.
ROW = struct.Struct("<qBi")
# The child's exit code for a MemoryError (Python's side of the cap; Rust aborts instead).
MEMORY_EXIT = 3
# What Rust's allocator prints before it aborts the process.
RUST_ALLOC_FAILED = b"memory allocation of"
# Where `-m quiz.fitting` is found when the project is not installed as a package.
_ROOT = Path(__file__).resolve().parent.parent

Progress = Callable[[int, str], None]


class OutOfMemory(Exception):
    """The fit needed more memory than its cap."""


class ChildFailed(Exception):
    """The child ended without a result, for a reason other than memory."""


def compute(
    reviews: Sequence[optimizer.Review],
    *,
    current: Sequence[float] | None,
    desired_retention: float,
    new_per_day: int,
    progress: Progress,
) -> dict[str, Any]:
    """Everything a fit stores: the fit and the workload/retention table under both parameter
    sets (JSON-ready). Raises optimizer.NotEnoughReviews, or ValueError for a fit py-fsrs
    refuses."""
    result = optimizer.fit(
        reviews, current=current, desired_retention=desired_retention, progress=progress
    )
    progress(90, "Simulating your workload at each retention")
    deck = len({review.card_id for review in reviews})
    in_force = current or scheduling.DEFAULT_PARAMETERS
    workload = [
        {"retention": now["retention"], "current": now, "fitted": fitted}
        for now, fitted in zip(
            optimizer.workload(in_force, deck_size=deck, new_per_day=new_per_day),
            optimizer.workload(result.parameters, deck_size=deck, new_per_day=new_per_day),
            strict=True,
        )
    ]
    return {
        "parameters": result.parameters,
        "training": result.training,
        "held_out": result.held_out,
        "held_out_reviews": result.held_out_reviews,
        "wins": result.wins,
        "intervals": result.intervals,
        "reviews": result.reviews,
        "workload": workload,
    }


# -- the parent's side ---------------------------------------------------------------------------


def _send(
    stdin: IO[bytes], header: dict[str, Any], rows: Iterable[tuple[int, int, dt.date]]
) -> None:
    stdin.write(json.dumps(header).encode() + b"\n")
    chunk = bytearray()
    for card_id, rating, day in rows:
        chunk += ROW.pack(card_id, rating, day.toordinal())
        if len(chunk) >= 1 * MB:
            stdin.write(chunk)
            chunk.clear()
    stdin.write(chunk)
    stdin.close()


def run(
    rows: Iterable[tuple[int, int, dt.date]],
    *,
    current: Sequence[float] | None,
    desired_retention: float,
    new_per_day: int,
    memory_limit_mb: int,
    cpu_limit_s: int,
    progress: Progress = lambda percent, stage: None,
) -> dict[str, Any]:
    """Fit in a child process capped at `memory_limit_mb` of address space; `compute`'s result.

    Raises:
        ValueError: too few usable reviews, or a fit py-fsrs refuses (the child's message).
        OutOfMemory: the child reached its memory cap.
        ChildFailed: the child ended without a result for another reason.
    Whatever else interrupts the wait (Celery's soft time limit) kills the child first.
    """
    header = {
        "current": list(current) if current else None,
        "desired_retention": desired_retention,
        "new_per_day": new_per_day,
    }
    command = [sys.executable, "-m", "quiz.fitting", str(memory_limit_mb), str(cpu_limit_s)]
    # A file, not a pipe: a child writing a long traceback can never block on it.
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            command,
            cwd=_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        try:
            answer = _converse(child, header, rows, progress)
            code = child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if answer is not None and code == 0:
            if "refused" in answer:
                raise ValueError(answer["refused"])
            return answer["result"]
        stderr.seek(0)
        err = stderr.read()
    if code == MEMORY_EXIT or (code == -signal.SIGABRT and RUST_ALLOC_FAILED in err):
        raise OutOfMemory(f"the fit needed more than {memory_limit_mb} MB")
    tail = err[-2000:].decode(errors="replace")
    logger.error("the fit's process ended with code %s:\n%s", code, tail)
    raise ChildFailed(f"the fit's process ended with code {code}")


def _converse(
    child: subprocess.Popen, header: dict[str, Any], rows: Iterable, progress: Progress
) -> dict[str, Any] | None:
    """Send the input, pass on progress; the child's last message, or None if it sent none."""
    assert child.stdin is not None and child.stdout is not None
    try:
        _send(child.stdin, header, rows)
    except BrokenPipeError:
        return None  # the child died reading (its memory cap, most likely): its code says why
    for line in child.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            logger.warning("the fit's process wrote %r", line[:200])  # a library's print
            continue
        if "progress" in message:
            progress(*message["progress"])
        else:
            return message
    return None


# -- the child's side ----------------------------------------------------------------------------


def _cap(memory_limit_mb: int, cpu_limit_s: int) -> None:
    for kind, wanted in (
        (resource.RLIMIT_AS, memory_limit_mb * MB),
        (resource.RLIMIT_CPU, cpu_limit_s),
    ):
        _, hard = resource.getrlimit(kind)
        resource.setrlimit(
            kind, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)
        )


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str]) -> int:
    memory_limit_mb, cpu_limit_s = int(argv[0]), int(argv[1])
    _cap(memory_limit_mb, cpu_limit_s)
    try:
        stdin = sys.stdin.buffer
        header = json.loads(stdin.readline())
        day_of = functools.cache(dt.date.fromordinal)  # one date object per study day
        reviews = [
            optimizer.Review(card, rating, day_of(day))
            for card, rating, day in ROW.iter_unpack(stdin.read())
        ]
        try:
            result = compute(
                reviews,
                current=header["current"],
                desired_retention=header["desired_retention"],
                new_per_day=header["new_per_day"],
                progress=lambda percent, stage: _say({"progress": [percent, stage]}),
            )
        except ValueError as exc:  # optimizer.NotEnoughReviews among them
            _say({"refused": str(exc)})
            return 0
        _say({"result": result})
    except MemoryError:
        os._exit(MEMORY_EXIT)  # no clean-up: anything more could need memory
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
