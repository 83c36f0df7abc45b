"""`make run`: Django's development server, a sim lab worker and a parameter-fit worker, started
and stopped as one.

make runs this file as its recipe's only process (`exec`), with the standard library only, so
`make run` can also call it before set-up to check the port. Each child runs in its own process
group, so stopping one also stops what it started (runserver's reloaded child, Celery's pool).

All stop when this process gets SIGINT, SIGTERM or SIGHUP, and when make gives up: GNU make
forwards only SIGTERM to its recipe; on SIGINT or SIGHUP sent to make alone it waits for the
recipe to end, which it would never do, so the parent's signal state is watched (see ParentWatch).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Celery's warm shutdown lets a running lab finish its step; after this the groups are killed.
GRACE_S = 10.0
POLL_S = 0.2


def port_problem(host: str, port: int) -> str | None:
    """Why the web server could not listen on host:port, or None when it can."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        return f"HOST={host} is not an address this machine can listen on ({exc.strerror})"
    with socket.socket(family, kind, proto) as probe:
        # As runserver does: a stopped server's connections in TIME_WAIT do not hold the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                other = port + 1 if port < 65535 else 8001
                return (
                    f"port {port} on {host} is already in use (is another `make run` running?). "
                    f"Stop it, or use another port: make run PORT={other}"
                )
            return f"cannot listen on {host}:{port} ({exc.strerror})"
    return None


def parse_port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"PORT must be a whole number from 1 to 65535, got {raw!r}"
        )
    return port


def _caught_signals(pid: int) -> int | None:
    """The mask of signals `pid` has a handler for (Linux /proc), or None when unknown."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    return None


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class ParentWatch:
    """Notices that make, our parent, is stopping: it died, or it is in its fatal-signal handler.

    On SIGINT or SIGHUP GNU make resets that signal to its default action (so its handler bit
    drops from /proc/<pid>/status SigCgt), then waits for the recipe before dying. Only a parent
    named make is read that way; a shell changes its handlers for other reasons.
    """

    WATCHED = sum(1 << (sig - 1) for sig in STOP_SIGNALS)

    def __init__(self) -> None:
        self.ppid = os.getppid()
        is_make = _command_name(self.ppid) in {"make", "gmake"}
        self.initial = _caught_signals(self.ppid) if is_make else None

    def stopping(self) -> bool:
        if os.getppid() != self.ppid:
            return True
        if self.initial is None:
            return False
        now = _caught_signals(self.ppid)
        return now is not None and bool(self.initial & self.WATCHED & ~now)


def _term_when_parent_dies() -> None:
    """In the child before exec (Linux): SIGTERM it if this supervisor dies, even by SIGKILL."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGTERM))


class Child:
    def __init__(self, name: str, argv: Sequence[str], *, nice: int = 0) -> None:
        self.name = name

        def before_exec() -> None:
            _term_when_parent_dies()
            if nice:
                os.nice(nice)

        # Own session and group: a terminal's Ctrl-C reaches only make and us, and we stop the rest.
        self.process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=before_exec,  # safe: this process starts no threads
        )

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def gone(self) -> bool:
        """True once the child and everything left in its process group have exited."""
        if self.process.poll() is None:
            return False
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return True
        return False


def stop_all(children: Sequence[Child], grace_s: float = GRACE_S) -> None:
    # SIGTERM to each leader only: Celery stops its own pool (a signalled pool process would be
    # logged as an error) and runserver its reloaded child; whatever is left is killed below.
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(child.gone() for child in children):
        time.sleep(POLL_S)
    for child in children:
        if not child.gone():
            print(f"make run: the {child.name} did not stop in {grace_s:.0f} s; killing it")
            child.signal_group(signal.SIGKILL)
            child.process.wait()


def commands(host: str, port: int, venv: Path) -> dict[str, list[str]]:
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server = [str(venv / "bin" / "python"), "manage.py", "runserver", bind]
    if ":" in host:
        server.append("--ipv6")
    celery = [str(venv / "bin" / "celery"), "-A", "config", "worker", "--loglevel=INFO"]
    # A worker of its own for parameter fits, so a fit never holds one of the two lab slots.
    return {
        "web server": server,
        "lab worker": [*celery, "-Q", "labs.sim,default", "--concurrency=2", "--hostname=sim@%h"],
        "fit worker": [*celery, "-Q", "quiz.fit", "--concurrency=1", "--hostname=fit@%h"],
    }


COMPILE = """
import compileall, pathlib, sys
venv = pathlib.Path(sys.argv[1])
for packages in venv.glob("lib/python*/site-packages"):
    compileall.compile_dir(packages, quiet=2, workers=1)
(venv / ".bytecode").touch()
"""


def bytecode_command(venv: Path) -> list[str] | None:
    """Where Python writes no bytecode itself (PYTHONDONTWRITEBYTECODE, as in many containers),
    every start compiles Django anew; compile the virtualenv's packages once (after each install),
    in the background, so the next starts skip that."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return None
    marker, installed = venv / ".bytecode", venv / ".installed"
    if marker.exists() and (
        not installed.exists() or marker.stat().st_mtime >= installed.stat().st_mtime
    ):
        return None
    return [str(venv / "bin" / "python"), "-c", COMPILE, str(venv)]


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=POLL_S):
            return True
    except OSError:
        return False


class DevRun:
    """The web server first; the workers once the server listens (on two busy cores the page
    answers sooner when they do not all start at once), or after WORKER_AFTER_S regardless."""

    WORKER_AFTER_S = 30.0

    def __init__(self, host: str, port: int, venv: Path) -> None:
        self.host, self.port = host, port
        self.commands = commands(host, port, venv)
        self.bytecode = bytecode_command(venv)
        self.children: list[Child] = []
        # Work that may end by itself (the bytecode compile), stopped with the rest if still going.
        self.background: list[Child] = []
        self.received: list[int] = []
        self.watch = ParentWatch()

    def start(self, name: str) -> None:
        self.children.append(Child(name, self.commands[name]))

    def run(self) -> int:
        """Until a stop signal, make stopping, or a child exiting; then stop all; exit code."""
        why, code = "an error in make run", 1
        try:
            self.start("web server")
            started_at = time.monotonic()
            while True:
                # Asked to stop: a clean stop exits 0, so make does not print "Error 143".
                if self.received:
                    why, code = signal.Signals(self.received[0]).name, 0
                    break
                if self.watch.stopping():
                    why, code = "make is stopping", 0
                    break
                ended = next((c for c in self.children if c.process.poll() is not None), None)
                if ended is not None:
                    code = ended.process.returncode or 1
                    why = f"the {ended.name} exited (code {ended.process.returncode})"
                    break
                if len(self.children) == 1 and (
                    listening(self.host, self.port)
                    or time.monotonic() - started_at > self.WORKER_AFTER_S
                ):
                    self.start("lab worker")
                    self.start("fit worker")
                    if self.bytecode:
                        print("make run: compiling bytecode in the background, once", flush=True)
                        # Lowest priority: it must not slow the server or the worker down.
                        self.background.append(Child("bytecode compile", self.bytecode, nice=19))
                self.background = [c for c in self.background if c.process.poll() is None]
                time.sleep(POLL_S)
        except OSError as exc:
            why = f"cannot start {exc.filename}: {exc.strerror}"
        finally:
            # Also on an unexpected error here: never leave a server or worker behind.
            print(f"\nmake run: stopping the web server and the workers ({why})", flush=True)
            stop_all(self.children + self.background)
        print("make run: stopped")
        return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=parse_port, default=8000)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument("--check-port", action="store_true", help="only check the port is free")
    args = parser.parse_args(argv)

    problem = port_problem(args.host, args.port)
    if problem:
        print(f"make run: {problem}", file=sys.stderr)
        return 2
    if args.check_port:
        return 0

    devrun = DevRun(args.host, args.port, args.venv)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: devrun.received.append(signum))
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"\n  Serving School: http://{shown}:{args.port}/")
    print("  Workers: simulated labs, and parameter fits, started once the server listens.")
    print("  Ctrl-C stops them all.")
    print(f"  First staff user: {args.venv}/bin/python manage.py createsuperuser\n", flush=True)
    return devrun.run()


if __name__ == "__main__":
    sys.exit(main())
