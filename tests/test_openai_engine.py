"""OpenAIEngine against httpx.MockTransport: request shape, retries, isolation, accounting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, Prewarm, Work
from fabricctl.engines.base import EngineError
from fabricctl.engines.openai import OpenAIEngine, counter_delta, parse_metrics

PREFIX = ["You are terse. ", "Q: 1+1 A: 2. "]


def item(i: int, prompt: str = "", tokens: int = 10) -> Item:
    p = Payload(components=PREFIX, prompt=prompt or f"question {i}?",
                component_tokens=[4, 6], prompt_tokens=3)
    return Item(id=f"q{i}", model="m", signature=7, input_tokens=tokens, max_tokens=4,
                payload=encode_payload(p))


def work(items: list[Item], max_input_len: int = 100) -> Work:
    return Work(id=1, model="m", signature=7, lane=0, epoch=1, pad_to=16, max_tokens=4,
                max_input_len=max_input_len, items=items)


def completion(prompts: list[str] | str, reason: str = "length", cached: int = 0) -> dict:
    prompts = [prompts] if isinstance(prompts, str) else prompts
    return {"choices": [{"index": i, "text": f"out:{p[-12:]}", "finish_reason": reason}
                        for i, p in enumerate(prompts)],
            "usage": {"prompt_tokens": 10 * len(prompts), "completion_tokens": 4 * len(prompts),
                      "prompt_tokens_details": {"cached_tokens": cached}}}


METRICS = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="32",enable_prefix_caching="True",engine="0"}} 1.0
# TYPE process_start_time_seconds gauge
process_start_time_seconds {t}
"""

Handler = Callable[[httpx.Request], httpx.Response]


def engine(handler: Handler, **kw) -> OpenAIEngine:
    kw.setdefault("attempts", 3)
    return OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                        max_input_len=100, transport=httpx.MockTransport(handler),
                        backoff_s=0.001, scrape_metrics=kw.pop("scrape_metrics", False), **kw)


class Recorder:
    """Keeps every completion request body; answers with `respond(body, n)`."""

    def __init__(self, respond: Callable[[dict, int], httpx.Response]) -> None:
        self.bodies: list[dict] = []
        self.respond = respond

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        self.bodies.append(body)
        return self.respond(body, len(self.bodies))


async def test_request_body_shape_and_results() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    eng = engine(rec)
    res = await eng.run(work([item(0), item(1)]))
    assert len(rec.bodies) == 1
    body = rec.bodies[0]
    assert body["model"] == "m" and body["max_tokens"] == 4
    assert body["temperature"] == 0 and body["ignore_eos"] is True
    assert body["prompt"] == ["".join(PREFIX) + "question 0?", "".join(PREFIX) + "question 1?"]
    assert [r.id for r in res] == ["q0", "q1"]
    assert all(r.finish_reason == "length" and r.tokens_out == 4 for r in res)
    assert all(r.cached_tokens is None for r in res)  # list request: not trustworthy
    assert eng.stats().batches == 1 and eng.stats().items == 2
    await eng.close()


async def test_single_prompt_keeps_cached_tokens() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"], cached=32)))
    eng = engine(rec)
    [res] = await eng.run(work([item(0)]))
    assert isinstance(rec.bodies[0]["prompt"], str)
    assert res.cached_tokens == 32 and res.tokens_out == 4


async def test_length_exceeded_is_not_sent() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    eng = engine(rec)
    res = await eng.run(work([item(0), item(1, tokens=500), item(2)], max_input_len=100))
    assert [r.id for r in res] == ["q0", "q1", "q2"]
    assert res[1].finish_reason == "length_exceeded" and res[1].text == ""
    assert len(rec.bodies[0]["prompt"]) == 2
    # A batch of only oversized items sends nothing at all.
    res = await eng.run(work([item(3, tokens=500)], max_input_len=100))
    assert res[0].finish_reason == "length_exceeded" and len(rec.bodies) == 1


async def test_retries_500_then_succeeds() -> None:
    def respond(b: dict, n: int) -> httpx.Response:
        if n < 3:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return httpx.Response(200, json=completion(b["prompt"]))

    rec = Recorder(respond)
    res = await engine(rec, attempts=3).run(work([item(0), item(1)]))
    assert len(rec.bodies) == 3 and [r.finish_reason for r in res] == ["length", "length"]


async def test_retries_exhausted_raise() -> None:
    rec = Recorder(lambda b, n: httpx.Response(503, text="down"))
    with pytest.raises(EngineError, match="503"):
        await engine(rec, attempts=2).run(work([item(0)]))
    assert len(rec.bodies) == 2


async def test_connection_error_raises_engine_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(EngineError, match="connection error"):
        await engine(refuse, attempts=2).run(work([item(0)]))


async def test_timeout_raises_engine_error() -> None:
    calls = []

    def slow(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(EngineError, match="timed out"):
        await engine(slow, attempts=3, timeout_s=0.01).run(work([item(0)]))
    assert len(calls) == 3


async def test_4xx_isolates_the_bad_item() -> None:
    def respond(b: dict, n: int) -> httpx.Response:
        prompts = b["prompt"] if isinstance(b["prompt"], list) else [b["prompt"]]
        if any("BAD" in p for p in prompts):
            return httpx.Response(400, json={"error": {"message": "too long", "code": 400}})
        return httpx.Response(200, json=completion(b["prompt"]))

    rec = Recorder(respond)
    res = await engine(rec).run(work([item(0), item(1, prompt="BAD"), item(2)]))
    assert [r.id for r in res] == ["q0", "q1", "q2"]
    assert res[1].finish_reason == "error" and "too long" in (res[1].error or "")
    assert res[0].finish_reason == res[2].finish_reason == "length"
    assert res[0].error is None
    assert len(rec.bodies) == 4  # the list, then one request per item


async def test_abort_is_retried() -> None:
    def respond(b: dict, n: int) -> httpx.Response:
        data = completion(b["prompt"])
        if n == 1:
            data["choices"][1]["finish_reason"] = "abort"
        return httpx.Response(200, json=data)

    rec = Recorder(respond)
    res = await engine(rec).run(work([item(0), item(1), item(2)]))
    assert [r.finish_reason for r in res] == ["length"] * 3
    assert rec.bodies[1]["prompt"] == "".join(PREFIX) + "question 1?"  # only the aborted one
    assert res[1].text.startswith("out:")


async def test_abort_forever_raises() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"], "abort")))
    with pytest.raises(EngineError, match="aborted"):
        await engine(rec, attempts=2).run(work([item(0), item(1)]))


def test_parse_metrics_and_block_size() -> None:
    s = parse_metrics(METRICS.format(q=300.0, h=128.0, t=1.0))
    assert s.counters["prefix_cache_queries"] == 300 and s.counters["prefix_cache_hits"] == 128
    assert s.block_size == 32 and s.start_time == 1.0
    assert parse_metrics("").block_size is None


def test_counter_delta_reset() -> None:
    assert counter_delta(None, 50) == 0
    assert counter_delta(50, 80) == 30
    assert counter_delta(80, 20) == 20  # decreased: the server restarted


async def test_metrics_deltas_accumulate_with_reset() -> None:
    scrapes = iter([(100, 0, 1.0), (160, 32, 1.0),  # batch 1: +60 / +32
                    (160, 32, 1.0), (40, 10, 1.0),  # batch 2: counter went down: reset
                    (40, 10, 1.0), (90, 20, 2.0)])  # batch 3: new start time: reset

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            q, h, t = next(scrapes)
            return httpx.Response(200, text=METRICS.format(q=q, h=h, t=t))
        body = json.loads(request.content)
        return httpx.Response(200, json=completion(body["prompt"]))

    eng = engine(handler, scrape_metrics=True)
    await eng.run(work([item(0), item(1)]))
    assert eng.last_batch_cache == (60, 32)
    await eng.run(work([item(0)]))
    assert eng.last_batch_cache == (40, 10)
    await eng.run(work([item(0)]))
    st = eng.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (60 + 40 + 90, 32 + 10 + 20)
    assert st.block_size == 32 and not st.simulated


async def test_metrics_404_disables_scraping() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/metrics":
            return httpx.Response(404)
        return httpx.Response(200, json=completion(json.loads(request.content)["prompt"]))

    eng = engine(handler, scrape_metrics=True)
    await eng.run(work([item(0)]))
    await eng.run(work([item(1)]))
    assert paths.count("/metrics") == 1 and eng.stats().block_size == 0


async def test_prewarm_sends_prefix_with_one_token() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    eng = engine(rec)
    await eng.prewarm(Prewarm(model="m", signature=7, label="x", epoch=2, lanes=[(0, 16)],
                              sample=item(5)))
    assert rec.bodies == [{"model": "m", "prompt": "".join(PREFIX), "max_tokens": 1,
                           "temperature": 0.0, "ignore_eos": True}]
    await eng.prewarm(Prewarm(model="m", signature=7, label="x", epoch=2, lanes=[]))
    assert len(rec.bodies) == 1  # no sample: nothing to warm


async def test_limits_and_unreadable_payload() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    eng = engine(rec)
    assert eng.limits().max_batch_size == 8 and eng.limits().max_input_len == 100
    bad = Item(id="x", model="m", signature=7, input_tokens=5, max_tokens=4, payload=b"\xc1")
    res = await eng.run(work([bad, item(1)]))
    assert res[0].finish_reason == "error" and res[1].finish_reason == "length"


async def test_a_scrape_answered_after_a_later_one_is_not_counted_again() -> None:
    counters = [(100, 40), (150, 60), (160, 70)]  # in the order the scrapes are sent
    sent: list[int] = []
    older_arrived, older_may_answer = asyncio.Event(), asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        k = len(sent)
        sent.append(k)
        if k == 1:  # the second scrape sent is answered after the third
            older_arrived.set()
            await older_may_answer.wait()
        q, h = counters[k]
        return httpx.Response(200, text=METRICS.format(q=q, h=h, t=1.0))

    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(handler),
                       scrape_metrics=True)
    assert await eng.scrape() is not None  # the baseline
    older = asyncio.ensure_future(eng.scrape())
    await older_arrived.wait()
    assert await eng.scrape() is not None
    older_may_answer.set()
    assert await older is not None
    st = eng.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (160 - 100, 70 - 40)
