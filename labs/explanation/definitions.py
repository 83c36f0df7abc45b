"""How a run's numbers are defined: said in the run record (meta["definitions"]) and on the run
page, so a learner comparing with `vllm bench serve` knows what differs.

The vLLM harness stamps TTFT at the socket (first byte sent to the last byte of the first
content chunk received); bench starts its clock just before the POST, so its TTFT also holds
connecting and the client's own wait, typically a few milliseconds more. Both are measured; the
record keeps bench's as `ttft_bench_s`. E2E and goodput start where bench starts them, before
the POST; a run recorded before that says its E2E started at the socket, as it did. Sampling is
the lab's `temperature`: 0 (greedy) unless a speculative lab sets it, where it decides whether
ngram drafts are accepted. Pure Python, no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labs.backends import is_simulated
from labs.parameters.params import stored_param

TTFT_SOCKET = (
    "stamped at the socket: from the request's first byte sent to the last byte of its first "
    "content chunk received, on this machine's clock"
)
TTFT_BENCH = (
    "as vllm bench serve stamps it: from just before the POST (connecting and the client's own "
    "wait included) to the first content chunk"
)
TTFT_SIM = (
    "simulated: from the request's arrival to the end of the engine step that produced its "
    "first token"
)
E2E_BENCH = (
    "as vllm bench serve times it: from just before the POST to the last chunk received; "
    "goodput judges TTFT and E2E from the same start"
)
E2E_SIM = "simulated: from the request's arrival to the end of the step of its last token"
# What a real engine's run recorded before E2E was timed as bench times it measured.
E2E_SOCKET = (
    "stamped at the socket, as TTFT: from the request's first byte sent to the last chunk "
    "received (this run was measured before E2E started where vllm bench serve starts it)"
)
SAMPLING_SIM = "not simulated: drafts are accepted at the lab's acceptance, whatever the tokens"


def sampling(temperature: float) -> str:
    """Which sampling a real engine's requests used, and what it means for speculation."""
    if temperature == 0:
        return (
            "greedy (temperature 0): a rerun gives the same tokens, and ngram drafts that "
            "match are accepted (vllm bench serve samples at the server's default, 1)"
        )
    return (
        f"sampled at temperature {temperature:g}: fewer ngram drafts match the sampled tokens "
        "than greedily"
    )


def definitions(backend: str, temperature: float) -> dict[str, Any]:
    """What the run record's meta["definitions"] holds for a run on `backend`."""
    if is_simulated(backend):
        return {"ttft": TTFT_SIM, "e2e": E2E_SIM, "sampling": SAMPLING_SIM}
    return {
        "ttft": TTFT_SOCKET,
        "ttft_bench": TTFT_BENCH,
        "e2e": E2E_BENCH,
        "sampling": sampling(temperature),
        "temperature": temperature,
    }


def _ms(value: object) -> str:
    return f"{value * 1000:,.2f} ms" if isinstance(value, int | float) else "not measured"


def shown(
    backend: str, params: Mapping[str, Any], result: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    """The run page's definitions, as (term, text): how TTFT was stamped with its mean, bench's
    TTFT side by side (a real engine's run), and the sampling used."""
    temperature = stored_param(params, "temperature")
    said = definitions(backend, float(temperature))
    result = result or {}
    ttft = (result.get("ttft_s") or {}).get("mean")
    lines = [("TTFT", f"{said['ttft']}; mean {_ms(ttft)}")]
    if "ttft_bench" in said:
        bench = (result.get("ttft_bench_s") or {}).get("mean")
        lines.append(("TTFT (vllm bench serve)", f"{said['ttft_bench']}; mean {_ms(bench)}"))
    # The run's own record says how its E2E was timed; one without the word started at the
    # socket (or, simulated, at the arrival).
    stored = (result.get("meta") or {}).get("definitions") or {}
    e2e_said = stored.get("e2e") or (E2E_SIM if is_simulated(backend) else E2E_SOCKET)
    e2e = (result.get("e2e_s") or {}).get("mean")
    lines.append(("E2E", f"{e2e_said}; mean {_ms(e2e)}"))
    meta = result.get("meta") or {}
    if isinstance(meta.get("warmup_s"), int | float):
        failed = f" (it failed: {meta['warmup_error']})" if meta.get("warmup_error") else ""
        lines.append(
            (
                "Warm-up",
                "one request before the run, not measured, as vllm bench serve sends its first "
                f"prompt as a test: it took {_ms(meta['warmup_s'])}{failed}. A fresh server's "
                "first request pays one-time costs (on a CPU worker, the ngram proposer's "
                "compilation) that would otherwise fall on one request of the run",
            )
        )
    lines.append(("Sampling", said["sampling"]))
    return lines
