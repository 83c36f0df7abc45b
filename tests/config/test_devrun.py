"""`make run` (config/devrun.py): a taken port is said plainly; a signal to make stops everything.

The real-process tests start `make run` on a free port of 8170-8179 with their own SQLite file and
broker folder under tmp_path, so they touch neither var/ nor another suite's port.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from config.devrun import DevRun, bytecode_command, parse_port, port_problem

ROOT = Path(__file__).resolve().parents[2]
PORTS = range(8170, 8180)
HOST = "127.0.0.1"
# Failure guards only: a loaded machine may take a while to start Django and Celery.
START_GUARD_S = 240
STOP_GUARD_S = 90

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.socket() as server:
        server.bind((HOST, 0))
        server.listen()
        yield server


def free_port() -> int:
    for port in PORTS:
        if port_problem(HOST, port) is None:
            return port
    pytest.fail(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


def make_env(tmp_path: Path) -> dict[str, str]:
    # A make run by `make test` passes its jobserver in MAKEFLAGS; this make has its own.
    drop = {"MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"}
    drop |= {"DATABASE_URL", "CELERY_BROKER_URL"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(VAR_DIR=str(tmp_path / "var"), ENV_FILE="")
    return env


def default_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def descendants(root: int) -> dict[int, str]:
    """pid -> command line of `root` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        todo.extend(children.get(pid, []))
    return found


def still_running(pid: int, cmdline: str) -> bool:
    """True if the process lives on (a zombie, or a new process with its pid, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        now = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, IndexError):
        return False
    return state != "Z" and now == cmdline


def wait_for_page(make: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline:
        assert make.poll() is None, f"make run ended early:\n{log.read_text()}"
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer is the server
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the page did not answer:\n{log.read_text()}")


def wait_for_worker(make: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while "ready." not in log.read_text():
        assert make.poll() is None, f"make run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"the worker did not start:\n{log.read_text()}"
        time.sleep(0.5)


def test_it_says_which_port_is_taken(listening):
    port = listening.getsockname()[1]
    problem = port_problem(HOST, port)
    assert problem is not None
    assert f"port {port} on {HOST} is already in use" in problem
    assert f"PORT={port + 1}" in problem


def test_it_finds_a_free_port_free():
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    assert port_problem(HOST, port) is None


@pytest.mark.parametrize("raw", ["abc", "0", "65536", "-1", ""])
def test_it_rejects_a_port_out_of_range(raw):
    with pytest.raises(argparse.ArgumentTypeError, match="PORT must be .* from 1 to 65535"):
        parse_port(raw)


def test_it_compiles_bytecode_once_where_python_writes_none(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    packages = venv / "lib" / "python3.11" / "site-packages"
    packages.mkdir(parents=True)
    (packages / "module.py").write_text("VALUE = 1\n")
    (venv / ".installed").touch()
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    assert bytecode_command(venv) is None  # Python caches bytecode itself

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    command = bytecode_command(venv)
    assert command is not None
    subprocess.run([sys.executable, *command[1:]], check=True, timeout=120)
    assert list((packages / "__pycache__").glob("module.*.pyc"))
    assert bytecode_command(venv) is None  # done for this install

    os.utime(venv / ".installed", (time.time() + 5, time.time() + 5))
    assert bytecode_command(venv) is not None  # a later install compiles again


def test_it_says_the_port_is_taken_when_make_run_runs_twice(tmp_path, listening):
    port = listening.getsockname()[1]
    done = subprocess.run(
        ["make", "--no-print-directory", "run", f"PORT={port}"],
        cwd=ROOT,
        env=make_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=STOP_GUARD_S,
    )
    assert done.returncode != 0
    assert f"make run: port {port} on {HOST} is already in use" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    # It stopped before set-up and before starting anything.
    assert "Serving School:" not in done.stdout
    assert "manage.py" not in done.stdout


@pytest.mark.worker
@needs_proc
@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGTERM,
        # The same path for the other two signals, ten seconds each: `make test-deep`.
        pytest.param(signal.SIGINT, marks=pytest.mark.deep),
        pytest.param(signal.SIGHUP, marks=pytest.mark.deep),
    ],
    ids=lambda sig: sig.name,
)
def test_it_stops_server_and_worker_when_make_gets_a_signal(tmp_path, sig):
    port = free_port()
    log = tmp_path / "make-run.log"
    with log.open("w") as out:
        # Its own session, as a terminal or a process manager would start it; the signal goes to
        # make alone (kill -TERM <make's pid>), not to its process group.
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"PORT={port}"],
            cwd=ROOT,
            env=make_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # Signals ignored here (under nohup, or in a shell's background job) would stay
            # ignored in make, which then rightly keeps running: start it as a terminal would.
            preexec_fn=default_stop_signals,
        )
    started: dict[int, str] = {}
    try:
        wait_for_page(make, port, log)
        wait_for_worker(make, log)
        started = descendants(make.pid)
        commands = " ".join(started.values())
        assert "runserver" in commands and "celery" in commands, started

        os.kill(make.pid, sig)
        make.wait(timeout=STOP_GUARD_S)

        left = {pid: cmd for pid, cmd in started.items() if still_running(pid, cmd)}
        assert left == {}
        assert port_problem(HOST, port) is None
        assert "make run: stopped" in log.read_text()
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        # Never leave a server behind, even when the test failed.
        for pid, cmd in started.items():
            if still_running(pid, cmd):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_clean_stop_exits_0_so_make_prints_no_error(sig):
    # make printed "Error 143" after `kill -TERM` of make run: the stop is asked for, not a fault.
    devrun = DevRun(HOST, free_port(), ROOT / ".venv")
    devrun.commands = {"web server": [sys.executable, "-c", "import time; time.sleep(60)"]}
    devrun.received.append(sig)
    assert devrun.run() == 0
    assert all(child.process.poll() is not None for child in devrun.children)


def test_a_child_that_dies_is_still_an_error():
    devrun = DevRun(HOST, free_port(), ROOT / ".venv")
    devrun.commands = {"web server": [sys.executable, "-c", "raise SystemExit(3)"]}
    assert devrun.run() == 3
