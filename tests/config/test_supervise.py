import signal
import subprocess
import sys
import time
from pathlib import Path

from config.supervise import FIRST_WAIT_S, LONGEST_WAIT_S, next_wait

SUPERVISE = Path(__file__).resolve().parents[2] / "config" / "supervise.py"


def test_the_wait_doubles_while_the_worker_keeps_failing_and_resets_once_it_ran_a_while():
    waits, wait = [], 0.0
    for _ in range(8):
        wait = next_wait(wait, ran_s=2)
        waits.append(wait)
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]
    assert next_wait(LONGEST_WAIT_S, ran_s=600) == FIRST_WAIT_S


def _wait_for(check, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_worker_that_exits_by_itself_is_started_again_and_sigterm_stops_both(tmp_path):
    starts = tmp_path / "starts"
    # Exits by itself twice (as after the broker crash), then runs until it is told to stop.
    child = (
        "import pathlib, signal, sys, time\n"
        f"p = pathlib.Path({str(starts)!r})\n"
        "n = len(p.read_text().splitlines()) if p.exists() else 0\n"
        "p.write_text(p.read_text() + 'start\\n' if p.exists() else 'start\\n')\n"
        "if n < 2: sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(600)\n"
    )
    supervisor = subprocess.Popen(
        [sys.executable, str(SUPERVISE), sys.executable, "-c", child],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: starts.exists() and len(starts.read_text().splitlines()) == 3)
        time.sleep(0.5)
        assert supervisor.poll() is None
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0  # the worker's own code: stopped, not crashed
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    log = supervisor.stderr.read()
    assert log.count("the worker exited with code 1") == 2
    assert "starting it again in 1 s" in log and "starting it again in 2 s" in log
    assert len(starts.read_text().splitlines()) == 3  # not started again after SIGTERM
