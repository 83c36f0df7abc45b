"""Per-request block tables on top of a BlockPool: paged or contiguous.

Paged (vLLM): a request holds ceil(computed + scheduled tokens / block_size) blocks, taken one at
a time as it grows.

    block table of a request with 37 tokens, block_size 16
    [b3: 16 full] [b8: 16 full] [b1: 5 used, 11 empty]

Contiguous (servers before paged attention): admission reserves prompt + max_tokens slots at
once and the request never needs more, so it is never preempted; the unused part of the
reservation is the waste paging removes. Only the reservation's size is modelled, not where it
sits, so external fragmentation (which makes contiguous allocation worse still) is left out.

Prefix caching keys a full block by its position and content. Here only the shared prefix is
identical across requests; every other block is unique to its request, so the only other hits
are a preempted request finding its own blocks again when it is recomputed.
"""

from __future__ import annotations

import numpy as np

from labs.prediction.predict import blocks_for_tokens
from labs.sim.block_pool import BlockKey, BlockPool
from labs.sim.entities import RequestTable


class KVCacheManager:
    """Allocates and frees the blocks of each request.

    Args:
        pool: the replica's blocks.
        table: the run's requests.
        block_size: tokens per block.
        contiguous: reserve prompt + max_tokens at admission instead of paging.
    """

    def __init__(
        self, pool: BlockPool, table: RequestTable, block_size: int, *, contiguous: bool = False
    ) -> None:
        self.pool = pool
        self.table = table
        self.block_size = block_size
        self.contiguous = contiguous
        # NOTE: a contiguous reservation is private to its request, so nothing is shared.
        self.caching = pool.enable_caching and not contiguous
        # NOTE: every block table lives in one flat array, request i's at _start[i], sized for
        # the most blocks it can ever hold; its length is table.num_blocks[i].
        if contiguous:
            most = table.num_prompt_tokens + table.max_tokens
        else:
            most = table.num_prompt_tokens + table.num_output_tokens_target
        capacity = blocks_for_tokens(most, block_size)
        self._start = np.cumsum(capacity) - capacity
        self._tables = np.empty(int(capacity.sum()), dtype=np.int32)  # block ids < 2**31
        self._num_shared_blocks = table.num_shared_prefix_tokens // block_size

    @property
    def num_shared_blocks(self) -> int:
        """Full blocks of the shared prefix (keyed by position, so shared by every request)."""
        return self._num_shared_blocks

    def block_table(self, idx: int) -> np.ndarray:
        """Request `idx`'s blocks, in token order (a view)."""
        start = int(self._start[idx])
        return self._tables[start : start + int(self.table.num_blocks[idx])]

    @property
    def block_tables(self) -> list[np.ndarray]:
        """Every request's block table (for tests and observers)."""
        return [self.block_table(i) for i in range(len(self.table))]

    def _keys(self, idx: int, start: int, end: int) -> range | list[BlockKey]:
        """Prefix-cache keys of blocks start..end-1 of request `idx`.

        Blocks wholly inside the shared prefix hold the same tokens in every request, so their
        key is their position; any other block is keyed by (request, position), as an int.
        """
        shared = self._num_shared_blocks
        own = range(((idx + 1) << 32) + max(start, shared), ((idx + 1) << 32) + end)
        if start >= shared:
            return own
        return [*range(start, min(end, shared)), *own]

    def blocks_to_reserve(self, idx: int) -> int:
        """Blocks a contiguous reservation takes: prompt + max_tokens slots."""
        t = self.table
        return blocks_for_tokens(int(t.num_prompt_tokens[idx] + t.max_tokens[idx]), self.block_size)

    def get_computed_blocks(self, idx: int) -> list[int]:
        """The longest run of cached full blocks at the start of the request's tokens.

        NOTE: capped at (num_tokens - 1) // block_size blocks, so at least the last token is
        computed and yields the next token's logits (vLLM does the same).
        """
        if not self.caching:
            return []
        max_blocks = (int(self.table.num_tokens(idx)) - 1) // self.block_size
        hits = []
        for key in self._keys(idx, 0, max_blocks):
            block = self.pool.lookup(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_evictable(self, hits: list[int]) -> int:
        """How many of a request's prefix-cache hits sit in the free queue (nobody holds them):
        touching them takes them out of it."""
        return sum(1 for b in hits if self.pool.is_free(b))

    def admit(self, idx: int, hits: list[int], num_new_tokens: int) -> None:
        """Give a waiting request its first blocks: the cache hits plus enough for
        `num_new_tokens`, or its whole contiguous reservation. The caller has checked they are
        free (labs.sim.rules.Rules.admission_need)."""
        t, bs = self.table, self.block_size
        start = int(self._start[idx])
        if self.contiguous:
            blocks = self.pool.allocate(self.blocks_to_reserve(idx))
            assert blocks is not None, "admitted without the free blocks for its reservation"
            num_hit, num_blocks = 0, len(blocks)
            self._tables[start : start + num_blocks] = blocks
        else:
            num_hit = len(hits)
            self.pool.touch(hits)
            new = self.pool.allocate(blocks_for_tokens(num_hit * bs + num_new_tokens, bs) - num_hit)
            assert new is not None, "admitted without the free blocks for its prompt"
            self._tables[start : start + num_hit] = hits
            self._tables[start + num_hit : start + num_hit + len(new)] = new
            num_blocks = num_hit + len(new)
        t.num_blocks[idx] = num_blocks
        t.num_cached_blocks[idx] = num_hit
        t.num_computed_tokens[idx] = num_hit * bs
        if self.caching and num_hit < self._num_shared_blocks:
            # vLLM V1 registers a request's full blocks when it schedules them, before the
            # step computes them (KVCacheManager.allocate_slots), so a request admitted later
            # in the same step already hits the shared prefix this one is computing: whether
            # prompts arrive together or spread out does not change which of them compute it.
            shared_tokens = min(num_hit * bs + num_new_tokens, self._num_shared_blocks * bs)
            self._cache(idx, num_hit, shared_tokens)

    def allocate(self, idx: np.ndarray, num_blocks: np.ndarray) -> None:
        """Append new blocks to the tables of (distinct) requests `idx` (`num_blocks` each, at
        least one). The caller has checked they are free (labs.sim.rules.blocks_fit)."""
        blocks = self.pool.allocate(int(num_blocks.sum()))
        assert blocks is not None, "allocated more blocks than are free"
        self.place(np.repeat(idx, num_blocks), blocks)

    def place(self, owners: np.ndarray, blocks: np.ndarray) -> None:
        """Append `blocks[j]` to the table of request `owners[j]`, in order (a request's new
        blocks in the order they were taken)."""
        t = self.table
        if len(owners) == 1:
            r = int(owners[0])
            self._tables[int(self._start[r] + t.num_blocks[r])] = blocks[0]
            t.num_blocks[r] += 1
            return
        # Each block's rank among its owner's new blocks: a stable sort groups owners.
        order = np.argsort(owners, kind="stable")
        sorted_owners = owners[order]
        first = np.r_[True, sorted_owners[1:] != sorted_owners[:-1]]
        group_start = np.flatnonzero(first)
        counts = np.diff(np.r_[group_start, len(owners)])
        rank = np.arange(len(owners)) - np.repeat(group_start, counts)
        slots = self._start[sorted_owners] + t.num_blocks[sorted_owners] + rank
        self._tables[slots] = blocks[order]
        np.add.at(t.num_blocks, sorted_owners[group_start], counts)

    def free(self, idx: int, *, preempted: bool = False) -> None:
        """Release all of a request's blocks (tail first, so its tail is evicted first).

        A preempted request's full blocks are registered first, so its recompute can find
        those not yet evicted.
        """
        t = self.table
        if preempted and self.caching:
            self._cache(idx, int(t.num_cached_blocks[idx]), int(t.num_computed_tokens[idx]))
        self.pool.free(self.block_table(idx)[::-1])
        t.num_blocks[idx] = 0
        t.num_cached_blocks[idx] = 0

    def free_finished(self, idx: list[int]) -> None:
        """Release all blocks of finished requests `idx` in one go, as `free` would one after
        another. NOTE: only for blocks no two of them share (no prefix-cache hits)."""
        if not idx:
            return
        t = self.table
        req = np.asarray(idx, dtype=np.int64)
        lengths = t.num_blocks[req]
        # Each table last block first, the tables one after another.
        last = np.repeat(self._start[req] + lengths - 1, lengths)
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        self.pool.free(self._tables[last - within])
        t.num_blocks[idx] = 0
        t.num_cached_blocks[idx] = 0

    def _cache(self, idx: int, start: int, num_computed_tokens: int) -> None:
        end = num_computed_tokens // self.block_size
        if end > start:
            blocks = self.block_table(idx)[start:end].tolist()
            self.pool.cache(blocks, self._keys(idx, start, end))
            self.table.num_cached_blocks[idx] = end

    def cache_full_blocks(self, idx: np.ndarray) -> None:
        """Register the shared-prefix blocks of requests `idx` that became full of computed
        tokens.

        NOTE: a block past the shared prefix is unique to its request, so only that request can
        hit it, and only after a preemption: such blocks are registered when the request is
        preempted (`free`) rather than as they fill. The hits are the same; the bookkeeping of
        a block per 16 decoded tokens is saved.
        """
        shared = self._num_shared_blocks
        if not self.caching or not shared:
            return
        t = self.table
        cached = t.num_cached_blocks[idx]
        grown = np.flatnonzero((cached < shared) & (t.num_computed_tokens[idx] >= self.block_size))
        end_tokens = np.minimum(t.num_computed_tokens[idx], shared * self.block_size)
        for i in grown.tolist():
            self._cache(int(idx[i]), int(cached[i]), int(end_tokens[i]))
