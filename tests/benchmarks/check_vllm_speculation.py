"""Check, against vLLM 0.33's own source, what the lab's speculation flag makes vLLM do.

    pip download vllm==0.33.0 --no-deps -d /tmp/w && python -m zipfile -e /tmp/w/vllm-*.whl /tmp/v
    python -m tests.benchmarks.check_vllm_speculation /tmp/v

No GPU and no torch needed: the functions that resolve the synthetic keys
(`SpeculativeConfig._resolve_synthetic_acceptance_rates`, `_acceptance_length_to_rates`) and
turn rates into per-position conditional rates (`unconditional_to_conditional_rates`) are taken
from the unpacked wheel's files with `ast` and run as they are. The rejection rule itself is a
Triton kernel (v1/sample/rejection_sampler.py); the script prints its lines and applies the same
rule (position i accepted while uniform < conditional[i], stop at the first rejection, a bonus
token when all k are accepted) to a million simulated steps. Output: docs/speculation-check.md.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import numpy as np

from labs.backends.vllm.server import synthetic_acceptance_rates
from labs.prediction.predict import spec_tokens_per_step

STEPS = 1_000_000


def _functions(path: Path, names: set[str]) -> dict[str, Any]:
    """The named functions (at any depth) of a source file, decorators dropped, executed."""
    tree = ast.parse(path.read_text())
    found = [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in names
    ]
    for node in found:
        node.decorator_list = []
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    missing = names - set(namespace)
    if missing:
        raise SystemExit(f"{path} has no {', '.join(sorted(missing))}: not vLLM 0.33?")
    return namespace


def _kernel_lines(path: Path) -> list[str]:
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if "synthetic_conditional_rates_ptr + pos" in line or "uniform_prob < rate" in line
    ]


def tokens_per_step(conditional: list[float], rng: np.random.Generator) -> np.ndarray:
    """Tokens each step yields under the rule: 1 + the run of accepted drafts from position 0."""
    draws = rng.random((STEPS, len(conditional)))
    accepted = draws < np.asarray(conditional)
    run = np.cumprod(accepted, axis=1).sum(axis=1)
    return 1 + run


def main(root: str) -> None:
    vllm = Path(root) / "vllm"
    spec = _functions(
        vllm / "config" / "speculative.py",
        {"_acceptance_length_to_rates", "_resolve_synthetic_acceptance_rates"},
    )
    util = _functions(
        vllm / "v1" / "spec_decode" / "utils.py", {"unconditional_to_conditional_rates"}
    )

    class SpeculativeConfig:  # what the resolver calls itself through
        _acceptance_length_to_rates = staticmethod(spec["_acceptance_length_to_rates"])

    spec["_resolve_synthetic_acceptance_rates"].__globals__["SpeculativeConfig"] = SpeculativeConfig
    resolve = spec["_resolve_synthetic_acceptance_rates"]
    to_conditional = util["unconditional_to_conditional_rates"]
    print("Rejection kernel lines (v1/sample/rejection_sampler.py):")
    for line in _kernel_lines(vllm / "v1" / "sample" / "rejection_sampler.py"):
        print("    " + line)
    rng = np.random.default_rng(0)
    print(
        f"\n{'k':>2} {'alpha':>5} | {'key':<8} {'resolved rates':<28} {'mean':>6} {'std':>6}"
        f" | i.i.d. model mean, std"
    )
    for k, alpha in ((3, 0.7), (4, 0.6), (2, 0.5), (5, 0.8)):
        probs = [alpha ** (j - 1) * (1 - alpha) for j in range(1, k + 1)] + [alpha**k]
        mean = sum(j * p for j, p in enumerate(probs, 1))
        std = sum((j - mean) ** 2 * p for j, p in enumerate(probs, 1)) ** 0.5
        assert abs(mean - spec_tokens_per_step(k, alpha)) < 1e-12
        for key, rates in (
            ("length", resolve(k, None, spec_tokens_per_step(k, alpha))),
            ("rates", resolve(k, synthetic_acceptance_rates(k, alpha), None)),
        ):
            steps = tokens_per_step(to_conditional(rates), rng)
            shown = "[" + ", ".join(f"{r:.3f}" for r in rates) + "]"
            print(
                f"{k:>2} {alpha:>5} | {key:<8} {shown:<28} {steps.mean():6.3f} {steps.std():6.3f}"
                f" | {mean:.3f}, {std:.3f}"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/vllmsrc")
