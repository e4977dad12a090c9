"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables, and prefix caching.

Only ids and counters live here; the K/V tensors themselves live in the runner (GPU buffers or numpy).

Prefix caching: once a block is full of computed tokens it gets a key, the sha256 of (parent block key,
its token ids), so a key names the whole prefix up to the block's end. Where the runner's decode path (one-token
rows) and prefill path (multi-token chunks) write different bits, the key also counts the block's slots that the
decode path wrote (the positions from `decode_from` on: a request's generated tokens), so a block is reused only
by a sequence that would write it the same way: a new prompt never takes a chat's earlier answer as decoded, and a
request recomputed after a preemption finds its own. A new request whose first full blocks
have known keys reuses those physical blocks and starts computing after them. Blocks whose ref count drops
to 0 stay in the cache (and in the free list) until their space is needed; the free list is ordered so that
unkeyed blocks are taken first, then keyed ones least recently used first.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass

from webinfer.engine.batch import NULL_BLOCK

ROOT_HASH = b"webinfer-kv-v1"


def block_hash(parent: bytes, token_ids: list[int], decoded: int = 0) -> bytes:
    """Chained key of a full block: it depends on every token from position 0 to the block's end, and on how many
    of its slots (its last `decoded`) the decode path wrote."""
    tag = struct.pack("<I", decoded) + b"decoded" if decoded else b""
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}I", *token_ids) + tag).digest()


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    hash: bytes | None = None   # set once the block is full and computed; then findable by other sequences


class BlockPool:
    """Blocks 1..num_blocks-1 (block 0 is the null block), with ref counts, a free list and the key -> block map."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # free block ids; allocation pops from the front. Unkeyed blocks go to the front, keyed ones to the back,
        # so the front is always the cheapest to reuse and keyed blocks leave least recently used first.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(NULL_BLOCK + 1, num_blocks))
        self.cached: dict[bytes, int] = {}
        self.evictions = 0

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        bid, _ = self.free.popitem(last=False)
        blk = self.blocks[bid]
        assert blk.ref_cnt == 0, f"block {bid} in the free list with ref_cnt {blk.ref_cnt}"
        if blk.hash is not None:  # evict: its old content is about to be overwritten
            if self.cached.get(blk.hash) == bid:
                del self.cached[blk.hash]
            blk.hash = None
            self.evictions += 1
        blk.ref_cnt = 1
        return bid

    def lookup(self, h: bytes) -> int | None:
        return self.cached.get(h)

    def touch(self, bid: int) -> None:
        """Take a reference on a cached block (a prefix hit); it leaves the free list if it was unused."""
        blk = self.blocks[bid]
        if blk.ref_cnt == 0:
            del self.free[bid]
        blk.ref_cnt += 1

    def release(self, bid: int) -> None:
        blk = self.blocks[bid]
        assert blk.ref_cnt > 0, f"block {bid} released more often than taken"
        blk.ref_cnt -= 1
        if blk.ref_cnt == 0:
            self.free[bid] = None
            if blk.hash is None:
                self.free.move_to_end(bid, last=False)

    def set_hash(self, bid: int, h: bytes) -> None:
        """Register a full, computed block under its key (the first block with a key keeps it)."""
        if h in self.cached:
            return
        self.blocks[bid].hash = h
        self.cached[h] = bid


class KVCacheManager:
    """Block tables of the live sequences over one BlockPool."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.tables: dict[int, list[int]] = {}
        self.hashes: dict[int, list[bytes]] = {}  # keys of the sequence's full blocks, in order (may run ahead of registration)
        self.num_registered: dict[int, int] = {}  # how many of the sequence's blocks have been offered to the cache
        self.query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.hit_tokens = 0    # of which found

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_usable * self.block_size

    def _chain(self, seq_id: int, token_ids: list[int], upto_blocks: int, decode_from: int | None) -> list[bytes]:
        hs = self.hashes.setdefault(seq_id, [])
        bs = self.block_size
        while len(hs) < upto_blocks:
            i = len(hs)
            decoded = 0 if decode_from is None else min(bs, max(0, (i + 1) * bs - decode_from))
            hs.append(block_hash(hs[-1] if hs else ROOT_HASH, token_ids[i * bs:(i + 1) * bs], decoded))
        return hs

    def find_prefix(self, seq_id: int, token_ids: list[int], decode_from: int | None = None) -> list[int]:
        """Physical blocks of the longest cached prefix of token_ids, leaving at least one token to compute (the
        runner needs to feed something to produce logits). decode_from: the first position the decode path writes
        for this sequence (None: the runner's paths write the same bits); the key chain is memoised per seq_id, so
        token_ids must only ever grow for one seq_id and decode_from stay the same. Takes no references yet."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = max(0, len(token_ids) - 1) // self.block_size
        hs = self._chain(seq_id, token_ids, max_blocks, decode_from)
        found = []
        for h in hs[:max_blocks]:
            bid = self.pool.lookup(h)
            if bid is None:
                break
            found.append(bid)
        return found

    def allocate(self, seq_id: int, num_tokens: int, prefix_blocks: list[int] | None = None) -> bool:
        """Make seq_id's block table cover num_tokens positions. prefix_blocks: cached blocks to start a new
        table with (from find_prefix). Returns False, changing nothing, if there are not enough free blocks."""
        table = self.tables.get(seq_id, [])
        prefix_blocks = prefix_blocks or []
        assert not (table and prefix_blocks), "prefix blocks only start a new table"
        have = len(table) + len(prefix_blocks)
        need = -(-num_tokens // self.block_size) - have
        # hit blocks that nobody holds sit in the free list: taking them shrinks it too
        idle_hits = sum(1 for b in prefix_blocks if self.pool.blocks[b].ref_cnt == 0)
        if max(need, 0) + idle_hits > self.pool.num_free:
            return False
        for b in prefix_blocks:
            self.pool.touch(b)
        table = table + list(prefix_blocks)
        for _ in range(need):
            table.append(self.pool.allocate())
        self.tables[seq_id] = table
        self.num_registered.setdefault(seq_id, len(prefix_blocks))
        return True

    def record_prefix_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.query_tokens += num_prompt_tokens
        self.hit_tokens += num_hit_tokens

    def cache_computed(self, seq_id: int, token_ids: list[int], num_computed: int,
                       decode_from: int | None = None) -> None:
        """Offer the sequence's blocks that are now full of computed tokens to the prefix cache (decode_from: as
        find_prefix's)."""
        if not self.enable_prefix_caching:
            return
        full = num_computed // self.block_size
        start = self.num_registered.get(seq_id, 0)
        if full <= start:
            return
        hs = self._chain(seq_id, token_ids, full, decode_from)
        table = self.tables[seq_id]
        for i in range(start, full):
            self.pool.set_hash(table[i], hs[i])
        self.num_registered[seq_id] = full

    def free(self, seq_id: int) -> None:
        """Drop the sequence's references. Tail blocks are released first so they sit nearer the front of the
        free list: a shared prefix outlives the unique tail that follows it."""
        for b in reversed(self.tables.pop(seq_id, [])):
            self.pool.release(b)
        self.hashes.pop(seq_id, None)
        self.num_registered.pop(seq_id, None)

    def block_table(self, seq_id: int) -> list[int]:
        return self.tables.get(seq_id, [])

    def stats(self) -> dict:
        p = self.pool
        used = sum(1 for b in p.blocks[1:] if b.ref_cnt > 0)
        return {
            "blocks_total": p.num_usable, "blocks_used": used, "blocks_free": p.num_free,
            "blocks_cached": len(p.cached), "evictions": p.evictions,
            "prefix_query_tokens": self.query_tokens, "prefix_hit_tokens": self.hit_tokens,
            "prefix_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
        }
