"""How big a simulated run is, in O(1) from its parameters, and whether it fits the budget.

The web process must refuse a run that would not fit a worker without building anything in
proportion to the learner's numbers (a 10^10-token KV pool, a million prompts): every function
here does a handful of integer operations, whatever the parameters.

What a run holds at its peak (measured with tracemalloc on the simulator, see
tests/labs/prediction/test_sizing.py for the check that these stay upper bounds):

- the KV pool: about 140 bytes per block (free queue entry, reference count, cache key);
- every streamed chunk until the run ends: about 95 bytes (measured on the simulator as of
  December 2026, Poisson and one-at-a-time runs alike), one chunk per sampled step of each
  request, so at most one per output token;
- every step that emitted a chunk: a few bytes of bookkeeping;
- every request: its columns and its record, under 1 KB, and its block table, 4 bytes for each
  block it can ever hold (prompt + output tokens, or prompt + max_tokens when contiguous, over
  block_size), allocated for every request at the start: 16 KB for a 4,000-token prompt in
  single-token blocks, whether or not prefix caching then finds most of it cached;
- with prefix caching, the lookup of a request's cached prefix: a list of the blocks it finds,
  up to one entry per block of its prompt, for the request being admitted.

The constants below are those figures rounded up. Limits follow from `LABS_SIM_MAX_RUN_MB`: the
pool may hold at most budget / 2 / BYTES_PER_BLOCK blocks, the run at most about budget / 136
output tokens over all its requests.

Pure Python: no Django, so the backend in the worker checks the same numbers again.
"""

from __future__ import annotations

import contextlib
import math
import resource
from collections.abc import Iterator
from dataclasses import dataclass

from labs.parameters.params import LabParams, ParamError
from labs.prediction.predict import blocks_for_tokens, kv_capacity_tokens

MB = 1024 * 1024
BASE_BYTES = 16 * MB
BYTES_PER_BLOCK = 160
BYTES_PER_CHUNK = 120
BYTES_PER_EMITTING_STEP = 16
BYTES_PER_REQUEST = 1024
BYTES_PER_TABLE_ENTRY = 4
# A Python list entry and its int, for each block a prefix-cache lookup returns.
BYTES_PER_PREFIX_HIT = 40


class RunTooLarge(ParamError):
    """The run is valid but would need more memory than one simulated run may use."""


@dataclass(frozen=True)
class RunSize:
    """Upper bounds on what a simulated run holds; `bytes` is the estimate of its peak."""

    pool_blocks: int
    requests: int
    chunks: int
    emitting_steps: int
    longest_request_tokens: int
    table_entries: int = 0
    prefix_hit_entries: int = 0

    @property
    def pool_bytes(self) -> int:
        return self.pool_blocks * BYTES_PER_BLOCK

    @property
    def bytes(self) -> int:
        return (
            BASE_BYTES
            + self.pool_bytes
            + self.requests * BYTES_PER_REQUEST
            + self.chunks * BYTES_PER_CHUNK
            + self.emitting_steps * BYTES_PER_EMITTING_STEP
            + self.table_entries * BYTES_PER_TABLE_ENTRY
            + self.prefix_hit_entries * BYTES_PER_PREFIX_HIT
        )

    @property
    def mb(self) -> float:
        return self.bytes / MB


def _min_batch(params: LabParams, num_prompts: int, pool_blocks: int, longest_tokens: int) -> int:
    """Fewest requests that decode together while the run is busy: a lower bound on how many
    chunks each emitting step carries. Poisson arrivals can leave one request alone."""
    engine, work = params.engine, params.workload
    if work.request_rate is not None:
        return 1
    in_flight = min(num_prompts, work.max_concurrency or num_prompts)
    fit = pool_blocks // max(1, blocks_for_tokens(longest_tokens, engine.block_size))
    return max(1, min(in_flight, engine.max_num_seqs, fit))


def sim_run_size(params: LabParams, *, num_prompts: int | None = None) -> RunSize:
    """Upper bounds on a simulated run's pool, chunks and steps (O(1)); `num_prompts` replaces
    the workload's own count (to find the largest that fits)."""
    engine, work = params.engine, params.workload
    prompts = work.num_prompts if num_prompts is None else num_prompts
    capacity = kv_capacity_tokens(params.model, params.hardware, engine)
    pool_blocks = max(0, capacity // engine.block_size)
    longest_prompt = work.prompt_range[1]
    longest_output = work.output_range[1]
    reserve = work.max_tokens if engine.kv_allocation == "contiguous" else longest_output
    longest = longest_prompt + max(reserve, longest_output)
    chunks = prompts * longest_output
    batch = _min_batch(params, max(1, prompts), pool_blocks, longest)
    # The last requests of a run may decode alone: one extra step per token of the longest.
    steps = math.ceil(chunks / batch) + longest_output
    blocks_per_request = blocks_for_tokens(longest, engine.block_size)
    caching = engine.prefix_caching and engine.kv_allocation != "contiguous"
    return RunSize(
        pool_blocks=pool_blocks,
        requests=prompts,
        chunks=chunks,
        emitting_steps=min(chunks, steps),
        longest_request_tokens=longest,
        table_entries=prompts * blocks_per_request,
        prefix_hit_entries=blocks_per_request if caching else 0,
    )


def sim_steps(params: LabParams) -> int:
    """An upper bound (O(1)) on the simulated steps a run takes, its cost in the worker's time:
    one for each request in each step that decodes it (a chunk), one for each step, and one
    prefill for each request (max_num_batched_tokens holds the longest prompt). Measured on the
    simulator at under 10 microseconds each on one core, whatever the settings."""
    size = sim_run_size(params)
    return size.chunks + size.emitting_steps + size.requests


def sim_precheck(params: LabParams, *, max_run_mb: int | None) -> RunSize:
    """Refuse, in O(1), what the simulator would refuse or could not hold.

    Raises:
        ParamError: the pool holds no block, or not the longest request (kv_capacity_tokens).
        RunTooLarge: the run would need more than `max_run_mb` (None: no limit); the message
            names the field to lower and its largest value for these settings.
    """
    size = sim_run_size(params)
    engine = params.engine
    block = engine.block_size
    if size.pool_blocks < 1:
        capacity = kv_capacity_tokens(params.model, params.hardware, engine)
        raise ParamError(
            {
                "kv_capacity_tokens": "kv_capacity_tokens must be at least one block "
                f"({block} tokens): the weights leave {max(capacity, 0):,} tokens of KV "
                "cache; raise tp or gpu_memory_utilization, or lower weight_dtype"
            }
        )
    if blocks_for_tokens(size.longest_request_tokens, block) > size.pool_blocks:
        what = "prompt + max_tokens" if engine.kv_allocation == "contiguous" else "prompt + output"
        raise ParamError(
            {
                "kv_capacity_tokens": "kv_capacity_tokens must hold the longest request "
                f"({what} = {size.longest_request_tokens:,} tokens), got "
                f"{size.pool_blocks * block:,}"
            }
        )
    if max_run_mb is not None:
        _check_budget(params, size, max_run_mb)
    return size


def _check_budget(params: LabParams, size: RunSize, max_run_mb: int) -> None:
    budget = max_run_mb * MB
    if size.bytes <= budget:
        return
    need = f"about {size.mb:,.0f} MB, and one simulated run may use {max_run_mb:,} MB"
    if size.pool_bytes > budget // 2:
        # The pool alone takes most of it: name the pool's size.
        most_blocks = max(1, (budget // 2) // BYTES_PER_BLOCK)
        block = params.engine.block_size
        raise RunTooLarge(
            {
                "kv_capacity_tokens": (
                    f"kv_capacity_tokens is too large to simulate with block_size {block}: "
                    f"its {size.pool_blocks:,} blocks need {need}. Use at most "
                    f"{most_blocks * block:,} tokens, or a larger block_size"
                )
            }
        )
    most_prompts = _most_prompts(params, budget)
    raise RunTooLarge(
        {
            "num_prompts": (
                f"num_prompts x output_tokens is too large to simulate: {size.requests:,} "
                f"requests of up to {params.workload.output_range[1]:,} output tokens need "
                f"{need}. With these settings use at most {most_prompts:,} prompts, or fewer "
                "output tokens"
            )
        }
    )


def _most_prompts(params: LabParams, budget: int) -> int:
    """The largest num_prompts that fits `budget` with the other settings as they are (a binary
    search over the O(1) estimate: some 30 steps whatever the numbers)."""
    low, high = 0, params.workload.num_prompts
    while low < high:
        mid = (low + high + 1) // 2
        if sim_run_size(params, num_prompts=mid).bytes <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def _address_space_now() -> int:
    """Bytes of address space this process uses now (Linux); 0 where unknown."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * resource.getpagesize()


@contextlib.contextmanager
def address_space_limit(extra_bytes: int) -> Iterator[bool]:
    """Cap this process's address space at what it uses now plus `extra_bytes` while the block
    runs, so a run that outgrows its estimate gets a MemoryError (the worker survives and records
    why) instead of the machine's OOM killer. Yields False (and limits nothing) where the
    platform cannot tell its own size."""
    now = _address_space_now()
    if now == 0 or extra_bytes <= 0:
        yield False
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    wanted = now + extra_bytes
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft <= wanted:
        # Already tighter than asked (an outer limit): leave it.
        yield True
        return
    resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    try:
        yield True
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
