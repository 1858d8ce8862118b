"""Token counts of ASCII text by pre-token piece: what a byte-level BPE tokenizer gives, faster.

Contract: `PieceCounter.load(tokenizer)` returns a counter for a `tokenizers.Tokenizer` whose
pipeline it recognizes, else None. Recognized: no normalizer or Unicode normal forms only
(identity on ASCII); a pre-tokenizer that is either `ByteLevel` (no prefix space, the GPT-2
split) or a `Split` on a regex followed by a `ByteLevel` that only maps bytes (as Llama 3
and Qwen2 ship), where the regex uses only constructs it can rewrite for ASCII text
(`\\p{L}`, `\\p{N}`, `\\s`, `\\S`, `\\r`, `\\n`, `\\t`, escaped punctuation); a BPE model
without dropout. Such a tokenizer splits a text into pieces and runs its BPE on each piece
alone, so a text's count is the sum of its pieces' counts: `count(text)` splits with the
same regex rewritten for ASCII (Python's `re`), and counts each distinct piece once with
the tokenizer's own model (a bounded cache). It answers only ASCII text holding none of
the tokenizer's added tokens (`covers(text)`); anything else is the caller's to encode.
At load the counter checks itself against the tokenizer on probe texts that exercise every
branch of the split (contractions, digits, punctuation, runs of whitespace, control
characters): the same pieces as the tokenizer's own pre-tokenizer and the same counts as
its encode, or it is refused (None), so a pattern it rewrites wrongly falls back to the
tokenizer instead of miscounting.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_WS = " \\t\\n\\x0b\\x0c\\r"  # ASCII's Unicode White_Space (not \x1c-\x1f, unlike Python's \s)
_IN_CLASS = {"\\p{L}": "A-Za-z", "\\p{N}": "0-9", "\\s": _WS}
_OUTSIDE = {"\\p{L}": "[A-Za-z]", "\\p{N}": "[0-9]", "\\s": f"[{_WS}]", "\\S": f"[^{_WS}]"}
_KEPT = {"\\r", "\\n", "\\t"}
_UNICODE_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}
CACHE_PIECES = 1 << 18  # distinct pieces remembered; the cache starts over past this
PROBES = (
    "Hello, world! It's 2024: we've 3,141 items (and you'll see 'em).",
    "I'M SURE HE'D SAY THEY'RE HERE; DON'T.", "  leading and trailing  ", "a\tb\n\nc \r\n d",
    "x   y\t \tz", "1234567 89 0.5e-3 #tag @user a_b-c", "\x1c\x1dx\x1e \x1fy\x7f \x00z\x0b\x0c",
    "''s 's's ll'll ' ' '", "end with spaces   ", "\n\n\n", "   ", "!!! ??? ...", "",
    "def f(x):\n    return x ** 2  # comment\n", "URL: https://example.com/a?b=c&d=e",
)


def bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte's character (GPT-2's table)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    chars = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, chars, strict=True)}


ASCII_MAP = {b: c for b, c in bytes_to_unicode().items() if b < 128}  # str.translate table


def ascii_pattern(onig: str) -> str | None:
    """`onig` (a tokenizer's split regex) rewritten for ASCII text in Python's `re`, or None
    when it uses a construct this rewrite does not know."""
    out: list[str] = []
    depth = 0  # inside a [...] class
    i = 0
    while i < len(onig):
        ch = onig[i]
        if ch == "\\":
            tok = onig[i:i + 5] if onig.startswith("\\p{", i) else onig[i:i + 2]
            if tok.startswith("\\p{") and not tok.endswith("}"):
                return None
            table = _IN_CLASS if depth else _OUTSIDE
            if tok in table:
                out.append(table[tok])
            elif tok in _KEPT or (len(tok) == 2 and not tok[1].isalnum()):
                out.append(tok)
            else:
                return None
            i += len(tok)
            continue
        if ch == "[":
            if depth:
                return None  # nested classes (onig set operations)
            depth = 1
        elif ch == "]" and depth:
            depth = 0
        out.append(ch)
        i += 1
    return None if depth else "".join(out)


def split_pattern(spec: dict[str, Any]) -> str | None:
    """The split regex (onig syntax) of a recognized pre-tokenizer spec, else None."""
    kind = spec.get("type")
    if kind == "ByteLevel":
        ok = not spec.get("add_prefix_space") and spec.get("use_regex", True)
        return GPT2_SPLIT if ok else None
    if kind != "Sequence":
        return None
    parts = spec.get("pretokenizers") or []
    if len(parts) != 2:
        return None
    split, level = parts
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated"
            or split.get("invert") or level.get("type") != "ByteLevel"
            or level.get("add_prefix_space") or level.get("use_regex", True)):
        return None
    pattern = split.get("pattern") or {}
    regex = pattern.get("Regex")
    return regex if isinstance(regex, str) else None


def _plain_normalizer(spec: dict[str, Any] | None) -> bool:
    """No normalizer, or only Unicode normal forms (all of them leave ASCII as it is)."""
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_plain_normalizer(s) for s in spec.get("normalizers") or [])
    return spec.get("type") in _UNICODE_FORMS


class _Model(msgspec.Struct):
    """Why: of a tokenizer's model only its kind and dropout matter here (not its vocab)."""

    type: str = ""
    dropout: float | None = None


class _Added(msgspec.Struct):
    """Why: an added token is split out before the pre-tokenizer: text holding one is not
    counted by pieces."""

    content: str = ""


class _Spec(msgspec.Struct):
    """Why: the parts of a `tokenizer.json` that decide whether pieces count it; the vocab
    and merges (most of the file) are skipped, not built."""

    model: _Model = msgspec.field(default_factory=_Model)
    normalizer: dict[str, Any] | None = None
    pre_tokenizer: dict[str, Any] | None = None
    added_tokens: list[_Added] = msgspec.field(default_factory=list)


class _Pieces(dict[str, int]):
    """Why: piece -> its count, filled on a miss, so a text's sum is one C-level `map`."""

    def __init__(self, tokenize: Any) -> None:
        super().__init__()
        self._tokenize = tokenize

    def __missing__(self, piece: str) -> int:
        if len(self) >= CACHE_PIECES:
            self.clear()
        n = self[piece] = len(self._tokenize(piece.translate(ASCII_MAP)))
        return n


class PieceCounter:
    """Why: a tokenizer's own encode costs ~45 µs a short line, most of it building what a
    count never reads; summing cached piece counts gives the same number in a few."""

    def __init__(self, tokenizer: Any, split: re.Pattern[str],
                 added: re.Pattern[str] | None) -> None:
        self._split = split.findall
        self._added = added.search if added is not None else None
        self._pieces = _Pieces(tokenizer.model.tokenize)
        self._count_of = self._pieces.__getitem__

    @classmethod
    def load(cls, tokenizer: Any, source: bytes | None = None) -> PieceCounter | None:
        """A counter for `tokenizer` (a `tokenizers.Tokenizer`) when its pipeline is one
        this module counts exactly (and its probes agree), else None. `source`: the
        `tokenizer.json` it was loaded from, when at hand (else it is serialized again)."""
        try:
            spec = msgspec.json.decode(source or tokenizer.to_str(), type=_Spec)
        except msgspec.DecodeError:  # a field of another type: not a pipeline known here
            return None
        if (spec.model.type != "BPE" or spec.model.dropout
                or not _plain_normalizer(spec.normalizer)):
            return None
        onig = split_pattern(spec.pre_tokenizer or {})
        pattern = ascii_pattern(onig) if onig is not None else None
        if pattern is None:
            return None
        try:
            split = re.compile(pattern)
        except re.error:
            return None
        contents = [t.content for t in spec.added_tokens if t.content]
        added = re.compile("|".join(map(re.escape, contents))) if contents else None
        counter = cls(tokenizer, split, added)
        pre_tokenize = tokenizer.pre_tokenizer.pre_tokenize_str
        for text in PROBES:
            if not counter.covers(text):  # holds an added token: never counted by pieces
                continue
            theirs = [piece for piece, _ in pre_tokenize(text)]
            if ([piece.translate(ASCII_MAP) for piece in counter.pieces(text)] != theirs
                    or counter.count(text) != len(
                        tokenizer.encode(text, add_special_tokens=False).ids)):
                return None
        return counter

    @property
    def cached(self) -> int:
        """Distinct pieces whose counts are remembered (at most `CACHE_PIECES`)."""
        return len(self._pieces)

    def covers(self, text: str) -> bool:
        """Whether `count(text)` is the tokenizer's count: ASCII, and no added token in it."""
        return text.isascii() and (self._added is None or self._added(text) is None)

    def pieces(self, text: str) -> list[str]:
        """The pieces `text` splits into (before the byte mapping), as the tokenizer's."""
        return self._split(text)

    def count(self, text: str) -> int:
        """The tokens of `text` (one `covers` says yes to), summed over its pieces."""
        return sum(map(self._count_of, self._split(text)))
