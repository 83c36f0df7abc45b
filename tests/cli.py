"""`python manage.py ...` as a script runs it, in the test's own process: the same argument parsing,
output and exit status through Django's ManagementUtility, without a Python start per case.
Tests that need a fresh process (another environment or settings) still start one."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from django.core.management import ManagementUtility


@dataclass
class Completed:
    """What subprocess.run would have given: exit status and the two streams."""

    returncode: int
    stdout: str
    stderr: str


def manage(*argv: str) -> Completed:
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ManagementUtility(["manage.py", *argv]).execute()
        except SystemExit as exit_:
            code = exit_.code
    if not isinstance(code, int):
        # sys.exit("message") prints the message and exits 1, as the interpreter does.
        if code is not None:
            err.write(f"{code}\n")
        code = 0 if code is None else 1
    return Completed(code, out.getvalue(), err.getvalue())
