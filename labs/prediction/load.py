"""What a run under the learner's load does, in closed form: the engine the simulator's `ideal`
profile runs (labs/sim/scheduler.py), step by step in the mean.

The engine keeps R sequences at once: R = min(requests in flight, max_num_seqs, the sequences
the KV pool holds, what the step's token budget lets through). Each of them cycles the same way:
its prompt is computed in the step after it is admitted (p steps if the budget splits it), the
first token comes at the end of that step, and s = (output - 1) / tokens per step decode steps
later it is done. So

    cycle (steps)   = p + s                                   (`Cycle`)
    cycle (seconds) = heavy steps x t_heavy + light steps x t_light
    throughput      = R / cycle, at most the offered rate      (Little's law: R = X x E2E)

A light step decodes the R sequences (memory-bound: weights once + R contexts of KV); a heavy
step also computes prompts (compute-bound beside them). Prompts that arrive together are
computed together: a closed loop whose first prompts fit one step keeps them in one wave;
Poisson arrivals bring them one at a time.

The run is finite (num_prompts), so its first wave (prompts in turn through the budget, a cold
prefix cache), the waits of requests beyond R, and its last arrival or wave are counted as well:
output tokens/s = num_prompts x output tokens / the run's length.

A request rate below what the engine serves runs R = rate x E2E sequences (fixed point), each
request waiting for the step in progress when it arrives; near capacity a queue forms (Erlang's
formula for R servers), and above capacity the queue grows for the whole run.

Standard library and numpy only.

Why one module: what a run under load does is one chain of closed forms (admission, batch, step
time, latency percentiles) whose parts call each other in both directions; docs/prediction.md
follows it in this order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from labs.parameters.catalog import Hardware, ModelSpec
from labs.parameters.params import EngineConfig, Workload
from labs.prediction.steps import (
    draft_time_s,
    prefill_time_s,
    spec_decode,
    step_time_s,
)


@dataclass(frozen=True)
class Shape:
    """The mean request: its prompt and output, what of its prompt a warm prefix cache serves,
    and speculation's tokens per step."""

    prompt: int
    output: int
    cached: int  # prompt tokens a warm cache serves (0 when nothing is cached)
    k: int  # drafts per decode step
    decode_steps: float  # steps after the first token (`spec_decode`): output - 1 without drafts
    verify: float  # tokens a decoding sequence puts in a step: 1 + its drafts

    @property
    def warm(self) -> int:
        """Prompt tokens a warm request computes."""
        return max(self.prompt - self.cached, 1)

    @property
    def tokens_per_step(self) -> float:
        """Output tokens a decode step yields per sequence on average."""
        return (self.output - 1) / self.decode_steps if self.decode_steps else 1.0

    @property
    def context(self) -> float:
        """KV tokens a decoding sequence holds on average over its decode."""
        return self.prompt + (self.output - 1) / 2


class Pricer:
    """Step times of the ideal engine from a step's mean composition."""

    def __init__(
        self, hardware: Hardware, model: ModelSpec, engine: EngineConfig, verify: float = 1.0
    ) -> None:
        self.hw, self.model, self.engine = hardware, model, engine
        self.k = engine.spec_tokens
        self.verify = verify  # tokens each decoding sequence puts in a step

    def step(
        self,
        prefill: float,
        decoders: float,
        kv: float,
        prefilling: float = 0.0,
    ) -> float:
        """A step computing `prefill` prompt tokens (of `prefilling` sequences) beside
        `decoders` decoding sequences (1 + k tokens each), reading `kv` tokens of KV: the step's
        roofline time plus, with drafts, the drafting passes."""
        hw, model, engine, k = self.hw, self.model, self.engine, self.k
        seqs = decoders + prefilling
        verify = decoders * self.verify
        seconds = step_time_s(hw, model, engine, prefill, verify, kv, num_seqs=seqs)
        if k and decoders and self.verify > 1:
            # Drafting runs when anyone decodes: a mean below one sequence is the share of
            # steps that have a decoder, each drafting for at least one. It takes a pass per
            # draft, and near a request's end it drafts fewer than k: verify - 1 on average.
            busy = min(decoders, 1.0)
            passes = (self.verify - 1) / k
            drafts = draft_time_s(hw, model, engine, max(decoders, 1.0), kv / busy)
            seconds += busy * passes * drafts
        return seconds

    def light(self, shape: Shape, decoders: float) -> float:
        """A decode step of `decoders` sequences at the mean context."""
        return self.step(0, decoders, decoders * shape.context)


@dataclass(frozen=True)
class Cycle:
    """The steady state of R sequences that each cycle prompt -> decode -> done, prompts
    arriving `group` at a time (all R at once: one wave; 1: one by one).

    heavy steps carry a group's prompt tokens beside the others' decodes; light steps decode
    only. Each request spends `prefill_steps` + `decode_steps` steps in the engine."""

    running: float
    group: float
    prefill_steps: int
    decode_steps: float
    heavy_s: float
    light_s: float
    heavy_steps: float  # per cycle, every group's
    light_steps: float

    @property
    def seconds(self) -> float:
        """A request's time in the engine: its prefill and its decode."""
        return self.heavy_steps * self.heavy_s + self.light_steps * self.light_s

    @property
    def first_token_s(self) -> float:
        return self.prefill_steps * self.heavy_s

    @property
    def requests_per_s(self) -> float:
        return self.running / self.seconds if self.seconds > 0 else math.inf

    def tpot_s(self, output: int) -> float | None:
        if output <= 1:
            return None
        return (self.seconds - self.first_token_s) / (output - 1)


def cycle(
    pricer: Pricer, shape: Shape, running: float, group: float, budget: int, chunked: bool
) -> Cycle | None:
    """The steady cycle of `running` sequences admitting `group` prompts together; None when
    its prompts and decodes do not fit the token budget (the budget, not R, then sets the
    pace: `budget_steady`).

    A group's prompts take p = ceil(group x prompt / room) steps (chunked; whole prompts
    without chunking), room being the budget the others' decodes leave. R / group groups
    each make p steps of a cycle of p + s heavy; when that is more steps than the cycle has,
    every step carries prompts and the groups grow to R x p / (p + s)."""
    running = max(running, 1.0)
    group = min(max(group, 1.0), running)
    s = shape.decode_steps
    for _ in range(8):
        others = running - group
        room = budget - others * shape.verify * s / (s + 1)
        tokens = group * shape.warm
        if room <= 0 or (not chunked and room < shape.warm):
            return None
        if chunked:
            steps = max(1, math.ceil(tokens / room))
        else:
            steps = math.ceil(group / int(room // shape.warm))
        waves = running / group
        if waves * steps <= steps + s + 1e-9:
            break
        wider = running * steps / (steps + s)
        if wider <= group * (1 + 1e-9):
            return None
        group = min(wider, running)
    else:
        return None
    heavy_steps = waves * steps
    light_steps = steps + s - heavy_steps
    decoders = others * s / (s + steps)
    heavy = pricer.step(
        tokens / steps,
        decoders,
        decoders * shape.context + group * shape.cached,
        prefilling=group,
    )
    light = pricer.light(shape, running) if s else 0.0
    return Cycle(running, group, steps, s, heavy, light, heavy_steps, light_steps)


# -- the first wave ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstWave:
    """The first `count` requests, admitted together at the start: their prompts computed in
    turn through the token budget (the first ones cold, before the shared prefix is cached),
    each first token at the end of the step that finishes its prompt."""

    first_token_s: np.ndarray  # per request, from the start
    prefill_steps: int
    step_s: float  # one prefill step
    groups: int  # steps that finish at least one prompt: the waves the run keeps

    def decode_seen_steps(self) -> np.ndarray:
        """Prefill steps each request's decode still shares with the wave's later prompts."""
        done_at = np.rint(self.first_token_s / self.step_s) if self.step_s else 0
        return np.maximum(self.prefill_steps - done_at, 0)


def first_wave(pricer: Pricer, shape: Shape, engine: EngineConfig, count: int) -> FirstWave:
    """Request j's first token comes at the end of the step that computes the last of its
    prompt: the wave's prompt tokens fill the budget in turn, step after step (chunked
    prefill), or whole prompts fill it as far as they go (chunked prefill off). Only the
    first prompt is cold: the engine registers the shared prefix's blocks when it schedules
    them, so every later prompt, even of the same step, hits them. Each step is priced by its
    own tokens; no prompt gets its first token sooner than it would alone. O(count) in numpy;
    count is at most max_num_seqs."""
    count = max(count, 1)
    budget = engine.max_num_batched_tokens
    cold, warm = shape.prompt, shape.warm
    num_cold = 1  # later prompts, even of the same step, hit the prefix it schedules
    if engine.chunked_prefill:
        tokens = np.full(count, warm, dtype=np.int64)
        tokens[0] = cold
        ends = np.cumsum(tokens)
        done_step = -(-ends // budget)
        steps = int(done_step[-1])
        step_tokens = np.full(steps, budget, dtype=np.int64)
        step_tokens[-1] = int(ends[-1]) - budget * (steps - 1)
    else:
        per_step = max(1, budget // warm)
        # The first step: the cold prompt and the warm ones that fit beside it.
        in_first = 1 + max(0, budget - cold) // warm
        index = np.arange(count)
        done_step = np.where(index < in_first, 1, 2 + (index - in_first) // per_step)
        steps = int(done_step[-1])
        step_tokens = np.bincount(done_step - 1, minlength=steps) * warm
        step_tokens[0] += cold - warm
    seconds = np.array([pricer.step(float(t), 0, 0, prefilling=1) for t in np.unique(step_tokens)])
    step_s = seconds[np.searchsorted(np.unique(step_tokens), step_tokens)]
    clock = np.cumsum(step_s)
    first = clock[done_step - 1]
    alone = np.full(count, prefill_time_s(pricer.hw, pricer.model, engine, cold, 0))
    alone[num_cold:] = prefill_time_s(pricer.hw, pricer.model, engine, cold, shape.cached)
    first = np.maximum(first, alone)
    groups = len(np.unique(done_step))
    return FirstWave(first, steps, float(clock[-1] / steps), groups)


# -- waits -------------------------------------------------------------------------------------


def closed_loop_wait_s(
    num_prompts: int, concurrency: int, batch: int, service_s: float
) -> tuple[float, float]:
    """(mean, median) wait before a request's first step when a client keeps `concurrency`
    requests in flight and the engine runs `batch` at a time, each wave taking `service_s`.

    Request i runs in wave i // batch, which starts at (i // batch) x service_s. The first
    `concurrency` requests are issued at 0; request i after them when request i - concurrency
    finishes, at (1 + (i - concurrency) // batch) x service_s. Concurrency above the batch
    therefore waits whole waves: that is the queueing a TTFT then shows.

    Counted in closed form, in O(1) whatever `num_prompts` (this runs in the web process). With
    concurrency = q x batch + r, the first `concurrency` requests wait 0, 1, ..., q - 1 waves
    (batch of each) and r wait q; every later one waits q - 1 waves, or q if its offset past
    `concurrency` is r or fewer short of a whole batch.
    """
    c = max(1, min(concurrency, num_prompts))
    if batch >= c:
        return 0.0, 0.0
    q, r = divmod(c, batch)
    full, rest = divmod(num_prompts - c, batch)
    at_q = full * r + max(0, rest - (batch - r)) + r
    at_q_minus_1 = num_prompts - batch * (q - 1) - at_q

    def waves_at(rank: int) -> int:
        """The rank-th smallest wait, in waves: batch requests each at 0 .. q - 2, then q - 1."""
        if rank < batch * (q - 1):
            return rank // batch
        return q - 1 if rank < batch * (q - 1) + at_q_minus_1 else q

    waves = batch * q * (q - 1) // 2 + (q - 1) * (at_q_minus_1 - batch) + q * at_q
    middle = (waves_at((num_prompts - 1) // 2) + waves_at(num_prompts // 2)) / 2
    return waves * service_s / num_prompts, middle * service_s


def erlang_c(servers: int, load: float) -> float:
    """Erlang's C formula: the chance an arrival finds all `servers` busy when the offered load
    is `load` (= rate x service time, below `servers`), computed by the stable recursion of
    Erlang's B formula."""
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    b = 1.0
    for n in range(1, servers + 1):
        b = load * b / (n + load * b)
    rho = load / servers
    return b / (1 - rho + rho * b)


def poisson_peak(mean: float, arrivals: int, cap: int) -> tuple[int, float]:
    """(most sequences at once, the chance the run's peak lands within 25% of it) for Poisson
    arrivals that each stay a while: an arrival finds Poisson(mean) others (Little's law gives
    the mean), and the run's peak is the largest of `arrivals` such counts plus the arrival
    itself, taken as independent: P(peak <= m) = F(m - 1)^arrivals, F the Poisson CDF. The
    median of that is the figure, never above `cap` (the engine's limit) or `arrivals`."""
    top = max(1, min(cap, arrivals))
    if mean <= 0:
        return 1, 1.0
    # P(peak <= m) for m = 1 .. top, from the Poisson CDF of the others.
    term = math.exp(-mean) if mean < 700 else 0.0
    cdf = term
    below = []
    for m in range(1, top + 1):
        below.append(cdf**arrivals if m < top else 1.0)
        term *= mean / m
        cdf = min(1.0, cdf + term)
        if cdf >= 1 - 1e-12 and m < top:
            below.extend([1.0] * (top - m))
            break
    peak = next(m for m, p in enumerate(below, start=1) if p >= 0.5)
    low, high = math.ceil(peak / 1.25), math.floor(peak * 1.25)
    within = below[min(high, top) - 1] - (below[low - 2] if low >= 2 else 0.0)
    return peak, within


def makespan_chance(arrivals: int, rate: float, tail_s: float) -> float:
    """The chance that a run of `arrivals` Poisson arrivals at `rate` lasts within 25% of its
    expected length (n - 1) / rate + `tail_s`, so that its throughput is within 25% of the
    formula's: the last arrival is a sum of n - 1 exponential gaps (Erlang's distribution)."""
    k = arrivals - 1
    if k <= 0:
        return 1.0
    if k > 400:
        return 1.0  # a spread of 1 / sqrt(n - 1) or less: within 25% nearly always
    expected = k / rate + tail_s

    def cdf(t: float) -> float:
        if t <= 0:
            return 0.0
        x = rate * t
        term = math.exp(-x)
        total = term
        for i in range(1, k):
            term *= x / i
            total += term
        return max(0.0, 1.0 - total)

    # Throughput within 25% of the formula's: the run's length within 25% of the expected.
    return cdf(1.25 * expected - tail_s) - cdf(0.75 * expected - tail_s)


# -- the prediction under load -----------------------------------------------------------------


@dataclass(frozen=True)
class LoadPrediction:
    """What the learner's load does: the sequences in the engine, the rate it finishes
    requests at, how long requests queue, TTFT (mean, median), TPOT and E2E including that
    queueing, and output tokens/s over the whole run. `uncovered` names the figures the
    formulas do not cover for these settings, with why."""

    batch: int
    capacity_requests_per_s: float
    queue_wait_s: float
    queue_wait_p50_s: float
    ttft_s: float
    ttft_p50_s: float
    e2e_s: float
    tpot_s: float | None
    output_tokens_per_s: float
    regime: str
    own_prefill_s: float = 0.0
    prefill_interference_s: float = 0.0
    plain_tpot_s: float | None = None
    uncovered: dict[str, str] = field(default_factory=dict)


# -- the token budget ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetSteady:
    """What the step's token budget (max_num_batched_tokens) lets an engine with a queue run.

    `running`: sequences in the engine at once, decoding or prefilling (Little's law: requests
    admitted per step x steps each spends there); `per_step`: requests admitted per step;
    `admit_share`: the share of steps that carry prompt tokens."""

    running: float
    per_step: float
    admit_share: float
    # The most at once: with chunked prefill a step's prompt tokens run from the end of one
    # prompt into the next, so a step holds one more sequence than it fills.
    peak: float

    def caps(self, allowed: int) -> bool:
        """Whether the budget runs fewer sequences than the `allowed` other limits let run."""
        return math.ceil(self.running) < allowed


def budget_steady(engine: EngineConfig, workload: Workload, cached_tokens: int = 0) -> BudgetSteady:
    """The steady state of a queued engine's token budget, admitting as the scheduler does
    (labs/sim/scheduler.py): running sequences take their tokens first, oldest first, and
    waiting prompts get what is left.

    With u uncached prompt tokens, d = (output - 1) / tokens per step decode steps of 1 + k
    tokens each (k drafts) and budget B:

    - chunked prefill fills every step: r = B / (u + d (1 + k)) requests start per step, about
      r x d sequences decode and max(r, 1) prompts are part-way through;
    - without it a prompt joins a step only whole. When m = floor(B / (u + d (1 + k))) >= 1,
      r = m prompts join each step beside the r x d decodes they lead to (up to
      (B - (m + 1) u) / (d (1 + k)) when m + 1 still fit beside fewer decodes). When not even
      one does, a prompt waits until at most (B - u) / (1 + k) sequences decode:
      floor((B - u) / (1 + k)) + 1 run, one at a time when the prompt needs the whole budget.
    """
    budget = engine.max_num_batched_tokens
    prompt = max(workload.prompt_tokens - cached_tokens, 1)
    steps, per_decode = spec_decode(
        workload.output_tokens - 1, engine.spec_tokens, engine.acceptance
    )
    per_request = prompt + steps * per_decode
    if engine.chunked_prefill:
        per_step = budget / per_request
        decoding = per_step * steps
        return BudgetSteady(
            decoding + max(per_step, 1.0), per_step, 1.0, math.ceil(decoding + per_step) + 1
        )
    whole = budget // per_request
    if whole >= 1:
        per_step = float(whole)
        if steps:
            per_step = max(per_step, (budget - (whole + 1) * prompt) / (steps * per_decode))
        running = per_step * (steps + 1)
        return BudgetSteady(running, per_step, min(per_step, 1.0), running)
    running = max((budget - prompt) // per_decode + 1, 1)
    per_step = running / (steps + 1)
    return BudgetSteady(float(running), per_step, per_step, float(running))


@dataclass(frozen=True)
class BudgetTimes:
    """Seconds of a budget-bound engine in its steady state (`budget_steady`)."""

    first_token_s: float  # from a request's admission to its first token
    tpot_s: float  # between a decoding sequence's tokens
    plain_tpot_s: float  # the same, were its steps to carry no prompt tokens for others
    requests_per_s: float
    in_engine_s: float  # admission to last token: first_token_s + (output - 1) x tpot_s


def budget_times(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    workload: Workload,
    steady: BudgetSteady,
    context_tokens: int,
    cached_tokens: int = 0,
) -> BudgetTimes:
    """Price `steady`'s steps: a step that admits carries per_step / admit_share prompts beside
    the r x d decodes of `context_tokens` each, the others the decodes alone.

    With chunked prefill every step admits, so each token of a decoding sequence waits for
    a full step and a prompt spans 1 / r of them. Without it the prompt is one step, and a
    sequence decoding while fewer than one request is admitted per step sees the admissions
    of the others that turn over during its decode (running - 1), not one per step."""
    k, alpha = engine.spec_tokens, engine.acceptance
    prompt = max(workload.prompt_tokens - cached_tokens, 1)
    steps, per_decode = spec_decode(workload.output_tokens - 1, k, alpha)
    tokens_per_step = (workload.output_tokens - 1) / steps if steps else 1.0
    share = steady.admit_share
    decoding = steady.per_step * steps
    decode_tokens = round(decoding * per_decode)
    kv_read = round(decoding * context_tokens)
    prompts = round(steady.per_step / share * prompt)
    admit = step_time_s(hardware, model, engine, prompts, decode_tokens, kv_read)
    plain = step_time_s(hardware, model, engine, 0, decode_tokens, kv_read)
    drafts = 0.0
    if k:  # a pass per draft: per_decode - 1 of them on average (fewer than k near the end)
        drafts = draft_time_s(hardware, model, engine, round(decoding), kv_read)
        drafts *= (per_decode - 1) / k
    if not steps:
        seen = plain  # nothing decodes: no token waits on a prompt
    elif engine.chunked_prefill or share >= 1:
        seen = admit
    else:
        others = min(steps, max(steady.running - 1, 0.0))
        seen = plain + others / steps * (admit - plain)
    # A chunked prompt spans the 1 / r steps that fill with its tokens, a whole one its own.
    spans = max(1.0, 1 / steady.per_step) if engine.chunked_prefill else 1.0
    alone = prefill_time_s(hardware, model, engine, workload.prompt_tokens, cached_tokens)
    first = max(spans * admit, alone)
    tpot = (seen + drafts) / tokens_per_step
    mean_step = share * admit + (1 - share) * plain + drafts
    return BudgetTimes(
        first_token_s=first,
        tpot_s=tpot,
        plain_tpot_s=(plain + drafts) / tokens_per_step,
        requests_per_s=steady.per_step / mean_step,
        in_engine_s=first + (workload.output_tokens - 1) * tpot,
    )


def pipeline_wait_s(
    num_prompts: int, concurrency: int, running: float, requests_per_s: float
) -> tuple[float, float]:
    """(mean, median) wait before a request's first step when `concurrency` clients keep
    requests in flight on an engine that starts `requests_per_s` of them one after another
    and holds `running` (fewer than `concurrency`): the budget-bound engine, never in waves.

    Request i starts at i / rate. The first `concurrency` are issued at 0; each later one when
    the request `concurrency` ahead of it finishes, running / rate after it started (Little's
    law), so it waits (concurrency - running) / rate. O(1), as closed_loop_wait_s."""
    c = max(1, min(concurrency, num_prompts))
    later = num_prompts - c
    waits = max(c - running, 0.0)  # of a later request, in units of 1 / rate
    mean = (c * (c - 1) / 2 + later * waits) / num_prompts
    below = min(c, math.ceil(waits))  # first requests that wait less than a later one

    def at(rank: int) -> float:
        """The rank-th smallest wait: 0 .. below - 1, the later ones, then the rest."""
        if rank < below:
            return float(rank)
        return waits if rank < below + later else float(rank - later)

    middle = (at((num_prompts - 1) // 2) + at(num_prompts // 2)) / 2
    return mean / requests_per_s, middle / requests_per_s


# -- the run -------------------------------------------------------------------------------------


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The median of `values` each counted `weights` times (numpy's linear percentile of the
    expanded list, to within one step)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    total = cum[-1]
    lo = np.searchsorted(cum, (total - 1) / 2, side="right")
    hi = np.searchsorted(cum, total / 2, side="right")
    return float((v[min(lo, len(v) - 1)] + v[min(hi, len(v) - 1)]) / 2)


def request_shape(engine: EngineConfig, workload: Workload, cached_tokens: int) -> Shape:
    """The mean request of the workload, its decode steps and verified tokens per step."""
    k = engine.spec_tokens
    steps, verify = spec_decode(workload.output_tokens - 1, k, engine.acceptance)
    return Shape(
        prompt=workload.prompt_tokens,
        output=workload.output_tokens,
        cached=cached_tokens,
        k=k,
        decode_steps=steps,
        verify=verify,
    )


def predict_load(
    hardware: Hardware,
    model: ModelSpec,
    engine: EngineConfig,
    workload: Workload,
    seq_cap: int,
    cached_tokens: int = 0,
) -> LoadPrediction:
    """The run under the learner's load: closed-loop `max_concurrency` clients (all prompts at
    once when unset), or Poisson arrivals at `request_rate`, on an engine that holds at most
    `seq_cap` sequences (max_num_seqs and the KV pool), and fewer when the token budget lets
    fewer through (`budget_steady`)."""
    shape = request_shape(engine, workload, cached_tokens)
    pricer = Pricer(hardware, model, engine, shape.verify)
    if workload.request_rate is None:
        return _closed_loop(pricer, shape, engine, workload, seq_cap)
    return _open_loop(pricer, shape, engine, workload, seq_cap)


def _in_flight(workload: Workload) -> int:
    """Requests the client keeps in flight: `concurrency`, the batch the prediction assumes
    (labs.parameters.params.align_run_batch makes max_concurrency follow it for a run); with a
    request rate, max_concurrency when set, else every prompt."""
    n = workload.num_prompts
    if workload.request_rate is None:
        c = workload.concurrency
    else:
        c = workload.max_concurrency if workload.max_concurrency is not None else n
    return max(1, min(c, n))


def _in_step(shape: Shape, workload: Workload, engine: EngineConfig, wave: FirstWave) -> bool:
    """Whether requests keep taking the same steps: prompts computed in one step (or all of
    one length), and decode step counts that spread by less than half a step. Output lengths
    drawn from [lo, hi] spread by (hi - lo) / sqrt(12) tokens; with drafts each step yields T
    tokens (mean m, spread v from the chance each draft is accepted), so s steps spread by
    sqrt(s) x v / m steps."""
    if wave.prefill_steps > 1 and workload.prompt_range[0] != workload.prompt_range[1]:
        return False
    lo, hi = workload.output_range
    per_step = variance = 0.0
    k, alpha = engine.spec_tokens, engine.acceptance
    if k and alpha > 0 and shape.decode_steps and shape.output > 2:
        # P(T = j) = alpha^(j-1) (1 - alpha) for j <= k, P(T = k + 1) = alpha^k.
        chances = [alpha ** (j - 1) * (1 - alpha) for j in range(1, k + 1)] + [alpha**k]
        per_step = sum(j * c for j, c in enumerate(chances, start=1))
        spread = sum(j * j * c for j, c in enumerate(chances, start=1)) - per_step**2
        variance = shape.decode_steps * spread / per_step**2
    variance += ((hi - lo) / math.sqrt(12) / max(per_step, 1.0)) ** 2
    return math.sqrt(variance) < 0.5


def _budget_run(
    pricer: Pricer,
    shape: Shape,
    engine: EngineConfig,
    workload: Workload,
    steady: BudgetSteady,
    in_flight: int,
) -> LoadPrediction:
    """The budget-bound engine (`budget_steady`): requests start one after another at the rate
    the budget lets through, never in waves."""
    n = workload.num_prompts
    times = budget_times(
        pricer.hw, pricer.model, engine, workload, steady, round(shape.context), shape.cached
    )
    rate = times.requests_per_s
    mean_wait, p50_wait = pipeline_wait_s(n, in_flight, steady.running, rate)
    first = times.first_token_s
    tpot = times.tpot_s if shape.output > 1 else None
    makespan = (n - 1) / rate + times.in_engine_s
    return LoadPrediction(
        batch=max(1, min(math.ceil(steady.peak), in_flight)),
        capacity_requests_per_s=rate,
        queue_wait_s=mean_wait,
        queue_wait_p50_s=p50_wait,
        ttft_s=first + mean_wait,
        ttft_p50_s=first + p50_wait,
        e2e_s=mean_wait + times.in_engine_s,
        tpot_s=tpot,
        output_tokens_per_s=n * shape.output / makespan,
        regime="token budget",
        own_prefill_s=first,
        prefill_interference_s=(shape.output - 1) * (times.tpot_s - times.plain_tpot_s),
        plain_tpot_s=times.plain_tpot_s if tpot is not None else None,
    )


def _closed_loop(
    pricer: Pricer, shape: Shape, engine: EngineConfig, workload: Workload, seq_cap: int
) -> LoadPrediction:
    """A client that keeps c requests in flight (every prompt at once when unset).

    The first R = min(c, cap) start together (`first_wave`) and keep the waves their prompts
    finished in (`cycle`); each slot then serves its share of the prompts back to back, and
    requests beyond R wait whole cycles for a slot (`closed_loop_wait_s`). The run lasts until
    the slot with the most left finishes."""
    n = workload.num_prompts
    c = _in_flight(workload)
    running = max(1, min(c, seq_cap))
    steady = budget_steady(engine, workload, shape.cached)
    if steady.caps(running):
        return _budget_run(pricer, shape, engine, workload, steady, c)
    wave = first_wave(pricer, shape, engine, running)
    # Requests that finish together come back together, so the waves the first prompts
    # finished in return every cycle, unless the requests take different times: lengths
    # drawn from a range, or drafts accepted by chance. Then they drift apart, and later
    # prompts arrive one by one.
    in_step = _in_step(shape, workload, engine, wave)
    group = running / wave.groups if in_step else 1.0
    cyc = cycle(
        pricer, shape, running, group, engine.max_num_batched_tokens, engine.chunked_prefill
    )
    if cyc is None:
        return _budget_run(pricer, shape, engine, workload, steady, c)
    s = shape.decode_steps
    d = shape.output - 1
    # The first wave decodes through the later prompts' prefill steps, then on light steps.
    seen = np.minimum(wave.decode_seen_steps(), s)
    first_decode = seen * wave.step_s + (s - seen) * cyc.light_s
    first_finish = wave.first_token_s + first_decode
    slots = np.arange(running)
    served = -(-(n - slots) // running)  # requests slot j serves: ceil((n - j) / R)
    makespan = float((first_finish + (served - 1) * cyc.seconds).max())
    later = n - running
    if in_step or c <= running:
        mean_wait, p50_wait = closed_loop_wait_s(n, c, running, cyc.seconds)
    else:  # slots free one by one: a later request waits (c - R) / throughput
        mean_wait, p50_wait = pipeline_wait_s(n, c, running, cyc.requests_per_s)
    own = float((wave.first_token_s.sum() + later * cyc.first_token_s) / n)
    own_p50 = _weighted_median(
        np.append(wave.first_token_s, cyc.first_token_s),
        np.append(np.ones(running), max(later, 0)),
    )
    tpot = None
    if d > 0:
        steady_tpot = cyc.tpot_s(shape.output) or 0.0
        tpot = float((first_decode.sum() / d + later * steady_tpot) / n)
    decode_mean = float((first_decode.sum() + later * (cyc.seconds - cyc.first_token_s)) / n)
    return LoadPrediction(
        batch=running,
        capacity_requests_per_s=cyc.requests_per_s,
        queue_wait_s=mean_wait,
        queue_wait_p50_s=p50_wait,
        ttft_s=own + mean_wait,
        ttft_p50_s=own_p50 + p50_wait,
        e2e_s=own + mean_wait + decode_mean,
        tpot_s=tpot,
        output_tokens_per_s=n * shape.output / makespan,
        regime="concurrency" if running == c else "max_num_seqs or KV pool",
        own_prefill_s=own,
        plain_tpot_s=cyc.light_s / shape.tokens_per_step if d > 0 else None,
    )


def _open_loop(
    pricer: Pricer, shape: Shape, engine: EngineConfig, workload: Workload, seq_cap: int
) -> LoadPrediction:
    """Poisson arrivals at rate lambda.

    Below capacity: R = lambda x E2E sequences (Little's law, a fixed point from one). A
    decoding request sees lambda x its decode time other prompts arrive, each making p of its
    steps heavy: decode time D = s x t_light / (1 - lambda x p x (t_heavy - t_light)). An
    arrival finds the engine busy with chance 1 - e^-R and waits for the step in progress;
    near capacity it also waits for a slot (Erlang's C formula over R slots).

    Above capacity mu (the cycle of `cap` sequences): the k-th request starts k / mu in, so
    it waits k (1 / mu - 1 / lambda); the queue grows for the whole run."""
    n = workload.num_prompts
    rate = float(workload.request_rate or 0.0)
    c = _in_flight(workload)
    cap = max(1, min(seq_cap, c))
    # With max_concurrency at or below what the engine holds, a request that finds every
    # client slot taken waits in the client, and is sent (its TTFT's clock starts) only when
    # a slot frees: the engine never queues it.
    client_queues = workload.max_concurrency is not None and c <= seq_cap
    budget, chunked = engine.max_num_batched_tokens, engine.chunked_prefill
    steady = budget_steady(engine, workload, shape.cached)
    # Saturated, the engine runs as a closed loop of its `cap` slots: requests that finish
    # together are replaced together, in the waves its first prompts made while they last.
    saturated = first_wave(pricer, shape, engine, cap)
    group = cap / saturated.groups if _in_step(shape, workload, engine, saturated) else 1.0
    full = None if steady.caps(cap) else cycle(pricer, shape, cap, group, budget, chunked)
    if full is None:
        times = budget_times(
            pricer.hw, pricer.model, engine, workload, steady, round(shape.context), shape.cached
        )
        capacity = times.requests_per_s
    else:
        capacity = full.requests_per_s
    d = shape.output - 1
    alone = prefill_time_s(pricer.hw, pricer.model, engine, shape.prompt, shape.cached)
    cold = prefill_time_s(pricer.hw, pricer.model, engine, shape.prompt, 0)
    near = _near_capacity(rate, capacity)
    below = None
    if rate < capacity or n <= cap:
        below = _open_loop_fixed_point(
            pricer, shape, engine, rate, cap, alone, n, engine_queues=not client_queues
        )
    if below is not None:
        running, ttft, tpot_s, decode_s, light, wait, wait_p50 = below
        # Prompts that come faster than the engine computes them queue one behind another:
        # request j arrives j / rate in and, the engine computing a prompt per `per_prompt`
        # (a first wave's pace, several to a step), gets its first token no sooner than
        # cold + j x per_prompt from the start. The first request finds nothing cached.
        count = min(n, cap)
        wave = first_wave(pricer, shape, engine, count)
        per_prompt = wave.step_s * wave.prefill_steps / count
        alone_each = np.full(count, ttft)
        alone_each[0] += cold - alone
        behind = cold + np.arange(count) * (per_prompt - 1 / rate)
        each = np.maximum(behind, alone_each)
        later = n - count
        ttft_mean = float((each.sum() + later * ttft) / n) + wait
        ttft_p50 = _weighted_median(np.append(each, ttft), np.append(np.ones(count), later))
        e2e = ttft + decode_s
        # The run ends when its last arrival is done: queued behind the first prompts if
        # every request came in that first stretch.
        last_ttft = float(each[-1]) if not later else ttft
        makespan = (n - 1) / rate + last_ttft + decode_s
        # A sequence is counted beside another's arrival if it is still running when the
        # step in progress ends: it overlaps arrivals from its own arrival (waiting included)
        # until its last step begins.
        last_step = light if shape.decode_steps else alone
        peak, within = poisson_peak(rate * max(e2e - last_step, 0.0), n, cap)
        uncovered = dict(near)
        if within < 0.5:
            uncovered["running_seqs"] = (
                f"the most sequences at once is chance here: {rate * e2e:.2g} on average "
                f"(rate x E2E, Little's law), and a run of {n:,} Poisson arrivals peaks within "
                f"25% of {peak:,} only {within:.0%} of the time"
            )
        chance = makespan_chance(n, rate, e2e)
        if chance < 0.5:
            uncovered["output_tokens_per_s"] = (
                f"output tokens/s is chance here: {n:,} Poisson arrivals end about "
                f"{(n - 1) / rate:.3g} s in, give or take {math.sqrt(max(n - 1, 0)) / rate:.2g} s, "
                f"and a run lands within 25% of the formula's figure only {chance:.0%} of the "
                "time"
            )
        return LoadPrediction(
            batch=peak,
            uncovered=uncovered,
            capacity_requests_per_s=capacity,
            queue_wait_s=ttft_mean - alone,
            queue_wait_p50_s=max(0.0, ttft_p50 + wait_p50 - alone),
            ttft_s=ttft_mean,
            ttft_p50_s=ttft_p50 + wait_p50,
            e2e_s=ttft_mean + decode_s,
            tpot_s=tpot_s if d > 0 else None,
            output_tokens_per_s=n * shape.output / makespan,
            regime="rate below capacity",
            own_prefill_s=alone,
            plain_tpot_s=light / shape.tokens_per_step if d > 0 else None,
        )
    # Above capacity: the engine runs saturated at its slots, its queue growing by
    # 1 / mu - 1 / rate a request, until the client's own slots are full: beyond that,
    # requests wait in the client (before their clock starts), and the engine's queue holds
    # the c - slots the client keeps there, each waiting (c - slots) / mu.
    gap = max(0.0, 1 / capacity - 1 / rate)
    if full is not None:
        own, tpot, in_engine = full.first_token_s, full.tpot_s(shape.output), full.seconds
        plain = full.light_s / shape.tokens_per_step
        slots = min(cap, n)
    else:
        own, tpot, in_engine = times.first_token_s, times.tpot_s, times.in_engine_s
        plain = times.plain_tpot_s
        slots = max(1, min(cap, math.ceil(steady.running), n))
    longest = max(c - slots, 0) / capacity
    # Request i waits i x gap once the first `slots` have started, at most `longest`.
    waits = np.minimum(np.arange(slots, n) * gap, longest)
    mean_wait = float(waits.sum()) / n
    p50_wait = float(np.median(np.append(np.zeros(slots), waits)))
    makespan = max((n - 1) / rate, (n - 1) / capacity) + in_engine
    return LoadPrediction(
        batch=slots,
        capacity_requests_per_s=capacity,
        queue_wait_s=mean_wait,
        queue_wait_p50_s=p50_wait,
        ttft_s=own + mean_wait + (cold - alone) / n,
        ttft_p50_s=own + p50_wait,
        e2e_s=own + mean_wait + (cold - alone) / n + (in_engine - own),
        tpot_s=tpot if d > 0 else None,
        output_tokens_per_s=n * shape.output / makespan,
        regime="rate above capacity",
        own_prefill_s=own,
        plain_tpot_s=plain if d > 0 else None,
        uncovered=dict(near),
    )


# From this share of capacity up to it, the queue that forms sets TTFT, and the formulas
# leave it uncovered (`_near_capacity`).
NEAR_CAPACITY = 0.65


def _near_capacity(rate: float, capacity: float) -> dict[str, str]:
    """TTFT (mean and median) left uncovered where the rate is NEAR_CAPACITY of capacity or
    more but below it: there the wait is set by how a run's Poisson arrivals bunch, by
    prompts that queue into one long step, and by a queue that starts empty and needs many
    arrivals to build. Erlang's steady-state formula, which the prediction uses further from
    capacity, lands within 25% of the ideal engine in few such runs."""
    if not NEAR_CAPACITY * capacity <= rate < capacity:
        return {}
    why = (
        f"the formulas do not cover TTFT here: {rate:.3g} requests/s is {rate / capacity:.0%} "
        f"of the {capacity:.3g} requests/s the engine serves, where the queue a run builds "
        "depends on how its arrivals bunch, more than a steady-state formula can say"
    )
    return {"loaded_ttft_s": why, "loaded_ttft_p50_s": why}


def _open_loop_fixed_point(
    pricer: Pricer,
    shape: Shape,
    engine: EngineConfig,
    rate: float,
    cap: int,
    alone_s: float,
    arrivals: int,
    engine_queues: bool = True,
) -> tuple[float, float, float, float, float, float, float] | None:
    """(running, TTFT, TPOT, decode time, a light step, mean and median wait for a slot) of
    Poisson arrivals at `rate` below capacity, or None when no fixed point holds under `cap`
    (the rate is at or above capacity). A run of n requests has at most n - 1 others to
    share steps with, however long each stays."""
    s = shape.decode_steps
    budget = engine.max_num_batched_tokens
    others_most = max(arrivals - 1, 0)
    running = 1.0
    result = None
    for _ in range(60):
        decoders = min(rate * (result[3] if result else 0.0), others_most)
        light = pricer.light(shape, 1 + decoders) if s else 0.0
        room = max(budget - decoders * shape.verify, 1)
        chunks = max(1, math.ceil(shape.warm / room)) if engine.chunked_prefill else 1
        heavy = pricer.step(
            shape.warm / chunks, decoders, decoders * shape.context + shape.cached, 1
        )
        step_extra = chunks * max(heavy - light, 0.0)  # what another's prompt adds
        extra = rate * step_extra
        # Decode time D = s x light + (prompts arriving from its own prefill until its last
        # decode step starts) x step_extra, with at most n - 1 of them in the run:
        # D = s x light + rate x (t_prefill + D (1 - 1 / s)) x step_extra.
        bounded = s * light + others_most * step_extra
        seen = extra * (1 - 1 / s) if s else 0.0
        own = s * light + extra * chunks * heavy
        decode_s = min(own / (1 - seen), bounded) if seen < 1 else bounded
        if engine.chunked_prefill:
            # A step carries at most a budget's chunk beside the decodes: every decode step
            # heavy is the most prompts can slow a decode.
            decode_s = min(decode_s, s * max(heavy, light))
        if not s:
            decode_s = 0.0  # one token each: nothing decodes after the first
        # Steps per second of each kind, for the step an arrival finds in progress: its mean
        # remaining time is E[t^2] / (2 E[t]) over the time spent in each kind.
        heavy_rate = rate * chunks
        light_rate = max(0.0, (1 - heavy_rate * heavy) / light) if light else 0.0
        spent = heavy_rate * heavy + light_rate * light
        residual = (heavy_rate * heavy**2 + light_rate * light**2) / (2 * spent) if spent else 0
        # The chance an arrival finds the engine busy: 1 - e^-R of Poisson others, and only
        # for n - 1 of n requests (the first finds it idle).
        busy = (1 - math.exp(-running)) * others_most / max(arrivals, 1)
        ttft = max(busy * residual + chunks * heavy, alone_s)
        e2e = ttft + decode_s
        new_running = min(rate * e2e, float(arrivals))
        if new_running > cap and cap < arrivals:
            return None
        tpot = decode_s / (shape.output - 1) if shape.output > 1 else 0.0
        settled = abs(new_running - running) <= 1e-6 * max(running, 1.0)
        result = (new_running, ttft, tpot, decode_s, light)
        running = new_running
        if settled:
            break
    if result is None:
        return None
    # Near capacity, a queue for a slot (Erlang C over `cap` slots, deterministic service),
    # where more requests come than the engine has slots for: a share C of arrivals waits,
    # on average (E2E / 2) / (cap - offered load); the median waits only if C > 1/2.
    running, ttft, tpot, decode_s, light = result
    service = ttft + decode_s
    offered = rate * service
    wait = wait_p50 = 0.0
    if engine_queues and cap < arrivals and offered < cap:
        busy_all = erlang_c(cap, offered)
        drain = (cap - offered) / (service / 2) if service else math.inf
        wait = busy_all / drain
        wait_p50 = math.log(2 * busy_all) / drain if busy_all > 0.5 else 0.0
    return running, ttft, tpot, decode_s, light, wait, wait_p50
