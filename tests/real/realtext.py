"""Real-text workloads for the tiny model, token-exact, and the cache arithmetic around them.

Helpers for the real-vLLM tests (not a test module):
- `Tok`: the tiny model's `tokenizer.json` read with `tokenizers` (no BOS, as vLLM sends it).
- `make_shapes` / `Shape.item_prompt`: shapes whose components and item prompts join at
  pre-token boundaries (every piece but the first starts with a space, none ends with one),
  so the tokens of `"".join(components) + prompt` are exactly the tokens of the pieces
  concatenated; `Shape.check` asserts it. A nonce in the first component keeps every run's
  prefixes out of whatever earlier tests left in the servers' caches.
- `scrape_counters`: vLLM's own `vllm:prefix_cache_{queries,hits}_total` (and block
  config) from a server's /metrics.
- `chain_hashes`: vLLM-style chained full-block hashes of real token ids (for the sim).
- `achievable_hits`: the most a warm cache can give a sequence of requests per server: every
  request gets floor(min(prefix, L-1)/B)*B except the first of each shape on each server.
- `MultiCopyAPC`: the reference model of docs/engine-notes.md section 3 with vLLM's hash ->
  *every block holding it* map (`BlockHashToBlockMap`), the one difference that matters once
  duplicate blocks exist.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import xxhash
from make_tiny_model import OBJECTS, SUBJECTS, VERBS  # the words the tokenizer learnt
from prometheus_client.parser import text_string_to_metric_families


def sentence(rng: random.Random) -> str:
    """One corpus-like sentence, starting with a space and ending with a full stop."""
    return f" {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."


class Tok:
    """Why: the token counts producers declare must be the ones vLLM computes."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

    def ids(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        return len(self.ids(text))


@dataclass
class Shape:
    """One prompt shape: components (the shared prefix) and their token ids."""

    index: int
    label: str
    components: list[str]
    prefix_ids: list[int] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        return "".join(self.components)

    @property
    def prefix_tokens(self) -> int:
        return len(self.prefix_ids)

    def item_prompt(self, code: int, rng: random.Random, extra: int) -> str:
        """An item's varying part: its own code first (so no two items share a block past
        the prefix), then a question and `extra` sentences."""
        tail = "".join(sentence(rng) for _ in range(extra))
        return (f" {code}: what does {rng.choice(SUBJECTS)} do with "
                f"{rng.choice(OBJECTS)}?{tail}")

    def check(self, tok: Tok, prompt: str) -> list[int]:
        """The tokens of prefix + prompt; asserts the pieces are token-aligned."""
        ids = tok.ids(self.prefix + prompt)
        pieces = [t for c in self.components for t in tok.ids(c)] + tok.ids(prompt)
        assert ids == pieces, f"shape {self.label}: components do not join at token boundaries"
        assert ids[: self.prefix_tokens] == self.prefix_ids
        return ids


def nonce() -> str:
    """8 random digits: 8 tokens with the tiny tokenizer whatever the digits, so a test's
    token counts (and so its cache behaviour) are the same on every run."""
    return str(random.SystemRandom().randrange(10**7, 10**8))


def make_shapes(tok: Tok, n: int, nonce: str, rng: random.Random, sentences: Sequence[int],
                fits: Callable[[int], bool]) -> list[Shape]:
    """`n` shapes: a system line (nonce), `sentences[k % len]` example sentences, a tools line
    lengthened one token at a time until `fits(prefix tokens)` (e.g. the block holding the
    prefix's end keeps room for an item's own code, so that block is the item's alone)."""
    shapes = []
    for k in range(n):
        system = f"system {nonce} {k}: you answer questions about the broker."
        examples = "".join(sentence(rng) for _ in range(sentences[k % len(sentences)]))
        tools = f" tools: {rng.choice(SUBJECTS)} {rng.choice(VERBS)} the results."
        while True:
            s = Shape(k, f"shape{k}", [system, examples, tools])
            s.prefix_ids = tok.ids(s.prefix)
            if fits(s.prefix_tokens):
                break
            tools += " the"  # one token
        assert s.prefix_ids == [t for c in s.components for t in tok.ids(c)]
        shapes.append(s)
    return shapes


class Counters:
    """Why: one scrape of vLLM's own prefix-cache counters and cache configuration."""

    def __init__(self, text: str) -> None:
        self.queries = self.hits = 0.0
        self.block_size = self.num_blocks = 0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "vllm:prefix_cache_queries_total":
                    self.queries += s.value
                elif s.name == "vllm:prefix_cache_hits_total":
                    self.hits += s.value
                elif s.name == "vllm:cache_config_info":
                    self.block_size = int(s.labels.get("block_size") or 0)
                    self.num_blocks = int(s.labels.get("num_gpu_blocks") or 0)


async def scrape_counters(base_url: str) -> Counters:
    async with httpx.AsyncClient(timeout=10.0) as client:
        resp = await client.get(base_url.rstrip("/") + "/metrics")
        resp.raise_for_status()
        return Counters(resp.text)


_SEED = xxhash.xxh3_64_intdigest(b"tests/real: none hash")


def chain_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a token sequence (block i depends on 0..i)."""
    out, parent = [], _SEED
    for start in range(0, len(ids) - block_size + 1, block_size):
        block = ids[start:start + block_size]
        parent = xxhash.xxh3_64_intdigest(struct.pack(f"<{block_size + 1}Q", parent, *block))
        out.append(parent)
    return out


def best_hit(prefix: int, prompt_len: int, block_size: int) -> int:
    """floor(min(prefix, L-1)/B)*B: what a warm cache gives one request (docs/engine-notes.md,
    section 2)."""
    usable = min(prefix, prompt_len - 1)
    return max(0, usable) // block_size * block_size


def achievable_hits(requests: Iterable[tuple[str, int, int, int]], block_size: int) -> int:
    """Sum of `best_hit` over (server, shape, prefix, L) in the order each server saw them,
    except the first request of each shape on each server (its cold prefill)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for server, shape, prefix, length in requests:
        if (server, shape) in seen:
            total += best_hit(prefix, length, block_size)
        else:
            seen.add((server, shape))
    return total


class MultiCopyAPC:
    """The reference `APCSim` (tests/test_prefix_cache.py), except that a hash maps to every
    block holding it, as vLLM's `BlockHashToBlockMap` does: a lookup takes the oldest copy,
    evicting one block drops only that copy. Duplicates arise when a request recomputes a
    block that is cached, e.g. the last block of a bare-prefix pre-warm whose prefix is a whole
    number of blocks (its hit stops at L-1)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.bs = block_size
        self.free = list(range(1, num_blocks))  # 0 = the null block
        self.hash_of: dict[int, object] = {}
        self.cache: dict[object, list[int]] = {}
        self.ref = dict.fromkeys(self.free, 0)

    def run(self, hashes: Sequence[int], prompt_len: int, max_tokens: int) -> int:
        """One request start to finish; returns its cached tokens."""
        hit = []
        for h in hashes[: (prompt_len - 1) // self.bs]:
            copies = self.cache.get(h)
            if not copies:
                break
            hit.append(copies[0])
        for b in hit:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        total = prompt_len + max_tokens - 1
        new = [self.free.pop(0) for _ in range(-(-total // self.bs) - len(hit))]
        for b in new:
            old = self.hash_of.pop(b, None)
            if old is not None:
                self.cache[old].remove(b)
                if not self.cache[old]:
                    del self.cache[old]
            self.ref[b] += 1
        blocks = hit + new
        for i in range(len(hit), total // self.bs):
            h: object = hashes[i] if i < len(hashes) else ("generated", object())
            self.hash_of[blocks[i]] = h
            self.cache.setdefault(h, []).append(blocks[i])
        head, tail = [], []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (tail if b in self.hash_of else head).append(b)
        self.free = head + self.free + tail
        return len(hit) * self.bs


