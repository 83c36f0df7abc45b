"""A fixed pool of KV blocks: free queue, reference counts and the prefix-cache map.

    free queue (eviction order: the head goes first)
    head -> [b7] [b2] [b9] ... [b4] <- tail (freed most recently)

A block nobody references sits in the free queue but keeps its cached contents (its key stays in
the map) until `allocate` hands it out again; a prefix-cache hit on such a block takes it back
out of the queue (`touch`). So "free" counts evictable cached blocks too, as in vLLM.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

import numpy as np

BlockKey = Hashable


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
        self._ref_cnt = np.zeros(num_blocks, dtype=np.int64)
        self._key: list[BlockKey | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockKey, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        """Fraction of blocks some request holds (vLLM's kv_cache_usage_perc)."""
        return self.num_used_blocks / self.num_blocks

    def ref_cnt(self, block: int) -> int:
        return int(self._ref_cnt[block])

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` blocks from the head of the free queue, evicting what they cached.

        Returns:
            The block ids, each with one reference; None (and nothing taken) if too few are free.
        """
        free = self._free
        if num_blocks > len(free):
            return None
        pop = free.popitem
        blocks = [pop(last=False)[0] for _ in range(num_blocks)]
        self._ref_cnt[blocks] = 1
        if self._cached:
            keys, cached = self._key, self._cached
            for block in blocks:
                key = keys[block]
                if key is not None:
                    keys[block] = None
                    if cached.get(key) == block:
                        del cached[key]
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each (distinct) block; a block nobody holds joins the tail of the
        free queue (still cached). Pass a request's blocks last-first so its tail is evicted
        first."""
        if not blocks:
            return
        ids = np.array(blocks)
        self._ref_cnt[ids] -= 1
        unheld = ids[self._ref_cnt[ids] == 0]
        self._free.update(dict.fromkeys(unheld.tolist()))

    def lookup(self, key: BlockKey) -> int | None:
        """The block caching `key`, if any (held or free)."""
        return self._cached.get(key)

    def is_free(self, block: int) -> bool:
        return bool(self._ref_cnt[block] == 0)

    def touch(self, blocks: list[int]) -> None:
        """Take a reference to (distinct) cached blocks (a prefix-cache hit), out of the free
        queue if nobody held them."""
        if not blocks:
            return
        ids = np.array(blocks)
        for block in ids[self._ref_cnt[ids] == 0].tolist():
            del self._free[block]
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
