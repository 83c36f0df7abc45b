"""Calibrate one device from its own runs: a short sweep on its vLLM engine, fitted with the
published calibration's search (labs.sim.published_calibration.coordinate_search), part of it
held out.

The sweep (SWEEP) is fixed here, roles included, before anything is measured: batch-1 decode, a
batch sweep, a long prefill and an ngram speculation run. Each point is measured `repeats` times
and its median kept. The fit moves the device's constants (labs.parameters.device_calibration) to
match the `fit` points on the simulator's realistic profile; the `held_out` points are only
simulated with the result and give the held-out error. `manage.py lab calibrate` runs it and stores
a labs.models.DeviceCalibration.

Pure Python; never Django (the command does the storing).

Why one module: the sweep's runs and the fit to them are one table read two ways; the fit's
residuals name the runs, so the two stay side by side.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import date
from typing import TYPE_CHECKING, Any

from labs.measurement.metrics import summarize
from labs.parameters.catalog import CPU_KIND
from labs.parameters.device_calibration import (
    CONSTANT_BOUNDS,
    MEASURED_CONSTANTS,
    DeviceConstants,
    every_step_acceptance,
)
from labs.parameters.params import LabParams, align_run_batch, parse_lab_params
from labs.sim.engine_model import load_calibration
from labs.sim.lab import build_simulator
from labs.sim.published_calibration import coordinate_search, log_error_loss, relative_error

if TYPE_CHECKING:
    from labs.backends.base import RunRecord


@dataclass(frozen=True)
class SweepPoint:
    id: str
    role: str  # "fit" | "held_out", fixed before any measurement
    what: str
    changes: Mapping[str, Any]  # lab parameters over the base settings
    metric: str  # a dotted key of labs.measurement.metrics.summarize


# Small on purpose: the CPU vLLM worker must finish it in minutes. Prompt and output lengths are
# fixed (range ratio 0) so every repeat asks the same. Roles are fixed here, before anything is
# measured; a held-out error means something only if no choice was made after seeing it.
# - D1, D2, D4, D5 (fit) are measured by TPOT, the step time they stand for: D1 and D2 vary the
#   batch at a short context, D4 the context at batch 1 (without it a token of KV read and a
#   sequence's own step work trade against each other), D5 the batch at 8 sequences, so the
#   fitted step does not stay flat where the engine's grows.
# - P1 and P3 (fit) are prefills of two lengths. P1's 1,000-token prompt and its output fit the
#   1,024-token context of the decode points' server, so they share it.
# - S2 (fit) gives the fit a point with drafts. S1 and the speculation change are measured by
#   E2E and, like S2, answer 128 tokens: vLLM's ngram proposer drafts only after a 5-token match,
#   which the random-weight model's greedy answers reach once they fall into loops; shorter
#   answers draft too little for the change to stand out of the noise.
# - Held out: D3 (8 decoding, short answers), P2 (a prefill between the fitted two) and S1 (one
#   sequence drafting).
# Each point sends at least twice as many requests as it keeps in flight: on a shared VM one
# request's TPOT wanders over seconds, and a longer run averages that out.
_DECODE = {"prompt_tokens": 64, "output_tokens": 32, "max_tokens": 64}
_ONE_DECODING = {**_DECODE, "max_concurrency": 1, "num_prompts": 16}
_PREFILL = {"output_tokens": 2, "max_tokens": 16, "max_concurrency": 1, "num_prompts": 4}
_NGRAM = {"spec_method": "ngram", "spec_tokens": 3}
_LONG = {"prompt_tokens": 64, "output_tokens": 128, "max_tokens": 160}
_ONE_LONG = {**_LONG, "max_concurrency": 1, "num_prompts": 8}
_EIGHT_DECODING = {**_DECODE, "max_concurrency": 8, "num_prompts": 32}
SWEEP: tuple[SweepPoint, ...] = (
    SweepPoint("D1", "fit", "batch-1 decode", _ONE_DECODING, "tpot_s.mean"),
    SweepPoint("D2", "fit", "4 sequences decoding", {**_DECODE, "max_concurrency": 4,
               "num_prompts": 16}, "tpot_s.mean"),
    SweepPoint("D3", "held_out", "8 sequences decoding", _EIGHT_DECODING, "output_tokens_per_s"),
    SweepPoint("D4", "fit", "batch-1 decode, long prompt", {**_ONE_DECODING,
               "prompt_tokens": 512}, "tpot_s.mean"),
    SweepPoint("D5", "fit", "8 decoding, longer answers", {**_LONG,
               "max_concurrency": 8, "num_prompts": 16}, "tpot_s.mean"),
    SweepPoint("P1", "fit", "a long prefill", {**_PREFILL, "prompt_tokens": 1000}, "ttft_s.mean"),
    SweepPoint("P2", "held_out", "a shorter prefill", {**_PREFILL, "prompt_tokens": 512},
               "ttft_s.mean"),
    SweepPoint("P3", "fit", "a short prefill", {**_PREFILL, "prompt_tokens": 128}, "ttft_s.mean"),
    SweepPoint("S1", "held_out", "ngram speculation, 3 drafts", {**_ONE_LONG, **_NGRAM},
               "e2e_s.mean"),
    SweepPoint("S2", "fit", "ngram, 3 drafts, 4 decoding", {**_LONG, "max_concurrency": 4,
               "num_prompts": 16, **_NGRAM}, "e2e_s.mean"),
)  # fmt: skip


@dataclass(frozen=True)
class Change:
    """A change of one setting the lessons teach: measured on the device and simulated with its
    fitted constants, compared as the ratio after / before (never fitted)."""

    what: str
    before: Mapping[str, Any]
    after: Mapping[str, Any]
    metric: str


# Each side equal to a sweep point's settings where it can be, so it is measured once.
CHANGES: tuple[Change, ...] = (
    Change("max_num_seqs 1 -> 8", {**_EIGHT_DECODING, "max_num_seqs": 1},
           {**_EIGHT_DECODING, "max_num_seqs": 8}, "output_tokens_per_s"),
    Change("ngram speculation off -> on (3 drafts)", _ONE_LONG, {**_ONE_LONG, **_NGRAM},
           "e2e_s.mean"),
)  # fmt: skip


@dataclass(frozen=True)
class Measured:
    point: SweepPoint
    params: LabParams  # as simulated (Runs.simulated_params)
    value: float  # median over the repeats
    frontend_latency_s: float | None = None  # median over the repeats (`frontend_latency`)


@dataclass(frozen=True)
class DeviceFit:
    constants: DeviceConstants
    points: list[dict[str, Any]]  # id, role, what, metric, measured, predicted, error

    @property
    def held_out_errors(self) -> list[float]:
        return [abs(p["error"]) for p in self.points if p["role"] == "held_out"]


def metric_value(summary: Mapping[str, Any], metric: str) -> float:
    value: Any = summary
    for part in metric.split("."):
        value = value[part]
    return float(value)


def settings_params(base: Mapping[str, Any], changes: Mapping[str, Any]) -> LabParams:
    """The base settings (model, GPU, ...) with `changes`, on the realistic profile, lengths
    fixed, prefix caching off. Raises ParamError naming a bad base setting."""
    values = {**base, **changes, "sim_profile": "realistic"}
    values.update(input_range_ratio=0, output_range_ratio=0, request_rate=None)
    # Every repeat draws the same token ids (the workload's seed), and a shorter prompt is the
    # start of a longer one: with the prefix cache on, a point's later repeats (and P2 after P1)
    # would find most of their prompt cached, while the simulator, each run fresh, computes it.
    values["prefix_caching"] = False
    return parse_lab_params(align_run_batch(values))


def point_params(base: Mapping[str, Any], point: SweepPoint) -> LabParams:
    """The point's lab parameters (settings_params with the point's changes)."""
    return settings_params(base, point.changes)


def run_summary(record: RunRecord) -> dict[str, Any]:
    """labs.measurement.metrics.summarize, plus what the simulator is told of a speculative run: the
    decode tokens made (every output token after each request's first) and the drafts the
    engine accepted (its counter; None where it reported none), and how many times it drafted
    (its drafts counter, for `drafted_share`)."""
    summary = summarize(record)
    done = [r for r in record.requests if r.error is None and r.finish_s is not None]
    summary["decode_tokens"] = sum(max(r.output_tokens - 1, 0) for r in done)
    summary["spec_accepted_tokens"] = record.counters.spec_accepted_tokens
    summary["spec_drafts"] = record.counters.spec_drafts
    summary["engine_first_token_s"] = record.counters.engine_first_token_s
    summary["engine_requests"] = record.counters.engine_requests
    return summary


def frontend_latency(summary: Mapping[str, Any]) -> float | None:
    """The API server's time per request in a run: the client's mean TTFT less the engine's
    own mean time from queueing a request to its first token (vLLM's queue-time and
    prefill-time histograms). What is left is off the engine: the HTTP request and the input
    processing before the engine core has it, the output processing and the stream after.
    None where the engine reported no histograms, or counted other requests than the client
    finished (a run cut short)."""
    engine_s, count = summary.get("engine_first_token_s"), summary.get("engine_requests")
    ttft = (summary.get("ttft_s") or {}).get("mean")
    if engine_s is None or not count or ttft is None or count != summary.get("completed"):
        return None
    return max(ttft - engine_s / count, 0.0)


def other_streams(params: LabParams) -> int:
    """The requests a sweep point's client keeps in flight beside each one (all the sweep's
    points are closed loops with at least as many requests as streams)."""
    return max((params.workload.max_concurrency or 1) - 1, 0)


def device_frontend_line(measured: list[Measured]) -> tuple[float, float]:
    """The front end's time the device's simulator is given (not fitted to any throughput or
    latency): (seconds for a request alone, seconds each other stream in flight adds), the
    least-squares line through the fit points' own figures (`frontend_latency`) against the
    streams beside each request (`other_streams`). One Python process relays every stream, so
    its time grows with them (on a 2-core CPU worker it is several times longer at 8 in flight
    than alone, which one figure for every request would miss). Flat (the median, slope 0)
    where the fit points have one load only or the line would fall; (0, 0) where none reported
    it, as the published calibration has it."""
    found = [
        (other_streams(m.params), m.frontend_latency_s)
        for m in measured
        if m.point.role == "fit" and m.frontend_latency_s is not None
    ]
    if not found:
        return 0.0, 0.0
    flat = statistics.median(y for _, y in found), 0.0
    xs = [x for x, _ in found]
    if min(xs) == max(xs):
        return flat
    slope, intercept = statistics.linear_regression(xs, [y for _, y in found])
    if slope <= 0:
        return flat
    # Alone a request still takes some time; a line through noisy figures may cross 0 first.
    return max(intercept, 0.0), slope


def frontend_cpu(measured: list[Measured]) -> float:
    """The front end's CPU time per request that a busy engine loses (the simulator's
    `frontend_cpu_s`), measured, never fitted: on a CPU worker, what each other stream in flight
    adds to a request's front-end time (`device_frontend_line`'s slope), which is the one API
    server process busy with that stream's request. vLLM's CPU backend gives the model's thread
    one core and leaves the API server, the client and the engine's scheduler to share the
    other, so that work, done while the engine steps others, is taken from the engine. The
    slope, not the time alone: of the two readings of the line it is the one with which the
    simulated mean TTFT of 8 clients (D5) matches the engine's; the time alone overprices it,
    and leaving the term out underprices it. 0 on a GPU worker, whose API server has host cores
    of its own."""
    if measured[0].params.hardware.name != CPU_KIND:
        return 0.0
    return device_frontend_line(measured)[1]


def drafted_share(summary: Mapping[str, Any]) -> float | None:
    """The share of its sequence-steps in which the engine proposed drafts: its drafts counter
    over the steps its sequences decoded (decode tokens less accepted drafts, one token a step
    besides those). vLLM's ngram proposer drafts only after a 5-token match. None where the
    engine reported no counters."""
    drafts, accepted = summary.get("spec_drafts"), summary.get("spec_accepted_tokens")
    if drafts is None or accepted is None or "decode_tokens" not in summary:
        return None
    steps = int(summary["decode_tokens"]) - int(accepted)
    return min(int(drafts) / steps, 1.0) if steps > 0 else None


# The least draft share simulated: a run whose engine never drafted is simulated drafting at
# one step in a thousand, at acceptance 0 (the scheduler's share must be above 0).
_MIN_DRAFT_SHARE = 1e-3


def spec_drafting(k: int, summary: Mapping[str, Any]) -> tuple[float, float]:
    """(alpha, share) at which the simulator reproduces a speculative run's drafting: a
    sequence drafts k tokens at `share` of its steps, the engine's (`drafted_share`), and there
    makes the tokens per drafted step the engine made (its decode tokens less the steps without
    drafts, over its drafts), at per-draft acceptance alpha (`step_acceptance`). Where the
    engine reported no drafts counter, every step drafts at the alpha that makes its tokens per
    step."""
    decode_tokens, accepted = int(summary["decode_tokens"]), int(summary["spec_accepted_tokens"])
    share = drafted_share(summary)
    if share is None:
        return step_acceptance(k, decode_tokens, accepted), 1.0
    drafts = int(summary["spec_drafts"])
    return step_acceptance(k, drafts + accepted, accepted), max(share, _MIN_DRAFT_SHARE)


def step_acceptance(k: int, decode_tokens: int, accepted: int) -> float:
    """The per-draft acceptance alpha at which the simulator's steps (k drafts each, accepted
    until the first rejection) make the tokens per step the engine made: decode_tokens over
    its steps, decode_tokens - accepted (each step makes one token plus those accepted).

    Given all the engine's decode tokens and steps, it is the alpha of a simulator drafting at
    every step; `spec_drafting` gives it the drafted steps only."""
    steps = decode_tokens - accepted
    if k <= 0 or accepted <= 0 or steps <= 0:
        return 0.0
    return every_step_acceptance(k, decode_tokens / steps)


def cpu_times(stat_path: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total): the CPU time, in clock ticks since boot over all CPUs, that the
    hypervisor gave to other guests while this one wanted it, and all CPU time (the first line
    of Linux's /proc/stat; guest time is already inside user time). None where it cannot be
    read (not Linux)."""
    try:
        with open(stat_path) as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two `cpu_times` readings that the hypervisor took:
    0 on a quiet machine or a bare one; None where either reading is missing."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class Runs:
    """Runs each distinct setting `repeats` times, once: a setting asked for again (a change's
    side that is also a sweep point) gets the summaries already measured. `warmups` runs of
    each setting go first and are not kept: the first requests a vLLM server answers pay
    one-time costs (on the CPU worker the ngram proposer's compilation, which makes a first
    drafting run's TTFT many times that of the runs after it).

    `measure` runs many settings in interleaved rounds (the sweep does); a setting never
    measured so far runs its repeats back to back when its values are asked for."""

    def __init__(
        self,
        run: Callable[[LabParams], Mapping[str, Any]],
        repeats: int = 3,
        warmups: int = 0,
        on_run: Callable[[int, int, LabParams], None] | None = None,
    ) -> None:
        self._run_one, self.repeats, self.warmups = run, repeats, warmups
        self._done: dict[str, list[Mapping[str, Any]]] = {}
        # Before each run: (runs done, runs planned, the setting about to run), so a long
        # sweep can say how far it is (the devices page, a learner's "about N minutes left").
        self.on_run = on_run
        self.runs_done = 0
        self.runs_planned = 0

    def _run(self, params: LabParams) -> Mapping[str, Any]:
        self.runs_planned = max(self.runs_planned, self.runs_done + 1)
        if self.on_run is not None:
            self.on_run(self.runs_done, self.runs_planned, params)
        summary = self._run_one(params)
        self.runs_done += 1
        return summary

    def measure(self, settings: list[LabParams]) -> None:
        """Measure each of `settings` not measured yet, in `repeats` rounds that visit every
        one of them once, so that a machine whose speed wanders over minutes moves the repeats
        of every setting alike instead of all the repeats of a few (back to back, on a shared
        VM, a point measured in a slow minute can come out a third off, and a change whose two
        sides fell in different minutes more).

        Settings with the same engine settings (one vLLM server) run next to each other, and
        every other round runs the whole order backwards: the server a round ends on starts
        the next, and a setting early in one round is late in the next. Wherever the engine
        settings change (the backend restarts its server), `warmups` unkept runs of every
        setting of the new server go first: a server's first run of each shape pays one-time
        costs (kept, they would make a drafting point half again as slow or more on every new
        server)."""
        groups: dict[str, list[LabParams]] = {}
        seen = set(self._done)
        for params in settings:
            key = self._key(params)
            if key not in seen:
                seen.add(key)
                groups.setdefault(repr(params.engine), []).append(params)
        order = [(engine, params) for engine, group in groups.items() for params in group]
        self.runs_planned = self.runs_done + self._count(order, groups)
        previous = None
        for round_number in range(self.repeats):
            for engine, params in order if round_number % 2 == 0 else reversed(order):
                if engine != previous:
                    for _ in range(self.warmups):
                        for setting in groups[engine]:
                            self._run(setting)
                    previous = engine
                self._done.setdefault(self._key(params), []).append(self._run(params))

    def _count(
        self, order: list[tuple[str, LabParams]], groups: Mapping[str, list[LabParams]]
    ) -> int:
        """The runs `measure` makes of `order`: every repeat, and the warm-ups wherever the
        engine settings change."""
        count, previous = 0, None
        for round_number in range(self.repeats):
            for engine, _ in order if round_number % 2 == 0 else reversed(order):
                if engine != previous:
                    count += self.warmups * len(groups[engine])
                    previous = engine
                count += 1
        return count

    def values(self, params: LabParams, metric: str) -> list[float]:
        """The metric of each repeat, in the order run."""
        return [metric_value(s, metric) for s in self.summaries(params)]

    def summaries(self, params: LabParams) -> list[Mapping[str, Any]]:
        """Each repeat's summary, in the order run (measured now if not yet)."""
        key = self._key(params)
        if key not in self._done:
            self.runs_planned = self.runs_done + self.warmups + self.repeats
            for _ in range(self.warmups):
                self._run(params)
            self._done[key] = [self._run(params) for _ in range(self.repeats)]
        return self._done[key]

    @staticmethod
    def _key(params: LabParams) -> str:
        return json.dumps(params.as_dict(), sort_keys=True, default=str)

    def median(self, params: LabParams, metric: str) -> float:
        return statistics.median(self.values(params, metric))

    def simulated_params(self, params: LabParams) -> LabParams:
        """`params` as the simulator runs them: with drafts, at the acceptance and the draft
        share the engine made in these runs (the median of its repeats, `spec_drafting`), not
        the lab's assumed alpha; both are the workload's and the model's, not device constants.
        Unchanged where the runs did not report what was accepted."""
        k = params.engine.spec_tokens
        if not k:
            return params
        summaries = self.summaries(params)
        if any(
            s.get("spec_accepted_tokens") is None or "decode_tokens" not in s for s in summaries
        ):
            return params
        drafting = [spec_drafting(k, s) for s in summaries]
        alpha = statistics.median(a for a, _ in drafting)
        share = statistics.median(s for _, s in drafting)
        engine = replace(params.engine, acceptance=min(alpha, 0.999), draft_share=share)
        return replace(params, engine=engine)

    def frontend_latency(self, params: LabParams) -> float | None:
        """The median over the repeats of `frontend_latency`; None unless every repeat had it."""
        found = [frontend_latency(s) for s in self.summaries(params)]
        if not found or any(x is None for x in found):
            return None
        return statistics.median(x for x in found if x is not None)

    def spread(self, params: LabParams, metric: str) -> str:
        """ "(0.0041 to 0.0057 over 3 runs; steal 0.0% to 2.1%)": how far the repeats disagree
        on a busy machine, and how much CPU time the hypervisor took in them where the runs
        say."""
        values = self.values(params, metric)
        text = f"{min(values):.3g} to {max(values):.3g} over {len(values)} runs"
        shares = [s.get("steal_share") for s in self.summaries(params)]
        stolen = [x for x in shares if x is not None]
        if stolen and len(stolen) == len(shares):
            # The CPU time the hypervisor took in each run (labs.calibration.jobs,
            # calibrate_and_store).
            text += f"; steal {min(stolen):.1%} to {max(stolen):.1%}"
        return f"({text})"


def sweep_settings(base: Mapping[str, Any]) -> list[LabParams]:
    """Every setting the sweep and the lessons' changes run, each once, in an order where each
    change's two sides run one right after the other in every round (`Runs.measure` keeps a
    server's settings together and reverses every other round): the drafting server's
    settings ending with speculation on, then the plain server's from speculation off to 8
    sequences at once, then max_num_seqs 1's own server. Sides run minutes apart would see
    different speeds on a machine whose speed wanders, and the change with them (`paired_ratio`)."""
    points = [point_params(base, point) for point in SWEEP]
    (fewer, more), (off, on) = (
        (settings_params(base, c.before), settings_params(base, c.after)) for c in CHANGES
    )
    drafting = [p for p in points if p.engine == on.engine and p != on]
    plain = [p for p in points if p.engine == more.engine and p not in (more, off)]
    others = [p for p in points if p.engine not in (on.engine, more.engine)]
    return [*others, *drafting, on, off, *plain, more, fewer]


def setting_label(base: Mapping[str, Any], params: LabParams) -> str:
    """What a sweep's setting is, in the sweep's words: "D2 4 sequences decoding", or a
    change's side ("ngram speculation off -> on (3 drafts), before")."""
    for point in SWEEP:
        if point_params(base, point) == params:
            return f"{point.id} {point.what}"
    for change in CHANGES:
        for side, changes in (("before", change.before), ("after", change.after)):
            if settings_params(base, changes) == params:
                return f"{change.what}, {side}"
    return "a setting of the sweep"


def measure_sweep(
    base: Mapping[str, Any], runs: Runs, log: Callable[[str], None] = print
) -> list[Measured]:
    """Each point of SWEEP measured with `runs`; the median of its metric kept. The points and
    the changes' settings are measured together, in interleaved rounds (`Runs.measure`)."""
    runs.measure(sweep_settings(base))
    measured = []
    for point in SWEEP:
        params = point_params(base, point)
        value = runs.median(params, point.metric)
        simulated = runs.simulated_params(params)
        latency = runs.frontend_latency(params)
        measured.append(Measured(point, simulated, value, latency))
        accepted = ""
        if params.engine.spec_tokens:
            # "the engine's" only where every repeat reported its drafts counter: otherwise the
            # share is the simulator's default, every step.
            counted = all(drafted_share(s) is not None for s in runs.summaries(params))
            accepted = (
                f"; simulated at acceptance {simulated.engine.acceptance:.3f}, drafting at "
                f"{simulated.engine.draft_share:.0%} of its sequence-steps"
                + (" (the engine's)" if counted else " (no drafts counter: every step)")
            )
        log(
            f"{point.id} {point.what}: {point.metric} {value:.6g} "
            + runs.spread(params, point.metric)
            + accepted
            + ("" if latency is None else f"; front end {latency * 1e3:.2f} ms")
        )
    found = [m for m in measured if m.point.role == "fit" and m.frontend_latency_s is not None]
    if found:
        alone, per_stream = device_frontend_line(measured)
        lost = frontend_cpu(measured)  # the figure the simulator is given, not a copy of it
        log(
            f"the API server's time per request: {alone * 1e3:.2f} ms alone, plus"
            f" {per_stream * 1e3:.2f} ms for each other stream in flight (client TTFT less the"
            " engine's queue and prefill histograms; a line through "
            + ", ".join(m.point.id for m in found)
            + "), simulated off the engine"
            + (
                f"; a CPU worker's busy engine loses {lost * 1e3:.2f} ms of a core to each"
                " request handed to it"
                if lost
                else ""
            )
        )
    return measured


@dataclass(frozen=True)
class MeasuredChange:
    change: Change
    before: LabParams  # as simulated (Runs.simulated_params)
    after: LabParams
    ratio: float  # measured after / before: the median of the rounds' (paired_ratio)


def paired_ratio(before: list[float], after: list[float]) -> float:
    """The median over the rounds of after / before, each pair from one round, where the two
    sides ran one after the other (`sweep_settings`): a machine that is slower for a minute
    slows both sides of that round's pair alike, where the ratio of the two medians takes each
    side's middle repeat from different minutes."""
    return statistics.median(a / b for b, a in zip(before, after, strict=True))


def measure_changes(
    base: Mapping[str, Any], runs: Runs, log: Callable[[str], None] = print
) -> list[MeasuredChange]:
    """Each of CHANGES measured on the device with `runs`: the median of the rounds' ratios
    (`paired_ratio`); the ratio of the medians is logged beside it."""
    out = []
    for change in CHANGES:
        before, after = settings_params(base, change.before), settings_params(base, change.after)
        ratio = paired_ratio(runs.values(before, change.metric), runs.values(after, change.metric))
        of_medians = runs.median(after, change.metric) / runs.median(before, change.metric)
        out.append(
            MeasuredChange(
                change, runs.simulated_params(before), runs.simulated_params(after), ratio
            )
        )
        log(
            f"{change.what}: {change.metric} x{ratio:.4g} measured (the median of the rounds'"
            f" ratios; x{of_medians:.4g} as the ratio of the medians), before "
            f"{runs.spread(before, change.metric)}, after {runs.spread(after, change.metric)}"
        )
    return out


def check_changes(measured: list[MeasuredChange], device: DeviceConstants) -> list[dict[str, Any]]:
    """Each measured change beside the simulator's, priced with the device's constants: the
    changes as fractions, the error of the simulated ratio against the measured one and of the
    simulated change against the measured change."""
    rows = []
    for m in measured:
        metric = m.change.metric
        simulated = simulate(m.after, metric, device) / simulate(m.before, metric, device)
        rows.append(
            {
                "what": m.change.what,
                "metric": metric,
                "measured_change": m.ratio - 1,
                "simulated_change": simulated - 1,
                "error": relative_error(simulated, m.ratio),
                # The change itself (+300% vs +250% is 17% off), the stricter reading.
                "change_error": relative_error(simulated - 1, m.ratio - 1),
            }
        )
    return rows


def simulate(params: LabParams, metric: str, device: DeviceConstants) -> float:
    """What the simulator, priced with `device`'s constants, gives for `metric`."""
    return metric_value(summarize(build_simulator(params, device=device).run()), metric)


def simulate_point(m: Measured, device: DeviceConstants) -> float:
    """What the simulator, priced with `device`'s constants, gives for the point."""
    return simulate(m.params, m.point.metric, device)


def _constants(device: str, values: Mapping[str, float], on: date, where: str) -> DeviceConstants:
    return DeviceConstants(
        device=device, **values, fitted_on=on, fit_error=0.0, held_out_error=0.0, where=where
    )


def starting_values(measured: list[Measured]) -> dict[str, float]:
    """The published constants of the sweep's GPU kind: where the search starts."""
    cal = load_calibration()
    hardware = measured[0].params.hardware
    gpu = cal.gpu(hardware)
    decode = gpu.decode_step_overhead_s
    if hardware.name == CPU_KIND:
        gpu = replace(gpu, gemm_efficiency=1.0)  # its measured matmul rate (searched_bounds)
        # No published constants describe a CPU; the GPU-like start (GEMMs at half their rate
        # at 40 tokens) made one-row decode steps so costly that the search first cut the step
        # overhead to 0 and stayed there. A CPU's matmul is about as efficient for one row as
        # for many: start there, and let the search move it.
        gpu = replace(gpu, gemm_half_tokens=1.0)
    # A GPU's CPU prepares most of a sequence's step while the GPU runs (3.5 us published); a
    # CPU worker's engine does it on the device itself, in Python: start at 100 us.
    per_seq = 1e-4 if hardware.name == CPU_KIND else cal.per_seq_overhead_s
    frontend = device_frontend_line(measured)
    return {
        "bandwidth_efficiency": gpu.bandwidth_efficiency,
        "kv_bandwidth_efficiency": gpu.kv_bandwidth_efficiency,
        "gemm_efficiency": gpu.gemm_efficiency,
        "decode_step_overhead_s": cal.decode_step_overhead_s if decode is None else decode,
        "mixed_step_overhead_s": cal.mixed_step_overhead_s,
        "gemm_half_tokens": gpu.gemm_half_tokens,
        # The search moves by factors, so from 0 it would never move: it starts at a decode
        # step's fixed CPU time, the same kind of cost.
        "spec_step_overhead_s": cal.spec_step_overhead_s
        or (cal.decode_step_overhead_s if decode is None else decode),
        "attention_efficiency": cal.attention_efficiency,
        "per_seq_overhead_s": per_seq,
        # Measured, never searched (searched_bounds leaves them out).
        "frontend_latency_s": frontend[0],
        "frontend_per_stream_s": frontend[1],
        "frontend_cpu_s": frontend_cpu(measured),
        **ngram_drafting(measured),
    }


def ngram_drafting(measured: list[Measured]) -> dict[str, float]:
    """How a CPU worker's engine drafts by ngram, measured (never fitted) on the sweep's
    speculative points: the acceptance per draft in the steps that drafted, and the share of
    sequence-steps that drafted (Runs.simulated_params, from the engine's counters; the
    medians over the points). The predictor prices the device's ngram runs with them, where
    the CPU build accepts what its greedy tokens match, not the lab's alpha. {} on a GPU, or
    where no point reported its drafts."""
    if measured[0].params.hardware.name != CPU_KIND:
        return {}
    drafting = [
        m.params.engine
        for m in measured
        if m.params.engine.spec_method == "ngram" and m.params.engine.draft_share < 1.0
    ]
    if not drafting:
        return {}
    return {
        "ngram_acceptance": statistics.median(e.acceptance for e in drafting),
        "ngram_draft_share": statistics.median(e.draft_share for e in drafting),
    }


def searched_bounds(measured: list[Measured]) -> dict[str, tuple[float, float]]:
    """The constants the search moves, with their bounds: all of them, except a CPU's GEMM
    ceiling. A CPU worker's FLOP/s figure is its own bf16 matmul rate, measured on the engine's
    threads (cpu_tools.py probe), so a large GEMM reaches it by definition (1); fitted, the
    ceiling traded against attention's efficiency, which the sweep's two fitted prefills cannot
    tell apart: the fit would draw a straight line through P3 and P1 where the engine's
    prefill time curves, and put the held-out P2 between them far off."""
    searched = {k: v for k, v in CONSTANT_BOUNDS.items() if k not in MEASURED_CONSTANTS}
    if measured[0].params.hardware.name == CPU_KIND:
        return {k: v for k, v in searched.items() if k != "gemm_efficiency"}
    return searched


def fit_device(
    device: str,
    measured: list[Measured],
    *,
    on: date,
    where: str = "this worker",
    # Six rounds: on a CPU worker's sweep three leave the loss several times higher, and the
    # held-out error with it. The sweep's runs take the minutes.
    rounds: int = 6,
    log: Callable[[str], None] = print,
) -> DeviceFit:
    """Fit the device's constants to the `fit` points only, then price every point with them.
    The errors are median |simulated / measured - 1| of each role."""
    fitted = [m for m in measured if m.point.role == "fit"]

    def loss(values: dict[str, float]) -> float:
        constants = _constants(device, values, on, where)
        return log_error_loss([(simulate_point(m, constants), m.value) for m in fitted])

    start = starting_values(measured)
    values, _ = coordinate_search(
        loss, start, searched_bounds(measured), rounds, log, step=0.5, max_moves=8
    )
    found = _constants(device, values, on, where)
    points: list[dict[str, Any]] = []
    for m in measured:
        predicted = simulate_point(m, found)
        points.append(
            {
                "id": m.point.id,
                "role": m.point.role,
                "what": m.point.what,
                "metric": m.point.metric,
                "measured": m.value,
                "predicted": predicted,
                "error": relative_error(predicted, m.value),
            }
        )

    def median_error(role: str) -> float:
        return statistics.median(abs(p["error"]) for p in points if p["role"] == role)

    constants = DeviceConstants(
        device=device,
        **values,
        fitted_on=on,
        fit_error=median_error("fit"),
        held_out_error=median_error("held_out"),
        where=where,
    )
    return DeviceFit(constants=constants, points=points)
