"""Shapes found where none is declared (`formats/autoshape.py`): the rule on small literal
cases, its properties, its fixed memory, and how the reader and the settings take it."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from cli_helpers import clean_env, error_lines, fabricctl
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.config import load_config
from fabricctl.core.payload import decode_payload
from fabricctl.core.signature import signature
from fabricctl.errors import UsageError
from fabricctl.formats.autoshape import (
    ShapeFinder,
    applies,
    byte_blocks,
    finder_for,
    token_blocks,
)
from fabricctl.formats.common import Draft, Source
from fabricctl.formats.reader import Parsed, parse_lines

# block_tokens=1 under the estimate: a block is 4 bytes, so cases stay readable


def cuts(prompts: list[str], **kw: int) -> list[str]:
    f = ShapeFinder(1, **kw)
    return [p[: f.prefix(p)] for p in prompts]


def test_the_first_line_of_a_group_finds_nothing_the_second_its_shared_blocks() -> None:
    assert cuts(["AAAABBBBxx", "AAAABBBBy1", "AAAABBBBCCCC"]) == ["", "AAAABBBB", "AAAABBBB"]


def test_a_line_sharing_nothing_finds_nothing_and_a_partial_block_is_never_a_prefix() -> None:
    assert cuts(["AAAA1", "BBBB2", "AAA", "AAAB"]) == ["", "", "", ""]


def test_a_group_keeps_its_cut_when_two_lines_share_more_than_the_group() -> None:
    got = cuts(["AAAABBBBCCCC1111", "AAAABBBBCCCC2222", "AAAABBBBCCCC2222zzzz",
                "AAAABBBBCCCC3333"])
    assert got == ["", "AAAABBBBCCCC", "AAAABBBBCCCC", "AAAABBBBCCCC"]


def test_a_shared_system_prompt_splits_into_its_instructions_once_they_are_many() -> None:
    a, b = "SSSSAAAAAAAA", "SSSSBBBBBBBB"
    got = cuts([a + "1111", b + "2222", a + "3333", a + "4444", a + "5555", b + "6666",
                b + "7777", b + "8888"], promote=3)
    assert got == ["", "SSSS", "SSSS", a, a, "SSSS", b, b]


def test_groups_do_not_mix() -> None:
    got = cuts(["AAAAAAAA1", "BBBBBBBB1", "AAAAAAAA2", "BBBBBBBB2"])
    assert got == ["", "", "AAAAAAAA", "BBBBBBBB"]


def test_the_estimate_cuts_inside_a_character_back_to_its_start() -> None:
    b = byte_blocks("abcédefg", 1)
    assert b.keys == [b"abc\xc3", b"\xa9def"]
    assert b.ends == [3, 7]


def test_a_tokenizer_block_ends_where_the_next_token_starts() -> None:
    # "ab cd ef" as tokens "ab", " cd", " ef" (ids 1, 2, 3); two tokens a block
    b = token_blocks([1, 2, 3], [(0, 2), (2, 5), (5, 8)], 8, block_tokens=2)
    assert b.ends == [5]
    b = token_blocks([1, 2, 3, 4], [(0, 2), (2, 5), (5, 8), (8, 9)], 9, block_tokens=2)
    assert b.ends == [5, 9]


class FakeTokenizer:
    """Why: a tokenizer-shaped counter (one token a word) without loading a model."""

    name = "tokenizer:fake"

    def count(self, text: str) -> int:
        return len(self.encode(text)[0])

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        start = 0
        for word in text.split(" "):
            end = start + len(word)
            ids.append(sum(map(ord, word)) % 1000)
            offsets.append((start, end))
            start = end + 1
        return ids, offsets


def test_with_a_tokenizer_blocks_are_tokens() -> None:
    f = ShapeFinder(2)
    tok = FakeTokenizer()
    assert f.prefix("you are kind q1", tok) == 0
    assert f.prefix("you are kind q2", tok) == len("you are ")  # 2 words: one block


def draft(prompt: str, source: Source = Source.COMPLETIONS, components: list[str] | None = None,
          chat: bool = False) -> Draft:
    return Draft("i", "m", components or [], prompt, 4, source, chat=chat)


def test_only_openai_lines_that_declare_nothing_are_shaped() -> None:
    assert applies(draft("AAAA"))
    assert applies(draft("AAAA", Source.EMBEDDINGS))
    assert not applies(draft("AAAA", Source.NATIVE))
    assert not applies(draft("AAAA", Source.CHAT, chat=True))
    assert not applies(draft("AAAA", components=["x"]))
    assert not applies(draft(""))
    f = ShapeFinder(1)
    f.shape(draft("AAAA1"))
    d = f.shape(draft("AAAA2"))
    assert (d.components, d.prompt) == (["AAAA"], "2")
    native = f.shape(draft("AAAA3", Source.NATIVE))
    assert (native.components, native.prompt) == ([], "AAAA3")


def test_the_setting_and_its_checks(tmp_path: Path) -> None:
    assert finder_for("declared") is None
    assert isinstance(finder_for("auto", 32), ShapeFinder)
    assert finder_for("auto", 32).block_tokens == 32  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="shapes must be one of auto, declared, not 'always'"):
        finder_for("always")
    assert load_config(cwd=tmp_path, env={}).producer.shapes == "auto"
    assert load_config(cwd=tmp_path, env={}).producer.block_size == 16
    cfg = load_config(cwd=tmp_path, env={}, overrides={"producer": {"shapes": "declared"}})
    assert cfg.producer.shapes == "declared"
    assert cfg.set_by["producer.shapes"] == "flags"
    with pytest.raises(UsageError, match=r"producer\.shapes must be one of auto, declared"):
        load_config(cwd=tmp_path, env={}, overrides={"producer": {"shapes": "x"}})
    (tmp_path / "fabric.toml").write_text("[producer]\nblock_size = 0\n")
    with pytest.raises(UsageError, match="block_size must be >= 1"):
        load_config(cwd=tmp_path, env={})


def test_the_table_and_the_cuts_never_exceed_their_caps() -> None:
    assert len(ShapeFinder()._keys) == 0  # nothing looked at, nothing allocated
    f = ShapeFinder(1, slots=1024, max_cuts=16)
    for i in range(20_000):
        group = f"{i % 40:04d}" * 3  # 40 groups of a 3-block prefix
        f.prefix(f"{group}{i:08d}zzzz")
        assert f.cuts <= 16
    assert f.entries <= 1024
    assert len(f._keys) == 1024 and len(f._counts) == 1024
    assert f.found > 19_000  # the hot groups stay findable through the churn


# ---- the reader and its properties ----------------------------------------------------------

enc = msgspec.json.Encoder()


def completion(i: int, prompt: str, prefix: list[str] | None = None) -> bytes:
    body: dict[str, object] = {"model": "fabric-demo", "prompt": prompt, "max_tokens": 4}
    if prefix is not None:
        body["prefix"] = prefix
    return enc.encode({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                       "body": body})


def parsed(lines: list[bytes], finder: ShapeFinder | None, first: int = 1) -> list[Parsed]:
    return [p for p in parse_lines(lines, finder=finder, first_line_no=first)
            if isinstance(p, Parsed)]


def test_the_reader_shapes_plain_completions_and_keeps_the_prompt_sent() -> None:
    lines = [completion(i, "SYSTEM PROMPT, TWO BLOCKS" + "." * 7 + f"q{i}") for i in range(3)]
    items = [p.item for p in parsed(lines, ShapeFinder(4))]
    assert [i.signature for i in items] == [0, signature(["SYSTEM PROMPT, TWO BLOCKS......."]),
                                            signature(["SYSTEM PROMPT, TWO BLOCKS......."])]
    for line, item in zip(lines, items, strict=True):
        pay = decode_payload(item.payload)
        assert pay.text() == msgspec.json.decode(line)["body"]["prompt"]
    assert all(p.item.signature == 0 for p in parsed(lines, None))  # "declared": as today


def test_a_declared_prefix_is_kept_and_not_registered() -> None:
    f = ShapeFinder(1)
    lines = [completion(0, "AAAA1", ["BBBB"]), completion(1, "AAAA2")]
    items = [p.item for p in parsed(lines, f)]
    assert items[0].signature == signature(["BBBB"])
    assert items[1].signature == 0


ascii_text = st.text(alphabet="abcdefgh ", max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.lists(ascii_text, min_size=1, max_size=30), st.integers(1, 3))
def test_same_input_same_shapes_and_a_prefix_is_whole_blocks_of_the_prompt(
        prompts: list[str], block: int) -> None:
    a, b = ShapeFinder(block), ShapeFinder(block)
    got = [a.prefix(p) for p in prompts]
    assert got == [b.prefix(p) for p in prompts]
    for p, n in zip(prompts, got, strict=True):
        assert 0 <= n <= len(p)
        assert n % (4 * block) == 0  # ASCII: the estimate's blocks are whole bytes


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=20))
def test_a_prefix_found_in_any_text_is_a_real_prefix(prompts: list[str]) -> None:
    f = ShapeFinder(1)
    for p in prompts:
        d = f.shape(draft(p or "x"))
        assert "".join(d.components) + d.prompt == (p or "x")


@settings(max_examples=40, deadline=None)
@given(st.lists(ascii_text, min_size=1, max_size=40), st.integers(1, 39))
def test_chunking_does_not_change_the_shapes(prompts: list[str], split: int) -> None:
    lines = [completion(i, p or "x") for i, p in enumerate(prompts)]
    whole = [p.item.signature for p in parsed(lines, ShapeFinder(1))]
    f = ShapeFinder(1)
    split = min(split, len(lines))
    parts = parsed(lines[:split], f) + parsed(lines[split:], f, first=split + 1)
    assert [p.item.signature for p in parts] == whole


@settings(max_examples=40, deadline=None)
@given(st.lists(ascii_text, min_size=2, max_size=30, unique=True),
       st.text(alphabet="XYZ", min_size=12, max_size=12))
def test_a_known_group_gets_one_signature_after_its_first_line(suffixes: list[str],
                                                                 prefix: str) -> None:
    # a 3-block prefix; each suffix opens with a block of its own, so lines share no more
    lines = [completion(i, prefix + f"{i:04d}" + s) for i, s in enumerate(suffixes)]
    sigs = [p.item.signature for p in parsed(lines, ShapeFinder(1))]
    assert sigs[0] == 0
    assert set(sigs[1:]) == {signature([prefix])}


# ---- end to end: `fabricctl run` on simulated GPUs ------------------------------------------

GROUPS, PER_GROUP = 6, 60


def known_shapes(path: Path, declared: bool) -> Path:
    """GROUPS instructions of 40 blocks (distinct from their first block) before per-line
    questions, round robin; with `declared`, the instruction as `body.prefix`."""
    instructions = [f"<instruction {g}> " + f"rule {g}: be exact. " * 60 for g in range(GROUPS)]
    with path.open("wb") as f:
        for i in range(GROUPS * PER_GROUP):
            ins = instructions[i % GROUPS]
            question = f"\n[{i:05d}] what is {i * 7919 % 1000} squared? " * (1 + i % 5)
            if declared:
                f.write(completion(i, question, [ins]) + b"\n")
            else:
                f.write(completion(i, ins + question) + b"\n")
    return path


def run_sim(tmp_path: Path, workload: Path, shapes: str, tag: str) -> dict[str, object]:
    import asyncio
    import dataclasses
    import io

    import fabricctl.cli.run as batchjob

    cfg = load_config(cwd=tmp_path, env={}, overrides={"producer": {"shapes": shapes}})
    cfg = dataclasses.replace(cfg, data_dir=tmp_path / f"data-{tag}", engine="sim",
                              sim=dataclasses.replace(cfg.sim, time_scale=0.0))
    out = io.BytesIO()
    summary = asyncio.run(batchjob.run_job(cfg, workload, out, errors=lambda m: None))
    assert len(out.getvalue().splitlines()) == GROUPS * PER_GROUP
    return msgspec.structs.asdict(summary)


def test_run_finds_the_shapes_of_plain_completions_and_hits_as_declared(tmp_path: Path) -> None:
    plain = known_shapes(tmp_path / "plain.jsonl", declared=False)
    declared = run_sim(tmp_path, known_shapes(tmp_path / "declared.jsonl", True), "auto", "d")
    auto = run_sim(tmp_path, plain, "auto", "a")
    off = run_sim(tmp_path, plain, "declared", "o")
    assert declared["shapes"] == GROUPS
    assert auto["shapes"] == GROUPS + 1  # the groups, and their first lines (signature 0)
    assert off["shapes"] == 1  # everything signature 0, as before
    sigs = {p.item.signature for p in parse_lines(plain.read_bytes().splitlines())
            if isinstance(p, Parsed)}
    assert sigs == {0}
    assert isinstance(auto["kv_hit_rate"], float) and isinstance(declared["kv_hit_rate"], float)
    assert auto["kv_hit_rate"] >= declared["kv_hit_rate"] - 0.05
    assert auto["kv_hit_rate"] > 0.5
    assert off["kv_hit_rate"] == 0.0  # the simulated engine sees no shared text it was not told


def test_the_run_command_takes_shapes_and_refuses_a_bad_one(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b"".join(completion(i, f"{'AB' * 40}{i % 2}{'CD' * 40}?{i}") + b"\n"
                               for i in range(12)))
    got = {}
    for shapes in ("auto", "declared"):
        out = tmp_path / f"{shapes}.json"
        r = fabricctl("run", str(plain), "--engine", "sim", "--shapes", shapes, "--json",
                      "-o", str(tmp_path / "results.jsonl"), env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        out.write_bytes(r.stdout)
        got[shapes] = json.loads(r.stdout.decode().strip().splitlines()[-1])["shapes"]
    # the first line: none; a 1-block start all share; each half's 2 blocks once 4 share them
    assert got == {"auto": 4, "declared": 1}
    r = fabricctl("run", str(plain), "--engine", "sim", "--shapes", "always", env=env,
                  cwd=tmp_path)
    assert r.returncode == 2
    assert error_lines(r.stderr) == ["fabricctl: error: flags: producer.shapes must be one of "
                                     "auto, declared"]


def test_a_real_tokenizer_cuts_at_its_tokens_with_character_offsets(tmp_path: Path) -> None:
    from test_tokenizer_choice import model_dir

    from fabricctl.formats.tokens import TokenizerCounter

    counter = TokenizerCounter(str(model_dir(tmp_path) / "tokenizer.json"))
    f = ShapeFinder(2)
    head = "één two three  four "  # non-ASCII and a double space: offsets are characters
    assert f.prefix(head + "five", counter) == 0
    cut = f.prefix(head + "six", counter)
    assert cut == len(head)  # 4 tokens, two blocks, up to the next token: in characters
