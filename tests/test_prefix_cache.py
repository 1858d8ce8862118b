"""PrefixCache against vllm.md A4's validated reference model, plus its invariants as properties.

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
# The reference model, copied verbatim from vllm.md A4 (validated 152/152 against vLLM 0.32.0)
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


def _script(seed: int, block_size: int, num_blocks: int, n: int) -> list[tuple[list[int], int]]:
    """n sequential requests over 4+ shapes (shared token prefixes) that fit the pool."""
    rng = random.Random(seed)
    cap_tokens = (num_blocks - 1) * block_size
    shapes = [[rng.randrange(1000) for _ in range(rng.randint(8, 90))] for _ in range(5)]
    shapes.append(shapes[0][:20] + [7] * 30)  # shares a head with shape 0
    out = []
    for i in range(n):
        prefix = rng.choice(shapes)
        max_tokens = rng.choice([1, 1, 2, 8, 17, 40])
        suffix_max = max(1, min(60, cap_tokens - len(prefix) - max_tokens + 1))
        suffix = [10_000 + i * 100 + j for j in range(rng.randint(0, suffix_max))]
        prompt = prefix + suffix
        if rng.random() < 0.1:  # an exact repeat of an earlier request
            prompt, max_tokens = out[rng.randrange(len(out))] if out else (prompt, max_tokens)
        if -(-(len(prompt) + max_tokens - 1) // block_size) > num_blocks - 1:
            prompt = prompt[: cap_tokens - max_tokens]
        out.append((prompt, max_tokens))
    return out


@pytest.mark.parametrize(
    ("block_size", "num_blocks", "seed"),
    [(16, 12, 1), (16, 24, 2), (32, 12, 3), (32, 20, 4), (16, 40, 5), (32, 40, 6)],
)
def test_matches_reference_model(block_size: int, num_blocks: int, seed: int) -> None:
    ref, sim = APCSim(num_blocks, block_size), PrefixCache(num_blocks, block_size)
    script = _script(seed, block_size, num_blocks, 150)
    got, want = [], []
    for prompt, max_tokens in script:
        hashes = chained_block_hashes(prompt, block_size)
        want.append(ref.run(prompt, max_tokens))
        got.append(sim.run(hashes, len(prompt), max_tokens))
        assert list(sim.free_queue) == ref.free  # same queue order, block for block
        prompt_entries = {h: b for h, b in ref.cache.items() if isinstance(h, int)}
        assert {h: b for h, b in sim.cache.items() if h < 1 << 64} == prompt_entries
        sim.check()
    assert got == want
    assert sim.queries == sum(len(p) for p, _ in script)
    assert sim.hits == sum(want)
    assert sim.evictions > 0 and 0 < sum(1 for w in want if w) < len(want)  # all paths exercised


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


@settings(max_examples=150, deadline=None)
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
