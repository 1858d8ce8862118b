"""Reliability against the real vLLM CPU servers (issue 10's engine faults, real engine).

It lives here, not in tests/reliability/, because it shares this directory's session
servers (a session fixture is visible only under its conftest's directory; a second pair of
vLLM servers would cost a minute and two cores). The scenario code and the checker are
tests/reliability's (rel_inproc.py, rel_history.py).

A fault-injecting transport sits between `OpenAIEngine` and one real server, as a proxy
would: it answers 500, drops the connection in the middle of a request (what a server
killed mid-batch looks like from the client), refuses connections for a while (a server
restarting), rewrites some choices of a real answer to finish_reason "abort", or answers
500 to every request carrying one poison prompt. A live broker (in this event loop) and
`Consumer`s drive it. Every item must end with exactly one result: vLLM's own, or, for the
poison item only, an error result saying it was quarantined.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

_TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_TESTS / "reliability"), str(_TESTS)]

from rel_history import History, check, make_item  # noqa: E402
from rel_inproc import Watched, live_broker, results, settled, submit, until  # noqa: E402

from fabricctl.core.payload import decode_payload  # noqa: E402
from fabricctl.engines.openai import OpenAIEngine  # noqa: E402
from fabricctl.formats.results import ResultRecord  # noqa: E402
from fabricctl.supervisor.launcher import Launcher  # noqa: E402

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]
MODEL = "tiny"
N = 40

Rule = Callable[[int, dict[str, object]], str | None]  # (request no., body) -> fault or None


class FaultProxy(httpx.AsyncBaseTransport):
    """Why: a real server that fails on cue, the way servers fail, without killing it."""

    def __init__(self, rule: Rule) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.rule = rule
        self.requests = 0
        self.faults: dict[str, int] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/completions":
            return await self.inner.handle_async_request(request)
        self.requests += 1
        body = json.loads(request.content)
        fault = self.rule(self.requests, body)
        if fault:
            self.faults[fault] = self.faults.get(fault, 0) + 1
        if fault == "refused":
            raise httpx.ConnectError("connection refused (the server is restarting)")
        if fault == "500":
            return httpx.Response(500, json={"error": {"message": "injected: internal error"}})
        if fault == "dropped":  # the server died with the request in hand
            await self.inner.handle_async_request(request)
            raise httpx.RemoteProtocolError("server disconnected without sending a response")
        resp = await self.inner.handle_async_request(request)
        if fault != "abort":
            return resp
        await resp.aread()
        data = json.loads(resp.content)
        for ch in data.get("choices", [])[::2]:
            ch["finish_reason"], ch["text"] = "abort", ""
        return httpx.Response(resp.status_code, json=data)

    async def aclose(self) -> None:
        await self.inner.aclose()


def tiny_items(n: int, tag: str) -> list:
    return [make_item(k, tag, model=MODEL) for k in range(n)]


async def run(tmp: Path, servers: Launcher, rules: list[Rule], items: list,
              setup: Callable[[list[Watched]], None] | None = None,
              **consumer_kw: object) -> tuple[History, list[tuple[int, ResultRecord]],
                                              list[Watched], list[FaultProxy]]:
    hist = History()
    proxies = [FaultProxy(r) for r in rules]
    engines = [OpenAIEngine(servers.servers[i].base_url, MODEL, max_batch_size=8,
                            max_batch_tokens=4096, max_input_len=4096, transport=p,
                            attempts=2, backoff_s=0.05, timeout_s=60.0, scrape_metrics=False)
               for i, p in enumerate(proxies)]
    stop = asyncio.Event()
    async with live_broker(tmp / "data") as server:
        consumers = [Watched(server.state.cfg.socket_path, f"vllm{i}", MODEL, e, gpu=i,
                             pull_wait_s=0.2, **consumer_kw)  # type: ignore[arg-type]
                     for i, e in enumerate(engines)]
        if setup is not None:
            setup(consumers)
        tasks = [asyncio.ensure_future(c.run(stop)) for c in consumers]
        try:
            await submit(server.state.cfg.socket_path, items, hist)
            await until(settled(server, len(items)), 180, "every item settled")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            for e in engines:
                await e.close()
        res = await results(server.state.cfg.socket_path)
        assert server.state.view.ledger.difference() == (0, 0)
    return hist, res, consumers, proxies


def answered(rec: ResultRecord) -> bool:
    """vLLM's own answer: it ran to max_tokens or stopped (a random model may emit EOS)."""
    return (rec.error is None and rec.finish_reason in ("length", "stop")
            and rec.completion_tokens > 0)


async def test_flaky_vllm_retried_items_never_lost(vllm_servers: Launcher, tmp_path: Path
                                                   ) -> None:
    script = {1: "500", 2: "dropped", 4: "abort", 6: "500", 7: "dropped", 9: "abort"}
    hist, res, consumers, proxies = await run(
        tmp_path, vllm_servers, [lambda n, _: script.get(n)], tiny_items(N, "flaky"))
    report = check(hist, res, text_ok=answered)
    assert report.clean(), str(report)
    assert set(proxies[0].faults) == {"500", "dropped", "abort"}, proxies[0].faults
    assert consumers[0].quarantined == 0


async def test_vllm_down_then_back_batches_fail_back(vllm_servers: Launcher, tmp_path: Path
                                                    ) -> None:
    down = {"now": True}  # connections refused until the consumer failed a batch back

    def back_up(consumers: list[Watched]) -> None:
        consumers[0].on_fail_back = lambda: down.update(now=False)

    hist, res, consumers, proxies = await run(
        tmp_path, vllm_servers, [lambda n, _: "refused" if down["now"] else None],
        tiny_items(16, "down"), setup=back_up)
    report = check(hist, res, text_ok=answered)
    assert report.clean(), str(report)
    assert proxies[0].faults["refused"] >= 3  # the batch, then each of its items alone
    assert consumers[0].failures == 1
    assert consumers[0].quarantined == 0


async def test_poison_prompt_quarantined_on_real_vllm(vllm_servers: Launcher, tmp_path: Path
                                                     ) -> None:
    items = tiny_items(N, "pz")
    poison = items[7]
    marker = decode_payload(poison.payload).prompt

    def rule(_: int, body: dict[str, object]) -> str | None:
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) else [prompt]
        return "500" if any(marker in str(p) for p in prompts) else None

    hist, res, consumers, _ = await run(tmp_path, vllm_servers, [rule, rule], items)
    errors = {rec.id: rec.error for _, rec in res if rec.error}
    report = check(hist, res, text_ok=lambda rec: answered(rec) or rec.id == poison.id)
    assert report.clean(), str(report)
    assert set(errors) == {poison.id}, errors
    assert str(errors[poison.id]).startswith("quarantined after 2 attempts: http"), errors
    assert "HTTP 500" in str(errors[poison.id])
    assert sum(c.quarantined for c in consumers) == 1
