"""How hard the randomised tests try: a sample in `make test`, the full count in `make test-deep`.

Every property and fuzz test states its full count once, as `examples(full)`. `make test` runs a
tenth of it (at least 10), enough to exercise every branch of the strategy on each pass;
`make test-deep` (TESTS_DEEP=1) runs the full count. Hypothesis draws the same examples on every
run where a test says derandomize=True, so a failure in either target reproduces.
"""

from __future__ import annotations

import os

DEEP = os.environ.get("TESTS_DEEP", "") == "1"


def examples(full: int) -> int:
    """The number of examples (or random runs) to try: `full` when deep, else a tenth of it."""
    return full if DEEP else max(10, full // 10)
