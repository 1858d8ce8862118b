"""A block-level model of vLLM's automatic prefix caching, for the simulated GPU.

Contract (vLLM's behaviour as docs/engine-notes.md, section 3, states it, with every copy of
a block hash kept as vLLM 0.32's `BlockHashToBlockMap` does):
- KV lives in `num_blocks` blocks of `block_size` tokens; block 0 is the null block, so
  `capacity = num_blocks - 1`. A block is *used* (ref > 0) or *free* (in the free queue).
- `match` walks a sequence's full-block hashes from the start over the first floor((L-1)/B)
  blocks and stops at the first miss: hits are multiples of B, at most L-1.
- `allocate` is atomic: it touches the hit blocks, pops new blocks from the HEAD of the free
  queue (lazily evicting the hash a popped block carries: that copy only), then registers
  the hash of every block that became full (generated blocks get fresh unique hashes). Not
  enough free blocks: it changes nothing and returns False (`can_allocate` asks only).
- Duplicates are kept: a hash maps to every block holding it and a lookup takes the oldest
  surviving copy (`cache`; `dups` holds the copies of hashes with two or more).
- `free` releases a sequence tail first: blocks reaching ref 0 go to the HEAD of the queue
  unhashed and to the TAIL hashed (LRU by finish time, deepest blocks evicted first).
- Blocks in use are never evicted; free + used == capacity always. `queries`/`hits` count
  tokens, like vllm:prefix_cache_{queries,hits}.
Sequences may be held across scheduler steps (`allocate` grows one, `free` releases it on
finish or preemption); every operation is O(1) per block (an OrderedDict free queue). A bad
size, hit blocks for a sequence that holds blocks, or a `run` that does not fit the pool is
a `UsageError`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from fabricctl.errors import UsageError

_UNIQUE_BASE = 1 << 64  # generated-block hashes live above every 64-bit prompt hash


class CacheSeq:
    """Why: the block table and block hashes one in-flight request holds in the cache."""

    __slots__ = ("blocks", "hashes", "num_hashed")

    def __init__(self, hashes: Sequence[int] = ()) -> None:
        self.hashes: list[int] = list(hashes)  # full-block hashes (prompt, then generated)
        self.blocks: list[int] = []  # block table, in token order
        self.num_hashed = 0  # leading blocks of `blocks` whose hash is registered


class PrefixCache:
    """Why: the simulated GPU's KV pool, so cache warmth and eviction behave like vLLM's."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2 or block_size < 1:
            raise UsageError("need num_blocks >= 2 (block 0 is the null block) and block_size >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cache: dict[int, int] = {}  # block hash -> its oldest copy (what a lookup takes)
        self.dups: dict[int, dict[int, None]] = {}  # hash -> all its copies, when 2 or more
        self.queries = 0  # tokens of admitted requests (vllm:prefix_cache_queries_total)
        self.hits = 0  # tokens found cached (vllm:prefix_cache_hits_total)
        self.evictions = 0  # cached blocks (copies) whose hash was dropped on reuse
        self._next_unique = _UNIQUE_BASE

    # -- read-only views -------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self.free_queue)

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: blocks held by requests over capacity (warmth not counted)."""
        return self.num_used / self.capacity

    def cached(self, block_hash: int) -> bool:
        return block_hash in self.cache

    # -- the request lifecycle -------------------------------------------------------------
    def match(self, seq: CacheSeq, num_tokens: int) -> list[int]:
        """Cached blocks for a fresh sequence of `num_tokens` tokens; changes nothing."""
        hit: list[int] = []
        get = self.cache.get
        for h in seq.hashes[: (num_tokens - 1) // self.block_size]:
            b = get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def can_allocate(self, seq: CacheSeq, num_slots: int, hit: Sequence[int] = ()) -> bool:
        """Whether `allocate(seq, num_slots, hit)` would succeed now; changes nothing."""
        need = -(-num_slots // self.block_size) - len(seq.blocks) - len(hit)
        if need <= 0:
            return True
        ref = self.ref
        evictable = sum(1 for b in hit if ref[b] == 0)
        return need <= len(self.free_queue) - evictable

    def allocate(self, seq: CacheSeq, num_slots: int, hit: Sequence[int] = ()) -> bool:
        """Grow `seq` (taking `hit` first, only when it holds nothing) to cover `num_slots`."""
        ref, free_queue = self.ref, self.free_queue
        blocks = seq.blocks
        need = -(-num_slots // self.block_size) - len(blocks) - len(hit)
        if need > 0 or hit:
            evictable = 0
            for b in hit:
                if ref[b] == 0:
                    evictable += 1
            if need > len(free_queue) - evictable:
                return False
            if hit:
                if blocks:
                    raise UsageError("hit blocks can only start an empty sequence")
                for b in hit:
                    if ref[b] == 0:
                        del free_queue[b]
                    ref[b] += 1
                blocks.extend(hit)
                seq.num_hashed = len(hit)  # hit blocks carry their hashes already
            if need > 0:
                hash_of, pop = self.hash_of, free_queue.popitem
                for _ in range(need):
                    b = pop(last=False)[0]
                    h = hash_of[b]
                    if h is not None:
                        hash_of[b] = None
                        self._drop_copy(h, b)
                        self.evictions += 1
                    ref[b] = 1
                    blocks.append(b)
        full = num_slots // self.block_size
        if full > seq.num_hashed:
            self._register(seq, full)
        return True

    def _drop_copy(self, h: int, b: int) -> None:
        """Forget block `b` as a copy of hash `h`; `h` stays cached while another copy does."""
        copies = self.dups.get(h)
        if copies is None:  # the only copy
            del self.cache[h]
            return
        del copies[b]
        if self.cache[h] == b:  # the oldest copy went: the next oldest serves lookups
            self.cache[h] = next(iter(copies))
        if len(copies) == 1:
            del self.dups[h]

    def _register(self, seq: CacheSeq, full: int) -> None:
        """Register the hashes of blocks num_hashed..full-1 (they became full this step)."""
        hashes, blocks, hash_of = seq.hashes, seq.blocks, self.hash_of
        cache, dups = self.cache, self.dups
        for i in range(seq.num_hashed, full):
            if i < len(hashes):
                h = hashes[i]
            else:  # a block of generated tokens: a hash no other request can produce
                h = self._next_unique
                self._next_unique += 1
                hashes.append(h)
            b = blocks[i]
            hash_of[b] = h
            first = cache.get(h)
            if first is None:
                cache[h] = b
            else:  # a recomputed cached block: vLLM keeps both copies, the older one first
                copies = dups.get(h)
                if copies is None:
                    dups[h] = {first: None, b: None}
                else:
                    copies[b] = None
        seq.num_hashed = full

    def free(self, seq: CacheSeq) -> None:
        """Release every block of `seq`, tail first; its registered hashes stay cached."""
        ref, hash_of, free_queue = self.ref, self.hash_of, self.free_queue
        head: list[int] = []
        for b in reversed(seq.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if hash_of[b] is None:
                    head.append(b)
                else:
                    free_queue[b] = None  # appended to the tail, deepest block first
        for b in reversed(head):  # the queue becomes head + queue, in the reference's order
            free_queue[b] = None
            free_queue.move_to_end(b, last=False)
        seq.blocks = []
        seq.num_hashed = 0

    def record(self, num_tokens: int, hit_tokens: int) -> None:
        """Count one admitted request's lookup (not a re-admission after preemption)."""
        self.queries += num_tokens
        self.hits += hit_tokens

    def run(self, hashes: Sequence[int], num_tokens: int, max_tokens: int = 1) -> int:
        """One request start to finish (the reference's `run`); returns its cached tokens."""
        seq = CacheSeq(hashes)
        hit = self.match(seq, num_tokens)
        if not self.allocate(seq, num_tokens + max_tokens - 1, hit):
            raise UsageError("request does not fit in the KV cache")
        hit_tokens = len(hit) * self.block_size
        self.record(num_tokens, hit_tokens)
        self.free(seq)
        return hit_tokens

    def reset(self) -> bool:
        """Drop every cached hash (POST /reset_prefix_cache); refused while blocks are held."""
        if self.num_used:
            return False
        self.cache.clear()
        self.dups.clear()
        self.hash_of = [None] * self.num_blocks
        return True

    def check(self) -> None:
        """Assert the pool's invariants (tests and debugging; O(num_blocks))."""
        assert self.num_free + self.num_used == self.capacity
        assert 0 not in self.free_queue
        for b in range(1, self.num_blocks):
            assert (self.ref[b] == 0) == (b in self.free_queue), b
            assert self.ref[b] >= 0
        for h, b in self.cache.items():
            assert self.hash_of[b] == h
        copies_of: dict[int, list[int]] = {}
        for b in range(1, self.num_blocks):
            hb = self.hash_of[b]
            if hb is not None:  # every hashed block is a cached copy of its hash
                copies_of.setdefault(hb, []).append(b)
                assert h in self.cache, (b, h)
        assert set(copies_of) == set(self.cache)
        for h, copies in self.dups.items():
            assert len(copies) >= 2 and next(iter(copies)) == self.cache[h], h
            assert sorted(copies) == sorted(copies_of[h]), h
        for h, blocks in copies_of.items():
            assert (len(blocks) >= 2) == (h in self.dups), h
