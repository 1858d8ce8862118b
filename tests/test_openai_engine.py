"""OpenAIEngine against httpx.MockTransport: request shape, retries, isolation, accounting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, Prewarm, Work
from fabricctl.engines.metrics import counter_delta, parse_metrics
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.errors import EngineError

PREFIX = ["You are terse. ", "Q: 1+1 A: 2. "]


def item(i: int, prompt: str = "", tokens: int = 10) -> Item:
    p = Payload(components=PREFIX, prompt=prompt or f"question {i}?",
                component_tokens=[4, 6], prompt_tokens=3)
    return Item(id=f"q{i}", model="m", signature=7, input_tokens=tokens, max_tokens=4,
                payload=encode_payload(p))


def work(items: list[Item], max_input_len: int = 100) -> Work:
    return Work(id=1, model="m", signature=7, lane=0, epoch=1, pad_to=16, max_tokens=4,
                max_input_len=max_input_len, items=items)


def completion(prompt: str, reason: str = "length", cached: int = 0, tokens: int = 4,
               n: int = 1) -> dict:
    """A vLLM /v1/completions answer to one prompt."""
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": j, "text": f"out:{prompt[-12:]}", "logprobs": None,
                         "finish_reason": reason, "stop_reason": None} for j in range(n)],
            "usage": {"prompt_tokens": 10, "completion_tokens": tokens * n,
                      "total_tokens": 10 + tokens * n,
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


async def test_one_request_per_item_with_its_own_body() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"], cached=3)))
    eng = engine(rec)
    res = await eng.run(work([item(0), item(1)]))
    assert len(rec.bodies) == 2
    # nothing added: no temperature, no ignore_eos, the item's own max_tokens
    assert sorted(rec.bodies, key=lambda b: b["prompt"]) == [
        {"model": "m", "prompt": "".join(PREFIX) + f"question {i}?", "max_tokens": 4}
        for i in (0, 1)]
    assert [r.id for r in res] == ["q0", "q1"]
    assert all(r.finish_reason == "length" and r.tokens_out == 4 for r in res)
    assert all(r.cached_tokens == 3 and r.prompt_tokens == 10 for r in res)  # vLLM's usage
    assert all(r.body == b"" for r in res)  # a native item keeps no body of one choice
    assert eng.stats().batches == 1 and eng.stats().items == 2
    await eng.close()


def body_item(i: int, body: dict, chat: bool = False, source: int = 0,
              max_tokens: int = 4) -> Item:
    p = Payload(components=PREFIX, prompt=f"question {i}?", component_tokens=[4, 6],
                prompt_tokens=3, chat=chat, body=json.dumps(body).encode())
    return Item(id=f"q{i}", model="m", signature=7, input_tokens=10, max_tokens=max_tokens,
                payload=encode_payload(p), source=source)


async def test_items_of_one_batch_keep_their_own_params() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    items = [body_item(0, {"max_tokens": 5, "seed": 1, "stop": ["."]}),
             body_item(1, {"max_tokens": 40, "temperature": 0.9, "weird_field": [1]})]
    await engine(rec).run(work(items))
    got = {b["max_tokens"]: {k: v for k, v in b.items() if k != "prompt"} for b in rec.bodies}
    assert got == {5: {"model": "m", "max_tokens": 5, "seed": 1, "stop": ["."]},
                   40: {"model": "m", "max_tokens": 40, "temperature": 0.9,
                        "weird_field": [1]}}


async def test_chat_items_go_to_the_chat_endpoint_as_written() -> None:
    seen: list[tuple[str, dict]] = []
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                           "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
              "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13,
                        "prompt_tokens_details": None}}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, content=json.dumps(answer, indent=2).encode())

    eng = engine(handler)
    [res] = await eng.run(work([body_item(0, {"messages": messages, "max_tokens": 3},
                                          chat=True, source=2)]))
    assert seen == [("/v1/chat/completions",
                     {"messages": messages, "max_tokens": 3, "model": "m"})]
    assert (res.text, res.finish_reason, res.tokens_out, res.prompt_tokens) == ("hi", "stop",
                                                                                  1, 12)
    assert res.cached_tokens is None
    # an OpenAI batch item keeps the body as sent, on one line
    assert b"\n" not in res.body and json.loads(res.body) == answer


async def test_n_choices_and_logprobs_keep_the_body_of_a_native_item() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"], n=2)))
    [res] = await engine(rec).run(work([body_item(0, {"max_tokens": 4, "n": 2})]))
    assert res.tokens_out == 8 and len(json.loads(res.body)["choices"]) == 2


async def test_length_exceeded_is_not_sent() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    eng = engine(rec)
    res = await eng.run(work([item(0), item(1, tokens=500), item(2)], max_input_len=100))
    assert [r.id for r in res] == ["q0", "q1", "q2"]
    assert res[1].finish_reason == "length_exceeded" and res[1].text == ""
    assert len(rec.bodies) == 2
    # A batch of only oversized items sends nothing at all.
    res = await eng.run(work([item(3, tokens=500)], max_input_len=100))
    assert res[0].finish_reason == "length_exceeded" and len(rec.bodies) == 2


async def test_retries_500_then_succeeds() -> None:
    def respond(b: dict, n: int) -> httpx.Response:
        if n < 3:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return httpx.Response(200, json=completion(b["prompt"]))

    rec = Recorder(respond)
    res = await engine(rec, attempts=3).run(work([item(0)]))
    assert len(rec.bodies) == 3 and [r.finish_reason for r in res] == ["length"]


async def test_retries_exhausted_raise() -> None:
    rec = Recorder(lambda b, n: httpx.Response(503, text="down"))
    with pytest.raises(EngineError, match="503"):
        await engine(rec, attempts=2).run(work([item(0)]))
    assert len(rec.bodies) == 2


async def test_the_window_bounds_requests_in_flight() -> None:
    in_flight = peak = 0
    gate = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if peak >= 3:
            gate.set()
        await gate.wait()
        in_flight -= 1
        return httpx.Response(200, json=completion(json.loads(request.content)["prompt"]))

    eng = engine(handler, window=3)
    res = await eng.run(work([item(i) for i in range(8)]))
    assert len(res) == 8 and peak == 3
    assert engine(handler).window == 24  # default: three batches of the max batch size (8)


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


async def test_4xx_is_that_items_error_and_the_batch_goes_on() -> None:
    refusal = {"error": {"message": "temperature must be non-negative", "type":
                         "BadRequestError", "param": None, "code": 400}}

    def respond(b: dict, n: int) -> httpx.Response:
        if "BAD" in b["prompt"]:
            return httpx.Response(400, json=refusal)
        return httpx.Response(200, json=completion(b["prompt"]))

    rec = Recorder(respond)
    res = await engine(rec).run(work([item(0), item(1, prompt="BAD"), item(2)]))
    assert [r.id for r in res] == ["q0", "q1", "q2"]
    assert res[1].finish_reason == "error" and res[1].status == 400
    assert res[1].error == "HTTP 400: temperature must be non-negative"
    assert json.loads(res[1].body) == refusal
    assert res[0].finish_reason == res[2].finish_reason == "length"
    assert res[0].error is None
    assert len(rec.bodies) == 3  # each once: a refusal is not retried


async def test_abort_is_retried() -> None:
    def respond(b: dict, n: int) -> httpx.Response:
        aborted = n == 1
        return httpx.Response(200, json=completion(b["prompt"], "abort" if aborted else "length"))

    rec = Recorder(respond)
    eng = engine(rec)
    res = await eng.run(work([item(1)]))
    assert [r.finish_reason for r in res] == ["length"]
    assert len(rec.bodies) == 2 and rec.bodies[0] == rec.bodies[1]
    assert res[0].text.startswith("out:")


async def test_abort_forever_is_the_items_abort() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"], "abort")))
    res = await engine(rec, attempts=2).run(work([item(0), item(1)]))
    assert [r.finish_reason for r in res] == ["abort", "abort"]  # the consumer isolates them
    assert len(rec.bodies) == 4


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
    scrapes = iter([(100, 0, 1.0), (160, 32, 1.0),  # the baseline, batch 1: +60 / +32
                    (40, 10, 1.0),  # batch 2: counter went down: reset
                    (90, 20, 2.0)])  # batch 3: new start time: reset

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            q, h, t = next(scrapes)
            return httpx.Response(200, text=METRICS.format(q=q, h=h, t=t))
        body = json.loads(request.content)
        return httpx.Response(200, json=completion(body["prompt"]))

    eng = engine(handler, scrape_metrics=True)
    await eng.run(work([item(0), item(1)]))
    await eng.run(work([item(0)]))
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
    assert rec.bodies == [{"model": "m", "prompt": "".join(PREFIX), "max_tokens": 1}]
    await eng.prewarm(Prewarm(model="m", signature=7, label="x", epoch=2, lanes=[]))
    assert len(rec.bodies) == 1  # no sample: nothing to warm


async def test_limits_and_unreadable_payload() -> None:
    rec = Recorder(lambda b, n: httpx.Response(200, json=completion(b["prompt"])))
    eng = engine(rec)
    assert eng.limits().max_batch_size == 8 and eng.limits().max_input_len == 100
    bad = Item(id="x", model="m", signature=7, input_tokens=5, max_tokens=4, payload=b"\xc1")
    res = await eng.run(work([bad, item(1)]))
    assert res[0].finish_reason == "error" and res[1].finish_reason == "length"


async def test_scrapes_go_one_at_a_time_so_counters_never_read_backwards() -> None:
    """The server reads its counters when it handles a scrape, not when it was sent. Two
    in flight (a batch's and another's) could read them in the reverse order: a lower
    value folded after a higher one reads as a restart and counts everything again (seen
    on the real vLLM: the run's hit rate above the achievable)."""
    live = {"q": 100.0, "h": 40.0}
    entered: list[float] = []
    first_in, first_go = asyncio.Event(), asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        entered.append(live["q"])
        if len(entered) == 2:  # the first scrape after the baseline is slow to be handled
            first_in.set()
            await first_go.wait()
        return httpx.Response(200, text=METRICS.format(q=live["q"], h=live["h"], t=1.0))

    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(handler),
                       scrape_metrics=True)
    assert await eng.scrape() is not None  # the baseline: 100 / 40
    live.update(q=150.0, h=60.0)
    slow = asyncio.ensure_future(eng.scrape())
    await first_in.wait()
    second = asyncio.ensure_future(eng.scrape())
    for _ in range(50):  # every chance to be sent, without a clock
        await asyncio.sleep(0)
    assert len(entered) == 2, entered  # not sent while the other is in flight
    live.update(q=160.0, h=70.0)
    first_go.set()
    assert await slow is not None and await second is not None
    assert len(entered) == 3
    st = eng.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (160 - 100, 70 - 40)


async def test_prewarm_of_a_chat_shape_sends_its_shared_messages() -> None:
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": ""},
                                                      "finish_reason": "length"}]})

    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    sample = body_item(0, {"messages": messages, "tools": tools, "max_tokens": 9}, chat=True)
    await engine(handler).prewarm(Prewarm(model="m", signature=7, label="x", epoch=1,
                                           lanes=[], sample=sample))
    assert seen == [("/v1/chat/completions", {"model": "m", "messages": messages[:1],
                                              "max_tokens": 1, "tools": tools})]
