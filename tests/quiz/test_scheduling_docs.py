"""docs/scheduling.md names the tests that show each rule: every one it names must exist (the
page once cited a test that had been renamed away), and the rules it states must be the code's."""

from __future__ import annotations

import re
from pathlib import Path

from quiz import scheduling, services

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "scheduling.md").read_text()


def test_every_test_the_page_names_exists():
    named = set(re.findall(r"`(?:[\w/]+\.py::)?(test_\w+)`", DOC))
    defined = {
        name
        for path in (ROOT / "tests" / "quiz").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)\(", path.read_text(), re.MULTILINE)
    }
    assert len(named) >= 10
    assert named <= defined, f"docs/scheduling.md names missing tests: {sorted(named - defined)}"


def _names(module: str, name: str) -> bool:
    return re.search(rf"`(?:(?:quiz\.)?{module}\.)?{name}[`(]", DOC) is not None


def test_every_function_the_page_names_exists():
    for name in (
        *("outcomes", "replay", "study_date", "day_start", "fuzz_bounds", "interval_shown"),
        *("no_shrink_minimum", "same_day_start"),
    ):
        assert _names("scheduling", name) and callable(getattr(scheduling, name)), name
    for name in ("learner_settings_update", "_snapshot_after"):
        assert _names("services", name) and callable(getattr(services, name)), name
