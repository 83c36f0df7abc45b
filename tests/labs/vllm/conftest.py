"""Fixtures for the vllm backend tests: the fake vLLM server and the stand-in `vllm` executable,
each in its own process on 127.0.0.1, and checks that nothing they started is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from labs.backends.vllm import backend as vllm_backend
from labs.backends.vllm.server import ServerManager, free_port

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_vllm.py"
STANDIN = HERE / "standin_vllm.py"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie holds no resources)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def wait_gone(pids: Iterable[int], timeout_s: float = 30.0) -> list[int]:
    """The pids still alive after waiting up to `timeout_s` (generous: a process that was not
    stopped never goes, so the wait only has to outlast a busy machine)."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


@dataclass
class FakeServer:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        return httpx.get(self.base_url + path, timeout=10, trust_env=False).json()

    def measured_log(self) -> dict[str, Any]:
        """The fake's log of the run's requests, without the unmeasured warm-up request the
        load generator sends first (loadgen.LoadOptions.warmup)."""
        return {k: v for k, v in self.get("/fake/log").items() if not k.endswith("-warmup")}


def _start_fake(log_dir: Path) -> FakeServer:
    port = free_port()
    log = (log_dir / f"fake-{port}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120  # a limit for a busy machine, not a speed check
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False)
            return FakeServer(process, port)
        except httpx.HTTPError:
            assert process.poll() is None, "the fake vLLM server died at start"
            assert time.monotonic() < deadline, "the fake vLLM server did not start"
            time.sleep(0.05)


def _stop_fakes(servers: Iterable[FakeServer]) -> None:
    processes = [server.process for server in servers]
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert wait_gone(p.pid for p in processes) == []


@pytest.fixture(scope="session")
def _idle_fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[FakeServer]]:
    """Fake servers no test is using, kept for the next one (each costs a Python process's
    start, FastAPI's import included); stopped when the test process ends."""
    idle: list[FakeServer] = []
    idle.append(_start_fake(tmp_path_factory.mktemp("fake-vllm")))
    yield idle
    _stop_fakes(idle)


@pytest.fixture
def fake_server(_idle_fakes: list[FakeServer], tmp_path_factory) -> Iterator[Any]:
    """Fake vLLM servers: `fake_server(config)` -> FakeServer, healthy (or at least listening,
    when the config says it never becomes healthy), in the state a new process with that config
    starts in. Servers are lent from a pool and reset (`POST /fake/reset`); one a test stopped is
    not lent again."""
    lent: list[FakeServer] = []

    def start(config: dict[str, Any] | None = None) -> FakeServer:
        while _idle_fakes and _idle_fakes[-1].process.poll() is not None:
            _idle_fakes.pop()
        server = (
            _idle_fakes.pop() if _idle_fakes else _start_fake(tmp_path_factory.mktemp("fake-vllm"))
        )
        lent.append(server)
        reset = httpx.post(
            f"{server.base_url}/fake/reset",
            content=json.dumps(config or {}),
            timeout=30,
            trust_env=False,
        )
        assert reset.status_code == 200, reset.text
        return server

    yield start
    _idle_fakes.extend(server for server in lent if server.process.poll() is None)


@dataclass
class StandIn:
    executable: Path
    record: Path
    cache: Path

    def starts(self) -> list[dict[str, Any]]:
        """One entry per start of the stand-in: pid, pgid, sid, argv, grandchild."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def pids(self) -> list[int]:
        return [pid for s in self.starts() for pid in (s["pid"], s["grandchild"])]


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    """A `vllm` executable that is the stand-in; VLLM_EXECUTABLE and LABS_VLLM_CACHE_DIR point at
    it and a temporary directory. Afterwards, no process it started may be left."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable = bin_dir / "vllm"
    # exec: the stand-in keeps the pid the manager started, as the real console script does.
    executable.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    executable.chmod(0o755)
    stand_in = StandIn(executable, tmp_path / "starts.jsonl", tmp_path / "cache")
    monkeypatch.setenv("VLLM_EXECUTABLE", str(executable))
    monkeypatch.setenv("LABS_VLLM_CACHE_DIR", str(stand_in.cache))
    monkeypatch.setenv("STANDIN_RECORD", str(stand_in.record))
    monkeypatch.delenv("LABS_VLLM_BASE_URL", raising=False)
    yield stand_in
    left = wait_gone(stand_in.pids())
    for start in stand_in.starts():
        if alive(start["pid"]) or alive(start["grandchild"]):
            os.killpg(start["pgid"], signal.SIGKILL)
    assert left == [], f"processes left running: {left}"


@pytest.fixture
def manager(standin: StandIn) -> Iterator[ServerManager]:
    """A ServerManager on the stand-in with short timeouts; stopped afterwards."""
    mgr = ServerManager(start_timeout_s=120, stop_timeout_s=3, cache=standin.cache)
    yield mgr
    mgr.stop()


@pytest.fixture
def fresh_backend_manager(standin: StandIn) -> Iterator[None]:
    """The vllm backend's process-wide manager, new for this test and stopped after it."""
    vllm_backend._manager = ServerManager(start_timeout_s=120, stop_timeout_s=3)
    yield
    vllm_backend.stop_server()
    vllm_backend._manager = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests against a real vLLM engine run only when asked for (`make test-vllm` passes
    `-m vllm_real`): they install and start vLLM's CPU build, minutes that `make test` skips."""
    if "vllm_real" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="against a real vLLM engine: run make test-vllm")
    for item in items:
        if item.get_closest_marker("vllm_real"):
            item.add_marker(skip)
