"""How many of a requirements lock's pins apply to the Python running this: the number uv and pip
install (a universal lock also pins packages for other platforms, behind markers). Standard
library only: it runs before anything is installed.

    python scripts/lock_count.py requirements.lock
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

# A marker's comparisons, `name op 'value'`; after they are replaced by True/False only these
# words and brackets may be left.
COMPARISON = re.compile(r"(\w+)\s*(===|==|!=|<=|>=|~=|<|>|not in|in)\s*(['\"])(.*?)\3")
LEFT = re.compile(r"^(?:\s|True|False|and|or|not|\(|\))*$")


def environment() -> dict[str, str]:
    return {
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "python_full_version": platform.python_version(),
        "sys_platform": sys.platform,
        "platform_system": platform.system(),
        "platform_machine": platform.machine(),
        "platform_python_implementation": platform.python_implementation(),
        "implementation_name": sys.implementation.name,
        "os_name": os.name,
    }


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _compare(actual: str, op: str, wanted: str, is_version: bool) -> bool:
    if op in ("in", "not in"):
        return (actual in wanted) == (op == "in")
    if op == "===":
        return actual == wanted
    if is_version:
        return _ordered(_version(actual), op, _version(wanted))
    return _ordered(actual, op, wanted)


def _ordered(left: tuple[int, ...] | str, op: str, right: tuple[int, ...] | str) -> bool:
    """`left op right` for two values of one type (`~=` read as >=, enough for a lock's pins)."""
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    before, after = left < right, left > right  # type: ignore[operator]
    return {"<": before, "<=": not after, ">": after, ">=": not before, "~=": not before}[op]


def applies(marker: str, env: dict[str, str]) -> bool:
    def atom(match: re.Match[str]) -> str:
        name, op, _, wanted = match.groups()
        if name not in env:
            raise ValueError(f"unknown marker variable {name!r}")
        return str(_compare(env[name], op, wanted, name.endswith("_version")))

    logic = COMPARISON.sub(atom, marker)
    if not LEFT.match(logic):
        raise ValueError(f"cannot read the marker {marker!r}")
    return bool(eval(logic, {"__builtins__": {}}))  # noqa: S307 - only True/False/and/or/not left


def count(lock_text: str, env: dict[str, str]) -> int:
    pins = (line for line in lock_text.splitlines() if re.match(r"[A-Za-z0-9]", line))
    return sum(1 for pin in pins if ";" not in pin or applies(pin.split(";", 1)[1], env))


if __name__ == "__main__":
    print(count(Path(sys.argv[1]).read_text(), environment()))
