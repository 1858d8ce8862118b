"""Issue 26's endpoints on the real-engine path: embeddings, score, rerank and responses lines
parsed with their shape (fabricctl.formats.endpoints), sent as written and read back
(fabricctl.engines.request), and written out (fabricctl.formats.results)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from fabricctl.core.payload import Payload, decode_payload, encode_payload
from fabricctl.core.signature import signature, signature_hex
from fabricctl.core.types import Item, ItemResult, Work
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.engines.request import prewarm_request, read_answer, request_of
from fabricctl.formats.chat import ASSISTANT_CUE
from fabricctl.formats.reader import LineError, Parsed, Source, parse_lines
from fabricctl.formats.results import make_record, native_line, openai_line, result_line


def j(obj: object) -> bytes:
    return json.dumps(obj).encode()


def line(url: str, cid: str = "c1", **body: object) -> dict:
    return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "m", **body}}


def parsed(*objs: dict) -> list[Parsed]:
    out = list(parse_lines([j(o) for o in objs]))
    assert all(isinstance(p, Parsed) for p in out), out
    return out  # type: ignore[return-value]


def one(obj: dict) -> tuple[Parsed, Payload]:
    [p] = parsed(obj)
    return p, decode_payload(p.item.payload)


def refused(obj: dict) -> str:
    [err] = list(parse_lines([j(obj)]))
    assert isinstance(err, LineError), err
    return err.reason


# ---- OpenAI batch lines: one per endpoint, with its shape ---------------------------------


def test_an_embedding_instruction_line_is_the_shape() -> None:
    p, pl = one(line("/v1/embeddings", input="Instruct: Find the answer\nQuery: what is 2+2",
                     dimensions=32))
    assert p.source is Source.EMBEDDINGS and p.item.source == 3
    assert pl.path == "/v1/embeddings" and pl.chat is False
    assert pl.components == ["Instruct: Find the answer\n"]
    assert pl.prompt == "Query: what is 2+2"
    assert p.item.signature == signature(["Instruct: Find the answer\n"])
    assert p.item.max_tokens == 1  # pooling generates nothing
    assert p.item.input_tokens == 7 + 5  # ceil(26 / 4) + ceil(18 / 4)
    assert json.loads(pl.body) == {"input": "Instruct: Find the answer\nQuery: what is 2+2",
                                   "dimensions": 32}


def test_embedding_lines_group_by_task() -> None:
    a, b, c = parsed(
        line("/v1/embeddings", "a", input="Instruct: Task one\nQuery: x"),
        line("/v1/embeddings", "b", input="Instruct: Task one\nQuery: a longer query"),
        line("/v1/embeddings", "c", input="Instruct: Task two\nQuery: x"))
    assert a.item.signature == b.item.signature != c.item.signature


def test_an_embedding_without_an_instruction_has_no_shape() -> None:
    _, pl = one(line("/v1/embeddings", input="Title\nA document about cats."))
    assert pl.components == [] and pl.prompt == "Title\nA document about cats."
    _, pl = one(line("/v1/embeddings", input="Instruct: no newline, no shape"))
    assert pl.components == []


def test_embedding_lists_have_no_shape_and_count_every_input() -> None:
    p, pl = one(line("/v1/embeddings", input=["abcd", "efgh", "ij"]))
    assert pl.components == [] and pl.prompt == "abcdefghij"
    assert p.item.input_tokens == 3
    _, pl = one(line("/v1/embeddings", input=["Instruct: T\nQuery: a", "Instruct: T\nQuery: b"]))
    assert pl.components == ["Instruct: T\n"] and pl.prompt == "Query: aQuery: b"
    _, pl = one(line("/v1/embeddings", input=["Instruct: T\nQuery: a", "Instruct: U\nQuery: b"]))
    assert pl.components == [] and pl.prompt == "Instruct: T\nQuery: aInstruct: U\nQuery: b"
    p, _ = one(line("/v1/embeddings", input=[5, 6, 7, 8, 9]))
    assert p.item.input_tokens == 5  # token ids: the exact count
    p, _ = one(line("/v1/embeddings", input=[[1, 2], [3, 4, 5]]))
    assert p.item.input_tokens == 5


def test_a_declared_embedding_prefix_is_sent_joined() -> None:
    p, pl = one(line("/v1/embeddings", input="the text", prefix=["search_query: "]))
    assert pl.components == ["search_query: "] and pl.prompt == "the text"
    assert json.loads(pl.body) == {"input": "search_query: the text"}
    assert p.item.signature == signature(["search_query: "])


def test_embedding_messages_are_read_as_chat() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    _, pl = one(line("/v1/embeddings", messages=msgs))
    assert pl.components == ["<|system|>\nS\n"]
    assert pl.prompt == "<|user|>\nU\n" + ASSISTANT_CUE
    assert json.loads(pl.body) == {"messages": msgs}


def test_a_score_query_is_shared_by_its_documents() -> None:
    p, pl = one(line("/score", text_1="is it hot?", text_2=["sun", "ice"]))
    assert p.source is Source.SCORE and pl.path == "/v1/score"
    assert pl.components == ["is it hot?"] and pl.prompt == "sunice"
    assert p.item.max_tokens == 1
    _, pl = one(line("/v1/score", queries="q", documents="d", instruction="Judge"))
    assert pl.components == ["Judge", "q"] and pl.prompt == "d"
    _, pl = one(line("/v1/score", data_1=["q"], data_2=["d1", "d2"]))
    assert pl.components == ["q"] and pl.prompt == "d1d2"
    _, pl = one(line("/v1/score", queries=["q1", "q2"], items=["d1", "d2"]))
    assert pl.components == [] and pl.prompt == "q1q2d1d2"


def test_a_rerank_query_is_the_shape_on_every_spelling() -> None:
    for url in ("/v1/rerank", "/rerank", "/v2/rerank"):
        p, pl = one(line(url, query="best fruit", documents=["apple", "kiwi"], top_n=1))
        assert p.source is Source.RERANK and pl.path == "/v1/rerank"
        assert pl.components == ["best fruit"] and pl.prompt == "applekiwi"
        assert json.loads(pl.body) == {"query": "best fruit", "documents": ["apple", "kiwi"],
                                       "top_n": 1}


def test_responses_share_instructions_and_items_before_the_last() -> None:
    items = [{"role": "user", "content": "hi"},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "hello"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "and?"}]}]
    p, pl = one(line("/v1/responses", instructions="Be brief.", input=items,
                     max_output_tokens=9))
    assert p.source is Source.RESPONSES and pl.path == "/v1/responses"
    assert pl.components == ["<|system|>\nBe brief.\n", "<|user|>\nhi\n",
                             "<|assistant|>\nhello\n"]
    assert pl.prompt == "<|user|>\nand?\n" + ASSISTANT_CUE
    assert p.item.max_tokens == 9
    p, pl = one(line("/v1/responses", input="just this"))
    assert pl.components == [] and pl.prompt == "<|user|>\njust this\n" + ASSISTANT_CUE
    assert p.item.max_tokens == 16
    _, pl = one(line("/v1/responses", input="x", tools=[{"type": "function", "name": "f"}]))
    assert pl.components == ['[{"name":"f","type":"function"}]']
    _, pl = one(line("/v1/responses", input=[
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "4"}]))
    assert pl.components == ['<|function_call|>\n\n{"arguments":"{}","call_id":"c","name":"f"}\n']


def test_the_two_spellings_of_a_message_are_one_shape() -> None:
    a, b = parsed(
        line("/v1/responses", "a", input=[{"role": "user", "content": "S"},
                                          {"role": "user", "content": "x"}]),
        line("/v1/responses", "b", input=[{"type": "message", "role": "user", "content": "S"},
                                          {"role": "user", "content": "y"}]))
    assert a.item.signature == b.item.signature != 0


URLS = ("/v1/completions, /v1/chat/completions, /v1/embeddings, /v1/score, /v1/rerank, "
        "/v1/responses, /v1/audio/transcriptions, /score, /rerank, /v2/rerank")


@pytest.mark.parametrize(("obj", "reason"), [
    (line("/v1/moderations", input="x"), f"url must be one of {URLS}"),
    (line("/v1/embeddings", input="x", stream=True), "body.stream must be false in a batch"),
    (line("/v1/embeddings", input=""), "body.input must not be empty"),
    (line("/v1/embeddings", input=[]), "body.input must not be empty"),
    (line("/v1/embeddings", input=5), "body.input must be a string, a list of strings or "
                                      "token ids"),
    (line("/v1/embeddings", input=["a", 1]), "body.input must be a string, a list of strings "
                                             "or token ids"),
    (line("/v1/embeddings", dimensions=8), "body.input is missing"),
    (line("/v1/embeddings", input=["a"], prefix=["p"]),
     "body.prefix needs body.input to be one string"),
    (line("/v1/embeddings", input="a", prefix="p"), "body.prefix must be a list of strings"),
    (line("/v1/rerank", query=3, documents=["a"]), "body.query must be a string"),
    (line("/v1/rerank", query="", documents=["a"]), "body.query must not be empty"),
    (line("/v1/rerank", query="q", documents=[]), "body.documents must not be empty"),
    (line("/v1/rerank", query="q", documents=[{"content": []}]),
     "body.documents must be a string or a list of strings"),
    (line("/v1/rerank", query="q", documents=["a"], prefix=["p"]),
     "body.prefix is only for /v1/completions and /v1/embeddings"),
    (line("/v1/score", text_1="q"), "body.text_1 and body.text_2 are missing (or queries and "
                                    "documents, queries and items, data_1 and data_2)"),
    (line("/v1/score", text_1=7, text_2="d"), "body.text_1 must be a string or a list of "
                                              "strings"),
    (line("/v1/responses", input=[]), "body.input must be a string or a non-empty list of "
                                      "input items"),
    (line("/v1/responses", input=""), "body.input must not be empty"),
    (line("/v1/responses", input=[1]), "body.input[0] must be an object"),
    (line("/v1/responses", input=[{"content": "x"}]), "body.input[0] must have a role or a "
                                                      "type"),
    (line("/v1/responses", input="x", instructions=3), "body.instructions must be a string"),
    (line("/v1/responses", input="x", max_output_tokens=0),
     "body.max_output_tokens must be at least 1"),
    (line("/v1/responses", input="x", stream=True), "body.stream must be false in a batch"),
])
def test_bad_endpoint_lines_are_named(obj: dict, reason: str) -> None:
    assert refused(obj) == reason


# ---- native lines naming an endpoint ------------------------------------------------------


def native(endpoint: str, **over: object) -> dict:
    return {"id": "n1", "model": "m", "endpoint": endpoint, **over}


def test_a_native_line_reaches_each_endpoint_with_params_as_its_body() -> None:
    p, pl = one(native("embeddings", params={"input": "Instruct: T\nQuery: q"}, label="emb"))
    assert p.source is Source.NATIVE and p.item.source == 0
    assert pl.path == "/v1/embeddings" and pl.components == ["Instruct: T\n"]
    assert p.item.label == "emb" and p.item.max_tokens == 1
    assert json.loads(pl.body) == {"input": "Instruct: T\nQuery: q"}
    _, pl = one(native("embeddings", prefix=["P: "], params={"input": "x"}))
    assert pl.components == ["P: "] and json.loads(pl.body) == {"input": "P: x"}
    _, pl = one(native("score", params={"text_1": "q", "text_2": ["a"]}))
    assert pl.path == "/v1/score" and pl.components == ["q"]
    _, pl = one(native("rerank", params={"query": "q", "documents": ["a", "b"]}))
    assert pl.path == "/v1/rerank" and pl.components == ["q"] and pl.prompt == "ab"
    p, pl = one(native("responses", params={"input": "hi", "max_output_tokens": 5}))
    assert pl.path == "/v1/responses" and p.item.max_tokens == 5
    p, _ = one(native("rerank", params={"query": "q", "documents": ["a"]}, input_tokens=40))
    assert p.item.input_tokens == 40


def test_native_completions_and_chat_may_be_named() -> None:
    p, pl = one(native("completions", prompt="p", max_tokens=3))
    assert pl.path == "" and pl.chat is False and p.item.max_tokens == 3
    _, pl = one(native("chat", messages=[{"role": "user", "content": "u"}], max_tokens=3))
    assert pl.path == "" and pl.chat is True


@pytest.mark.parametrize(("obj", "reason"), [
    (native("moderations", params={}), "endpoint must be one of completions, chat, "
                                       "embeddings, score, rerank, responses, transcriptions"),
    (native("embeddings"), "params is missing"),
    (native("embeddings", params=[1]), "params must be a JSON object, not an array"),
    (native("embeddings", params={"input": "x"}, max_tokens=4),
     "max_tokens is not allowed with endpoint embeddings: the request's fields go in params"),
    (native("rerank", prompt="x", params={}),
     "prompt is not allowed with endpoint rerank: the request's fields go in params"),
    (native("embeddings", params={"input": "x", "model": "m"}),
     "params.model is not allowed: give model at top level"),
    (native("embeddings", params={"input": "x", "prefix": ["p"]}),
     "params.prefix is not allowed: give prefix at top level"),
    (native("rerank", prefix=["p"], params={"query": "q", "documents": "d"}),
     "prefix is not allowed with endpoint rerank: only with completions and embeddings"),
    (native("embeddings", params={"input": "x", "stream": True}),
     "params.stream must be false in a batch"),
    (native("embeddings", params={"input": 3}),
     "params.input must be a string, a list of strings or token ids"),
    (native("chat", prompt="p", max_tokens=3), "messages is missing: endpoint chat takes "
                                               "messages"),
    ({**native("chat"), "endpoint": 7}, "endpoint must be a string"),
])
def test_bad_native_endpoint_lines_are_named(obj: dict, reason: str) -> None:
    assert refused(obj) == reason


# ---- the request and the answer -----------------------------------------------------------

EMBEDDING = {"id": "embd-1", "object": "list", "created": 1764633600, "model": "m",
             "data": [{"index": 0, "object": "embedding", "embedding": [0.125, -0.5]}],
             "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0,
                       "prompt_tokens_details": None}}
EMBEDDING_B64 = {**EMBEDDING, "data": [{"index": 0, "object": "embedding",
                                        "embedding": "AAAAPgAAAL8="}]}  # [0.125, -0.5]
SCORE = {"id": "score-1", "object": "list", "created": 1764633600, "model": "m",
         "data": [{"index": 0, "object": "score", "score": 0.75},
                  {"index": 1, "object": "score", "score": 0.25}],
         "usage": {"prompt_tokens": 12, "total_tokens": 12, "completion_tokens": 0,
                   "prompt_tokens_details": None}}
RERANK = {"id": "rerank-1", "model": "m", "usage": {"prompt_tokens": 12, "total_tokens": 12},
          "results": [{"index": 1, "document": {"text": "kiwi", "multi_modal": None},
                       "relevance_score": 0.9}]}
RESPONSE = {"id": "resp_1", "created_at": 1764633600, "incomplete_details": None,
            "instructions": "Be brief.", "metadata": None, "model": "m", "object": "response",
            "output": [{"id": "rs_1", "summary": [], "type": "reasoning", "content": None},
                       {"id": "msg_1", "content": [{"annotations": [], "text": "hel",
                                                    "type": "output_text", "logprobs": None},
                                                   {"annotations": [], "text": "lo",
                                                    "type": "output_text", "logprobs": None}],
                        "role": "assistant", "status": "completed", "type": "message"}],
            "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto",
            "tools": [], "top_p": 1.0, "background": False, "max_output_tokens": 9,
            "status": "completed", "truncation": "disabled",
            "usage": {"input_tokens": 14,
                      "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
                      "output_tokens": 3,
                      "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0},
                      "total_tokens": 17}}


def compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def item_of(obj: dict) -> Item:
    return one(obj)[0].item


def test_request_of_posts_the_body_as_written_to_its_endpoint() -> None:
    it = item_of(line("/rerank", query="q", documents=["a", "b"], top_n=1))
    path, body, keep = request_of(it, decode_payload(it.payload), "served")
    assert path == "/v1/rerank" and keep is True
    assert body == {"query": "q", "documents": ["a", "b"], "top_n": 1, "model": "served"}
    it = item_of(native("embeddings", params={"input": "x", "encoding_format": "base64"}))
    path, body, keep = request_of(it, decode_payload(it.payload), "served")
    assert (path, keep) == ("/v1/embeddings", True)  # a native result carries the vectors
    assert body == {"input": "x", "encoding_format": "base64", "model": "served"}


def test_no_prewarm_for_endpoint_requests() -> None:
    it = item_of(line("/v1/embeddings", input="Instruct: T\nQuery: q"))
    assert prewarm_request(decode_payload(it.payload), "m") is None
    it = item_of(line("/v1/responses", instructions="I", input="q"))
    assert prewarm_request(decode_payload(it.payload), "m") is None


@pytest.mark.parametrize("answer", [EMBEDDING, EMBEDDING_B64, SCORE])
def test_a_pooling_answer_is_kept_whole(answer: dict) -> None:
    content = compact(answer)
    path = "/v1/score" if answer is SCORE else "/v1/embeddings"
    res = read_answer(200, content, False, path)
    assert res == ItemResult(id="", text="", finish_reason="stop", tokens_out=0,
                             cached_tokens=None, prompt_tokens=answer["usage"]["prompt_tokens"],
                             body=content)


def test_a_rerank_answer_and_pretty_json_are_kept_as_one_line() -> None:
    pretty = json.dumps(RERANK, indent=2).encode()
    res = read_answer(200, pretty, True, "/v1/rerank")
    assert res is not None
    assert res.body == compact(RERANK)  # the same JSON, on one line
    assert (res.prompt_tokens, res.tokens_out, res.cached_tokens) == (12, 0, None)


def test_cached_tokens_are_read_when_a_pooling_engine_reports_them() -> None:
    answer = {**EMBEDDING, "usage": {"prompt_tokens": 40, "total_tokens": 40,
                                     "prompt_tokens_details": {"cached_tokens": 32}}}
    res = read_answer(200, compact(answer), True, "/v1/embeddings")
    assert res is not None and res.cached_tokens == 32


def test_a_responses_answer_gives_its_text_and_usage() -> None:
    content = compact(RESPONSE)
    res = read_answer(200, content, True, "/v1/responses")
    assert res == ItemResult(id="", text="hello", finish_reason="stop", tokens_out=3,
                             cached_tokens=8, prompt_tokens=14, body=content)
    cut = {**RESPONSE, "status": "incomplete",
           "incomplete_details": {"reason": "max_output_tokens"}}
    res = read_answer(200, compact(cut), True, "/v1/responses")
    assert res is not None and res.finish_reason == "length"
    gone = {**RESPONSE, "status": "cancelled"}
    res = read_answer(200, compact(gone), True, "/v1/responses")
    assert res is not None and res.finish_reason == "abort"


def test_an_answer_of_the_wrong_kind_is_none() -> None:
    assert read_answer(200, compact(RESPONSE), True, "/v1/embeddings") is None
    assert read_answer(200, compact(EMBEDDING), True, "/v1/responses") is None
    assert read_answer(200, b"not json", True, "/v1/rerank") is None


def test_an_engine_refusal_is_the_lines_error() -> None:
    refusal = {"error": {"message": "dimensions is not supported by this model",
                         "type": "BadRequestError", "param": None, "code": 400}}
    res = read_answer(400, compact(refusal), True, "/v1/embeddings")
    assert res == ItemResult(id="", finish_reason="error",
                             error="HTTP 400: dimensions is not supported by this model",
                             status=400, body=compact(refusal))


def test_a_missing_route_is_model_does_not_support_endpoint() -> None:
    res = read_answer(404, b'{"detail":"Not Found"}', True, "/v1/embeddings")
    assert res == ItemResult(  # run-batch's row for it: 400 and the bare message
        id="", finish_reason="error",
        error="HTTP 400: Model does not support endpoint: /v1/embeddings", status=400,
        body=b'"Model does not support endpoint: /v1/embeddings"')
    unsupported = {"error": {"message": "The model does not support Score API",
                             "type": "NotImplementedError", "param": None, "code": 501}}
    res = read_answer(501, compact(unsupported), True, "/v1/score")
    assert res is not None and res.status == 501
    assert res.error == "HTTP 501: The model does not support Score API"


# ---- the engine: each item on its endpoint ------------------------------------------------


def work_of(items: list[Item], max_input_len: int = 100) -> Work:
    return Work(id=1, model="m", signature=0, lane=0, epoch=1, pad_to=16, max_tokens=1,
                max_input_len=max_input_len, items=items)


def make_engine(handler: Callable[[httpx.Request], httpx.Response]) -> OpenAIEngine:
    return OpenAIEngine("http://srv", "served", max_batch_size=8, max_batch_tokens=4096,
                        max_input_len=100, transport=httpx.MockTransport(handler),
                        backoff_s=0.001, scrape_metrics=False, attempts=3)


async def test_the_engine_sends_each_endpoint_item_to_its_path() -> None:
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path == "/v1/embeddings":
            return httpx.Response(200, content=compact(EMBEDDING))
        if request.url.path == "/v1/rerank":
            return httpx.Response(501, json={"error": {
                "message": "The model does not support Rerank (Score) API",
                "type": "NotImplementedError", "param": None, "code": 501}})
        return httpx.Response(404, json={"detail": "Not Found"})

    long_docs = ["x" * 400] * 3  # 300 tokens in all, each input within max_input_len
    items = [item_of(line("/v1/embeddings", "e", input=long_docs)),
             item_of(line("/v1/rerank", "r", query="q", documents=["a"])),
             item_of(line("/v1/responses", "s", input="hi"))]
    res = await make_engine(handler).run(work_of(items))
    assert sorted(seen, key=lambda s: s[0]) == [  # each once: none is retried
        ("/v1/embeddings", {"input": long_docs, "model": "served"}),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "served"}),
        ("/v1/responses", {"input": "hi", "model": "served"})]
    assert [(r.id, r.finish_reason, r.status) for r in res] == [
        ("e", "stop", 0), ("r", "error", 501), ("s", "error", 400)]
    assert res[0].body == compact(EMBEDDING) and res[0].prompt_tokens == 7
    assert res[2].error == "HTTP 400: Model does not support endpoint: /v1/responses"


async def test_a_too_long_responses_item_is_not_sent() -> None:
    it = item_of(line("/v1/responses", "s", input="y" * 800))
    res = await make_engine(lambda r: httpx.Response(500)).run(work_of([it]))
    assert [(r.id, r.finish_reason) for r in res] == [("s", "length_exceeded")]


# ---- the result lines -----------------------------------------------------------------------


def test_the_openai_line_carries_the_engines_body_as_given() -> None:
    it = item_of(line("/v1/embeddings", "emb-1", input="x"))
    body = compact(EMBEDDING_B64)
    rec = make_record(it, ItemResult(id="emb-1", prompt_tokens=7, body=body), created=5)
    out = openai_line(rec)
    assert b'"body":' + body + b'},"error":null}\n' in out
    doc = json.loads(out)
    assert doc["custom_id"] == "emb-1" and doc["response"]["status_code"] == 200
    assert doc["response"]["body"] == EMBEDDING_B64


def test_the_openai_line_of_a_refused_endpoint_line() -> None:
    it = item_of(line("/v1/embeddings", "emb-2", input="x"))
    res = read_answer(404, b'{"detail":"Not Found"}', True, "/v1/embeddings")
    assert res is not None
    res.id = "emb-2"
    doc = json.loads(openai_line(make_record(it, res, created=5)))
    assert doc["response"] == {"status_code": 400, "request_id": doc["response"]["request_id"],
                               "body": None}
    assert doc["error"] == "Model does not support endpoint: /v1/embeddings"  # as run-batch


def test_a_native_endpoint_result_carries_the_engines_answer() -> None:
    it = item_of(native("rerank", params={"query": "q", "documents": ["apple", "kiwi"]}))
    rec = make_record(it, ItemResult(id="n1", prompt_tokens=12, body=compact(RERANK)),
                      gpu=0)
    out = native_line(rec)
    assert out == result_line(rec)
    assert out.endswith(b',"error":null,"response":' + compact(RERANK) + b"}\n")
    doc = json.loads(out)
    assert doc["text"] == "" and doc["finish_reason"] == "stop"
    assert doc["usage"] == {"prompt_tokens": 12, "completion_tokens": 0, "cached_tokens": None}
    assert doc["shape"] == signature_hex(signature(["q"]))


def test_a_native_responses_result_has_its_text_and_response() -> None:
    it = item_of(native("responses", params={"input": "hi"}))
    content = compact(RESPONSE)
    res = read_answer(200, content, True, "/v1/responses")
    assert res is not None
    res.id = "n1"
    doc = json.loads(native_line(make_record(it, res)))
    assert doc["text"] == "hello" and doc["response"] == RESPONSE
    assert doc["usage"] == {"prompt_tokens": 14, "completion_tokens": 3, "cached_tokens": 8}


def test_a_refused_native_endpoint_result_has_no_response() -> None:
    it = item_of(native("embeddings", params={"input": "x"}))
    res = read_answer(400, compact({"error": {"message": "bad", "type": "BadRequestError",
                                              "param": None, "code": 400}}),
                      True, "/v1/embeddings")
    assert res is not None
    res.id = "n1"
    doc = json.loads(native_line(make_record(it, res)))
    assert "response" not in doc and doc["error"] == "HTTP 400: bad"


def test_a_completion_payload_is_unchanged() -> None:
    p = Payload(["P"], "q", [1], 1)
    it = Item("i", "m", 0, 2, 4, encode_payload(p))
    assert request_of(it, p, "m") == ("/v1/completions",
                                      {"max_tokens": 4, "model": "m", "prompt": "Pq"}, False)
