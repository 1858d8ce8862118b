"""PrefixCache against the reference model of vLLM's prefix cache (docs/engine-notes.md,
section 3; corrected to keep duplicate blocks, as vLLM does), plus its invariants as properties.

Also the prompt-to-blocks mapping of fabricctl.engines.blocks: checked against a per-token
reference hashing of the same virtual token stream.
"""

from __future__ import annotations

import random
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.signature import component_hash
from fabricctl.core.types import Item
from fabricctl.engines.blocks import (
    SEED_HASH,
    achievable_cached_tokens,
    item_blocks,
    payload_blocks,
    unique_source,
)
from fabricctl.engines.prefix_cache import CacheSeq, PrefixCache

# ---------------------------------------------------------------------------------------------
# The reference model, of docs/engine-notes.md section 3 (validated 152/152 against vLLM 0.32.0).
# Kept as documentation: it maps a hash to ONE block (`setdefault`, and evicting a block drops
# the hash only if it is that block), but vLLM's BlockHashToBlockMap keeps every copy. The two
# differ once a cached block is recomputed (a duplicate) and the older copy is evicted while
# the newer one survives: vLLM still hits it, APCSim does not. `APCSimMultiCopy` below is the
# corrected reference PrefixCache is checked against; tests/real/test_sim_matches_vllm.py
# (test_sim_keeps_duplicate_blocks) shows the difference on a real vLLM 0.32.0.
# ---------------------------------------------------------------------------------------------


def chained_block_hashes(prompt, bs, salt=None):
    out, parent = [], ("NONE_HASH", salt)
    for i in range(len(prompt) // bs):
        parent = hash((parent, tuple(prompt[i * bs : (i + 1) * bs])))
        out.append(parent)
    return out


# fmt: off
class APCSim:
    def __init__(self, num_blocks, block_size):
        self.bs = block_size; self.free = list(range(1, num_blocks))   # 0 = null block  # noqa: E702
        self.hash_of, self.cache, self.ref = {}, {}, {b: 0 for b in self.free}
    def run(self, prompt, max_tokens=1, salt=None):          # one request, start to finish
        hs = chained_block_hashes(prompt, self.bs, salt)      # full prompt blocks only
        hit = []
        for h in hs[: (len(prompt) - 1) // self.bs]:
            b = self.cache.get(h)
            if b is None: break  # noqa: E701
            hit.append(b)
        for b in hit:
            if self.ref[b] == 0: self.free.remove(b)  # noqa: E701
            self.ref[b] += 1
        total = len(prompt) + max_tokens - 1                  # KV slots written
        new = [self.free.pop(0) for _ in range(-(-total // self.bs) - len(hit))]
        for b in new:
            h = self.hash_of.pop(b, None)
            if h is not None and self.cache.get(h) == b: del self.cache[h]  # noqa: E701
            self.ref[b] += 1
        blocks = hit + new
        for i in range(len(hit), total // self.bs):           # every full block gets a hash
            h = hs[i] if i < len(hs) else ("gen", object())   # generated-token blocks: unique
            self.hash_of[blocks[i]] = h; self.cache.setdefault(h, blocks[i])  # noqa: E702
        head, tail = [], []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0: (tail if b in self.hash_of else head).append(b)  # noqa: E701
        self.free = head + self.free + tail
        return len(hit) * self.bs                             # == usage cached_tokens
# fmt: on


# The corrected reference: APCSim with vLLM's hash -> every copy map (BlockHashToBlockMap). A
# lookup takes the oldest surviving copy (get_one_block: the first value of an insertion-ordered
# dict); registering a recomputed block adds a copy; evicting a block drops only its own copy
# and the hash only when no copy is left. The three changed lines are marked `# copies`.
# fmt: off
class APCSimMultiCopy(APCSim):
    def run(self, prompt, max_tokens=1, salt=None):
        hs = chained_block_hashes(prompt, self.bs, salt)
        hit = []
        for h in hs[: (len(prompt) - 1) // self.bs]:
            b = next(iter(self.cache.get(h, ())), None)                   # copies
            if b is None: break  # noqa: E701
            hit.append(b)
        for b in hit:
            if self.ref[b] == 0: self.free.remove(b)  # noqa: E701
            self.ref[b] += 1
        total = len(prompt) + max_tokens - 1
        new = [self.free.pop(0) for _ in range(-(-total // self.bs) - len(hit))]
        for b in new:
            h = self.hash_of.pop(b, None)
            if h is not None: self.cache[h].remove(b); self.cache[h] or self.cache.pop(h)  # copies  # noqa: E701, E702
            self.ref[b] += 1
        blocks = hit + new
        for i in range(len(hit), total // self.bs):
            h = hs[i] if i < len(hs) else ("gen", object())
            self.hash_of[blocks[i]] = h; self.cache.setdefault(h, []).append(blocks[i])  # copies  # noqa: E702
        head, tail = [], []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0: (tail if b in self.hash_of else head).append(b)  # noqa: E701
        self.free = head + self.free + tail
        return len(hit) * self.bs
# fmt: on


def _copies(cache: PrefixCache) -> dict[int, list[int]]:
    """PrefixCache's prompt-hash map as hash -> every copy, oldest first (the reference's form)."""
    return {h: list(cache.dups[h]) if h in cache.dups else [b]
            for h, b in cache.cache.items() if h < 1 << 64}  # fmt: skip


def _script(seed: int, block_size: int, num_blocks: int, n: int) -> list[tuple[list[int], int]]:
    """n sequential requests over 8 shapes (shared token prefixes) that fit the pool. Runs stay
    on one shape a while, then jump; 15% are bare-prefix pre-warms (max_tokens 1). Two shapes
    are a whole number of blocks long: a pre-warm of such a shape while it is cached recomputes
    its last block (the hit stops at L-1), so vLLM holds two copies of that block's hash.

    A few scripted duplicate-block episodes (as in tests/real test_sim_keeps_duplicate_blocks):
    item, pre-warm, then unique prompts that evict exactly the free blocks up to and including
    the OLDER copy, then an item of the same shape, which still hits the whole prefix through
    the newer copy. The filler is sized from a reference model run alongside."""
    rng = random.Random(seed)
    cap_tokens = (num_blocks - 1) * block_size
    shapes = [[rng.randrange(1000) for _ in range(rng.randint(8, 90))] for _ in range(5)]
    shapes.append(shapes[0][:20] + [7] * 30)  # shares a head with shape 0
    whole = [[rng.randrange(1000) for _ in range(k * block_size)] for k in (2, 3)]
    shapes += whole
    oracle = APCSimMultiCopy(num_blocks, block_size)
    out: list[tuple[list[int], int]] = []
    unique = iter(range(1_000_000, 10_000_000))

    def emit(prompt: list[int], max_tokens: int) -> None:
        oracle.run(prompt, max_tokens)
        out.append((prompt, max_tokens))

    prefix = shapes[0]
    while len(out) < n:
        i = len(out)
        if rng.random() < 0.04:  # a duplicate-block episode
            d = rng.choice(whole)
            k = len(d) // block_size
            if k + 2 <= num_blocks - 1:
                emit([*d, next(unique)], 1)
                emit(list(d), 1)  # the pre-warm: a second copy of block k
                older = oracle.cache[chained_block_hashes(d, block_size)[-1]][0]
                left = oracle.free.index(older) + 1  # evict up to and including the older copy
                while left:
                    m = min(left, num_blocks - 1)
                    left -= m
                    emit([next(unique) for _ in range(m * block_size)], 1)
                emit([*d, next(unique)], 1)  # hits all k blocks, through the newer copy
                continue
        if i == 0 or rng.random() < 0.4:
            prefix = rng.choice(shapes)
        max_tokens = rng.choice([1, 1, 2, 8, 17, 40])
        suffix_max = max(1, min(60, cap_tokens - len(prefix) - max_tokens + 1))
        suffix = [10_000 + i * 100 + j for j in range(rng.randint(0, suffix_max))]
        prompt = prefix + suffix
        if rng.random() < 0.15:  # a pre-warm: the bare prefix
            prompt, max_tokens = list(prefix), 1
        elif rng.random() < 0.1 and out:  # an exact repeat of an earlier request
            prompt, max_tokens = out[rng.randrange(len(out))]
        if -(-(len(prompt) + max_tokens - 1) // block_size) > num_blocks - 1:
            prompt = prompt[: cap_tokens - max_tokens]
        emit(prompt, max_tokens)
    return out


@pytest.mark.parametrize(
    ("block_size", "num_blocks", "seed"),
    [(16, 12, 1), (16, 24, 2), (32, 12, 3), (32, 20, 4), (16, 40, 5), (32, 40, 6)],
)
def test_matches_reference_model(block_size: int, num_blocks: int, seed: int) -> None:
    """Request by request against the corrected reference: cached tokens, the free queue block
    for block, and every copy of every prompt hash in order. The original APCSim, run alongside,
    must diverge somewhere (the duplicate-block episodes), or the check would prove nothing."""
    ref, sim = APCSimMultiCopy(num_blocks, block_size), PrefixCache(num_blocks, block_size)
    flawed = APCSim(num_blocks, block_size)
    script = _script(seed, block_size, num_blocks, 150)
    got, want, diverged, saw_dups = [], [], 0, False
    for prompt, max_tokens in script:
        hashes = chained_block_hashes(prompt, block_size)
        want.append(ref.run(prompt, max_tokens))
        got.append(sim.run(hashes, len(prompt), max_tokens))
        diverged += flawed.run(prompt, max_tokens) != want[-1]
        assert list(sim.free_queue) == ref.free  # same queue order, block for block
        prompt_entries = {h: bs for h, bs in ref.cache.items() if isinstance(h, int)}
        assert _copies(sim) == prompt_entries  # every copy, oldest first
        saw_dups = saw_dups or bool(sim.dups)
        sim.check()
    assert got == want
    assert len(script) >= 150 and len({tuple(p[:8]) for p, _ in script}) >= 4
    assert sim.queries == sum(len(p) for p, _ in script)
    assert sim.hits == sum(want)
    assert sim.evictions > 0 and 0 < sum(1 for w in want if w) < len(want)  # all paths exercised
    assert saw_dups and diverged >= 1  # the duplicate-block case happened and mattered


def test_duplicate_block_survives_eviction_of_older_copy() -> None:
    """Hand-checked, the real-vLLM scenario in miniature: B=4, 8 blocks (7 usable), a shape of
    exactly 2 blocks. vLLM (and the corrected reference) keep the pre-warm's copy of block 2
    cached after the original copy is evicted; the first model (APCSim) loses the hash."""
    bs = 4
    d = [1, 2, 3, 4, 5, 6, 7, 8]  # 2 whole blocks
    item1, item2 = [*d, 100], [*d, 200]
    hd = chained_block_hashes(d, bs)
    c = PrefixCache(8, bs)
    assert c.run(chained_block_hashes(item1, bs), 9, 1) == 0  # blocks 1,2 (hashed), 3 (partial)
    assert list(c.free_queue) == [3, 4, 5, 6, 7, 2, 1]
    assert c.run(hd, 8, 1) == 4  # hit stops at L-1: block 1 hit, block 2 recomputed into 3
    assert c.cache[hd[1]] == 2 and list(c.dups[hd[1]]) == [2, 3]  # two copies, older first
    assert list(c.free_queue) == [4, 5, 6, 7, 2, 3, 1]
    filler = list(range(1000, 1020))  # 5 unique blocks: evicts 4,5,6,7 and the older copy 2
    assert c.run(chained_block_hashes(filler, bs), 20, 1) == 0
    assert c.evictions == 1 and hd[1] not in c.dups and c.cache[hd[1]] == 3  # newer copy left
    assert c.run(chained_block_hashes(item2, bs), 9, 1) == 8  # the whole prefix still hits
    c.check()
    want = []
    for model in (APCSimMultiCopy(8, bs), APCSim(8, bs)):
        want.append([model.run(p, 1) for p in (item1, d, filler, item2)])
    assert want == [[0, 4, 0, 8], [0, 4, 0, 4]]  # corrected reference == PrefixCache; APCSim's not


def test_scripted_literals() -> None:
    """Hand-checked: B=4, 6 blocks (5 usable)."""
    c = PrefixCache(6, 4)
    p = list(range(10))  # 2 full blocks + 2 tokens
    hs = chained_block_hashes(p, 4)
    assert c.run(hs, 10, 1) == 0  # cold; blocks 1,2,3 used, 1 and 2 hashed
    assert list(c.free_queue) == [3, 4, 5, 2, 1]  # unhashed tail block to the head
    assert c.run(hs, 10, 1) == 8  # both full blocks hit (limit (10-1)//4 = 2)
    assert c.run(hs[:2], 8, 1) == 4  # L=8: only (8-1)//4 = 1 block may be looked up
    assert c.run(hs, 10, 7) == 8  # 16 slots: 4 blocks, the decode block hashed too
    assert (c.queries, c.hits) == (38, 20)
    assert c.num_used == 0 and c.num_free == 5


# ---------------------------------------------------------------------------------------------
# Properties: held sequences, growth, frees in any order (continuous batching)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    block_size=st.sampled_from([1, 4, 16]),
    num_blocks=st.integers(2, 40),
)
def test_invariants_under_interleaving(data: st.DataObject, block_size: int, num_blocks: int):
    cache = PrefixCache(num_blocks, block_size)
    prefixes = [[data.draw(st.integers(0, 3)) for _ in range(24)] for _ in range(3)]
    live: list[tuple[CacheSeq, int]] = []  # (seq, slots held)
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["admit", "admit", "grow", "free"]))
        if op == "admit":
            pre = prefixes[data.draw(st.integers(0, 2))][: data.draw(st.integers(0, 24))]
            n_own = data.draw(st.integers(0, 9))
            tokens = pre + [100 + data.draw(st.integers(0, 5)) for _ in range(n_own)]
            if not tokens:
                continue
            seq = CacheSeq(chained_block_hashes(tokens, block_size))
            hit = cache.match(seq, len(tokens))
            computed = len(hit) * block_size
            slots = computed + data.draw(st.integers(1, len(tokens) - computed))
            if cache.allocate(seq, slots, hit):
                hit_tokens = len(hit) * block_size
                assert hit_tokens % block_size == 0 and hit_tokens <= len(tokens) - 1
                live.append((seq, slots))
            else:
                assert seq.blocks == []
        elif op == "grow" and live:
            i = data.draw(st.integers(0, len(live) - 1))
            seq, slots = live[i]
            more = slots + data.draw(st.integers(1, 2 * block_size))
            before = list(seq.blocks)
            if cache.allocate(seq, more):
                live[i] = (seq, more)
                assert seq.blocks[: len(before)] == before
            else:
                assert seq.blocks == before
        elif op == "free" and live:
            seq, _ = live.pop(data.draw(st.integers(0, len(live) - 1)))
            cache.free(seq)
        cache.check()
        assert cache.num_free + cache.num_used == cache.capacity
        holders: dict[int, int] = {}
        for seq, slots in live:
            assert len(seq.blocks) == -(-slots // block_size)
            for i, b in enumerate(seq.blocks):
                holders[b] = holders.get(b, 0) + 1
                assert b not in cache.free_queue  # a block in use is never evictable
                if i < seq.num_hashed:
                    assert cache.hash_of[b] == seq.hashes[i]  # ... and keeps its hash
        assert all(cache.ref[b] == n for b, n in holders.items())
        assert cache.num_used == len(holders)
    for seq, _ in live:
        cache.free(seq)
    assert all(r == 0 for r in cache.ref) and cache.num_free == cache.capacity
    cache.check()


@settings(max_examples=100, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=70), st.integers(1, 20)),
        min_size=1,
        max_size=30,
    ),
    block_size=st.sampled_from([4, 16]),
)
def test_hits_are_whole_blocks_below_prompt_length(prompts, block_size) -> None:
    cache = PrefixCache(30, block_size)
    for tokens, max_tokens in prompts:
        if -(-(len(tokens) + max_tokens - 1) // block_size) > 29:
            continue
        hit = cache.run(chained_block_hashes(tokens, block_size), len(tokens), max_tokens)
        assert hit % block_size == 0 and hit <= len(tokens) - 1
        assert all(r == 0 for r in cache.ref)


def test_allocation_failure_changes_nothing() -> None:
    cache = PrefixCache(4, 4)  # 3 usable blocks
    held = CacheSeq(chained_block_hashes(list(range(8)), 4))
    assert cache.allocate(held, 8)
    snapshot = (list(cache.free_queue), list(cache.ref), dict(cache.cache))
    other = CacheSeq(chained_block_hashes([9] * 12, 4))
    assert not cache.allocate(other, 12)
    assert (list(cache.free_queue), list(cache.ref), dict(cache.cache)) == snapshot
    assert not cache.reset()  # refused while blocks are held
    cache.free(held)
    assert cache.reset() and cache.cache == {}


# ---------------------------------------------------------------------------------------------
# Prompt -> blocks
# ---------------------------------------------------------------------------------------------


def _token_level_hashes(sources: list[tuple[int, int]], bs: int) -> list[int]:
    """The definition, token by token: runs of consecutive (source, offset) per block."""
    tokens = [(src, off) for src, n in sources for off in range(n)]
    out, parent = [], SEED_HASH
    for i in range(len(tokens) // bs):
        runs: list[list[int]] = []
        for src, off in tokens[i * bs : (i + 1) * bs]:
            if runs and runs[-1][0] == src and runs[-1][1] + runs[-1][2] == off:
                runs[-1][2] += 1
            else:
                runs.append([src, off, 1])
        flat = [parent] + [x for r in runs for x in r]
        parent = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(flat)}Q", *flat))
        out.append(parent)
    return out


@settings(max_examples=100, deadline=None)
@given(
    comps=st.lists(
        st.tuples(st.sampled_from(["sys", "shots", "tools"]), st.integers(0, 50)), max_size=4
    ),
    prompt_tokens=st.integers(0, 60),
    block_size=st.sampled_from([1, 4, 16, 32]),
)
def test_payload_blocks_match_token_level_definition(comps, prompt_tokens, block_size) -> None:
    payload = Payload([c for c, _ in comps], "question", [n for _, n in comps], prompt_tokens)
    chain = payload_blocks(payload, block_size, "item-7")
    sources = [(component_hash(c), n) for c, n in comps]
    sources.append((unique_source("item-7", "question"), prompt_tokens))
    total = sum(n for _, n in sources)
    assert chain.tokens == total
    assert chain.hashes == _token_level_hashes(sources, block_size)
    assert len(chain.hashes) == total // block_size


def test_same_shape_shares_prefix_blocks_only() -> None:
    a = payload_blocks(Payload(["S", "F"], "p1", [40, 24], 30), 16, "a")  # prefix 64 = 4 blocks
    b = payload_blocks(Payload(["S", "F"], "p2", [40, 24], 50), 16, "b")
    c = payload_blocks(Payload(["S", "G"], "p1", [40, 24], 30), 16, "c")  # shares S (40 tokens)
    assert (a.tokens, len(a.hashes), b.tokens, len(b.hashes)) == (94, 5, 114, 7)
    assert a.hashes[:4] == b.hashes[:4] and a.hashes[4] != b.hashes[4]
    assert a.hashes[:2] == c.hashes[:2] and a.hashes[2] != c.hashes[2]
    again = payload_blocks(Payload(["S", "F"], "p1", [40, 24], 30), 16, "a")
    assert again == a  # deterministic


def test_item_blocks_falls_back_to_unique_prompt() -> None:
    good = Payload(["S"], "q", [32], 8)
    item = Item("x", "m", 1, 40, 4, encode_payload(good))
    assert item_blocks(item, 16) == payload_blocks(good, 16, "x")
    bad = Item("x", "m", 1, 40, 4, b"\xc1not msgpack")
    chain = item_blocks(bad, 16)
    assert chain.tokens == 40 and len(chain.hashes) == 2
    assert chain.hashes[0] != item_blocks(Item("y", "m", 1, 40, 4, b""), 16).hashes[0]
    mismatched = Item("z", "m", 1, 40, 4, encode_payload(Payload(["S", "T"], "q", [32], 8)))
    assert item_blocks(mismatched, 16).tokens == 40


@pytest.mark.parametrize(
    ("prefix", "length", "bs", "want"),
    [(88, 188, 16, 80), (96, 97, 16, 96), (96, 96, 16, 80), (0, 10, 16, 0), (50, 1, 16, 0),
     (256, 298, 128, 256), (300, 298, 128, 256)],
)  # fmt: skip
def test_achievable_cached_tokens(prefix: int, length: int, bs: int, want: int) -> None:
    assert achievable_cached_tokens(prefix, length, bs) == want
