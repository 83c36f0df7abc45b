"""labs.runs.queueing sends turns by the task's name: every process must know that task."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings


def test_a_web_process_knows_the_turn_task_without_importing_the_tasks_itself():
    # A fresh interpreter, as gunicorn starts one: this test process has imported the tasks
    # already (its neighbours do), which would hide a web process that has not.
    code = (
        "import django; django.setup()\n"
        "from config.celery import app\n"
        "from labs.runs import queueing\n"
        "print(queueing.RUN_NEXT in app.tasks)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
