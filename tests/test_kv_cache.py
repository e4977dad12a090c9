"""Block pool and prefix cache bookkeeping. Run: python -m pytest tests/test_kv_cache.py -q"""

from __future__ import annotations

import hashlib
import struct

import pytest

from webinfer.engine.kv_cache import ROOT_HASH, BlockPool, KVCacheManager, block_hash


def test_block_hash_is_chained_sha256():
    want = hashlib.sha256(ROOT_HASH + struct.pack("<3I", 1, 2, 3)).digest()
    assert block_hash(ROOT_HASH, [1, 2, 3]) == want
    # the same tokens after a different prefix are a different block
    assert block_hash(block_hash(ROOT_HASH, [9, 9, 9]), [1, 2, 3]) != block_hash(block_hash(ROOT_HASH, [8, 9, 9]), [1, 2, 3])


def test_pool_never_hands_out_null_block_and_counts_return():
    pool = BlockPool(5)
    got = [pool.allocate() for _ in range(4)]
    assert sorted(got) == [1, 2, 3, 4] and pool.num_free == 0
    for b in got:
        pool.release(b)
    assert pool.num_free == 4
    with pytest.raises(AssertionError):
        pool.release(1)


def test_prefix_hit_reuses_blocks_and_leaves_one_token():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = list(range(100, 110))  # 10 tokens: 2 full blocks
    assert kv.find_prefix(1, a) == []
    assert kv.allocate(1, len(a))
    kv.cache_computed(1, a, len(a))
    table_a = list(kv.block_table(1))
    kv.free(1)
    assert kv.stats()["blocks_used"] == 0 and kv.stats()["blocks_cached"] == 2
    b = a[:8] + [7, 7]
    assert kv.find_prefix(2, b) == table_a[:2]
    # exactly 8 tokens: only one block may come from the cache, the last token must be computed
    assert kv.find_prefix(3, a[:8]) == table_a[:1]
    # a different first block breaks the chain even if the second block's tokens match
    assert kv.find_prefix(4, [0] + a[1:]) == []
    assert kv.find_prefix(5, a[:8] + [7]) == table_a[:2]


def test_keys_count_the_slots_the_decode_path_wrote():
    """With decode_from (the scheduler's, where the runner's paths differ), a block's key counts its slots at and
    past decode_from: a sequence finds only blocks that it would write down the same paths."""
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = list(range(100, 113))  # a 6-token prompt and 7 generated tokens: blocks [prompt], [2 prompt, 2 decoded], [decoded]
    assert kv.allocate(1, len(a))
    kv.cache_computed(1, a, 12, decode_from=6)
    table_a = list(kv.block_table(1))
    kv.free(1)
    # a prompt that repeats the answer (its prefill path would write all three blocks): the prompt's block only
    assert kv.find_prefix(2, a, decode_from=len(a)) == table_a[:1]
    assert kv.find_prefix(3, a) == table_a[:1]  # a block the prefill path wrote keeps the key it has without
    # the same request recomputed (the same decode_from) finds all three; another split point only the first
    assert kv.find_prefix(4, a, decode_from=6) == table_a[:3]
    assert kv.find_prefix(5, a, decode_from=7) == table_a[:1]


def test_shared_block_ref_counts_and_failed_allocate_changes_nothing():
    kv = KVCacheManager(num_blocks=5, block_size=2)  # 4 usable blocks
    p = [1, 2, 3, 4, 5]
    assert kv.allocate(1, 5)  # 3 blocks
    kv.cache_computed(1, p, 5)
    hit = kv.find_prefix(2, p)
    assert hit == kv.block_table(1)[:2]
    assert kv.allocate(2, 5, hit)  # shares 2 blocks, takes 1 new
    assert [kv.pool.blocks[b].ref_cnt for b in hit] == [2, 2]
    before = (kv.pool.num_free, dict(kv.tables))
    assert not kv.allocate(3, 7)  # needs 4 blocks, 0 free
    assert (kv.pool.num_free, dict(kv.tables)) == before
    kv.free(1)
    kv.free(2)
    assert kv.pool.num_free == 4 and all(b.ref_cnt == 0 for b in kv.pool.blocks)


def test_cached_blocks_evicted_least_recently_used_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)  # 3 usable
    for sid, toks in [(1, [1, 1, 9]), (2, [2, 2, 9]), (3, [3, 3, 9])]:
        assert kv.allocate(sid, 2)
        kv.cache_computed(sid, toks, 2)
        kv.free(sid)
    # 1 was freed first: it is the one evicted by a new allocation
    assert kv.allocate(4, 2)
    assert kv.find_prefix(5, [1, 1, 9]) == []
    assert kv.find_prefix(8, [2, 2, 9]) != [] and kv.find_prefix(9, [3, 3, 9]) != []
    assert kv.stats()["evictions"] == 1
    # a hit refreshes: reuse 2, release it, then the next eviction takes 3
    hit = kv.find_prefix(6, [2, 2, 9])
    assert kv.allocate(6, 3, hit)  # 2 blocks: the hit and one new one (evicts 3's block)
    assert kv.find_prefix(7, [3, 3, 9]) == []
    assert kv.find_prefix(10, [2, 2, 9]) == hit
