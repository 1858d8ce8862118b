"""The JSONL reader, token counting and the two result forms (fabricctl.formats.reader)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import msgspec
import pytest

from fabricctl.core.payload import decode_payload
from fabricctl.core.signature import signature, signature_hex
from fabricctl.core.types import Item, ItemResult
from fabricctl.errors import BackendMissing
from fabricctl.formats.chat import ASSISTANT_CUE, render_message
from fabricctl.formats.reader import (
    MAX_LINE_BYTES,
    LineError,
    Parsed,
    Source,
    build_item,
    estimate_tokens,
    make_record,
    native_line,
    openai_line,
    parse_lines,
    parse_stream,
    read_lines,
    result_line,
)
from fabricctl.formats.results import ResultRecord
from fabricctl.formats.tokens import ComponentCache, EstimateCounter, split_counts


def j(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def native(ident: str = "n1", **over: object) -> dict:
    obj = {"id": ident, "model": "m", "prefix": ["SYS", "FEW"], "prompt": "hi", "max_tokens": 8}
    obj.update(over)
    return obj


def without(obj: dict, key: str) -> dict:
    return {k: v for k, v in obj.items() if k != key}


def comp(cid: str = "c1", **body_over: object) -> dict:
    body = {"model": "m", "prompt": "hello", "max_tokens": 4}
    body.update(body_over)
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body}


def chat(cid: str = "h1", messages: object = None, **body_over: object) -> dict:
    if messages is None:
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    body = {"model": "m", "messages": messages}
    body.update(body_over)
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def split(results: list[Parsed | LineError]) -> tuple[list[Parsed], list[tuple[int, str]]]:
    good = [r for r in results if isinstance(r, Parsed)]
    bad = [(r.line_no, r.reason) for r in results if isinstance(r, LineError)]
    return good, bad


# ---- the bad-input matrix ----------------------------------------------------------------

MAX = 4096
LONG = b'{"id": "long", "pad": "' + b"x" * 5000 + b'"}\n'

# (line, expected reason or None for a good line); blank lines are skipped silently.
MATRIX: list[tuple[bytes, str | None]] = [
    (j(native("g1")), None),
    (b"not json {\n", "line is not valid JSON: invalid character (byte 4)"),
    (b'{"id": "a",}\n', "line is not valid JSON: trailing comma in object (byte 11)"),
    (b"[1, 2]\n", "line must be a JSON object, not an array"),
    (b'"just a string"\n', "line must be a JSON object, not a string"),
    (b'{"id": "\xff\xfe"}\n', "line is not valid UTF-8"),
    (b"   \n", None),  # blank: skipped, but still numbered
    (LONG, f"line is longer than {MAX} bytes"),
    (j({"foo": 1}), "line is neither a native item nor an OpenAI batch request"),
    (j(without(native("x"), "id")), "id is missing"),
    (j(without(native("x"), "model")), "model is missing"),
    (j(without(native("x"), "prompt")), "prompt is missing"),
    (j(without(native("x"), "max_tokens")), "max_tokens is missing"),
    (j(native(5)), "id must be a string"),  # type: ignore[arg-type]
    (j(native("")), "id must not be empty"),
    (j(native("x" * 257)), "id is longer than 256 characters"),
    (j(native("x", model=3)), "model must be a string"),
    (j(native("x", model="")), "model must not be empty"),
    (j(native("x", prompt=None)), "prompt must be a string"),
    (j(native("x", prefix="SYS")), "prefix must be a list of strings"),
    (j(native("x", prefix=["SYS", 3])), "prefix[1] must be a string"),
    (j(native("x", params=[1])), "params must be a JSON object, not an array"),
    (j(native("x", max_tokens="8")), "max_tokens must be an integer"),
    (j(native("x", max_tokens=True)), "max_tokens must be an integer"),
    (j(native("x", max_tokens=8.0)), "max_tokens must be an integer"),
    (j(native("x", max_tokens=0)), "max_tokens must be at least 1"),
    (j(native("x", max_tokens=-3)), "max_tokens must be at least 1"),
    (j(native("x", max_tokens=2**31)), "max_tokens must be at most 2147483647"),
    (j(native("x", input_tokens=-1)), "input_tokens must be at least 1"),
    (j(native("x", input_tokens=1.5)), "input_tokens must be an integer"),
    (j(native("x", label=7)), "label must be a string"),
    (j(native("g2", prefix=None)), None),  # null optional fields count as absent
    (j(native("g1")), "id 'g1' is a duplicate of line 1"),
    (j(comp("c1")), None),
    (j(without(comp("x"), "custom_id")), "custom_id is missing"),
    (j(comp("")), "custom_id must not be empty"),
    (j({**comp("x"), "method": "GET"}), "method must be POST"),
    (
        j({**comp("x"), "url": "/v1/moderations"}),
        "url must be one of /v1/completions, /v1/chat/completions, /v1/embeddings, "
        "/v1/score, /v1/rerank, /v1/responses, /v1/audio/transcriptions, /score, /rerank, "
        "/v2/rerank",
    ),
    (j({**comp("x"), "body": [1]}), "body must be a JSON object, not an array"),
    (j({**comp("x"), "body": {"prompt": "p"}}), "body.model is missing"),
    (j(comp("x", prompt=["a", "b"])), "body.prompt must be a single string"),
    (j(native("x", params={"prompt": "p"})),
     "params.prompt is not allowed: give prompt at top level"),
    (j(comp("x", max_tokens=0)), "body.max_tokens must be at least 1"),
    (j(comp("x", stream=True)), "body.stream must be false in a batch"),
    (j(native("x", params={"stream": True})), "params.stream must be false in a batch"),
    (j(comp("c1")), "custom_id 'c1' is a duplicate of line 34"),
    (j(chat("h1")), None),
    (j(chat("x", messages=[])), "body.messages must be a non-empty list"),
    (j(chat("x", messages="hi")), "body.messages must be a non-empty list"),
    (j(chat("x", messages=["hi"])), "body.messages[0] must be an object with role and content"),
    (j(chat("x", messages=[{"content": "c"}])), "body.messages[0].role is missing"),
    (
        j(chat("x", messages=[{"role": "user", "content": "a"}, {"role": "user", "content": 5}])),
        "body.messages[1].content must be a string or a list of text parts",
    ),
    (
        j(chat("x", messages=[{"role": "user", "content": [{"type": "image_url"}]}])),
        "body.messages[0].content must be a string or a list of text parts",
    ),
    (j(native("g3")).replace(b"\n", b"\r\n"), None),  # CRLF endings are fine
    (j(native("g4"))[:-1], None),  # the last line may lack its newline
]


def test_bad_input_matrix_reports_every_kind_with_its_line_number() -> None:
    lines = [line for line, _ in MATRIX]
    good, bad = split(list(parse_lines(lines, max_line_bytes=MAX)))
    expected_bad = [(n, why) for n, (_, why) in enumerate(MATRIX, 1) if why is not None]
    blank_or_good = [n for n, (_, why) in enumerate(MATRIX, 1) if why is None]
    assert bad == expected_bad
    assert len({why for _, why in expected_bad}) >= 20  # distinct kinds
    assert [p.item.id for p in good] == ["g1", "g2", "c1", "h1", "g3", "g4"]
    assert [p.line_no for p in good] == [n for n in blank_or_good if MATRIX[n - 1][0].strip()]
    assert [p.item.source for p in good] == [int(p.source) for p in good]
    assert [p.source for p in good] == [
        Source.NATIVE,
        Source.NATIVE,
        Source.COMPLETIONS,
        Source.CHAT,
        Source.NATIVE,
        Source.NATIVE,
    ]


def test_the_same_matrix_through_a_binary_stream() -> None:
    data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line, _ in MATRIX)
    from_stream = list(parse_stream(io.BytesIO(data), max_line_bytes=MAX))
    from_lines = list(parse_lines([line for line, _ in MATRIX], max_line_bytes=MAX))
    assert from_stream == from_lines


def test_a_10mb_line_is_refused_without_being_held_or_parsed(monkeypatch) -> None:
    huge = b'{"id": "big", "prompt": "' + b"y" * (10 * 1024 * 1024) + b'"}\n'
    data = j(native("a")) + huge + j(native("b"))
    chunks = list(read_lines(io.BytesIO(data)))
    assert len(chunks) == 3
    assert max(len(c) for c in chunks) <= MAX_LINE_BYTES + 2

    calls: list[int] = []
    real = msgspec.json.decode

    def spy(buf: bytes, *a: object, **kw: object) -> object:
        calls.append(len(buf))
        return real(buf, *a, **kw)

    monkeypatch.setattr(msgspec.json, "decode", spy)
    good, bad = split(list(parse_lines([j(native("a")), huge, j(native("b"))])))
    assert bad == [(2, "line is longer than 1048576 bytes")]
    assert [p.item.id for p in good] == ["a", "b"]
    assert all(n < 1000 for n in calls)  # the huge line never reached the decoder


def test_blank_lines_bom_and_numbering() -> None:
    lines = [b"\xef\xbb\xbf" + j(native("a")), b"\n", b"", b"\t \r\n", j(native("b"))]
    good, bad = split(list(parse_lines(lines)))
    assert bad == []
    assert [(p.line_no, p.item.id) for p in good] == [(1, "a"), (5, "b")]


def test_line_error_prints_as_line_and_reason() -> None:
    assert str(LineError(7, "id is missing")) == "line 7: id is missing"


# ---- both formats ------------------------------------------------------------------------


def parse_one(obj: dict, **kw: object) -> Parsed:
    (result,) = parse_lines([j(obj)], **kw)  # type: ignore[arg-type]
    assert isinstance(result, Parsed), result
    return result


def test_native_line_becomes_an_item() -> None:
    p = parse_one(native("q1", prefix=["<sys>", "<few>"], prompt="abcdefgh", label="demo"))
    item = p.item
    assert (item.id, item.model, item.max_tokens, item.label) == ("q1", "m", 8, "demo")
    assert item.signature == signature(["<sys>", "<few>"])
    payload = decode_payload(item.payload)
    assert payload.components == ["<sys>", "<few>"]
    assert payload.prompt == "abcdefgh"
    assert payload.component_tokens == [2, 2]
    assert payload.prompt_tokens == 2
    assert item.input_tokens == 6
    assert p.source is Source.NATIVE


def test_native_without_prefix_has_signature_zero() -> None:
    item = parse_one(without(native("q1"), "prefix")).item
    assert item.signature == 0
    assert decode_payload(item.payload).components == []


def test_completions_line_with_and_without_the_prefix_extension() -> None:
    plain = parse_one(comp("c1", max_tokens=None, prompt="p"))
    assert plain.source is Source.COMPLETIONS
    assert plain.item.signature == 0
    assert plain.item.max_tokens == 16  # the API default when absent
    assert plain.item.id == "c1"
    assert plain.item.label == ""

    declared = parse_one(
        comp("c2", prefix=["SYS\n", "FEW\n"], max_tokens=None, max_completion_tokens=33)
    )
    assert declared.item.signature == signature(["SYS\n", "FEW\n"])
    assert declared.item.max_tokens == 33
    assert decode_payload(declared.item.payload).prompt == "hello"


def test_chat_components_are_every_message_but_the_last_in_order() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": [{"type": "text", "text": "4"}]},
        {"role": "user", "content": "3+3?"},
    ]
    p = parse_one(chat("h1", messages=messages, max_tokens=5, metadata={"label": "math"}))
    rendered = [
        "<|system|>\nYou are terse.\n",
        "<|user|>\n2+2?\n",
        "<|assistant|>\n4\n",
    ]
    assert [
        render_message(m["role"], "4" if i == 2 else m["content"])
        for i, m in enumerate(messages[:3])
    ] == rendered
    assert p.source is Source.CHAT
    assert p.item.signature == signature(rendered)
    assert p.item.signature != signature(list(reversed(rendered)))
    payload = decode_payload(p.item.payload)
    assert payload.components == rendered
    assert payload.prompt == "<|user|>\n3+3?\n" + ASSISTANT_CUE
    assert p.item.label == "math"
    assert p.item.max_tokens == 5

    # A different last message keeps the shape; a different earlier one changes it.
    other = [*messages[:3], {"role": "user", "content": "4+4?"}]
    assert parse_one(chat("h2", messages=other)).item.signature == p.item.signature
    changed = [{"role": "system", "content": "You are verbose."}, *messages[1:]]
    assert parse_one(chat("h3", messages=changed)).item.signature != p.item.signature


def test_empty_prefix_is_no_prefix() -> None:
    for line in (native("e1", prefix=[]), comp("e2", prefix=[]), without(native("e3"), "prefix")):
        assert parse_one(line).item.signature == 0


def test_native_params_and_max_tokens_are_the_request_body() -> None:
    params = {"temperature": 0.5, "seed": 3, "stop": ["."], "n": 2, "logprobs": 1,
              "response_format": {"type": "json_object"}}
    p = parse_one(native("p1", params=params, max_tokens=9))
    payload = decode_payload(p.item.payload)
    assert not payload.chat
    assert json.loads(payload.body) == {**params, "max_tokens": 9}
    assert payload.text() == "SYSFEWhi"  # what the engine sends as the prompt
    assert p.item.max_tokens == 9


def test_native_messages_are_a_chat_request() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    p = parse_one({"id": "m1", "model": "m", "messages": messages, "max_tokens": 3,
                   "params": {"seed": 1}})
    payload = decode_payload(p.item.payload)
    assert payload.chat and json.loads(payload.body) == {"seed": 1, "max_tokens": 3,
                                                         "messages": messages}
    assert p.item.signature == parse_one(chat("h9", messages=messages)).item.signature
    assert p.source is Source.NATIVE


def test_openai_body_is_kept_as_written_less_model_prompt_and_prefix() -> None:
    p = parse_one(comp("k1", prefix=["SYS "], n=2, seed=5, logprobs=2, extra_knob=[1]))
    payload = decode_payload(p.item.payload)
    assert json.loads(payload.body) == {"max_tokens": 4, "n": 2, "seed": 5, "logprobs": 2,
                                        "extra_knob": [1]}
    assert payload.text() == "SYS hello"
    h = parse_one(chat("k2", tools=[{"type": "function", "function": {"name": "f"}}],
                       tool_choice="auto"))
    hp = decode_payload(h.item.payload)
    assert hp.chat and json.loads(hp.body)["tool_choice"] == "auto"
    assert hp.components[0] == '[{"function":{"name":"f"},"type":"function"}]'
    # the tools are part of the shape
    assert h.item.signature != parse_one(chat("k3")).item.signature


def test_single_message_chat_has_no_components() -> None:
    p = parse_one(chat("h1", messages=[{"role": "user", "content": "hi"}]))
    assert p.item.signature == 0


# ---- token counts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 1),
        ("a", 1),
        ("abcd", 1),
        ("abcde", 2),
        ("abcdefgh", 2),
        ("abcdefghi", 3),
        ("é", 1),  # 2 bytes
        ("日本語", 3),  # 9 bytes
        ("🙂🙂", 2),  # 8 bytes
        ("x" * 4000, 1000),
        ("x" * 4001, 1001),
    ],
)
def test_estimate_exact_values(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def _word_tokenizer(tmp_path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, "one": 1, "two": 2, "three": 3}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_token_count_precedence(tmp_path) -> None:
    from fabricctl.formats.reader import load_counter

    counter = load_counter(_word_tokenizer(tmp_path))
    assert counter.count("one two three") == 3

    obj = native("a", prefix=["one two", "three"], prompt="one one one one one")
    # 1. declared input_tokens wins over the tokenizer (components still counted).
    declared = parse_one({**obj, "input_tokens": 100}, counter=counter).item
    payload = decode_payload(declared.payload)
    assert declared.input_tokens == 100
    assert payload.component_tokens == [2, 1]
    assert payload.prompt_tokens == 97
    # 2. the tokenizer, when configured and nothing is declared.
    tokenized = parse_one({**obj, "id": "b"}, counter=counter).item
    assert tokenized.input_tokens == 2 + 1 + 5
    # 3. the estimate otherwise: ceil(7/4) + ceil(5/4) + ceil(19/4).
    estimated = parse_one({**obj, "id": "c"}).item
    assert estimated.input_tokens == 2 + 2 + 5
    assert load_counter(None).name == "estimate"


def test_declared_total_smaller_than_the_prefix_scales_components() -> None:
    item = parse_one(native("a", prefix=["x" * 40, "y" * 20], input_tokens=6)).item
    payload = decode_payload(item.payload)
    assert item.input_tokens == 6
    assert payload.component_tokens == [4, 2]
    assert payload.prompt_tokens == 0
    assert split_counts([3, 3, 3], None, 4) == ([2, 1, 1], 0, 4)
    assert split_counts([3, 3], 5, None) == ([3, 3], 5, 11)


def test_component_counts_are_cached() -> None:
    class Counting(EstimateCounter):
        calls = 0

        def count(self, text: str) -> int:
            Counting.calls += 1
            return super().count(text)

    lines = [j(native(f"q{i}", prefix=["A" * 100, "B" * 100])) for i in range(50)]
    results = list(parse_lines(lines, counter=Counting()))
    assert all(isinstance(r, Parsed) for r in results)
    assert Counting.calls == 2 + 50  # each component once, each prompt once
    cache = ComponentCache(EstimateCounter(), size=2)
    for text in ("a", "b", "c", "a"):
        cache.count(text)
    assert len(cache._counts) == 2


def test_tokenizers_is_imported_lazily() -> None:
    code = "import sys, fabricctl.formats.reader; print('tokenizers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_tokenizers_package_says_how_to_install(monkeypatch) -> None:
    from fabricctl.formats.tokens import TokenizerCounter

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(BackendMissing, match=r"fabricctl\[tokenizer\]"):
        TokenizerCounter("/nonexistent/tokenizer.json")


# ---- results -------------------------------------------------------------------------------


def _item(ident: str = "q1", sig: int = 0xABC) -> Item:
    return Item(id=ident, model="m", signature=sig, input_tokens=40, max_tokens=8)


def test_native_result_line_has_the_documented_fields_in_order() -> None:
    rec = make_record(
        _item(),
        ItemResult(id="q1", text="ok", finish_reason="stop", tokens_out=3, cached_tokens=32),
        lane=5,
        epoch=2,
        gpu=1,
    )
    line = native_line(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    out = json.loads(line)
    assert list(out) == [
        "id",
        "model",
        "text",
        "finish_reason",
        "usage",
        "shape",
        "lane",
        "epoch",
        "gpu",
        "error",
    ]
    assert out["usage"] == {"prompt_tokens": 40, "completion_tokens": 3, "cached_tokens": 32}
    assert out["shape"] == signature_hex(0xABC) == "0000000000000abc"
    assert (out["lane"], out["epoch"], out["gpu"], out["error"]) == (5, 2, 1, None)
    assert result_line(rec) == line
    assert rec.source is Source.NATIVE
    chat_item = msgspec.structs.replace(_item(), source=2)
    assert make_record(chat_item, ItemResult(id="q1")).source is Source.CHAT
    assert make_record(_item(), ItemResult(id="q1"), source=1).source is Source.COMPLETIONS


def test_openai_output_round_trip_every_custom_id_once() -> None:
    inputs = [
        j(comp("c1")),
        j(chat("h1")),
        j(comp("c2", prefix=["P"])),
        j(chat("h2", max_tokens=3)),
        j(comp("c3")),
        j(chat("h3")),
    ]
    parsed = [p for p in parse_lines(inputs) if isinstance(p, Parsed)]
    assert len(parsed) == 6
    records = []
    for n, p in enumerate(parsed):
        if p.item.id == "c3":
            result = ItemResult(id="c3", text="", finish_reason="length_exceeded")
        elif p.item.id == "h3":
            result = ItemResult(id="h3", error="engine crashed", finish_reason="abort")
        else:
            result = ItemResult(id=p.item.id, text=f"answer {n}", tokens_out=2, cached_tokens=16)
        rec = make_record(
            p.item, result, source=p.source, lane=0, epoch=1, gpu=0, created=1_767_225_600
        )
        # What the broker stores survives msgpack (array_like) unchanged.
        stored = msgspec.msgpack.decode(msgspec.msgpack.encode(rec), type=ResultRecord)
        assert stored == rec
        records.append(stored)
    out = b"".join(result_line(r) for r in records)
    lines = out.splitlines()
    decoded = [msgspec.json.decode(line) for line in lines]
    assert [json.loads(line) for line in lines] == decoded
    assert sorted(d["custom_id"] for d in decoded) == ["c1", "c2", "c3", "h1", "h2", "h3"]
    by_id = {d["custom_id"]: d for d in decoded}
    for d in decoded:
        assert list(d) == ["id", "custom_id", "response", "error"]
        assert d["id"].startswith("fabric-")
        assert d["response"]["request_id"].startswith("fabric-batch-")

    c1 = by_id["c1"]["response"]
    assert c1["status_code"] == 200 and by_id["c1"]["error"] is None
    assert c1["body"]["object"] == "text_completion"
    assert c1["body"]["id"].startswith("cmpl-")
    assert c1["body"]["created"] == 1_767_225_600
    assert c1["body"]["choices"][0]["text"] == "answer 0"
    assert c1["body"]["choices"][0]["finish_reason"] == "stop"
    assert c1["body"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    assert c1["body"]["usage"]["total_tokens"] == (
        c1["body"]["usage"]["prompt_tokens"] + c1["body"]["usage"]["completion_tokens"]
    )

    h1 = by_id["h1"]["response"]["body"]
    assert h1["object"] == "chat.completion" and h1["id"].startswith("chatcmpl-")
    assert h1["choices"][0]["message"] == {
        "role": "assistant",
        "content": "answer 1",
        "tool_calls": [],
    }

    c3 = by_id["c3"]
    assert c3["response"]["status_code"] == 400 and c3["response"]["body"] is None
    assert c3["error"]["error"]["type"] == "BadRequestError"
    assert c3["error"]["error"]["code"] == 400
    h3 = by_id["h3"]
    assert h3["response"]["status_code"] == 500
    assert h3["error"]["error"]["message"] == "engine crashed"

    # Deterministic: the same records give the same bytes.
    assert b"".join(openai_line(r) for r in records) == out


def test_openai_usage_details_null_without_cached_tokens() -> None:
    rec = ResultRecord(id="c1", model="m", text="t", source=Source.COMPLETIONS)
    usage = json.loads(openai_line(rec))["response"]["body"]["usage"]
    assert usage["prompt_tokens_details"] is None


VLLM_BODY = (b'{"id":"chatcmpl-9","object":"chat.completion","created":5,"model":"tiny",'
             b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi",'
             b'"tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],'
             b'"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1,'
             b'"prompt_tokens_details":{"cached_tokens":0}}}')


def test_openai_output_carries_the_engines_body_byte_for_byte() -> None:
    item = msgspec.structs.replace(_item("h1"), source=2)
    res = ItemResult(id="h1", text="hi", tokens_out=1, cached_tokens=0, prompt_tokens=12,
                     body=VLLM_BODY)
    rec = make_record(item, res, created=7)
    assert rec.prompt_tokens == 12  # the engine's count, not the item's 40
    line = openai_line(rec)
    assert b'"body":' + VLLM_BODY + b"}" in line
    out = json.loads(line)
    assert out["response"]["status_code"] == 200 and out["error"] is None


def test_openai_output_of_an_engine_refusal_is_its_status_and_error() -> None:
    refusal = (b'{"error":{"message":"top_k must be -1 (disable), or at least 1, got -5.",'
               b'"type":"BadRequestError","param":null,"code":400}}')
    item = msgspec.structs.replace(_item("c9"), source=1)
    res = ItemResult(id="c9", finish_reason="error", error="HTTP 400: top_k ...", status=400,
                     body=refusal)
    out = json.loads(openai_line(make_record(item, res)))
    assert out["response"] == {"status_code": 400, "request_id": out["response"]["request_id"],
                               "body": None}
    assert out["error"] == json.loads(refusal)
    native = json.loads(native_line(make_record(_item("c9"), res)))
    assert native["error"] == "HTTP 400: top_k ..." and "choices" not in native


def test_native_output_has_choices_when_the_engine_gave_several_or_logprobs() -> None:
    two = (b'{"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":"stop"},'
           b'{"index":1,"text":"b","logprobs":null,"finish_reason":"length"}],'
           b'"usage":{"prompt_tokens":3,"completion_tokens":5}}')
    res = ItemResult(id="q1", text="a", tokens_out=5, prompt_tokens=3, body=two)
    out = json.loads(native_line(make_record(_item(), res)))
    assert [c["text"] for c in out["choices"]] == ["a", "b"] and out["text"] == "a"
    assert out["usage"]["prompt_tokens"] == 3
    lp = b'{"choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"]}}]}'
    out = json.loads(native_line(make_record(_item(), ItemResult(id="q1", body=lp))))
    assert out["choices"][0]["logprobs"] == {"tokens": ["a"]}
    one = b'{"choices":[{"index":0,"text":"a","logprobs":null}]}'
    assert "choices" not in json.loads(native_line(make_record(_item(), ItemResult(
        id="q1", body=one))))


def test_build_item_from_a_draft_directly() -> None:
    from fabricctl.formats.common import Draft

    draft = Draft(
        id="d", model="m", components=["ab"], prompt="cdefg", max_tokens=2, source=Source.NATIVE
    )
    item = build_item(draft, EstimateCounter())
    assert item.input_tokens == 1 + 2
