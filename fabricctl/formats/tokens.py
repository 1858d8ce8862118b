"""Token counts for producer input: declared, tokenized, or estimated, in that order.

Contract:
- A native line's `input_tokens`, when given, is the item's input length. Components are
  still counted so the payload says how long each is; the prompt gets the rest (components
  scaled down to fit a smaller declared total, the prompt 0), so `input_tokens ==
  sum(component_tokens) + prompt_tokens` always holds.
- Otherwise, with a tokenizer (a Hugging Face `tokenizer.json`, read with the optional
  `tokenizers` package), each component and the prompt are tokenized without special tokens.
  `choose_counter(tokenizer, model)` is the one choice: `[producer] tokenizer` (it must
  load), else `<model>/tokenizer.json` of a local model directory (one that does not load
  falls back, with a warning), else the estimate; the counter's `name` says which.
- Batches: a counter with `count_batch` (and `encode_batch`, for `formats.autoshape`) counts
  many texts in one call, on every core without the GIL; its counts, ids and offsets are
  exactly those of one text at a time. ASCII text with a byte-level BPE that
  `formats.pieces` recognizes is counted by its pieces' cached counts (the same number,
  cheaper); in batches only on a host with few cores (`pieces_in_batches`, `cheap`). The
  reader batches only with such a counter (`batches`).
- Otherwise the **estimate**: `max(1, ceil(len(text.encode("utf-8")) / 4))` per component
  and prompt: exact for no model, deterministic and cheap; a lane absorbs the error.
`tokenizers` is imported only when a tokenizer is loaded; asked for without the package, a
`BackendMissing` (exit 3) says how to install it. The measurements: README.md,
"Configuration" and "The path at GPU speed".
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from fabricctl.errors import BackendMissing
from fabricctl.formats.pieces import PieceCounter

ESTIMATE_BYTES_PER_TOKEN = 4
PIECES_BELOW_CORES = 6  # batches count by pieces on fewer cores (`pieces_in_batches`)
TOKENIZER_FILE = "tokenizer.json"

log = logging.getLogger("fabricctl.tokens")


def estimate_tokens(text: str) -> int:
    """The documented estimate: ceil(UTF-8 bytes / 4), at least 1."""
    n = len(text.encode("utf-8"))
    return max(1, -(-n // ESTIMATE_BYTES_PER_TOKEN))


class TokenCounter(Protocol):
    """Why: one seam for "how many tokens is this text", estimate or real tokenizer."""

    name: str

    def count(self, text: str) -> int: ...


@runtime_checkable
class BatchCounter(TokenCounter, Protocol):
    """Why: a counter that counts a chunk's texts in one call, on every core."""

    batched: bool  # False: the reader counts one text at a time all the same

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...

    def cheap(self, text: str) -> bool:
        """Whether `count(text)` is cheap Python work (holding the GIL) rather than a batch
        for every core: the reader counts a group of such texts on its own thread."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        ...


def batches(counter: TokenCounter) -> BatchCounter | None:
    """`counter` when it counts in batches (`count_batch`, and `batched`), else None."""
    return counter if isinstance(counter, BatchCounter) and counter.batched else None


class KnownCounts:
    """Why: a chunk's texts are counted in one batch first; its items are then built from
    those counts with the same code as one text at a time."""

    def __init__(self, name: str, counts: dict[str, int]) -> None:
        self.name = name
        self.counts = counts

    def count(self, text: str) -> int:
        return self.counts[text]


class EstimateCounter:
    """Why: a tokenizer-free count for producers that give no `input_tokens`."""

    name = "estimate"

    def count(self, text: str) -> int:
        return estimate_tokens(text)


class TokenizerCounter:
    """Why: exact counts when the operator points fabricctl at the model's tokenizer.json."""

    def __init__(self, path: str, *, batched: bool = True, pieces: bool = True,
                 cores: int | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # the optional extra is not installed
            raise BackendMissing(
                "counting tokens with a tokenizer needs the `tokenizers` package "
                "(pip install 'fabricctl[tokenizer]')"
            ) from exc
        self._tok = Tokenizer.from_file(path)
        self.name = f"tokenizer:{path}"
        self.batched = batched  # False: one text at a time (the reference, in tests and bench)
        # ASCII text counted piece by piece when the pipeline allows (`formats.pieces`)
        self._pieces = PieceCounter.load(self._tok, Path(path).read_bytes()) if pieces else None
        # ...and in batches too, unless the cores to encode on outpace one thread's pieces
        in_batches = pieces_in_batches(usable_cores() if cores is None else cores)
        self._batch_pieces = self._pieces if in_batches else None

    def count(self, text: str) -> int:
        fast = self._pieces
        if fast is not None and fast.covers(text):
            return fast.count(text)
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def cheap(self, text: str) -> bool:
        """Whether a batch counts `text` by pieces (`formats.pieces`), not encoded."""
        return self._batch_pieces is not None and self._batch_pieces.covers(text)

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The token ids and their character offsets (for `formats.autoshape`'s blocks)."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """`count` of each text: those `cheap` says yes to by pieces, the rest encoded in
        one call on every core (no offsets kept)."""
        fast = self._batch_pieces
        counts = [0] * len(texts)
        rest: list[int] = []  # the texts left to the tokenizer's own encode
        for i, text in enumerate(texts):
            if fast is not None and fast.covers(text):
                counts[i] = fast.count(text)
            else:
                rest.append(i)
        if rest:
            encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
            encoded = encode([texts[i] for i in rest], add_special_tokens=False)
            for i, e in zip(rest, encoded, strict=True):
                counts[i] = len(e)
        return counts

    def encode_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """`encode` of each text, in one call on every core."""
        return [(e.ids, e.offsets)
                for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def pieces_in_batches(cores: int) -> bool:
    """Whether a batch counts the texts pieces cover by pieces (one thread, holding the GIL)
    rather than encoding them on every core. Per short chat line (bench/tokenize_bench.py)
    the reader parses in about 13 µs, pieces count in about 7 more on the same thread, and
    the tokenizer encodes in about 45 µs of CPU spread over the other cores: from
    `PIECES_BELOW_CORES` cores on (one for the parser, one for a local daemon, four
    encoding: 11 µs a line) the encode keeps pace with the parser, where pieces would add
    their 7 µs to it."""
    return cores < PIECES_BELOW_CORES


def load_counter(tokenizer_path: str | None = None) -> TokenCounter:
    """A tokenizer counter for a configured path, else the estimate."""
    return TokenizerCounter(tokenizer_path) if tokenizer_path else EstimateCounter()


def model_tokenizer(model: str) -> str | None:
    """`<model>/tokenizer.json` when `model` is a local directory holding one and the
    `tokenizers` package is installed, else None (a hub name, a missing dir, no package)."""
    if not model:
        return None
    path = Path(model).expanduser() / TOKENIZER_FILE
    if not path.is_file() or importlib.util.find_spec("tokenizers") is None:
        return None
    return str(path)


def choose_counter(tokenizer_path: str, model: str) -> TokenCounter:
    """The token counter for a configuration: `[producer] tokenizer` when set (as
    `load_counter`: an error if it cannot be loaded), else the served model's own
    `tokenizer.json` (`model_tokenizer`), else the estimate. `name` says which."""
    if tokenizer_path:
        return TokenizerCounter(tokenizer_path)
    found = model_tokenizer(model)
    if found is not None:
        try:
            return TokenizerCounter(found)
        except Exception as e:  # found, but not a tokenizer this package reads
            log.warning("token counts: %s does not load (%s); using the estimate", found, e)
    return EstimateCounter()


class ComponentCache:
    """Why: shared prefixes repeat on every line, so count each distinct one once."""

    def __init__(self, counter: TokenCounter, size: int = 4096) -> None:
        self.counter = counter
        self.size = size
        self._counts: OrderedDict[str, int] = OrderedDict()

    def count(self, text: str) -> int:
        n = self.known(text)
        if n is None:
            n = self.counter.count(text)
            self.remember(text, n)
        return n

    def known(self, text: str) -> int | None:
        """The cached count of `text` (now the most recently used), or None."""
        n = self._counts.get(text)
        if n is not None:
            self._counts.move_to_end(text)
        return n

    def remember(self, text: str, n: int) -> None:
        """Cache `n` as the count of `text`, the least recently used dropped past `size`."""
        self._counts[text] = n
        if len(self._counts) > self.size:
            self._counts.popitem(last=False)


def split_counts(
    component_tokens: list[int], prompt_tokens: int | None, declared: int | None
) -> tuple[list[int], int, int]:
    """(component tokens, prompt tokens, total) honouring a declared total when given.

    `prompt_tokens` is the counted prompt (ignored when `declared` is set).
    """
    prefix = sum(component_tokens)
    if declared is None:
        assert prompt_tokens is not None
        return component_tokens, prompt_tokens, prefix + prompt_tokens
    if prefix <= declared:
        return component_tokens, declared - prefix, declared
    return _scale(component_tokens, declared), 0, declared


def _scale(counts: list[int], total: int) -> list[int]:
    """`counts` scaled to sum exactly to `total` (largest remainders get the leftovers)."""
    whole = sum(counts)
    exact = [c * total / whole for c in counts]
    out = [int(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: out[i] - exact[i])
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out
