"""vLLM's /metrics page (Prometheus text exposition) into engine counters and samples.

Names and meanings are vLLM 0.33's (vllm-notes.md section 2): counters carry a `_total` suffix and
count since the server started, so a run's counts are the page after the run minus the page
before; gauges (running, waiting, KV usage) are read at each poll during the run. Samples with
the same name but different labels (several engines, finish reasons) are added up; KV usage,
a fraction, is averaged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from labs.backends.base import EngineCounters, EngineSample

PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG = "vllm:cache_config_info"
# Histograms, observed as each request finishes (vLLM's v1/metrics/stats.py): queued to
# scheduled, and scheduled to the first token, in the engine core's clock.
QUEUE_TIME_SUM = "vllm:request_queue_time_seconds_sum"
PREFILL_TIME_SUM = "vllm:request_prefill_time_seconds_sum"
PREFILL_TIME_COUNT = "vllm:request_prefill_time_seconds_count"

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsFormatError(ValueError):
    """A /metrics line that is not Prometheus text format."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every sample on a Prometheus text page; comments and blank lines are skipped.

    Raises:
        MetricsFormatError: a line that is not `name{labels} value [timestamp]`.
    """
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_parse_line(line))
        except (ValueError, IndexError) as exc:
            raise MetricsFormatError(f"line {number}: {exc}: {line[:120]}") from None
    return samples


def _parse_line(line: str) -> Sample:
    match = _NAME.match(line)
    if match is None:
        raise ValueError("no metric name")
    name, pos = match.group(), match.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos = _parse_labels(line, pos + 1, labels)
    fields = line[pos:].split()
    if not fields or len(fields) > 2:
        raise ValueError("expected a value and at most a timestamp")
    return Sample(name, labels, _number(fields[0]))


def _parse_labels(line: str, pos: int, labels: dict[str, str]) -> int:
    """Read `a="x",b="y"}` from `pos`; returns the index after the closing brace."""
    while True:
        while line[pos] in " ,":
            pos += 1
        if line[pos] == "}":
            return pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            raise ValueError(f"bad label at column {pos + 1}")
        pos = match.end()
        value = []
        while line[pos] != '"':
            if line[pos] == "\\":
                pos += 1
                value.append(_ESCAPES.get(line[pos], "\\" + line[pos]))
            else:
                value.append(line[pos])
            pos += 1
        labels[match.group(1)] = "".join(value)
        pos += 1


def _number(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    return float(text)


class Snapshot:
    """One scrape of /metrics, indexed by metric name."""

    def __init__(self, samples: list[Sample]) -> None:
        self.by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            self.by_name.setdefault(sample.name, []).append(sample)

    @classmethod
    def from_text(cls, text: str) -> Snapshot:
        return cls(parse(text))

    def total(self, name: str) -> float | None:
        """The sum over all label sets, or None if the page has no such metric."""
        found = self.by_name.get(name)
        return sum(s.value for s in found) if found else None

    def mean(self, name: str) -> float | None:
        found = self.by_name.get(name)
        return sum(s.value for s in found) / len(found) if found else None

    def labels(self, name: str) -> Mapping[str, str]:
        found = self.by_name.get(name)
        return found[0].labels if found else {}


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None  # absent, or "None" before the engine sized its cache


def cache_config(snapshot: Snapshot | None) -> tuple[int | None, int | None]:
    """(num_gpu_blocks, block_size) from vllm:cache_config_info, where the page has it."""
    if snapshot is None:
        return None, None
    labels = snapshot.labels(CACHE_CONFIG)
    return _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")


def counters_between(before: Snapshot | None, after: Snapshot | None) -> EngineCounters:
    """What the engine counted during the run: `after` minus `before`, per counter.

    A counter that went down means the server restarted in between; then `after` alone is
    the best estimate. A counter the page does not have (no /metrics, a server that is not
    vLLM, no speculation) is None: not reported, never a measured 0.
    """

    def change(name: str) -> float | None:
        end = after.total(name) if after is not None else None
        if end is None:
            return None
        start = before.total(name) if before is not None else None
        start = start if start is not None and start <= end else 0.0
        return end - start

    def delta(name: str) -> int | None:
        value = change(name)
        return None if value is None else round(value)

    queued, prefill = change(QUEUE_TIME_SUM), change(PREFILL_TIME_SUM)
    num_gpu_blocks, block_size = cache_config(after or before)
    return EngineCounters(
        preemptions=delta(PREEMPTIONS),
        prefix_cache_queries=delta(PREFIX_QUERIES),
        prefix_cache_hits=delta(PREFIX_HITS),
        spec_drafts=delta(SPEC_DRAFTS),
        spec_draft_tokens=delta(SPEC_DRAFT_TOKENS),
        spec_accepted_tokens=delta(SPEC_ACCEPTED),
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        engine_first_token_s=None if queued is None or prefill is None else queued + prefill,
        engine_requests=delta(PREFILL_TIME_COUNT),
    )


def engine_sample(
    t_s: float, snapshot: Snapshot, num_gpu_blocks: int | None
) -> EngineSample | None:
    """Running, waiting and KV usage at `t_s`; None if the page lacks them."""
    running, waiting = snapshot.total(RUNNING), snapshot.total(WAITING)
    kv_usage = snapshot.mean(KV_USAGE)
    if running is None or waiting is None or kv_usage is None:
        return None
    blocks = None
    if num_gpu_blocks:
        # One block is vLLM's reserved null block; usage is a fraction of the others.
        blocks = round(kv_usage * (num_gpu_blocks - 1))
    return EngineSample(
        t_s=t_s,
        running=round(running),
        waiting=round(waiting),
        kv_usage=kv_usage,
        kv_blocks_used=blocks,
    )
