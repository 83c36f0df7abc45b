"""A stand-in for the `vllm` executable, started through the server manager in the tests.

`vllm serve MODEL_DIR [flags] --host H --port P` appends what it was started with to the JSON
lines file $STANDIN_RECORD (its pid, process group, session and arguments), starts a grandchild
that only sleeps (as vLLM starts its engine-core processes), then serves the fake vLLM
(fake_vllm.py) on H:P. $STANDIN_MODE changes that:

- `die`: fails to start as vLLM does, its cause ~60 lines above the generic "Engine core
  initialization failed", and exits with status 1 before serving;
- `never_healthy`: serves, but /health answers 503 forever;
- `ignore_term`: it and its grandchild ignore SIGTERM, so only SIGKILL stops them;
- `engine_ignores_term`: only the grandchild ignores SIGTERM.

The grandchild stands for vLLM's engine core: when it dies (a test kills it), the fake answers
as vLLM's API server does with a dead engine (fake_vllm.Engine.die), then exits after its
watchdog's period. Like every vLLM server started with --skip-tokenizer-init, it logs a warning
about the tokenizer at start.

$STANDIN_FAKE_CONFIG (JSON) is passed to the fake. `vllm --version` prints the fake's version.

`--max-model-len` (else the model directory's config.json `max_position_embeddings`) becomes the
fake's max_model_len, which it enforces on every request as vLLM does. A length above
max_position_embeddings exits at start, as vLLM 0.33 does unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
(config/model.py).

`--speculative-config` is read as vLLM 0.33's SpeculativeConfig reads its synthetic keys
(config/speculative.py): exactly one of `synthetic_acceptance_rates` (length k, each in [0, 1],
non-increasing) and `synthetic_acceptance_length` (in [1, k + 1], turned into vLLM's
minimum-variance schedule); anything else exits at start with vLLM's message. The fake then
accepts drafts with those rates, as vLLM's rejection sampler does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SLEEPER = """
import signal, sys, time
if sys.argv[1] in ("ignore_term", "engine_ignores_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(1)
"""


# A failed start as vLLM 0.32 logs it: the engine core's cause first, then a long traceback
# from the API server ending in the generic RuntimeError.
FAILED_START = "\n".join(
    [
        "(EngineCore_DP0 pid={pid}) ERROR 12-02 00:17:09 [core.py:1000] EngineCore failed to "
        "start.",
        "(EngineCore_DP0 pid={pid}) Traceback (most recent call last):",
        *['(EngineCore_DP0 pid={pid})   File "vllm/v1/engine/core.py", line 1, in run'] * 20,
        "(EngineCore_DP0 pid={pid}) ValueError: No valid attention backend found",
        "(APIServer pid=1) Traceback (most recent call last):",
        *['(APIServer pid=1)   File "vllm/v1/engine/utils.py", line 1432, in wait'] * 40,
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {{'EngineCore_DP0': 1}}",
    ]
)


def option(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def synthetic_rates(spec: dict) -> list[float]:
    """The per-position unconditional rates vLLM 0.33 would resolve `spec` to.

    Raises:
        ValueError: with vLLM's message, for what vLLM refuses.
    """
    k = int(spec["num_speculative_tokens"])
    rates, length = spec.get("synthetic_acceptance_rates"), spec.get("synthetic_acceptance_length")
    if (rates is None) == (length is None):
        raise ValueError(
            "rejection_sample_method='synthetic' requires exactly one of "
            "synthetic_acceptance_rates or synthetic_acceptance_length."
        )
    if rates is not None:
        if len(rates) != k:
            raise ValueError(f"synthetic_acceptance_rates must have length {k}, got {rates}.")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.")
        if any(rates[i] > rates[i - 1] for i in range(1, k)):
            raise ValueError(f"synthetic_acceptance_rates must be non-increasing, got {rates}.")
        return [float(r) for r in rates]
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length}.")
    accepted = length - 1  # the minimum-variance schedule: full positions, one partial, zeros
    full = int(accepted)
    return ([1.0] * full + [accepted - full] + [0.0] * (k - full - 1))[:k]


def max_model_len(argv: list[str]) -> int | None:
    """The server's context length as vLLM derives it, or None to keep the fake's default.

    Raises:
        ValueError: with vLLM's message, for a length above the model's.
    """
    try:
        config = json.loads((Path(argv[1]) / "config.json").read_text())
        derived = int(config["max_position_embeddings"])
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        derived = None
    if "--max-model-len" not in argv:
        return derived
    wanted = int(option(argv, "--max-model-len", "0"))  # the backend only sends integers
    if (
        derived is not None
        and wanted > derived
        and not os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    ):
        raise ValueError(
            f"User-specified max_model_len ({wanted}) is greater than the derived "
            f"max_model_len (max_position_embeddings={derived} in model's config.json). To "
            "allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    return wanted


def read_engine_args(argv: list[str], config: dict) -> None:
    """Put what the fake enforces from the engine flags into its `config`.

    Raises:
        ValueError: with vLLM's message, for flags vLLM refuses at start.
    """
    length = max_model_len(argv)
    if length is not None:
        config["max_model_len"] = length
    if "--speculative-config" in argv:
        config["speculative"] = True
        spec = json.loads(option(argv, "--speculative-config", "{}"))
        if spec.get("rejection_sample_method") == "synthetic":
            rates = synthetic_rates(spec)
            config["spec"] = {"k": int(spec["num_speculative_tokens"]), "rates": rates}


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--version"]:
        import fake_vllm

        print(fake_vllm.DEFAULTS["version"])
        return 0
    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c", SLEEPER, mode])
    record = os.environ.get("STANDIN_RECORD")
    if record:
        entry = {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "argv": argv,
            "grandchild": grandchild.pid,
        }
        with open(record, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
    print(f"INFO stand-in vllm {' '.join(argv[:2])}: loading model", flush=True)
    if mode == "die":
        print(FAILED_START.format(pid=grandchild.pid), file=sys.stderr, flush=True)
        return 1
    # Imported after the first log line: FastAPI takes a while to import on a busy machine, as
    # vLLM takes a while to load its model; the log should say something at once.
    import fake_vllm

    warning = "ValueError: Tokenizer not available when `skip_tokenizer_init=True`"
    print(fake_vllm.vllm_log("APIServer", "WARNING", "serving.py:222", warning), flush=True)
    config = fake_vllm.load_config(os.environ.get("STANDIN_FAKE_CONFIG"))
    config["model"] = option(argv, "--served-model-name", argv[1])
    config["block_size"] = int(option(argv, "--block-size", "16"))
    config["never_healthy"] = mode == "never_healthy"
    try:
        read_engine_args(argv, config)
    except ValueError as exc:
        print(f"ValueError: {exc}", file=sys.stderr, flush=True)
        grandchild.kill()
        return 1
    host, port = option(argv, "--host", "127.0.0.1"), int(option(argv, "--port", "8000"))
    asyncio.run(
        fake_vllm.serve(
            host, port, config, handle_term=mode != "ignore_term", engine_process=grandchild
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
