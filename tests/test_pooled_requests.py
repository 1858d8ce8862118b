"""Grouped embeddings requests answer each item exactly as one request per item does.

A fake vLLM (httpx.MockTransport) built on the simulated engine's embeddings bodies
(`fabricctl.engines.simendpoints`) answers both forms as vLLM 0.32 does: one vector per
input in input order, the usage summed over the inputs, a random id per request, and one
bad input refusing the whole list with a 400. Its token rule (a word a token, plus one when
`add_special_tokens` is not false; a token id a token) is the counter the engine is given,
as the served model's tokenizer is vLLM's own rule on a real server.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, ItemResult, Work
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.engines.pooled import (
    EMBEDDINGS,
    GROUP_INPUTS,
    plan_groups,
    pool_key,
    split_answer,
)
from fabricctl.engines.simbodies import Refusal
from fabricctl.engines.simendpoints import EmbedAsk, parse_ask

BAD = "BAD"  # an input the fake refuses, as vLLM refuses one over max_model_len
WORDS = ["the broker", "a lane packs", "cache", "one prompt evicts its blocks", "x"]


def tokens_of(value: Any, special: bool) -> int:
    if isinstance(value, str):
        return len(value.split()) + (1 if special else 0)
    return len(value)


class WordCounter:
    """Why: the engine's counter for the fake's token rule."""

    def __init__(self, skew: int = 0) -> None:
        self.skew = skew  # added to every count: a tokenizer that is not the server's
        self.calls = 0

    def counts(self, texts: list[str], special: bool) -> list[int]:
        self.calls += 1
        return [tokens_of(t, special) + self.skew for t in texts]


class FakeVllm:
    """Why: one server that answers the single and the list form the way vLLM does."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != EMBEDDINGS:
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        self.bodies.append(body)
        value = body.get("input")
        inputs = value if isinstance(value, list) and value and not isinstance(value[0], int) \
            else [value]
        if any(isinstance(v, str) and BAD in v for v in inputs):
            return httpx.Response(400, json={"error": {
                "message": "This model's maximum context length is 16 tokens.",
                "type": "BadRequestError", "param": None, "code": 400}})
        ask = parse_ask(EMBEDDINGS, body, str(body.get("model")))
        if isinstance(ask, Refusal):
            return httpx.Response(ask.status, content=ask.body)
        assert isinstance(ask, EmbedAsk)
        special = body.get("add_special_tokens", True) is not False
        n = sum(tokens_of(v, special) for v in inputs)
        content = ask.body(str(body.get("model")), uuid.uuid4().hex, n)
        return httpx.Response(200, content=content)


def item(i: int, body: dict[str, Any]) -> Item:
    p = Payload(components=[], prompt="", component_tokens=[], prompt_tokens=0,
                body=json.dumps(body).encode(), path=EMBEDDINGS)
    return Item(id=f"e{i}", model="m", signature=1, input_tokens=8, max_tokens=1,
                payload=encode_payload(p))


def run(bodies: list[dict[str, Any]], group: bool, counter: WordCounter | None = None,
        server: FakeVllm | None = None) -> tuple[list[ItemResult], OpenAIEngine]:
    async def go() -> tuple[list[ItemResult], OpenAIEngine]:
        eng = OpenAIEngine("http://srv", "m", max_batch_size=64, max_batch_tokens=4096,
                           max_input_len=100, transport=httpx.MockTransport(server or FakeVllm()),
                           scrape_metrics=False, group_pooling=group,
                           counter=counter if counter is not None else WordCounter())
        work = Work(id=1, model="m", signature=1, lane=0, epoch=1, pad_to=8, max_tokens=1,
                    max_input_len=100, items=[item(i, b) for i, b in enumerate(bodies)])
        try:
            return await eng.run(work), eng
        finally:
            await eng.close()
    return asyncio.run(go())


def comparable(res: ItemResult) -> dict[str, Any]:
    """Every field of a result, its body decoded with the per-request random id left out."""
    out: dict[str, Any] = {f: getattr(res, f) for f in res.__struct_fields__ if f != "body"}
    body = json.loads(res.body) if res.body else None
    if isinstance(body, dict):
        assert str(body.pop("id", "embd-")).startswith("embd-")
    out["body"] = body
    return out


inputs = st.one_of(
    st.sampled_from(WORDS),  # a text: most items
    st.sampled_from(WORDS),
    st.lists(st.integers(0, 500), min_size=1, max_size=5),  # token ids
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),  # a list: a group of its own
    st.just(f"a {BAD} input"),
)
params = st.sampled_from([{}, {}, {"encoding_format": "base64"}, {"dimensions": 8},
                          {"dimensions": 99}, {"add_special_tokens": False},
                          {"encoding_format": "base64", "embed_dtype": "float16"}])


@st.composite
def bodies(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 24))
    return [{"model": "whatever", "input": draw(inputs), **draw(params)} for _ in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_grouped_requests_answer_each_item_as_its_own_request_does(
        batch: list[dict[str, Any]]) -> None:
    alone, single = run(batch, group=False)
    grouped, eng = run(batch, group=True)
    assert [comparable(r) for r in grouped] == [comparable(r) for r in alone]
    assert single.requests == len(batch) and single.grouped == 0
    keys = [pool_key(EMBEDDINGS, dict(b, model="m")) for b in batch]
    ok = [k for k, b in zip(keys, batch, strict=True) if k is not None
          and not (isinstance(b["input"], str) and BAD in b["input"])
          and b.get("dimensions") != 99]
    # the items of a key that two or more share travel grouped, unless one of them is bad
    shared = {k for k in ok if ok.count(k) > 1 and keys.count(k) == ok.count(k)}
    assert eng.grouped == sum(ok.count(k) for k in shared)


def test_items_that_differ_only_in_their_input_travel_as_one_request() -> None:
    server = FakeVllm()
    batch = [{"model": "m", "input": f"{WORDS[i % 5]} {i}"} for i in range(10)]
    res, eng = run(batch, group=True, server=server)
    assert eng.requests == 1 and eng.grouped == 10
    assert server.bodies[0]["input"] == [b["input"] for b in batch]
    ids = {json.loads(r.body)["id"] for r in res}
    assert len(ids) == 10  # one id per item: the group's with -<i>
    for i, r in enumerate(res):
        body = json.loads(r.body)
        assert [d["index"] for d in body["data"]] == [0]
        own = len(batch[i]["input"].split()) + 1
        assert r.prompt_tokens == body["usage"]["prompt_tokens"] == own
        assert body["usage"]["total_tokens"] == r.prompt_tokens


def test_one_bad_input_sends_its_group_item_by_item() -> None:
    batch = [{"model": "m", "input": w} for w in WORDS] + [{"model": "m", "input": BAD}]
    res, eng = run(batch, group=True)
    assert eng.requests == 1 + len(batch) and eng.grouped == 0
    assert [r.status for r in res] == [0] * len(WORDS) + [400]
    assert res[-1].finish_reason == "error" and "maximum context length" in (res[-1].error or "")


def test_counts_that_are_not_the_servers_send_texts_one_by_one_from_then_on() -> None:
    counter = WordCounter(skew=1)
    batch = [{"model": "m", "input": w} for w in WORDS]
    grouped, eng = run(batch, group=True, counter=counter)
    alone, _ = run(batch, group=False)
    assert [comparable(r) for r in grouped] == [comparable(r) for r in alone]
    assert eng.grouped == 0 and eng.requests == 1 + len(batch)
    assert eng._counter is None  # the engine stopped trusting the counter


def test_a_list_input_is_a_group_of_its_own_and_token_ids_group_without_a_counter() -> None:
    server = FakeVllm()
    batch = [{"model": "m", "input": ["a b", "c"]}, {"model": "m", "input": [1, 2, 3]},
             {"model": "m", "input": [4, 5]}, {"model": "m", "input": "the broker"}]

    async def go() -> OpenAIEngine:
        eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=512,
                           max_input_len=100, transport=httpx.MockTransport(server),
                           scrape_metrics=False)  # no counter: texts travel alone
        work = Work(id=1, model="m", signature=1, lane=0, epoch=1, pad_to=8, max_tokens=1,
                    max_input_len=100, items=[item(i, b) for i, b in enumerate(batch)])
        await eng.run(work)
        await eng.close()
        return eng
    eng = asyncio.run(go())
    assert eng.grouped == 2 and eng.requests == 3
    assert sorted(map(str, (b["input"] for b in server.bodies))) == sorted(
        ["['a b', 'c']", "[[1, 2, 3], [4, 5]]", "the broker"])


def test_groups_are_cut_at_their_caps() -> None:
    keys: list[bytes | None] = [b"k"] * (GROUP_INPUTS + 6) + [b"j", None, b"j"]
    counts: list[int | None] = [1] * len(keys)
    groups, alone = plan_groups(keys, counts, GROUP_INPUTS, 10**6)
    assert [len(g) for g in groups] == [GROUP_INPUTS, 6, 2]
    assert alone == [GROUP_INPUTS + 7]
    groups, alone = plan_groups([b"k"] * 5, [4, 4, 4, 4, 4], 64, 8)
    assert groups == [[0, 1], [2, 3]] and alone == [4]
    assert plan_groups([b"k", b"k"], [3, None], 64, 8) == ([], [0, 1])


def test_an_answer_that_does_not_split_says_why() -> None:
    body = {"id": "embd-1", "object": "list", "created": 0, "model": "m",
            "data": [{"index": 0, "object": "embedding", "embedding": [0.5]}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    assert "1 vectors" in split_answer(json.dumps(body).encode(), [1, 2]).why
    assert "usage" in split_answer(json.dumps(body).encode(), [2]).why
    assert split_answer(b"[]", [3]).why
    ok = split_answer(json.dumps(body).encode(), [3])
    assert not ok.why and json.loads(ok.bodies[0])["id"] == "embd-1-0"
