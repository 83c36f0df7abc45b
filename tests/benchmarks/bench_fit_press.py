"""One press of "Optimize my parameters" for a learner with 600,000 reviews, on the app as
`make run` starts it (config/devrun.py: runserver, the lab worker and the fit worker; SQLite and
the filesystem broker in a temporary VAR_DIR).

It prepares that folder as `make setup` does, seeds one learner's log with bulk_create (the
synthetic forgetful learner of tests/quiz/synthetic_learners.py, cards of 3-12 reviews; with
`long`, cards of 128 reviews, the most a fit uses of a card, where a review costs the fit the
most memory), starts the app, logs in over HTTP and presses the button (POST
/quiz/parameters/optimize/). While the fit runs it requests /healthz every 0.1 s. It prints the
POST's time, /healthz's median and maximum before and during the fit, the fit's times (queued,
fitting), the peak memory of the fit's process, its training and held-out log loss (in force vs
fitted) and whether it would replace the parameters, and the machine's load average.

Not part of `make test` (wall-clock figures) and skipped by `make bench` unless BENCH_FIT_PRESS=1:
it takes a few minutes, most of them seeding. Run it with
    .venv/bin/python -m tests.benchmarks.bench_fit_press [reviews [long]]
or  BENCH_FIT_PRESS=1 .venv/bin/pytest tests/benchmarks/bench_fit_press.py -s
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PORT = 8168  # below the range of the devrun tests and bench_first_run (8170-8179)
REVIEWS = 600_000
PASSWORD = "bench-fit-press-0123"
GUARD_S = 1200


def _env(var_dir: Path) -> dict[str, str]:
    drop = {"MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES", "DATABASE_URL"}
    drop |= {"CELERY_BROKER_URL", "CACHE_URL", "VAR_DIR", "ENV_FILE", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(VAR_DIR=str(var_dir), ENV_FILE="", DJANGO_SETTINGS_MODULE="config.settings")
    return env


def _seed(reviews: int, shape: str) -> str:
    """One learner with `reviews` reviews over synthetic cards; their username."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from quiz.models import Card, Deck, ReviewLog
    from tests.quiz.factories import synthetic_review_rows
    from tests.quiz.synthetic_learners import review_log
    from tests.quiz.test_fitting import long_cards_log

    started = time.perf_counter()
    log = long_cards_log(reviews) if shape == "long" else review_log("forgetful", reviews, 3)
    generated = time.perf_counter()
    user = get_user_model().objects.create_user("bench-learner", password=PASSWORD)
    deck, _ = Deck.objects.get_or_create(slug="bench-fit", defaults={"title": "Bench fit"})
    with transaction.atomic():
        cards = Card.objects.bulk_create(
            (
                Card(
                    deck=deck,
                    slug=f"bench-fit-{card_id}",
                    kind="recall",
                    prompt=f"Question {card_id}?",
                    answer="Answer.",
                    steps=[],
                    is_active=False,  # history only: never shown in a quiz
                )
                for card_id in sorted({r.card_id for r in log})
            ),
            batch_size=5000,
        )
        ids = {int(card.slug.rsplit("-", 1)[1]): card.pk for card in cards}
        ReviewLog.objects.bulk_create(
            synthetic_review_rows(user, log, ids, "bench"), batch_size=5000
        )
    print(
        f"seeded {reviews:,} reviews of {len(cards):,} cards: generated in"
        f" {generated - started:.0f} s, stored in {time.perf_counter() - generated:.0f} s",
        flush=True,
    )
    return user.get_username()


def _wait(check, what: str, app: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        if app.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what}: not so\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _fit_peak_rss_kb() -> int:
    """The largest resident peak (VmHWM) of the fit processes running now (Linux /proc)."""
    peak = 0
    for entry in Path("/proc").iterdir():
        try:
            if b"quiz.fitting" not in (entry / "cmdline").read_bytes():
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError):
            continue
    return peak


class _Probe:
    """GET /healthz every 0.1 s, each on a new connection (as a health checker does; runserver
    may close a kept one under it), in a thread until stopped; also notes the fit process's peak
    memory."""

    def __init__(self, base_url: object) -> None:
        self.url = f"{base_url}/healthz"
        self.times: list[float] = []
        self.failures: list[str] = []
        self.fit_peak_kb = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        import httpx

        # One client (building one costs tens of ms), a new connection for each request.
        web = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
        while not self.done.is_set():
            began = time.perf_counter()
            try:
                web.get(self.url).raise_for_status()
                self.times.append(time.perf_counter() - began)
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
            self.fit_peak_kb = max(self.fit_peak_kb, _fit_peak_rss_kb())
            time.sleep(0.1)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def summary(self) -> str:
        if not self.times:
            return f"no answer; failures: {self.failures}"
        return (
            f"median {statistics.median(self.times) * 1000:.0f} ms,"
            f" max {max(self.times) * 1000:.0f} ms ({len(self.times)} requests,"
            f" {len(self.failures)} failed{': ' + self.failures[0] if self.failures else ''})"
        )


def main(reviews: int = REVIEWS, shape: str = "") -> None:
    import httpx

    with tempfile.TemporaryDirectory(prefix="bench-fit-press-") as tmp:
        var_dir = Path(tmp) / "var"
        var_dir.mkdir()
        env = _env(var_dir)
        python = str(ROOT / ".venv" / "bin" / "python")
        # As `make setup`: migrate and load the deck.
        subprocess.run([python, "manage.py", "prepare"], cwd=ROOT, env=env, check=True)
        os.environ.update(env)
        import django

        django.setup()
        from django.urls import reverse

        from quiz.models import ParameterFit

        username = _seed(reviews, shape)
        log = Path(tmp) / "make-run.log"
        with log.open("w") as out:
            command = [python, "config/devrun.py", "--port", str(PORT), "--venv", ".venv"]
            app = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        try:
            _wait(lambda: log.read_text().count(" ready.") >= 2, "both workers ready", app, log)
            web = httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60)
            web.get(reverse("login"))
            token = {"X-CSRFToken": web.cookies["csrftoken"]}
            answer = web.post(
                reverse("login"), data={"username": username, "password": PASSWORD}, headers=token
            )
            assert answer.status_code == 302, answer.text[:500]
            token = {"X-CSRFToken": web.cookies["csrftoken"]}
            web.get(reverse("quiz:parameters"))  # warm: a process's first request is slow
            idle = _Probe(web.base_url)
            time.sleep(3)
            idle.stop()

            print(f"load before the press: {os.getloadavg()}", flush=True)
            started = time.perf_counter()
            press = web.post(reverse("quiz:parameters-optimize"), headers=token)
            pressed_s = time.perf_counter() - started
            assert press.status_code == 302, press.text[:500]
            during = _Probe(web.base_url)
            fit = ParameterFit.objects.get()

            def finished() -> bool:
                fit.refresh_from_db()
                return fit.status not in ("queued", "running")

            _wait(finished, "the fit finished", app, log)
            during.stop()
            load = os.getloadavg()
        finally:
            app.send_signal(signal.SIGTERM)  # devrun stops the server and both workers
            app.wait(timeout=60)

        assert fit.status == "done", fit.error
        assert fit.started_at and fit.finished_at
        ev = fit.evaluation
        print(
            f"\nPOST {reverse('quiz:parameters-optimize')} (the press): {pressed_s * 1000:.0f} ms"
        )
        print(f"/healthz before the press: {idle.summary()}")
        print(f"/healthz while the fit ran: {during.summary()}")
        print(
            f"fit: waited {(fit.started_at - fit.created_at).total_seconds():.1f} s in the queue,"
            f" ran {(fit.finished_at - fit.started_at).total_seconds():.1f} s;"
            f" its process peaked at {during.fit_peak_kb / 1024:.0f} MB resident"
        )
        figures = (
            ("training", f"{fit.reviews:,} training"),
            ("held_out", f"{ev['held_out_reviews']:,} held-out"),
        )
        for name, items in figures:
            print(
                f"log loss on the {items} items: in force {ev[name]['current']['log_loss']:.4f},"
                f" fitted {ev[name]['fitted']['log_loss']:.4f}"
            )
        print(f"would replace the parameters: {'yes' if ev['wins'] else 'no'}")
        print(f"load average at the end of the fit (1, 5, 15 min): {load}")


@pytest.mark.skipif(not os.environ.get("BENCH_FIT_PRESS"), reason="minutes; BENCH_FIT_PRESS=1")
def test_one_press_for_a_learner_with_600000_reviews():
    # A process of its own: it sets Django up on its own folder, not the test database.
    subprocess.run([sys.executable, "-m", "tests.benchmarks.bench_fit_press"], cwd=ROOT, check=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else REVIEWS, *sys.argv[2:3])
