"""Locust users for `make loadtest` (tests/load/run.py starts the servers and reads the results).

- QuizLearner logs in once, then loops: fetch today's card, answer it, grade it (htmx requests,
  as the browser sends them), with 1-3 s of thinking between requests.
- LabUser logs in once, then changes a setting (live prediction), runs a small simulated lab and
  polls its page until it is done (or refused: the quota and queue caps answer 429).
- Health asks /healthz once a second, so each run has the trivial view beside the quiz.

Accounts learner0..N-1 exist with password LOAD_PASSWORD (run.py creates them).

The measured part starts when every learner has logged in (LOAD_EXPECTED_LOGINS of them): the
statistics restart then, LOAD_READY_FILE tells run.py, and the run stops LOAD_MEASURE_S later.
Log-ins queued behind a slow machine's hashing thus stay out of the steady state.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path

import gevent
from locust import HttpUser, between, constant, task

PASSWORD = os.environ.get("LOAD_PASSWORD", "load-test-passphrase-1")
HX = {"HX-Request": "true"}
_accounts = itertools.count()
TOKEN = re.compile(r"/quiz/answer/([\w-]+)/")
GRADE = re.compile(r"/quiz/grade/([\w-]+)/")
OPTION = re.compile(r'name="option" value="(\d+)"')
RUN = re.compile(r"/labs/runs/(\d+)/")


EXPECTED_LOGINS = int(os.environ.get("LOAD_EXPECTED_LOGINS", "0"))
READY_FILE = os.environ.get("LOAD_READY_FILE", "")
MEASURE_S = float(os.environ.get("LOAD_MEASURE_S", "60"))
_logins = itertools.count(1)


def _logged_in(environment) -> None:
    if next(_logins) != EXPECTED_LOGINS:
        return
    environment.runner.stats.reset_all()
    if READY_FILE:
        Path(READY_FILE).write_text(f"{time.time()}\n")
    gevent.spawn_later(MEASURE_S, environment.runner.quit)


class _LoggedIn(HttpUser):
    abstract = True

    def on_start(self) -> None:
        self.username = f"learner{next(_accounts)}"
        page = self.client.get("/accounts/login/", name="login page")
        token = self.client.cookies.get("csrftoken") or _csrf(page.text)
        data = {"username": self.username, "password": PASSWORD, "csrfmiddlewaretoken": token}
        for _ in range(30):
            with self.client.post(
                "/accounts/login/",
                data,
                headers={"Referer": self.host + "/accounts/login/"},
                name="login",
                allow_redirects=False,
                catch_response=True,
            ) as response:
                done = response.status_code == 302
                if not done and response.status_code == 503:
                    # Every hash slot busy: the page says to retry, as a person would.
                    response.success()
                elif not done:
                    response.failure(f"login: {response.status_code}")
                    return
            if done:  # counted after the `with`, which records this request
                _logged_in(self.environment)
                return
            self.wait()

    def post(self, url: str, data: dict, name: str, **kwargs):
        headers = {**HX, "X-CSRFToken": self.client.cookies.get("csrftoken", "")}
        headers["Referer"] = self.host + "/"
        return self.client.post(url, data, headers=headers, name=name, **kwargs)


def _csrf(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    return match.group(1) if match else ""


class QuizLearner(_LoggedIn):
    weight = 9
    wait_time = between(1, 3)

    def on_start(self) -> None:
        super().on_start()
        self.panel = ""

    @task
    def loop(self) -> None:
        # Fetch (or keep) the card on screen, answer it, then grade it: three quiz requests.
        if not TOKEN.search(self.panel):
            self.panel = self.client.get("/quiz/", headers=HX, name="quiz: fetch").text
            return
        token = TOKEN.search(self.panel).group(1)
        option = OPTION.search(self.panel)
        data = {"option": option.group(1)} if option else {"value": "1"}
        answer = self.post(f"/quiz/answer/{token}/", data, "quiz: answer")
        self.panel = answer.text
        self._think()
        graded = GRADE.search(self.panel)
        if graded:
            self.panel = self.post(
                f"/quiz/grade/{graded.group(1)}/", {"rating": 3}, "quiz: grade"
            ).text

    def _think(self) -> None:
        self.wait()


SMALL_RUN = {
    "backend": "sim",
    "num_prompts": "20",
    "prompt_tokens": "256",
    "output_tokens": "64",
    "max_tokens": "256",
}


class LabUser(_LoggedIn):
    weight = 1
    wait_time = between(1, 3)

    @task
    def predict_run_poll(self) -> None:
        self.client.get(
            "/labs/paged-kv/predict/",
            params={**SMALL_RUN, "block_size": "32"},
            headers=HX,
            name="lab: predict",
        )
        self.wait()
        with self.post(
            "/labs/paged-kv/runs/",
            SMALL_RUN,
            "lab: run",
            catch_response=True,
            allow_redirects=False,
        ) as response:
            if response.status_code == 429:
                response.success()  # quota or queue cap: an answer, not an error
                return
            match = RUN.search(response.headers.get("Location", ""))
            if response.status_code != 302 or not match:
                response.failure(f"run not queued: {response.status_code}")
                return
        url = f"/labs/runs/{match.group(1)}/"
        for _ in range(20):
            self.wait()
            poll = self.client.get(url, headers=HX, name="lab: poll")
            if poll.status_code == 286:  # htmx stop-polling: the run ended
                break


class Health(HttpUser):
    fixed_count = 1
    wait_time = constant(1)

    @task
    def healthz(self) -> None:
        self.client.get("/healthz", name="/healthz")
