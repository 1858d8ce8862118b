"""Counting by pieces (`formats/pieces.py`): for the byte-level BPE pipelines it recognizes
(GPT-2's split, and a `Split` regex before a byte-mapping `ByteLevel`, as Llama 3 and Qwen2
ship), the count of any text it covers is the tokenizer's own; it covers ASCII text without
added tokens only; it refuses every pipeline it does not know, and a rewrite its probes
disprove."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.formats import pieces
from fabricctl.formats.pieces import ASCII_MAP, GPT2_SPLIT, PieceCounter, ascii_pattern

tokenizers = pytest.importorskip("tokenizers")

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["The broker routes the items to a lane; it's 12,345 of them.",
          "You are a helpful assistant.\n\nAnswer in one line:\t42!",
          "def f(x):\n    return x ** 2  # I'm sure they'll see\n",
          "été, naïve café — ünïcode 1234567", "SHOUTING DON'T WE'LL   spaces   "]
SPECIAL = ["<s>", "</s>", "<|eot|>"]


def _trained(pre: Any, normalizer: Any = None, vocab: int = 600) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 30, trainer)
    return tok


def _split_then_bytes(pattern: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


@cache
def tokenizer(kind: str) -> Any:
    from tokenizers import normalizers, pre_tokenizers

    if kind == "gpt2":
        return _trained(pre_tokenizers.ByteLevel(add_prefix_space=False))
    if kind == "llama3":
        return _trained(_split_then_bytes(LLAMA3_SPLIT))
    if kind == "qwen2":
        return _trained(_split_then_bytes(QWEN2_SPLIT), normalizers.NFC())
    raise ValueError(kind)


KINDS = ["gpt2", "llama3", "qwen2"]


def own(tok: Any, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def test_ascii_pattern_rewrites_classes_for_ascii() -> None:
    assert ascii_pattern(r" ?\p{L}+") == " ?[A-Za-z]+"
    assert ascii_pattern(r"\p{N}{1,3}") == "[0-9]{1,3}"
    assert ascii_pattern(r"[^\s\p{L}\p{N}]+") == "[^ \\t\\n\\x0b\\x0c\\rA-Za-z0-9]+"
    assert ascii_pattern(r"\s+(?!\S)") == (
        "[ \\t\\n\\x0b\\x0c\\r]+(?![^ \\t\\n\\x0b\\x0c\\r])")
    assert ascii_pattern(r"[\r\n]*|\.") == r"[\r\n]*|\."


@pytest.mark.parametrize("onig", [r"\w+", r"\p{Lu}+", r"\d", r"[\S]", r"[[a-z]&&[^x]]",
                                  r"\p{L", r"[abc"])
def test_ascii_pattern_refuses_what_it_does_not_know(onig: str) -> None:
    assert ascii_pattern(onig) is None


@pytest.mark.parametrize("kind", KINDS)
def test_each_recognized_pipeline_loads(kind: str) -> None:
    assert PieceCounter.load(tokenizer(kind)) is not None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KINDS), st.text(st.characters(max_codepoint=127), max_size=120))
def test_an_ascii_text_counts_what_the_tokenizer_counts(kind: str, text: str) -> None:
    tok = tokenizer(kind)
    counter = PieceCounter.load(tok)
    assert counter is not None
    # the same pieces as the tokenizer's own pre-tokenizer (after its byte mapping)...
    theirs = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
    assert [p.translate(ASCII_MAP) for p in counter.pieces(text)] == theirs
    if counter.covers(text):  # ...so the same count
        assert counter.count(text) == own(tok, text)
    else:  # only an added token in it keeps ASCII text out
        assert any(s in text for s in SPECIAL)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(KINDS),
       st.lists(st.sampled_from(["the", " broker", "'s", "'LL", " 12345", "\n\n", "  ",
                                 "\t", "!?", "x", " ", "DON'T", "<s>", "été", "0.5"]),
                max_size=30))
def test_word_soup_counts_what_the_tokenizer_counts(kind: str, words: list[str]) -> None:
    tok = tokenizer(kind)
    counter = PieceCounter.load(tok)
    assert counter is not None
    text = "".join(words)
    assert counter.covers(text) == (text.isascii() and "<s>" not in text)
    if counter.covers(text):
        assert counter.count(text) == own(tok, text)


def test_the_piece_cache_starts_over_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tokenizer("gpt2")
    monkeypatch.setattr(pieces, "CACHE_PIECES", 4)
    counter = PieceCounter.load(tok)
    assert counter is not None
    texts = [" ".join(f"w{i}x{j}" for j in range(9)) for i in range(20)]
    assert [counter.count(t) for t in texts * 2] == [own(tok, t) for t in texts * 2]
    assert 0 < counter.cached <= 4


def test_pipelines_it_does_not_know_are_refused() -> None:
    from tokenizers import normalizers, pre_tokenizers

    assert PieceCounter.load(_trained(pre_tokenizers.ByteLevel(add_prefix_space=True))) is None
    assert PieceCounter.load(_trained(pre_tokenizers.Whitespace())) is None
    assert PieceCounter.load(_trained(pre_tokenizers.ByteLevel(add_prefix_space=False),
                                      normalizers.Lowercase())) is None
    assert PieceCounter.load(_trained(_split_then_bytes(r"\w+|\W"))) is None  # \w: unknown


def test_a_rewrite_its_probes_disprove_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # a split unlike the tokenizer's (no contractions, no rule for trailing spaces) gives
    # other counts on some probe: the counter is refused, and the tokenizer encodes
    monkeypatch.setattr(pieces, "GPT2_SPLIT", GPT2_SPLIT.replace("'s|", "").replace(
        r"\s+(?!\S)|", ""))
    assert PieceCounter.load(tokenizer("gpt2")) is None
