"""`make loadtest`: gunicorn + PostgreSQL + Redis + a sim worker on loopback, driven by locust.

1. Prepares the database named by LOAD_DATABASE_URL (migrate, the deck, LOAD_LEARNERS accounts
   with a high new-card limit) and starts gunicorn (gunicorn.conf.py, production settings) on
   127.0.0.1:LOAD_PORT and one sim worker, both on this machine only.
2. CPU per request: one client, one request at a time, LOAD_CPU_ROUNDS rounds of
   LOAD_CPU_REQUESTS x /healthz then as many quiz requests (fetch, answer, grade loops); the CPU
   time the gunicorn workers and their PostgreSQL backends used, read from /proc before and
   after, divided by the requests; medians over the rounds.
3. Locust at 10, 50 and 200 users (LOAD_STEPS), LOAD_STEP_S seconds each: p50/p95/p99 and errors
   per request type, /healthz beside them in the same run.
Results: var/load/results.md (and printed). Everything it started is stopped at the end.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PORT = int(os.environ.get("LOAD_PORT", "8160"))
HOST = f"http://127.0.0.1:{PORT}"
DB = os.environ.get("LOAD_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/serving_school_load")
REDIS = os.environ.get("LOAD_REDIS_URL", "redis://127.0.0.1:6379/6")
# LOAD_STEPS= (empty) measures the CPU per request only, without locust (a quick check).
STEPS = [int(n) for n in os.environ.get("LOAD_STEPS", "10,50,200").split(",") if n.strip()]
STEP_S = int(os.environ.get("LOAD_STEP_S", "60"))
# Learners arrive at this many per second (2 log-ins/s by default); the statistics
# restart once every one has logged in (within LOGIN_WAIT_S), so the table is the steady state.
SPAWN_RATE = float(os.environ.get("LOAD_SPAWN_RATE", "2"))
LOGIN_WAIT_S = int(os.environ.get("LOAD_LOGIN_WAIT_S", "600"))
# CPU per request: this many rounds of /healthz then the quiz, each this many requests.
CPU_ROUNDS = int(os.environ.get("LOAD_CPU_ROUNDS", "7"))
CPU_REQUESTS = int(os.environ.get("LOAD_CPU_REQUESTS", "150"))
# Locust's learners are learner0.. (one per user); the CPU measurement takes the last
# CPU_ROUNDS + 1 (a warm-up, and a fresh one per round).
LEARNERS = int(os.environ.get("LOAD_LEARNERS", str(max(STEPS, default=0) + 20 + CPU_ROUNDS)))
PASSWORD = "load-test-passphrase-1"  # noqa: S105 - throwaway accounts on loopback
OUT = ROOT / "var" / "load"
TICK = os.sysconf("SC_CLK_TCK")

ENV = {
    **os.environ,
    "DEBUG": "0",
    "SECRET_KEY": "load-test-only-" + "x" * 40,
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "SECURE_SSL_REDIRECT": "0",
    "SECURE_HSTS_SECONDS": "0",
    "SESSION_COOKIE_SECURE": "0",
    "CSRF_COOKIE_SECURE": "0",
    "DATABASE_URL": DB,
    "CELERY_BROKER_URL": REDIS,
    "CACHE_URL": REDIS,
    # Every simulated learner logs in from 127.0.0.1: one address standing for hundreds.
    "LOGIN_ATTEMPTS_PER_IP_PER_MIN": "100000",
    "VAR_DIR": str(OUT / "var"),
    "GUNICORN_BIND": f"127.0.0.1:{PORT}",
    "LOAD_PASSWORD": PASSWORD,
    "LOG_LEVEL": "WARNING",
}

SETUP = f"""
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from labs.models import LabRun
from quiz.models import LearnerSettings, ReviewLog, ReviewState, Showing
User = get_user_model()
names = [f"learner{{i}}" for i in range({LEARNERS})]
User.objects.filter(username__in=names).delete()
hashed = make_password({PASSWORD!r})
users = User.objects.bulk_create(User(username=n, password=hashed) for n in names)
LearnerSettings.objects.bulk_create(LearnerSettings(user=u, new_per_day=999) for u in users)
print("learners", len(users))
"""


def manage(*args: str, stdin: str | None = None) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=ENV,
        input=stdin,
        text=True,
        check=True,
        timeout=600,
    )


def start(cmd: list[str], log: str) -> subprocess.Popen:
    handle = (OUT / log).open("w")
    return subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def pg_backends() -> list[int]:
    name = DB.rsplit("/", 1)[1]
    # The name comes from this script's own LOAD_DATABASE_URL, not from outside.
    sql = f"select pid from pg_stat_activity where datname = '{name}'"  # noqa: S608
    host = re.search(r"@([^:/]+)", DB).group(1)
    out = subprocess.run(
        ["psql", "-h", host, "-U", "postgres", "-d", name, "-Atc", sql],
        capture_output=True,
        text=True,
    ).stdout
    return [int(p) for p in out.split()]


def cpu_s(pids: list[int]) -> dict[int, float]:
    """utime + stime of each process, in seconds (a process that is gone counts nothing)."""
    seconds = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return seconds


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle, all cores (locust's own included)."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / TICK


def web_cpu_s(master: int) -> float:
    """CPU of gunicorn's workers so far, those recycled meanwhile included (a worker that exits
    after max_requests is reaped by the master, which then counts its time as cutime + cstime)."""
    try:
        fields = Path(f"/proc/{master}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    reaped = (int(fields[13]) + int(fields[14])) / TICK
    return reaped + sum(cpu_s(children(master)).values())


def login(client: httpx.Client, username: str) -> None:
    client.get("/accounts/login/")
    token = client.cookies.get("csrftoken")
    response = client.post(
        "/accounts/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302, response.text[:300]


def quiz_loop(client: httpx.Client) -> int:
    """Fetch, answer, grade one card, as the browser's htmx does. Returns requests sent."""
    headers = {"HX-Request": "true", "X-CSRFToken": client.cookies.get("csrftoken", "")}
    # Every step must succeed: an error page measured as a quiz request would flatter the figure.
    panel = client.get("/quiz/", headers=headers).raise_for_status().text
    token = re.search(r"/quiz/answer/([\w-]+)/", panel)
    if token is None:
        return 1
    option = re.search(r'name="option" value="(\d+)"', panel)
    data = {"option": option.group(1)} if option else {"value": "1"}
    answer = client.post(f"/quiz/answer/{token.group(1)}/", data=data, headers=headers)
    answer.raise_for_status()
    grade = re.search(r"/quiz/grade/([\w-]+)/", answer.text)
    if grade is None:
        return 2
    client.post(
        f"/quiz/grade/{grade.group(1)}/", data={"rating": "3"}, headers=headers
    ).raise_for_status()
    return 3


def measure_cpu(master: int) -> dict[str, Any]:
    """CPU per request (web workers, and their PostgreSQL backends), one request at a time.

    CPU_ROUNDS rounds, each /healthz then the quiz, side by side: a machine shared with other
    work drifts between rounds, so the figures are each round's, and the medians over rounds."""
    with httpx.Client(base_url=HOST, timeout=30) as client:
        for _ in range(50):
            client.get("/healthz")
        # A server that has been up a while has read every card (its card and Markdown caches):
        # another learner goes through the deck first, on this client's kept-alive connection, so
        # through the gunicorn process that then serves the measured requests.
        login(client, f"learner{LEARNERS - 1}")
        for _ in range(300):
            if quiz_loop(client) == 1:  # no card left to show
                break
        rounds: dict[str, list[float]] = {}
        for round_ in range(CPU_ROUNDS):
            # A fresh learner per round, logged in outside the measured window: every measured
            # loop shows, answers and grades a new card. One learner for every round would run
            # out of cards (79, each shown twice on its first day) into cheap "done for today"
            # fetches, and flatter the figure.
            client.cookies.clear()
            login(client, f"learner{LEARNERS - 2 - round_}")
            quiz_loop(client)
            for label in ("healthz", "quiz"):
                web0, pg0 = web_cpu_s(master), cpu_s(pg_backends())
                sent = 0
                while sent < CPU_REQUESTS:
                    if label == "healthz":
                        client.get("/healthz")
                        sent += 1
                    else:
                        loop = quiz_loop(client)
                        if loop != 3:
                            raise RuntimeError(
                                f"the deck ran out after {sent} quiz requests in a round: "
                                "lower LOAD_CPU_REQUESTS"
                            )
                        sent += loop
                web1, pg1 = web_cpu_s(master), cpu_s(pg_backends())
                rounds.setdefault(f"{label}_web_ms", []).append(1000 * (web1 - web0) / sent)
                rounds.setdefault(f"{label}_pg_ms", []).append(1000 * cpu_delta(pg0, pg1) / sent)
                rounds.setdefault(f"{label}_n", []).append(sent)
        for label in ("healthz", "quiz"):
            rounds[f"{label}_ms"] = [
                w + p
                for w, p in zip(rounds[f"{label}_web_ms"], rounds[f"{label}_pg_ms"], strict=True)
            ]
        rounds["ratio"] = [
            q / h for q, h in zip(rounds["quiz_ms"], rounds["healthz_ms"], strict=True)
        ]
    results: dict[str, Any] = {name: statistics.median(values) for name, values in rounds.items()}
    results["rounds"] = rounds
    for label in ("healthz", "quiz"):
        results[f"{label}_n"] = sum(rounds[f"{label}_n"])
    results["ratio_min"], results["ratio_max"] = min(rounds["ratio"]), max(rounds["ratio"])
    return results


def run_step(users: int, master: int) -> list[dict[str, str]]:
    prefix = OUT / f"step{users}"
    ready = Path(f"{prefix}_ready")
    ready.unlink(missing_ok=True)
    locust = subprocess.Popen(
        [
            str(BIN / "locust"),
            "-f",
            "tests/load/locustfile.py",
            "--headless",
            "--only-summary",
            "-u",
            str(users),
            "-r",
            str(SPAWN_RATE),
            # A cap only: the locustfile stops the run STEP_S after the last learner logged in.
            "-t",
            f"{LOGIN_WAIT_S + STEP_S + 30}s",
            "--host",
            HOST,
            "--csv",
            str(prefix),
            "--stop-timeout",
            "10",
        ],
        cwd=ROOT,
        # One of the users is Health (fixed_count 1); every other one logs in.
        env={
            **ENV,
            "LOAD_EXPECTED_LOGINS": str(users - 1),
            "LOAD_READY_FILE": str(ready),
            "LOAD_MEASURE_S": str(STEP_S),
        },
        stdout=(OUT / f"step{users}.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    # The measured part starts when every learner has logged in, for the web CPU as for the
    # statistics; locust's wind-down after it is left out.
    deadline = time.monotonic() + LOGIN_WAIT_S
    while not ready.exists():
        if time.monotonic() > deadline or locust.poll() is not None:
            locust.kill()
            raise RuntimeError(
                f"{users} users: not every learner logged in within {LOGIN_WAIT_S} s"
                f" (see {OUT / f'step{users}.log'})"
            )
        time.sleep(0.2)
    web0, machine0, started = web_cpu_s(master), machine_busy_s(), time.monotonic()
    time.sleep(STEP_S)
    wall = time.monotonic() - started
    busy = web_cpu_s(master) - web0
    machine = machine_busy_s() - machine0
    try:
        locust.wait(timeout=120)
    except subprocess.TimeoutExpired:
        locust.kill()
        raise
    with open(f"{prefix}_stats.csv") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["web_cpu_cores"] = f"{busy / wall:.2f}"
        row["machine_cpu_cores"] = f"{machine / wall:.2f}"
    return rows


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def ensure_database() -> None:
    """Create the load test's own database on first use (a fresh machine has none)."""
    import psycopg
    from psycopg import sql

    url = httpx.URL(DB)
    name = url.path.lstrip("/")
    admin = str(url.copy_with(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def main() -> None:
    ensure_database()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "var").mkdir(exist_ok=True)
    manage("migrate", "--noinput", "-v", "0")
    manage("load_content")
    manage("collectstatic", "--noinput", "-v", "0")
    manage("shell", stdin=SETUP)
    subprocess.run(["redis-cli", "-u", REDIS, "flushdb"], check=False, capture_output=True)
    web = start([str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "config.wsgi"], "gunicorn.log")
    worker = start(
        [
            str(BIN / "celery"),
            "-A",
            "config",
            "worker",
            "-Q",
            "labs.sim",
            "--concurrency=1",
            "--hostname=load-sim@%h",
            "--loglevel=WARNING",
        ],
        "worker.log",
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{HOST}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        time.sleep(5)  # the worker's first heartbeat
        load_before = load_average()
        cpu = measure_cpu(web.pid)
        lines += [
            f"Load average before: {load_before} (2 cores, shared with other work).",
            "",
            "CPU per request, one request at a time (gunicorn workers + their PostgreSQL"
            f" backends), medians of {CPU_ROUNDS} rounds of {CPU_REQUESTS} requests each:",
            "",
            "| request | n | web CPU ms | PostgreSQL CPU ms | total ms |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label in ("healthz", "quiz"):
            w, p, t = cpu[f"{label}_web_ms"], cpu[f"{label}_pg_ms"], cpu[f"{label}_ms"]
            lines.append(f"| {label} | {cpu[f'{label}_n']:.0f} | {w:.1f} | {p:.1f} | {t:.1f} |")
        lines += [
            "",
            f"Quiz request / healthz CPU: {cpu['ratio']:.1f}x (median of {CPU_ROUNDS} rounds;"
            f" rounds {cpu['ratio_min']:.1f}x to {cpu['ratio_max']:.1f}x)",
            "",
            "Each round, total ms per request: healthz "
            + ", ".join(f"{v:.1f}" for v in cpu["rounds"]["healthz_ms"])
            + "; quiz "
            + ", ".join(f"{v:.1f}" for v in cpu["rounds"]["quiz_ms"])
            + ".",
            "",
        ]
        lines += [
            "| users | request | n | errors | p50 ms | p95 ms | p99 ms | req/s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        summary = [
            "",
            "| users | all requests/s | web CPU (cores) | whole machine busy (cores, locust too) |",
            "| --- | --- | --- | --- |",
        ]
        for users in STEPS:
            try:
                rows = run_step(users, web.pid)
            except RuntimeError as exc:
                # A slow machine's log-ins can outlast LOAD_LOGIN_WAIT_S: the steps before it
                # and the CPU figures still count, and the table says where it stopped.
                summary.append(f"| {users} | not measured: {exc} | | |")
                break
            for row in rows:
                if row["Name"] == "Aggregated":
                    summary.append(
                        f"| {users} | {float(row['Requests/s']):.1f} | {row['web_cpu_cores']} "
                        f"| {row['machine_cpu_cores']} |"
                    )
                if row["Name"] in ("login page", "Aggregated"):
                    continue
                lines.append(
                    f"| {users} | {row['Name']} | {row['Request Count']} | {row['Failure Count']} "
                    f"| {row['50%']} | {row['95%']} | {row['99%']} "
                    f"| {float(row['Requests/s']):.1f} |"
                )
        lines += summary
        lines += ["", f"Load average after: {load_average()}."]
    finally:
        stop(worker)
        stop(web)
    text = "\n".join(lines) + "\n"
    (OUT / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
