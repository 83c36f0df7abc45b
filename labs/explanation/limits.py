"""What held a run's admission back, read from the run's own engine series.

A request waits before its first step for one of four things: a free slot (max_num_seqs), room in
the KV pool for its prompt, room in the step's token budget (max_num_batched_tokens, whole prompts
only when chunked prefill is off), or nothing at all: the arrivals (concurrency, rate) never sent
more than the engine took. The engine series (labs.measurement.metrics: running, waiting, KV usage
and, from the simulator, tokens per step) shows which: while requests waited, which cap stood at
its limit, and for how long. `ramp` reads the same series for ramp-up and drain.

Pure functions over the stored summary and parameters; no Django.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from labs.parameters.params import stored_param

SEQS, KV, BUDGET, ARRIVALS = "max_num_seqs", "kv_pool", "token_budget", "arrivals"
UNCLEAR = ""  # requests waited, but no cap stood at its limit in the series
CAPS = (SEQS, KV, BUDGET)
# A cap that stood at its limit while requests waited for at least this share of the run holds
# admission; below it, the arrivals do.
HELD = 0.25
# The running count at or above this share of the plateau is the plateau (ramp).
PLATEAU = 0.9
# Without the pool's size, a KV usage this high is full.
KV_FULL = 0.95


@dataclass(frozen=True)
class Caps:
    """The limits a run's admission obeys, from its parameters and prediction."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    # What a waiting prompt needs: budget tokens (its cached prefix excluded) and KV blocks.
    prompt_tokens: int
    prompt_blocks: int
    num_blocks: int | None  # the KV pool in blocks; None when the run does not say
    in_flight: int | None  # closed loop: requests in flight at most (None: a rate, or all)
    request_rate: float | None
    num_prompts: int

    @classmethod
    def of_run(
        cls,
        params: Mapping[str, Any],
        prediction: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Caps | None:
        """The caps of a stored run (`LabRun.params`, its prediction and record meta), or None
        when the parameters lack them (a row stored by an older version)."""
        prediction, meta = prediction or {}, meta or {}
        seqs, budget = _int(params.get("max_num_seqs")), _int(params.get("max_num_batched_tokens"))
        prompt, block = _int(params.get("prompt_tokens")), _int(stored_param(params, "block_size"))
        prompts = _int(stored_param(params, "num_prompts"))
        if not (seqs and budget and prompt and block and prompts):
            return None
        cached = _int(prediction.get("prefix_cached_tokens")) or 0
        reserve = prompt
        if stored_param(params, "kv_allocation") == "contiguous":
            reserve += _int(stored_param(params, "max_tokens")) or 0
        num_blocks = _int(meta.get("num_gpu_blocks"))
        capacity = _int(prediction.get("kv_capacity_tokens"))
        if num_blocks is None and capacity:
            num_blocks = capacity // block
        rate = params.get("request_rate")
        in_flight = _int(params.get("max_concurrency")) or _int(params.get("concurrency"))
        return cls(
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            chunked_prefill=bool(stored_param(params, "chunked_prefill")),
            prompt_tokens=max(1, prompt - cached),
            prompt_blocks=-(-reserve // block),
            num_blocks=num_blocks or None,
            in_flight=min(in_flight, prompts) if in_flight and prompts else in_flight,
            request_rate=float(rate) if isinstance(rate, int | float) and rate > 0 else None,
            num_prompts=prompts,
        )

    def kv_full(self, usage: float) -> bool:
        """No room for a waiting prompt's blocks at this usage of the pool."""
        if self.num_blocks is None:
            return usage >= KV_FULL
        return (1.0 - usage) * self.num_blocks < self.prompt_blocks - 1e-9

    def budget_full(self, tokens: float) -> bool:
        """No room for a waiting prompt in a step that scheduled `tokens` tokens: none left at
        all, or (chunked prefill off) fewer than its whole prompt."""
        left = self.max_num_batched_tokens - tokens
        return left <= 0 if self.chunked_prefill else left < self.prompt_tokens

    def budget_may_hold(self, running: float) -> bool:
        """Without tokens per step (vLLM does not report them): the decodes of `running`
        sequences leave less than a whole prompt of the budget, so admission is paced by it."""
        return running + self.prompt_tokens > self.max_num_batched_tokens


@dataclass(frozen=True)
class Limit:
    """What held admission: `key` (one of CAPS, ARRIVALS, or UNCLEAR), the share of the run each cap
    stood at its limit while requests waited (`held`), the share with anyone waiting, the
    peaks the sentence quotes, and the sentence."""

    key: str
    held: Mapping[str, float]
    waited: float
    running_peak: int
    waiting_peak: int
    kv_peak: float
    tokens_peak: int | None  # None: the backend does not report tokens per step
    reached: frozenset[str]  # caps at their limit in some sample
    text: str


@dataclass(frozen=True)
class Ramp:
    """Ramp-up and drain in the running series: the plateau (the count the run spent half its
    time at or above), the seconds from the start until running first reached PLATEAU of it and
    from the last time it did to the end, and the sequences those ends lost against the plateau,
    averaged over the whole run."""

    level: float
    up_s: float
    down_s: float
    lost: float

    @property
    def threshold(self) -> int:
        return math.ceil(PLATEAU * self.level)

    @property
    def shown(self) -> bool:
        """The series sits below the plateau at an end."""
        return self.up_s + self.down_s > 0 and self.lost > 0

    def words(self) -> str:
        ends = []
        if self.up_s > 0:
            ends.append(f"the first {_seconds(self.up_s)}")
        if self.down_s > 0:
            ends.append(f"the last {_seconds(self.down_s)}")
        return (
            f"ramp-up and drain (fewer than {self.threshold:,} running for {' and '.join(ends)}, "
            f"{self.lost:.2g} fewer on average)"
        )


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) else None


def _seconds(value: float) -> str:
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:,.3g} s"


def _percent(value: float) -> str:
    return f"{value * 100:.3g}%"


def _engine(summary: Mapping[str, Any]) -> Mapping[str, Sequence[float]] | None:
    engine = (summary.get("series") or {}).get("engine") or {}
    times = engine.get("t_s") or []
    columns = ("running", "waiting", "kv_usage")
    if len(times) < 1 or any(len(engine.get(c) or []) != len(times) for c in columns):
        return None
    return engine


def _timeline(
    summary: Mapping[str, Any],
) -> tuple[Mapping[str, Sequence[float]], list[float], list[float]] | None:
    """The engine series, each sample's time, and how long it stands for (to the next sample,
    the last to the end of the run); None without a series or with no time in it."""
    engine = _engine(summary)
    if engine is None:
        return None
    times = [float(t) for t in engine["t_s"]]
    end = max(float(summary.get("duration_s") or 0.0), times[-1])
    spans = [max(0.0, b - a) for a, b in zip(times, [*times[1:], end], strict=True)]
    return (engine, times, spans) if sum(spans) > 0 else None


def binding_limit(summary: Mapping[str, Any], caps: Caps) -> Limit | None:
    """Which cap held admission in this run, from its engine series; None without a series.

    A sample in which requests waited counts for every cap standing at its limit in it (the
    token budget, when the backend does not report tokens per step, where the decodes leave
    less than a prompt of it and neither other cap is reached). The cap that stood there
    longest holds admission if that is at least HELD of the run; otherwise the arrivals do,
    unless requests waited that long with no cap at its limit (UNCLEAR: nothing is blamed).
    """
    timeline = _timeline(summary)
    if timeline is None:
        return None
    engine, times, spans = timeline
    total = sum(spans)
    running, waiting = engine["running"], engine["waiting"]
    usage = engine["kv_usage"]
    tokens = engine.get("scheduled_tokens")
    if tokens is not None and len(tokens) != len(times):
        tokens = None
    held = dict.fromkeys(CAPS, 0.0)
    reached: set[str] = set()
    waited = 0.0
    for i, span in enumerate(spans):
        at = set()
        if running[i] >= caps.max_num_seqs:
            at.add(SEQS)
        if caps.kv_full(usage[i]):
            at.add(KV)
        if tokens is not None and caps.budget_full(tokens[i]):
            at.add(BUDGET)
        reached |= at
        if waiting[i] <= 0:
            continue
        waited += span
        if tokens is None and not at and caps.budget_may_hold(running[i]):
            at.add(BUDGET)
        for cap in at:
            held[cap] += span
    if summary.get("preemptions"):
        # A preemption is the pool running out, though the sample after it may show room.
        reached.add(KV)
    shares = {cap: held[cap] / total for cap in CAPS}
    # Ties go to the cap that stops admission first in the scheduler's order.
    best = max(CAPS, key=lambda c: (shares[c], -CAPS.index(c)))
    unheld = UNCLEAR if waited / total >= HELD else ARRIVALS
    key = best if shares[best] >= HELD else unheld
    limit = Limit(
        key=key,
        held=shares,
        waited=waited / total,
        running_peak=int(max(running)),
        waiting_peak=int(max(waiting)),
        kv_peak=float(max(usage)),
        tokens_peak=int(max(tokens)) if tokens else None,
        reached=frozenset(reached),
        text="",
    )
    return _with_text(limit, caps)


def _fraction(ratio: float) -> str:
    """'half a', 'a quarter of a', '0.3 of a' (ratio < 1)."""
    for value, words in ((0.5, "half a"), (0.25, "a quarter of a"), (0.75, "three quarters of a")):
        if abs(ratio - value) < 0.005:
            return words
    return f"{ratio:.2g} of a"


def _cap_name(cap: str, caps: Caps, limit: Limit) -> str:
    if cap == SEQS:
        return f"max_num_seqs {caps.max_num_seqs:,}"
    if cap == KV:
        return f"the KV pool (peak {_percent(limit.kv_peak)})"
    return f"the step's token budget (max_num_batched_tokens {caps.max_num_batched_tokens:,})"


def _held_by(limit: Limit, caps: Caps) -> str:
    """The first half of the sentence: the cap that held, and what it did."""
    b, p = caps.max_num_batched_tokens, caps.prompt_tokens
    ran = f"{limit.running_peak:,} ran at once"
    if limit.key == SEQS:
        return f"max_num_seqs {caps.max_num_seqs:,} held admission: {ran} while up to " + (
            f"{limit.waiting_peak:,} waited"
        )
    if limit.key == KV:
        return f"the KV pool held admission: it filled (peak {_percent(limit.kv_peak)}): {ran}"
    if limit.key == BUDGET:
        inferred = "" if limit.tokens_peak is not None else " (tokens per step not reported)"
        if not caps.chunked_prefill:
            beside = b - p
            room = (
                "so only into a step with nothing else"
                if beside <= 0
                else f"so only beside at most {beside:,} decoding sequences"
            )
            return (
                f"the step's token budget (max_num_batched_tokens {b:,}, chunked prefill off) "
                f"takes a {p:,}-token prompt only whole, {room}{inferred}: {ran}"
            )
        if b < p:
            return (
                f"the step's token budget (max_num_batched_tokens {b:,}) admits "
                f"{_fraction(b / p)} {p:,}-token prompt per step{inferred}: {ran}"
            )
        return (
            f"the step's token budget (max_num_batched_tokens {b:,}) admits at most "
            f"{b / p:,.2g} prompts of {p:,} tokens per step{inferred}: {ran}"
        )
    if limit.key == UNCLEAR:
        return (
            f"requests waited for the engine {_percent(limit.waited)} of the run with no cap at "
            f"its limit in its series: {ran}"
        )
    if caps.request_rate is not None:
        source = f"Poisson arrivals at {caps.request_rate:,.3g} req/s"
    elif caps.in_flight:
        source = f"concurrency {caps.in_flight:,} keeps at most {caps.in_flight:,} in flight"
    else:
        source = f"the run's {caps.num_prompts:,} requests"
    waited = (
        "no request waited for the engine"
        if limit.waited == 0
        else f"requests waited for the engine only {_percent(limit.waited)} of the run"
    )
    return f"the arrivals held admission: {source}, and {waited}: {ran}"


def _with_text(limit: Limit, caps: Caps) -> Limit:
    text = _held_by(limit, caps)
    others = [c for c in CAPS if c != limit.key]
    never = [
        _cap_name(c, caps, limit)
        for c in others
        if c not in limit.reached and (c != BUDGET or limit.tokens_peak is not None)
    ]
    also = [
        f"{_cap_name(c, caps, limit)} held it too for {_percent(limit.held[c])} of the run"
        for c in others
        if limit.held[c] >= 0.05
    ]
    tail = [*also, f"{' and '.join(never)} never bound"] if never else also
    if tail:
        text += "; " + "; ".join(tail)
    return replace(limit, text=text)


def ramp(summary: Mapping[str, Any]) -> Ramp | None:
    """Ramp-up and drain in the running series; None without a series or with nothing running."""
    timeline = _timeline(summary)
    if timeline is None:
        return None
    engine, times, spans = timeline
    total = sum(spans)
    running = [float(r) for r in engine["running"]]
    if max(running) <= 0:
        return None
    # The plateau: the running count the run spent half its time at or above.
    half, acc, level = total / 2, 0.0, 0.0
    for value, span in sorted(zip(running, spans, strict=True), key=lambda x: -x[0]):
        acc += span
        if acc >= half:
            level = value
            break
    threshold = PLATEAU * level
    above = [i for i, r in enumerate(running) if r >= threshold]
    first, last = above[0], above[-1]
    ends = [*range(first), *range(last + 1, len(running))]
    lost = sum(max(0.0, level - running[i]) * spans[i] for i in ends) / total
    return Ramp(
        level=level,
        up_s=times[first] if first > 0 else 0.0,
        down_s=sum(spans[last + 1 :]),
        lost=lost,
    )


def formula_batch_reason(prediction: Mapping[str, Any], caps: Caps) -> str:
    """What sets the formulas' batch: 'concurrency 16', 'max_num_seqs 8', 'the sequences that
    fit the KV pool at their full length' or the token budget (a prediction that says what the
    rest would allow, `running_seqs_without_budget`)."""
    batch = _int(prediction.get("running_seqs"))
    fit = _int(prediction.get("max_concurrent_seqs"))
    if batch is None:
        return ""
    without = _int(prediction.get("running_seqs_without_budget"))
    if without is not None and batch < without:
        return (
            f"what the step's token budget (max_num_batched_tokens "
            f"{caps.max_num_batched_tokens:,}) keeps in the engine, of the {without:,} the rest "
            "would allow"
        )
    if caps.in_flight is not None and batch == caps.in_flight:
        return f"concurrency {caps.in_flight:,}"
    if batch == caps.max_num_seqs:
        return f"max_num_seqs {caps.max_num_seqs:,}"
    if fit is not None and batch == fit:
        return "the sequences that fit the KV pool at their full length"
    return ""
