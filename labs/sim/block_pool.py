"""A pool of KV blocks: free queue, reference counts and the prefix-cache map, grown lazily.

    free queue (eviction order: the head goes first)
    head -> [fresh: b9 b10 ... bN-1] [recycled: b7 b2 b4 ...] <- tail (freed most recently)

A block nobody references sits in the free queue but keeps its cached contents (its key stays in
the map) until `allocate` hands it out again; a prefix-cache hit on such a block takes it back
out of the queue (`touch`). So "free" counts evictable cached blocks too, as in vLLM.

NOTE: blocks never handed out yet ("fresh") hold nothing and always sit, in id order, at the head
of the queue: recycled blocks join at the tail and only cached (hence recycled) blocks are taken
out of the middle. So the fresh ones are a counter, not entries, and the per-block arrays grow
with the blocks actually used: a 30,000,000-block pool costs nothing up front.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

BlockKey = int  # prefix-cache key of a full block (labs/sim/kv_cache.py makes them)

_INITIAL = 1024


class BlockPool:
    """`num_blocks` KV blocks of one replica.

    Args:
        num_blocks: blocks in the pool.
        enable_caching: keep full blocks findable by key after they are freed.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._num_fresh_taken = 0  # blocks 0.._num_fresh_taken-1 have been handed out once
        self._num_free = num_blocks
        cap = min(num_blocks, _INITIAL)
        self._ref_cnt = np.zeros(cap, dtype=np.int64)
        self._key = np.full(cap, -1, dtype=np.int64)
        # The recycled part of the free queue: live entries are queue[head:tail] whose block's
        # _queue_pos still points at them (`touch` just forgets the entry).
        self._queue = np.empty(cap, dtype=np.int64)
        self._queue_pos = np.full(cap, -1, dtype=np.int64)
        self._head = 0
        self._tail = 0
        self._cached: dict[BlockKey, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free

    @property
    def has_cached_blocks(self) -> bool:
        """Whether any block carries a prefix-cache key."""
        return bool(self._cached)

    def usage(self) -> float:
        """Fraction of blocks some request holds (vLLM's kv_cache_usage_perc)."""
        return (self.num_blocks - self._num_free) / self.num_blocks

    def ref_cnt(self, block: int) -> int:
        return int(self._ref_cnt[block]) if block < self._num_fresh_taken else 0

    def _grow_blocks(self, needed: int) -> None:
        size = len(self._ref_cnt)
        if needed <= size:
            return
        new = min(self.num_blocks, max(needed, 2 * size))
        for name, fill in (("_ref_cnt", 0), ("_key", -1), ("_queue_pos", -1)):
            old = getattr(self, name)
            grown = np.full(new, fill, dtype=np.int64)
            grown[:size] = old
            setattr(self, name, grown)

    def _append_queue(self, blocks: np.ndarray) -> None:
        n = len(blocks)
        if self._tail + n > len(self._queue):
            live = self._queue[self._head : self._tail]
            size = max(2 * len(self._queue), len(live) + n)
            queue = np.empty(size, dtype=np.int64)
            queue[: len(live)] = live
            # Re-point only the entries that are still live; stale ones stay stale.
            valid = self._queue_pos[live] == np.arange(self._head, self._tail)
            self._queue_pos[live[valid]] = np.flatnonzero(valid)
            self._queue, self._tail, self._head = queue, len(live), 0
        self._queue[self._tail : self._tail + n] = blocks
        self._queue_pos[blocks] = np.arange(self._tail, self._tail + n)
        self._tail += n

    def allocate(self, num_blocks: int) -> np.ndarray | None:
        """Take `num_blocks` blocks from the head of the free queue, evicting what they cached.

        Returns:
            The block ids in queue order, each with one reference; None (and nothing taken) if
            too few are free.
        """
        if num_blocks > self._num_free:
            return None
        fresh = min(num_blocks, self.num_blocks - self._num_fresh_taken)
        start = self._num_fresh_taken
        self._grow_blocks(start + fresh)
        self._num_fresh_taken += fresh
        parts = [np.arange(start, start + fresh, dtype=np.int64)]
        need = num_blocks - fresh
        while need:
            end = min(self._tail, self._head + need)
            seg = self._queue[self._head : end]
            live = seg[self._queue_pos[seg] == np.arange(self._head, end)]
            self._head = end
            if len(live):
                parts.append(live)
                need -= len(live)
        blocks = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._queue_pos[blocks] = -1
        self._ref_cnt[blocks] = 1
        self._num_free -= num_blocks
        if self._cached:
            keys = self._key[blocks]
            keyed = keys >= 0
            for block, key in zip(blocks[keyed].tolist(), keys[keyed].tolist(), strict=True):
                self._key[block] = -1
                if self._cached.get(key) == block:
                    del self._cached[key]
        return blocks

    def free(self, blocks: np.ndarray | list[int]) -> None:
        """Drop one reference to each (distinct) block; a block nobody holds joins the tail of the
        free queue (still cached). Pass a request's blocks last-first so its tail is evicted
        first."""
        if len(blocks) == 0:
            return
        ids = np.asarray(blocks, dtype=np.int64)
        self._ref_cnt[ids] -= 1
        unheld = ids[self._ref_cnt[ids] == 0]
        if len(unheld):
            self._append_queue(unheld)
            self._num_free += len(unheld)

    def lookup(self, key: BlockKey) -> int | None:
        """The block caching `key`, if any (held or free)."""
        return self._cached.get(key)

    def is_free(self, block: int) -> bool:
        return self.ref_cnt(block) == 0

    def touch(self, blocks: list[int]) -> None:
        """Take a reference to (distinct) cached blocks (a prefix-cache hit), out of the free
        queue if nobody held them."""
        if not blocks:
            return
        ids = np.array(blocks, dtype=np.int64)
        unheld = ids[self._ref_cnt[ids] == 0]
        self._queue_pos[unheld] = -1
        self._num_free -= len(unheld)
        self._ref_cnt[ids] += 1

    def cache(self, blocks: Iterable[int], keys: Iterable[BlockKey]) -> None:
        """Register full blocks under their keys. The first block computed for a key wins; an
        identical block computed at the same time by another request stays unregistered."""
        if not self.enable_caching:
            return
        cached, block_keys = self._cached, self._key
        for block, key in zip(blocks, keys, strict=True):
            if key not in cached:
                cached[key] = block
                block_keys[block] = key
