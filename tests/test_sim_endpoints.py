"""The simulated engine on the endpoints beyond completions (issue 26): embeddings, score,
rerank and responses bodies in vLLM 0.32's schema, and the fake server answering the same.

Bodies are checked literally: their keys in vLLM's order, the usage, the vectors and scores
(deterministic), base64 against the float vectors, `dimensions`, no completion tokens for
pooling, and the cached tokens the simulated prefix cache gives a second input of a prefix
(counted by the GPU; a pooling result, like vLLM's pooling usage, reports none).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from fake_vllm import FakeVllm

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.records import Source
from fabricctl.core.signature import signature
from fabricctl.core.types import Item, ItemResult, Work
from fabricctl.engines.sim import SimCosts, SimEngine, SimGPU
from fabricctl.engines.simanswer import output_len
from fabricctl.engines.simbatch import run_work
from fabricctl.engines.simendpoints import EMBED_DIM, embedding, similarity

SMALL = SimCosts(block_size=16, num_blocks=40, max_num_seqs=8, max_num_batched_tokens=256)
INSTRUCT = "Instruct: find the passage\nQuery: "
SOURCES = {"/v1/embeddings": Source.EMBEDDINGS, "/v1/score": Source.SCORE,
           "/score": Source.SCORE, "/v1/rerank": Source.RERANK, "/rerank": Source.RERANK,
           "/v1/responses": Source.RESPONSES, "/v1/moderations": Source.NATIVE}
POOLING_USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens",
                      "prompt_tokens_details", "completion_tokens_details"]


def item(iid: str, path: str, body: dict[str, Any], *, prefix: int = 32, rest: int = 8,
         max_tokens: int = 16) -> Item:
    """An OpenAI batch item on `path`: a shared part of `prefix` tokens and its own `rest`."""
    comps = [INSTRUCT] if prefix else []
    payload = Payload(comps, f"the rest of {iid}", [prefix] if prefix else [], rest,
                      body=msgspec.json.encode(body), path=path)
    return Item(iid, "m", signature(comps), prefix + rest, max_tokens, encode_payload(payload),
                source=int(SOURCES[path]))


def run(gpu: SimGPU, *items: Item) -> list[ItemResult]:
    work = Work(1, "m", items[0].signature, 0, 1, 0, 0, 8192, list(items))
    results, _ = run_work(gpu, work)
    return results


def answer(path: str, body: dict[str, Any], **kw: Any) -> tuple[ItemResult, dict[str, Any]]:
    [res] = run(SimGPU(SMALL, max_input_len=200), item("x1", path, body, **kw))
    return res, msgspec.json.decode(res.body)


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


# --- embeddings ---------------------------------------------------------------------------------


def test_embedding_body_is_vllms_with_prompt_tokens_and_no_completion() -> None:
    res, body = answer("/v1/embeddings", {"input": "Query: what is a lane?"})
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert (body["object"], body["created"], body["model"]) == ("list", 0, "m")
    assert body["id"].startswith("embd-sim-")
    [data] = body["data"]
    assert list(data) == ["index", "object", "embedding"]
    assert (data["index"], data["object"]) == (0, "embedding")
    assert data["embedding"] == embedding("Query: what is a lane?")
    assert len(data["embedding"]) == EMBED_DIM
    assert math.isclose(math.fsum(x * x for x in data["embedding"]), 1.0, rel_tol=1e-6)
    assert body["usage"] == {"prompt_tokens": 40, "total_tokens": 40, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    assert list(body["usage"]) == POOLING_USAGE_KEYS
    assert (res.tokens_out, res.prompt_tokens, res.cached_tokens) == (0, 40, None)
    assert (res.text, res.finish_reason, res.status, res.error) == ("", "stop", 0, None)


LITERAL_EMBEDDING = (
    b'{"id":"embd-sim-fed336aa20e7a19d","object":"list","created":0,"model":"m","data":['
    b'{"index":0,"object":"embedding","embedding":'
    b'[0.7720292210578918,-0.6105435490608215,-0.1766563504934311]}],'
    b'"usage":{"prompt_tokens":40,"total_tokens":40,"completion_tokens":0,'
    b'"prompt_tokens_details":null,"completion_tokens_details":null}}'
)


def test_embedding_vectors_are_deterministic_and_literal() -> None:
    """Pinned values: a change to the vector derivation shows here."""
    first, _ = answer("/v1/embeddings", {"input": "fabric", "dimensions": 3})
    again, _ = answer("/v1/embeddings", {"input": "fabric", "dimensions": 3})
    assert first.body == again.body
    assert first.body == LITERAL_EMBEDDING


def test_list_input_gets_one_vector_each_in_order() -> None:
    texts = ["alpha", "bravo", "cargo"]
    _, body = answer("/v1/embeddings", {"input": texts})
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["embedding"] for d in body["data"]] == [embedding(t) for t in texts]
    assert len({tuple(d["embedding"]) for d in body["data"]}) == 3


def test_base64_is_the_float32_vector_little_endian() -> None:
    texts = ["alpha", "bravo"]
    _, floats = answer("/v1/embeddings", {"input": texts})
    _, b64 = answer("/v1/embeddings", {"input": texts, "encoding_format": "base64"})
    for f, b in zip(floats["data"], b64["data"], strict=True):
        raw = base64.b64decode(b["embedding"])
        assert raw == f32(f["embedding"])
        assert list(struct.unpack(f"<{EMBED_DIM}f", raw)) == f["embedding"]
    assert b64["usage"] == floats["usage"]


def test_base64_float16_and_big_endian_as_asked() -> None:
    _, floats = answer("/v1/embeddings", {"input": "alpha"})
    _, half = answer("/v1/embeddings", {"input": "alpha", "encoding_format": "base64",
                                        "embed_dtype": "float16", "endianness": "big"})
    raw = base64.b64decode(half["data"][0]["embedding"])
    assert raw == struct.pack(f">{EMBED_DIM}e", *floats["data"][0]["embedding"])
    res, body = answer("/v1/embeddings", {"input": "alpha", "encoding_format": "bytes"})
    assert res.status == 400 and "bytes" in body["error"]["message"]


def test_token_ids_and_messages_are_one_input_each() -> None:
    _, ids = answer("/v1/embeddings", {"input": [1, 2, 3]})
    _, batches = answer("/v1/embeddings", {"input": [[1, 2, 3], [4, 5]]})
    _, chat = answer("/v1/embeddings", {"messages": [{"role": "user", "content": "hi"}]})
    assert len(ids["data"]) == 1 and len(chat["data"]) == 1
    assert [d["embedding"] for d in batches["data"]] == [embedding("[1,2,3]"), embedding("[4,5]")]
    assert ids["data"][0]["embedding"] == batches["data"][0]["embedding"]


def test_dimensions_cut_the_vector_then_normalise_it() -> None:
    _, full = answer("/v1/embeddings", {"input": "alpha"})
    _, cut = answer("/v1/embeddings", {"input": "alpha", "dimensions": 4})
    vec, head = cut["data"][0]["embedding"], full["data"][0]["embedding"][:4]
    assert len(vec) == 4
    assert math.isclose(math.fsum(x * x for x in vec), 1.0, rel_tol=1e-6)
    ratios = [v / h for v, h in zip(vec, head, strict=True)]
    assert all(math.isclose(r, ratios[0], rel_tol=1e-5) for r in ratios)


def test_dimensions_out_of_range_is_vllms_400() -> None:
    res, body = answer("/v1/embeddings", {"input": "alpha", "dimensions": 17})
    message = "Model 'm' only supports dimensions in range [1, 16], got 17."
    assert body == {"error": {"message": message, "type": "BadRequestError", "param": None,
                              "code": 400}}
    assert (res.status, res.finish_reason, res.error) == (400, "error", f"HTTP 400: {message}")


def test_two_inputs_of_one_prefix_hit_the_cache_without_decoding() -> None:
    """Pooling is a prefill alone: no generated token, no decode step; a second input of the
    same instruction (2 blocks of 16) hits them (the GPU counts the hit), and vLLM's body
    still carries no details, so the result claims none either (its usage is its body's)."""
    gpu = SimGPU(SMALL, max_input_len=200)
    [a] = run(gpu, item("e1", "/v1/embeddings", {"input": "Query: one"}))
    assert gpu.counters.steps == 1
    [b] = run(gpu, item("e2", "/v1/embeddings", {"input": "Query: two"}))
    assert (a.cached_tokens, b.cached_tokens) == (None, None)
    assert (a.prompt_tokens, b.prompt_tokens, a.tokens_out, b.tokens_out) == (40, 40, 0, 0)
    c = gpu.counters
    assert (c.generation_tokens, c.prompt_tokens, c.prefix_cache_hits, c.steps) == (0, 80, 32, 2)
    assert msgspec.json.decode(b.body)["usage"]["prompt_tokens_details"] is None


# --- score and rerank ---------------------------------------------------------------------------


def test_score_body_one_query_against_each_text() -> None:
    res, body = answer("/v1/score", {"text_1": "what is a lane?", "text_2": ["a", "b"]})
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert body["id"].startswith("score-sim-") and body["object"] == "list"
    assert body["data"] == [
        {"index": 0, "object": "score", "score": similarity("what is a lane?", "a")},
        {"index": 1, "object": "score", "score": similarity("what is a lane?", "b")},
    ]
    assert body["usage"] == {"prompt_tokens": 40, "total_tokens": 40, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    assert (res.tokens_out, res.prompt_tokens) == (0, 40)


def test_score_pairs_n_to_n_and_its_short_path() -> None:
    _, body = answer("/score", {"queries": ["q1", "q2"], "documents": ["d1", "d2"]})
    assert [d["score"] for d in body["data"]] == [similarity("q1", "d1"),
                                                  similarity("q2", "d2")]
    assert all(-1.0 <= d["score"] <= 1.0 for d in body["data"])


def test_score_lengths_that_do_not_pair_are_vllms_400() -> None:
    res, body = answer("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert res.status == 400
    assert body["error"]["message"] == "Input lengths must be either 1:1, 1:N or N:N"


def test_rerank_sorted_by_relevance_and_cut_to_top_n() -> None:
    docs = ["lanes pack prompts", "shapes share prefixes", "the ledger balances",
            "engines answer"]
    res, body = answer("/v1/rerank", {"query": "what is a shape?", "documents": docs,
                                      "top_n": 2})
    assert list(body) == ["id", "model", "usage", "results"]
    assert body["id"].startswith("score-sim-") and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": 40, "total_tokens": 40}
    scores = sorted(((similarity("what is a shape?", d), i) for i, d in enumerate(docs)),
                    key=lambda s: s[0], reverse=True)
    assert body["results"] == [
        {"index": i, "document": {"text": docs[i], "multi_modal": None}, "relevance_score": s}
        for s, i in scores[:2]
    ]
    assert res.tokens_out == 0
    _, every = answer("/rerank", {"query": "what is a shape?", "documents": docs})
    assert len(every["results"]) == 4
    scores_all = [r["relevance_score"] for r in every["results"]]
    assert scores_all == sorted(scores_all, reverse=True)


# --- responses ----------------------------------------------------------------------------------


RESPONSE_KEYS = [
    "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object",
    "output", "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p",
    "background", "max_output_tokens", "max_tool_calls", "previous_response_id", "prompt",
    "reasoning", "service_tier", "status", "text", "top_logprobs", "truncation", "usage",
    "user", "presence_penalty", "frequency_penalty", "kv_transfer_params",
    "ec_transfer_params", "input_messages", "output_messages",
]


def test_responses_body_cut_at_max_output_tokens_is_incomplete() -> None:
    res, body = answer("/v1/responses", {"input": "Say hi", "max_output_tokens": 5,
                                         "ignore_eos": True, "instructions": "Be brief."})
    assert list(body) == RESPONSE_KEYS
    assert body["id"].startswith("resp_sim-") and body["object"] == "response"
    assert (body["status"], body["incomplete_details"]) == ("incomplete",
                                                            {"reason": "max_output_tokens"})
    assert (body["instructions"], body["max_output_tokens"], body["model"]) == (
        "Be brief.", 5, "m")
    assert (body["temperature"], body["top_p"], body["tool_choice"], body["tools"]) == (
        1.0, 1.0, "none", [])  # vLLM's validator: no tools, tool_choice "none"
    [message] = body["output"]
    assert message["id"].startswith("msg_sim-")
    assert {k: v for k, v in message.items() if k != "id"} == {
        "content": [{"annotations": [], "text": res.text, "type": "output_text",
                     "logprobs": None}],
        "role": "assistant", "status": "completed", "type": "message", "phase": None}
    assert len(res.text.split()) == 5
    assert body["usage"] == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 32,
                                 "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": 45,
    }
    assert (res.tokens_out, res.finish_reason, res.prompt_tokens) == (5, "length", 40)


def test_responses_that_stop_early_are_completed() -> None:
    iid = next(f"r{k}" for k in range(100) if output_len(f"r{k}", 0, 64) < 64)
    gpu = SimGPU(SMALL, max_input_len=200)
    [res] = run(gpu, item(iid, "/v1/responses", {"input": "hi", "max_output_tokens": 64},
                          max_tokens=8))
    body = msgspec.json.decode(res.body)
    assert (body["status"], body["incomplete_details"]) == ("completed", None)
    assert res.tokens_out == body["usage"]["output_tokens"] == output_len(iid, 0, 64)
    assert body["max_output_tokens"] == 64  # the request's own limit, not the item's


def test_responses_second_request_of_a_prefix_reports_cached_tokens() -> None:
    gpu = SimGPU(SMALL, max_input_len=200)
    run(gpu, item("p1", "/v1/responses", {"input": "one", "max_output_tokens": 2}))
    [res] = run(gpu, item("p2", "/v1/responses", {"input": "two", "max_output_tokens": 2}))
    details = msgspec.json.decode(res.body)["usage"]["input_tokens_details"]
    assert (details["cached_tokens"], details["cache_write_tokens"]) == (32, 0)
    assert res.cached_tokens == 32


# --- refusals and the engine --------------------------------------------------------------------


def test_an_endpoint_the_model_does_not_serve_is_a_400_result() -> None:
    gpu = SimGPU(SMALL, max_input_len=200, endpoints=frozenset({"/v1/chat/completions"}))
    [emb, mod] = run(gpu, item("e1", "/v1/embeddings", {"input": "x"}),
                     item("m1", "/v1/moderations", {"input": "x"}))
    assert emb.body == b'"Model does not support endpoint: /v1/embeddings"'  # as run-batch
    assert (emb.status, emb.finish_reason, emb.tokens_out) == (400, "error", 0)
    assert emb.error == "HTTP 400: Model does not support endpoint: /v1/embeddings"
    assert mod.error == "HTTP 400: Model does not support endpoint: /v1/moderations"
    assert (gpu.counters.requests, gpu.counters.items) == (0, 2)
    [ok] = run(SimGPU(SMALL, max_input_len=200, endpoints=frozenset({"/score"})),
               item("s1", "/v1/score", {"text_1": "a", "text_2": "b"}))
    assert ok.status == 0 and msgspec.json.decode(ok.body)["data"][0]["object"] == "score"


async def test_sim_engine_answers_each_endpoint_in_one_batch() -> None:
    engine = SimEngine(costs=SMALL, max_input_len=200, time_scale=0)
    items = [item("e", "/v1/embeddings", {"input": "x"}),
             item("s", "/v1/score", {"text_1": "a", "text_2": "b"}),
             item("r", "/v1/rerank", {"query": "a", "documents": ["b"]}),
             item("p", "/v1/responses", {"input": "x", "max_output_tokens": 3})]
    results = await engine.run(Work(1, "m", items[0].signature, 0, 1, 0, 0, 8192, items))
    objects = [msgspec.json.decode(r.body).get("object") for r in results]
    assert objects == ["list", "list", None, "response"]
    assert [r.tokens_out for r in results[:3]] == [0, 0, 0]
    assert all(r.prompt_tokens == 40 and r.status == 0 for r in results)


# --- the fake server ----------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    server = FakeVllm(unsupported=["/v1/responses"])
    yield server
    server.close()


def post(fake: FakeVllm, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(fake.url + path, json={"model": "m", **body}, timeout=10)


def test_fake_answers_embeddings_as_the_sim_does(fake: FakeVllm) -> None:
    r = post(fake, "/v1/embeddings", {"input": ["ab", "cde"], "dimensions": 3})
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert [d["embedding"] for d in body["data"]] == [embedding("ab", 3), embedding("cde", 3)]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    b64 = post(fake, "/v1/embeddings", {"input": "ab", "encoding_format": "base64"}).json()
    assert base64.b64decode(b64["data"][0]["embedding"]) == f32(embedding("ab"))


def test_fake_answers_score_and_rerank(fake: FakeVllm) -> None:
    score = post(fake, "/score", {"text_1": "q", "text_2": ["d1", "d22"]}).json()
    assert [d["score"] for d in score["data"]] == [similarity("q", "d1"), similarity("q", "d22")]
    assert score["usage"]["prompt_tokens"] == 7  # "qd1" + "qd22", a character a token
    rerank = post(fake, "/v1/rerank", {"query": "q", "documents": ["d1", "d22"], "top_n": 1})
    body = rerank.json()
    assert list(body) == ["id", "model", "usage", "results"]
    best = max(range(2), key=lambda i: similarity("q", ["d1", "d22"][i]))
    assert [r["index"] for r in body["results"]] == [best]
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


def test_fake_refuses_as_vllm(fake: FakeVllm) -> None:
    bad = post(fake, "/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert bad.status_code == 400
    assert bad.json() == {"error": {"message": "Input lengths must be either 1:1, 1:N or N:N",
                                    "type": "BadRequestError", "param": None, "code": 400}}
    # a route vLLM's server did not register for the model's task
    gone = post(fake, "/v1/responses", {"input": "hi"})
    assert (gone.status_code, gone.json()) == (404, {"detail": "Not Found"})


def test_fake_answers_responses_with_its_own_limit() -> None:
    server = FakeVllm()
    try:
        r = post(server, "/v1/responses", {"input": "hi", "max_output_tokens": 4,
                                           "ignore_eos": True})
    finally:
        server.close()
    body = r.json()
    assert r.status_code == 200 and list(body) == RESPONSE_KEYS
    assert body["output"][0]["content"][0]["text"] == "tok tok tok tok"
    assert (body["status"], body["usage"]["input_tokens"], body["usage"]["output_tokens"]) == (
        "incomplete", 2, 4)
