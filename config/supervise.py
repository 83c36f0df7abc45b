"""Keep a Celery worker running: start it, and start it again whenever it exits by itself.

    python config/supervise.py celery -A config worker -Q labs.sim,default --loglevel=INFO

A worker can exit on its own: started at a moment when Redis or the database is down, it exits
at once (config.celery's preflight). (A Redis outage under a running prefork worker used to end
it too, kombu failing while closing the lost connection's channel; config.celery now turns that
into the connection error it is, and the worker reconnects by itself.) Labs would then stay
offline until someone restarted it by hand; this restarts it, waiting 1 s, then 2, 4 ... at
most 30 s between tries while it keeps failing (back to 1 s once it has run a minute). A
systemd unit with Restart=always does the same job; use one or the other.

SIGTERM, SIGINT or SIGHUP stop it: the signal goes to the worker (a warm shutdown, as for a
worker started alone) and this exits with the worker's code, without restarting it. Standard
library only; the worker runs in this process's group, so killing the group kills both.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

FIRST_WAIT_S = 1.0
LONGEST_WAIT_S = 30.0
# A worker that ran this long before exiting was healthy: the next wait starts from the first.
HEALTHY_AFTER_S = 60.0


def next_wait(previous_s: float, ran_s: float) -> float:
    if ran_s >= HEALTHY_AFTER_S or previous_s <= 0:
        return FIRST_WAIT_S
    return min(previous_s * 2, LONGEST_WAIT_S)


def supervise(
    command: Sequence[str],
    *,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> int:
    stopping: list[int] = []
    child: list[subprocess.Popen] = []

    def on_stop(signum: int, _frame: object) -> None:
        stopping.append(signum)
        if child and child[0].poll() is None:
            child[0].send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_stop)
    wait_s = 0.0
    while True:
        started = time.monotonic()
        child[:] = [subprocess.Popen(list(command))]
        code = child[0].wait()
        if stopping:
            return code
        ran_s = time.monotonic() - started
        wait_s = next_wait(wait_s, ran_s)
        log(
            f"supervise: the worker exited with code {code} after {ran_s:.0f} s; "
            f"starting it again in {wait_s:.0f} s"
        )
        deadline = time.monotonic() + wait_s
        while not stopping and time.monotonic() < deadline:
            sleep(min(0.2, wait_s))
        if stopping:
            return code


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: supervise.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    return supervise(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
