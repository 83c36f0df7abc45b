"""The KV block pool: free-queue order, reference counts, prefix-cache eviction, and lazy growth
(a pool of 30,000,000 blocks allocates nothing up front)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from labs.sim.block_pool import BlockPool
from labs.sim.scheduler import SchedulerConfig
from labs.sim.simulator import Simulator
from tests.labs.sim.helpers import LinearCost, make_workload


def test_it_hands_out_fresh_blocks_first_then_the_oldest_freed():
    pool = BlockPool(6)
    a = pool.allocate(4).tolist()
    assert a == [0, 1, 2, 3] and pool.num_free_blocks == 2
    pool.free([3, 1])  # tail first, as a request frees its table
    assert pool.allocate(3).tolist() == [4, 5, 3]
    assert pool.allocate(2) is None  # only block 1 is free: nothing taken
    assert pool.num_free_blocks == 1 and pool.allocate(1).tolist() == [1]


def test_a_cache_hit_takes_a_free_block_out_of_the_queue_and_eviction_forgets_its_key():
    pool = BlockPool(4)
    blocks = pool.allocate(2).tolist()
    pool.cache(blocks, [10, 11])
    pool.free(blocks[::-1])
    assert pool.lookup(10) == blocks[0] and pool.is_free(blocks[0])
    pool.touch([blocks[0]])  # a hit: held again, out of the free queue
    assert pool.ref_cnt(blocks[0]) == 1 and pool.num_free_blocks == 3
    # Fresh blocks 2, 3 go first, then the freed block 1, whose key is evicted.
    assert pool.allocate(3).tolist() == [2, 3, blocks[1]]
    assert pool.lookup(11) is None and pool.lookup(10) == blocks[0]
    assert pool.allocate(1) is None


def test_a_huge_pool_allocates_nothing_up_front():
    tracemalloc.start()
    try:
        pool = BlockPool(30_000_000)
        first = pool.allocate(1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pool.num_free_blocks == 30_000_000 - 1000
    assert first.tolist() == list(range(1000))
    assert peak < 1_000_000  # bytes: the arrays grow with the blocks used, not the pool


def test_a_simulation_on_a_30_million_token_pool_at_block_size_1_stays_small():
    work = make_workload([300] * 20, [50] * 20)
    config = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=512, num_gpu_blocks=30_000_000, block_size=1
    )
    tracemalloc.start()
    try:
        sim = Simulator(config, work, LinearCost(0.01), np.random.default_rng(0))
        record = sim.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(r.output_tokens == 50 for r in record.requests)
    assert 0 < max(s.kv_blocks_used for s in record.samples) <= 8 * 350
    assert peak < 5_000_000
