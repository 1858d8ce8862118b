"""An Engine for any OpenAI-compatible server (vLLM first of all): one request per item.

Contract (on top of `fabricctl.engines.base.Engine`):
- `run(work)` sends every item of the batch as its own request, concurrently, on its own
  endpoint with the body its producer wrote (`fabricctl.engines.request.request_of`): the
  engine sets `model` to the served name (the batch's own when it is one of the other names
  the server answers: its LoRA adapters, `names`, configured or learnt from the server's
  /v1/models by `learn_names`) and adds nothing. Requests in flight are bounded by
  one window per engine (`window`, FIFO, shared by every batch the consumer has in hand),
  so a later batch's requests queue behind an earlier one's: each holds one of the window's
  kept-alive HTTP/1.1 connections while it is sent (`fabricctl.engines.pool.Connections`);
  /metrics and pre-warms go on a small client of their own. It returns one ItemResult per
  item, in order. Items with `input_tokens > work.max_input_len` are not sent and get an
  empty result with finish_reason "length_exceeded" (not embeddings, score or rerank
  requests, whose several inputs are sequences of their own: vLLM refuses a too-long one
  with a 400, that item's result); an unreadable payload gets an "error" result.
- Grouped embeddings (`group_pooling`, on by default; `fabricctl.engines.pooled`): items of
  the batch whose `/v1/embeddings` bodies differ only in their one input (a text counted by
  `counter`, the served model's tokenizer, or token ids) travel as one request with an
  input list, one window slot, and each gets the body its own request would have got
  (`split_answer`). A refusal of the group (4xx, 501: one bad input refuses the list) or an
  answer that does not split (its usage is not the counted sum; texts then travel alone for
  the engine's life) sends the group's items one by one, each with its own outcome.
- A 200 answer: text and finish_reason of choice 0 (`text`, or `message.content` for chat),
  vLLM's `usage` (prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens),
  and the body as the server sent it, kept for OpenAI-batch items (their output line
  carries it) and for native items whose answer has several choices or logprobs; an
  embeddings, score, rerank or responses answer is read as `read_answer` says, its body
  always kept.
- A 4xx (not 408/429) and a 501 (vLLM's "The model does not support ... API") are that
  item's error result: the server's message in `error`, its status in `status`, its error
  body in `body`; the batch goes on.
- Connection errors, timeouts, 408/429 and other 5xx are retried with exponential backoff
  (`attempts` in all), then `EngineError` for the batch. An answer whose choices have
  finish_reason "abort" (the server is shutting down) is resent; still aborted after
  `attempts`, the item's result has finish_reason "abort" (the consumer isolates it).
- Cache accounting: `/metrics` is scraped after each batch (and once before the first), one
  scrape at a time (the server reads its counters when it answers);
  `vllm:prefix_cache_{queries,hits}_total` deltas accumulate into `stats()` (a decrease, or a
  new `process_start_time_seconds`, is a restart: the new value is the delta). Block size is
  read once from `vllm:cache_config_info{block_size=...}`. A server without /metrics (404)
  is simply not scraped again.
- `prewarm(signal)` sends the sample item's shared prefix with `max_tokens 1`: its
  components joined to /v1/completions, or for a chat shape its messages but the last to
  /v1/chat/completions (tools included); best effort; nothing for an embeddings, score,
  rerank or responses shape (`fabricctl.engines.request.prewarm_request`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from fabricctl.core.payload import decode_payload
from fabricctl.core.types import ItemResult, Prewarm, Work
from fabricctl.engines.base import WINDOW_BATCHES, EngineLimits, EngineStats
from fabricctl.engines.pool import Connections
from fabricctl.engines.pooled import InputCounter, Send, plan_sends, split_answer
from fabricctl.engines.request import (
    ABORT,
    POOLING_PATHS,
    error_message,
    prewarm_request,
    read_answer,
    request_of,
)
from fabricctl.errors import EngineError, WorkloadError

log = logging.getLogger(__name__)

COUNTERS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}
RETRYABLE_STATUS = frozenset({408, 429})
NOT_IMPLEMENTED = 501  # vLLM: "The model does not support <X> API", never worth a retry


class MetricsSample(msgspec.Struct):
    """One scrape of a server's /metrics, reduced to what cache accounting needs."""

    counters: dict[str, float]  # EngineStats field name -> value summed over label sets
    block_size: int | None = None
    start_time: float | None = None


def parse_metrics(text: str) -> MetricsSample:
    """Parse Prometheus text into the counters fabricctl tracks (unknown series ignored)."""
    counters = dict.fromkeys(COUNTERS.values(), 0.0)
    sample = MetricsSample(counters=counters)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in COUNTERS:
                counters[COUNTERS[s.name]] += s.value
            elif s.name == "vllm:cache_config_info" and s.labels.get("block_size"):
                sample.block_size = int(s.labels["block_size"])
            elif s.name == "process_start_time_seconds":
                sample.start_time = s.value
    return sample


def counter_delta(prev: float | None, cur: float) -> float:
    """Increase of a counter since `prev`; a decrease means it was reset (restart)."""
    if prev is None:
        return 0.0
    return cur - prev if cur >= prev else cur


class _Rejected(Exception):
    """The server refused a request with a non-retryable 4xx."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _error_message(resp: httpx.Response) -> str:
    return error_message(resp.content)


class OpenAIEngine:
    """Why: one client for vLLM and any other OpenAI-compatible server a fleet may run."""

    simulated = False

    def __init__(self, base_url: str, model: str, *, max_batch_size: int,
                 max_batch_tokens: int, max_input_len: int, name: str = "openai",
                 transport: httpx.AsyncBaseTransport | None = None, timeout_s: float = 120.0,
                 attempts: int = 4, backoff_s: float = 0.5, backoff_max_s: float = 8.0,
                 scrape_metrics: bool = True, api_key: str | None = None,
                 window: int = 0, group_pooling: bool = True,
                 counter: InputCounter | None = None,
                 names: Sequence[str] | None = None) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = model
        # the other names the server answers (its LoRA adapters); None: `learn_names` asks it
        self._learn = names is None
        self._limits = EngineLimits(max_batch_size, max_batch_tokens, max_input_len,
                                    tuple(n for n in names or () if n != model))
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        # requests in flight at once; 0: the consumer's default window
        self.window = window if window > 0 else WINDOW_BATCHES * max(1, max_batch_size)
        self.requests = 0  # requests answered (any status), for tests and benches
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._conns = Connections(self.base_url, self.window, timeout_s=timeout_s,
                                  headers=headers, transport=transport)
        self._client = self._conns.side  # /metrics and pre-warms
        self._stats = EngineStats(simulated=False)
        self._scrape_ok = scrape_metrics
        self._last: dict[str, float] = {}
        # one scrape at a time: the server reads its counters when it handles a scrape, so
        # two in flight can read them in either order, and a lower one folded after a
        # higher would read as a restart and count everything again
        self._scraping = asyncio.Lock()
        self._start_time: float | None = None
        self.group_pooling = group_pooling
        self._counter = counter  # None: texts are not grouped (token ids still are)
        self.grouped = 0  # items answered through a grouped request, for tests and benches

    def limits(self) -> EngineLimits:
        return self._limits

    def served(self, model: str) -> str:
        """The name a request for `model` goes out under: its own when the server answers
        it (an adapter), else the served model's."""
        return model if model in self._limits.names else self.model

    async def learn_names(self) -> tuple[str, ...]:
        """The names the server answers besides the model's, from its /v1/models (vLLM
        lists the base model and every LoRA adapter); asked until one answer is read, and
        not at all when the names were configured. A server that cannot say keeps ()."""
        if not self._learn:
            return self._limits.names
        try:
            r = await self._client.get("/v1/models", timeout=10.0)
            data = r.json().get("data") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            log.warning("%s: /v1/models unreadable (%s): serving %r only", self.name, e,
                        self.model)
            return self._limits.names
        if not isinstance(data, list):
            return self._limits.names
        ids = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]
        names = tuple(dict.fromkeys(n for n in ids if n != self.model))
        self._limits = msgspec.structs.replace(self._limits, names=names)
        self._learn = False
        return names

    def stats(self) -> EngineStats:
        return msgspec.structs.replace(self._stats)

    async def close(self) -> None:
        await self._conns.aclose()

    # -- HTTP ---------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * (2**attempt), self.backoff_max_s)

    async def _post(self, path: str, body: dict[str, Any],
                    client: httpx.AsyncClient | None = None) -> httpx.Response:
        """POST on `client` (default: the side client), retrying transient failures; any
        answer that is not one comes back."""
        last = ""
        unreachable = False
        client = client or self._client
        for attempt in range(self.attempts):
            unreachable = True
            try:
                resp = await client.post(path, json=body)
            except httpx.TimeoutException:
                last = f"timed out after {self.timeout_s} s"
            except httpx.TransportError as e:
                last = f"connection error: {e!r}"
            else:
                unreachable = False
                self.requests += 1
                status = resp.status_code
                if status == NOT_IMPLEMENTED or (status < 500
                                                 and status not in RETRYABLE_STATUS):
                    return resp
                last = f"HTTP {resp.status_code}: {_error_message(resp)}"
            if attempt + 1 < self.attempts:
                log.debug("%s: %s; retry %d", self.base_url, last, attempt + 1)
                await asyncio.sleep(self._backoff(attempt))
        raise EngineError(f"{self.base_url}: {last} (after {self.attempts} attempts)",
                          unreachable=unreachable)

    async def _request(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST and decode a 2xx answer; _Rejected on a 4xx."""
        resp = await self._post(path, body)
        if resp.status_code >= 400:
            raise _Rejected(resp.status_code, _error_message(resp))
        try:
            return resp.json()
        except ValueError:
            raise EngineError(f"{self.base_url}: HTTP {resp.status_code} with a body that "
                              "is not JSON") from None

    async def _one(self, path: str, body: dict[str, Any], keep_body: bool) -> ItemResult:
        """One item's request, resent while its answer is aborted; result id left blank."""
        async with self._conns.slot() as client:
            res: ItemResult | None = None
            for attempt in range(self.attempts):
                resp = await self._post(path, body, client)
                res = read_answer(resp.status_code, resp.content, keep_body, path)
                if res is None:
                    raise EngineError(f"{self.base_url}: HTTP {resp.status_code} with a body "
                                      f"that is not an answer of {path}")
                if res.finish_reason != ABORT:
                    return res
                if attempt + 1 < self.attempts:
                    await asyncio.sleep(self._backoff(attempt))
            assert res is not None  # attempts >= 1
            return res

    # -- metrics ------------------------------------------------------------------------

    async def scrape(self) -> MetricsSample | None:
        """Scrape /metrics and fold counter increases into stats(); None when unavailable."""
        if not self._scrape_ok:
            return None
        async with self._scraping:
            return await self._scrape_one()

    async def _scrape_one(self) -> MetricsSample | None:
        try:
            resp = await self._client.get("/metrics")
            if resp.status_code == 404:
                self._scrape_ok = False
                return None
            resp.raise_for_status()
            sample = parse_metrics(resp.text)
        except (httpx.HTTPError, ValueError) as e:
            log.debug("%s: metrics scrape failed: %r", self.base_url, e)
            return None
        restarted = (self._start_time is not None and sample.start_time is not None
                     and sample.start_time != self._start_time)
        if sample.start_time is not None:
            self._start_time = sample.start_time
        for field, cur in sample.counters.items():
            prev = self._last.get(field)
            delta = cur if restarted and prev is not None else counter_delta(prev, cur)
            setattr(self._stats, field, getattr(self._stats, field) + int(delta))
            self._last[field] = cur
        if not self._stats.block_size and sample.block_size:
            self._stats.block_size = sample.block_size
        return sample

    # -- Engine -------------------------------------------------------------------------

    async def run(self, work: Work) -> list[ItemResult]:
        t0 = time.monotonic()
        results: list[ItemResult | None] = [None] * len(work.items)
        sends: list[Send] = []
        for i, item in enumerate(work.items):
            try:
                path, body, keep = request_of(item, decode_payload(item.payload),
                                              self.served(work.model))
            except (msgspec.MsgspecError, ValueError, WorkloadError) as e:
                results[i] = ItemResult(id=item.id, finish_reason="error",
                                        error=f"unreadable payload: {e}")
                continue
            # a pooling request's inputs are sequences of their own: vLLM checks each
            if item.input_tokens > work.max_input_len and path not in POOLING_PATHS:
                results[i] = ItemResult(id=item.id, finish_reason="length_exceeded")
                continue
            sends.append(Send(i, path, body, keep))
        if sends:
            if not self._last:  # no baseline yet: without one this batch goes uncounted
                await self.scrape()
            groups, alone = self._plan(sends)
            order = alone + [s for g in groups for s in g]
            calls = [self._single(s) for s in alone] + [self._group(g) for g in groups]
            done = await asyncio.gather(*calls, return_exceptions=True)
            failed = next((r for r in done if isinstance(r, BaseException)), None)
            if failed is not None:  # the server is down or broken: the batch goes back
                raise failed
            await self.scrape()
            answers = [res for batch in done for res in batch]  # type: ignore[union-attr]
            for s, res in zip(order, answers, strict=True):
                res.id = work.items[s.index].id
                results[s.index] = res
        self._stats.batches += 1
        self._stats.items += len(work.items)
        self._stats.busy_s += time.monotonic() - t0
        return [r for r in results if r is not None]

    def _plan(self, sends: list[Send]) -> tuple[list[list[Send]], list[Send]]:
        """(groups that travel as one request, the items that travel alone)."""
        return plan_sends(sends, self._counter) if self.group_pooling else ([], sends)

    async def _single(self, s: Send) -> list[ItemResult]:
        return [await self._one(s.path, s.body, s.keep)]

    async def _group(self, group: list[Send]) -> list[ItemResult]:
        """The group's inputs as one request, its answer split back; item by item when the
        server refuses the list or its answer does not split (see the module contract)."""
        first = group[0]
        body = dict(first.body, input=[s.body["input"] for s in group])
        counts = [s.count or 0 for s in group]
        async with self._conns.slot() as client:
            resp = await self._post(first.path, body, client)
        if resp.status_code < 400:
            split = split_answer(resp.content, counts)
            out = [r for b in split.bodies
                   if (r := read_answer(200, b, True, first.path)) is not None]
            if not split.why and len(out) == len(group):
                self.grouped += len(out)
                return out
            log.warning("%s: a grouped embeddings answer does not split (%s): its %d items "
                        "go one by one%s", self.base_url, split.why or "unreadable",
                        len(group), "; texts from now on too"
                        if isinstance(first.body["input"], str) else "")
            if isinstance(first.body["input"], str):
                self._counter = None  # its counts are not the server's
        answers = await asyncio.gather(*(self._one(s.path, s.body, s.keep) for s in group))
        return list(answers)

    async def prewarm(self, signal: Prewarm) -> None:
        if signal.sample is None:
            return
        try:
            req = prewarm_request(decode_payload(signal.sample.payload),
                                  self.served(signal.model))
        except (msgspec.MsgspecError, ValueError) as e:
            log.warning("%s: prewarm sample has an unreadable payload: %s", self.name, e)
            return
        if req is None:
            return
        if not self._last:  # no baseline yet: without one this request's tokens go uncounted
            await self.scrape()
        try:
            await self._request(*req)
        except (EngineError, _Rejected) as e:
            log.warning("%s: prewarm of shape %x failed: %s", self.name, signal.signature, e)
            return
        await self.scrape()
