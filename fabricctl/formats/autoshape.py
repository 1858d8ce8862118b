"""Shapes found where none is declared: the shared prefix of plain prompts, cut at blocks.

Contract:
- Which lines (`applies`): an OpenAI batch line (any endpoint but chat) whose parser found no
  components and whose prompt is a non-empty string; native lines, chat lines and lines that
  declare a prefix are left exactly as parsed.
- Blocks of `block_tokens` tokens, as vLLM's prefix cache cuts them: a tokenizer's token ids
  (a counter with `encode`), else 4 UTF-8 bytes a token (a cut inside a character moves back
  to its start). Only full blocks count, at most `max_blocks`. Block i's chain hash is xxh3_64
  of its bytes seeded with block i-1's (block 0: `SEED`): equal hashes, equal leading text.
- The rule (`ShapeFinder.find`, per job, in line order): `m` is how many leading blocks an
  earlier line had too; the prefix is the deepest *cut* among them (a group keeps one
  signature), a deeper block `promote` lines passed through becomes a cut, and with no cut
  and `m > 0` block `m` becomes one. `m = 0` finds nothing (signature 0); its chain is
  registered for the next line.
- Fixed memory: a table of `slots` chain hashes with counts (12 MiB at 2^20; two candidate
  slots per hash, the lower count replaced) and at most `max_cuts` cuts (LRU).
- Deterministic (same lines, same order, same prefixes); no I/O, no clock.
- `shape(draft, counter)` returns the draft with `components = [prefix]` and `prompt` the
  rest (their concatenation is the prompt as written), or the draft as it was; `shape_all`
  does each in order, encoding with a batch counter in one `encode_batch`.
The story and its measurements: README.md, "Shapes found where none is declared".
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import msgspec
import xxhash

from fabricctl.core.defaults import BLOCK_TOKENS, SHAPE_MODES
from fabricctl.errors import UsageError
from fabricctl.formats.common import Draft, Source
from fabricctl.formats.tokens import ESTIMATE_BYTES_PER_TOKEN, TokenCounter, batches

SEED = 0x9E3779B97F4A7C15  # chain seed of block 0 (any fixed constant)
TABLE_SLOTS = 1 << 20  # chain hashes remembered: 12 MiB
MAX_CUTS = 1 << 16  # cuts (found shapes) remembered, least recently used dropped
PROMOTE = 4  # lines through a deeper block before it becomes a cut (bench/autoshape_bench.py)
MAX_BLOCKS = 1024  # blocks of a prompt looked at: 16K tokens at 16 a block


class Encoder(Protocol):
    """Why: a tokenizer's ids and character offsets cut blocks where the engine will."""

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...


class Blocks(msgspec.Struct, frozen=True, gc=False):
    """Why: the full blocks of one prompt: what is hashed, and where each one ends."""

    keys: list[bytes]  # each full block's bytes (UTF-8, or token ids as u32)
    ends: list[int]  # the character offset where the prefix of blocks[:i+1] ends


def byte_blocks(text: str, block_tokens: int = BLOCK_TOKENS,
                max_blocks: int = MAX_BLOCKS) -> Blocks:
    """The estimate's blocks: `4 * block_tokens` UTF-8 bytes each, a cut inside a
    character moved back to its start."""
    data = text.encode("utf-8")
    size = ESTIMATE_BYTES_PER_TOKEN * block_tokens
    full = min(len(data) // size, max_blocks)
    keys = [data[i:i + size] for i in range(0, full * size, size)]
    if len(data) == len(text):  # ASCII: a byte is a character
        return Blocks(keys, list(range(size, (full + 1) * size, size)))
    ends: list[int] = []
    for i in range(1, full + 1):
        cut = i * size
        while cut < len(data) and (data[cut] & 0xC0) == 0x80:
            cut -= 1
        ends.append(len(data[:cut].decode("utf-8")))
    return Blocks(keys, ends)


def token_blocks(ids: Sequence[int], offsets: Sequence[tuple[int, int]], text_len: int,
                 block_tokens: int = BLOCK_TOKENS, max_blocks: int = MAX_BLOCKS) -> Blocks:
    """A tokenizer's blocks: `block_tokens` ids each, ending where the next token starts
    (or at the end of the text)."""
    full = min(len(ids) // block_tokens, max_blocks)
    keys = [array("I", ids[i * block_tokens:(i + 1) * block_tokens]).tobytes()
            for i in range(full)]
    ends = [offsets[i * block_tokens][0] if i * block_tokens < len(ids) else text_len
            for i in range(1, full + 1)]
    return Blocks(keys, ends)


def chain(keys: Sequence[bytes]) -> list[int]:
    """The chain hashes of blocks (never 0, the table's empty slot)."""
    out: list[int] = []
    h = SEED
    for k in keys:
        h = xxhash.xxh3_64_intdigest(k, h) or 1
        out.append(h)
    return out


class ShapeFinder:
    """Why: one job's memory of the block chains its earlier lines had, fixed in size, so
    a line can be given the prefix its group shares."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS, *, slots: int = TABLE_SLOTS,
                 max_cuts: int = MAX_CUTS, promote: int = PROMOTE,
                 max_blocks: int = MAX_BLOCKS) -> None:
        if slots < 2 or slots & (slots - 1):
            raise UsageError("slots must be a power of two >= 2")
        if block_tokens < 1 or promote < 2 or max_cuts < 1 or max_blocks < 1:
            raise UsageError("block_tokens, max_cuts and max_blocks must be >= 1, promote >= 2")
        self.block_tokens, self.promote, self.max_blocks = block_tokens, promote, max_blocks
        self.max_cuts = max_cuts
        self._mask = slots - 1
        # allocated at the first line looked at: a job of declared shapes costs nothing
        self._keys: array[int] = array("Q")
        self._counts: array[int] = array("I")
        self._cuts: OrderedDict[int, None] = OrderedDict()
        self.lines = 0  # lines looked at
        self.found = 0  # of them, lines given a prefix

    @property
    def entries(self) -> int:
        """Chain hashes held now (at most `slots`)."""
        return sum(1 for k in self._keys if k)

    @property
    def cuts(self) -> int:
        """Cuts held now (at most `max_cuts`)."""
        return len(self._cuts)

    def _cut(self, h: int) -> None:
        self._cuts[h] = None
        self._cuts.move_to_end(h)
        if len(self._cuts) > self.max_cuts:
            self._cuts.popitem(last=False)

    def register(self, hs: Sequence[int]) -> list[int]:
        """Register a line's chain hashes; for each, how many lines registered it before
        (0: new, or forgotten)."""
        if not self._keys:
            self._keys = array("Q", bytes(8 * (self._mask + 1)))
            self._counts = array("I", bytes(4 * (self._mask + 1)))
        tab, counts, mask = self._keys, self._counts, self._mask
        before: list[int] = []
        for h in hs:  # the finder's cost per line: kept flat
            a = h & mask
            if tab[a] != h:
                b = (h >> 32) & mask
                if b == a:
                    b ^= 1
                if tab[b] != h:
                    victim = a if counts[a] <= counts[b] else b
                    tab[victim], counts[victim] = h, 1
                    before.append(0)
                    continue
                a = b
            n = counts[a]
            if n < 0xFFFFFFFF:
                counts[a] = n + 1
            before.append(n)
        return before

    def find(self, keys: Sequence[bytes]) -> int:
        """How many leading blocks of a line (its full blocks' bytes) are its shape's
        prefix: 0 for none. Registers the line (see the module contract)."""
        self.lines += 1
        hs = chain(keys[: self.max_blocks])
        before = self.register(hs)
        m = 0
        while m < len(before) and before[m] > 0:
            m += 1
        if m == 0:
            return 0
        self.found += 1
        cuts = self._cuts
        d = next((i for i in range(m, 0, -1) if hs[i - 1] in cuts), 0)
        if d == 0:
            self._cut(hs[m - 1])
            return m
        p = next((i for i in range(m, d, -1) if before[i - 1] + 1 >= self.promote), 0)
        depth = p or d
        self._cut(hs[depth - 1])
        return depth

    def blocks(self, text: str, counter: TokenCounter | None = None) -> Blocks:
        """`text`'s blocks: by the counter's tokenizer when it has one, else the estimate."""
        encode = getattr(counter, "encode", None)
        if encode is None:
            return byte_blocks(text, self.block_tokens, self.max_blocks)
        ids, offsets = encode(text)
        return token_blocks(ids, offsets, len(text), self.block_tokens, self.max_blocks)

    def prefix(self, text: str, counter: TokenCounter | None = None) -> int:
        """The character length of `text`'s found prefix (0: none); registers the line."""
        return self._prefix(self.blocks(text, counter))

    def _prefix(self, b: Blocks) -> int:
        k = self.find(b.keys)
        return b.ends[k - 1] if k else 0

    def shape(self, draft: Draft, counter: TokenCounter | None = None) -> Draft:
        """The draft with its found prefix as its one component, or as it was."""
        if not applies(draft):
            return draft
        return _split(draft, self.prefix(draft.prompt, counter))

    def shape_all(self, drafts: list[Draft], counter: TokenCounter | None = None) -> list[Draft]:
        """`shape` of each draft, in order; with a batch counter (`tokens.batches`) the
        prompts looked at are encoded in one call, on every core. Same drafts either way."""
        batch = batches(counter) if counter is not None else None
        if batch is None:
            return [self.shape(d, counter) for d in drafts]
        todo = [i for i, d in enumerate(drafts) if applies(d)]
        out = list(drafts)
        encoded = batch.encode_batch([drafts[i].prompt for i in todo])
        for i, (ids, offsets) in zip(todo, encoded, strict=True):
            text = drafts[i].prompt
            b = token_blocks(ids, offsets, len(text), self.block_tokens, self.max_blocks)
            out[i] = _split(drafts[i], self._prefix(b))
        return out


def _split(draft: Draft, cut: int) -> Draft:
    """The draft with its first `cut` characters as its one component (0: as it was)."""
    if cut == 0:
        return draft
    return msgspec.structs.replace(draft, components=[draft.prompt[:cut]],
                                   prompt=draft.prompt[cut:])


def applies(draft: Draft) -> bool:
    """Whether the finder looks at a line (see the module contract)."""
    return (draft.source is not Source.NATIVE and draft.source is not Source.CHAT
            and not draft.chat and not draft.components and bool(draft.prompt))


def finder_for(shapes: str, block_tokens: int = BLOCK_TOKENS) -> ShapeFinder | None:
    """A job's finder for `[producer] shapes`: "auto" finds, "declared" (None) does not."""
    if shapes not in SHAPE_MODES:
        raise UsageError(f"shapes must be one of {', '.join(SHAPE_MODES)}, not {shapes!r}")
    return ShapeFinder(block_tokens) if shapes == "auto" else None
