"""An Engine for any OpenAI-compatible server (vLLM first of all): one request per item.

Contract (on top of `fabricctl.engines.base.Engine`):
- `run(work)` sends every item as its own request, concurrently, on its own endpoint with the
  body its producer wrote (`engines.request.request_of`), only `model` set to the served
  name (or the batch's own when the server answers it: `names`, or learnt by `learn_names`).
  One FIFO window per engine (`window`) bounds the requests in flight, each on a kept-alive
  connection (`engines.pool.Connections`). One ItemResult per item, in order; an item over
  `work.max_input_len` (not pooling) gets "length_exceeded", an unreadable payload "error".
- `group_pooling`: embeddings items differing only in their input go as one request
  (`engines.pooled`), resent one by one when the group is refused or does not split.
- A 200 is the item's answer (text, finish_reason, vLLM's `usage`, the body where kept); a
  4xx (not 408/429) or a 501 is the item's error result; connection errors, timeouts,
  408/429 and other 5xx are retried with backoff (`attempts`), then `EngineError` for the
  batch; "abort" answers are resent, still aborted they stay "abort".
- `stats()`: `vllm:prefix_cache_{queries,hits}_total` deltas scraped from `/metrics` after
  each batch (a restart counted), the block size from `vllm:cache_config_info`.
- `prewarm(signal)`: the shape's prefix with `max_tokens 1`, best effort (none for pooling).
- `shared_capacity`: a server shared with live traffic; the window follows its load
  (`engines.shared_server`), each body carries `batch_priority`.
The details of each: ARCHITECTURE.md, "The OpenAI engine".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec

from fabricctl.core.colocate import Colocation
from fabricctl.core.endpoints import MULTIPART_URLS
from fabricctl.core.payload import decode_payload
from fabricctl.core.types import ItemResult, Prewarm, Work
from fabricctl.engines.base import EngineLimits, EngineStats, request_window
from fabricctl.engines.metrics import MetricsSample, counter_delta, parse_metrics
from fabricctl.engines.pool import Connections
from fabricctl.engines.pooled import InputCounter, Send, plan_sends, split_answer
from fabricctl.engines.request import (
    ABORT,
    POOLING_PATHS,
    error_message,
    fetch_file,
    form_fields,
    prewarm_request,
    read_answer,
    request_of,
)
from fabricctl.engines.shared_server import LoadFollower
from fabricctl.errors import EngineError, WorkloadError

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429})
NOT_IMPLEMENTED = 501  # vLLM: "The model does not support <X> API", never worth a retry


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
                 names: Sequence[str] | None = None, shared_capacity: int | None = None,
                 batch_priority: int | None = None, live_target_s: float | None = None,
                 ) -> None:
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
        self.window = request_window(window, max_batch_size)
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
        # a shared server (its slots): the window follows its live load; bodies carry priority
        self.follower = (None if shared_capacity is None else LoadFollower(
            self.scrape, self._conns, Colocation(shared_capacity, max_window=self.window,
                                                 target_s=live_target_s),
            canary=self._canary if live_target_s else None))
        self.batch_priority = batch_priority
        self._refused_priority: int | None = None  # the batch priority a server refused

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
        shared = None if self.follower is None else self.follower.view()
        return msgspec.structs.replace(self._stats, shared=shared)

    async def close(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        await self._conns.aclose()

    # -- HTTP ---------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * (2**attempt), self.backoff_max_s)

    async def _post(self, path: str, body: dict[str, Any],
                    client: httpx.AsyncClient | None = None,
                    file: bytes | None = None) -> httpx.Response:
        """POST on `client` (default: the side client), retrying transient failures; any
        answer that is not one comes back. With `file`: multipart, the body as form fields."""
        last = ""
        unreachable = False
        client = client or self._client
        for attempt in range(self.attempts):
            unreachable = True
            try:
                resp = await (client.post(path, json=body) if file is None else client.post(
                    path, data=form_fields(body), files={"file": ("audio.bin", file)}))
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
            file = await fetch_file(body.get("file_url", ""), client) \
                if path in MULTIPART_URLS else None
            if isinstance(file, ItemResult):
                return file
            for attempt in range(self.attempts):
                resp = await self._post(path, body, client, file)
                if resp.status_code == 400 and self._priority_refused(body, resp.content):
                    body = {k: v for k, v in body.items() if k != "priority"}
                    resp = await self._post(path, body, client, file)
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

    def _priority_refused(self, body: dict[str, Any], content: bytes) -> bool:
        """Whether a 400 refused the batch `priority` this engine added (a server that does
        not schedule by priority may): then batch requests go without it from now on, said
        once, and the window alone keeps the live traffic's latency."""
        ours = self.batch_priority if self.batch_priority is not None else self._refused_priority
        if ours is None or body.get("priority") != ours or b"priority" not in content.lower():
            return False
        if self.batch_priority is not None:
            log.warning("%s refused the batch requests' priority (%s): they go without it; "
                        "start vLLM with --scheduling-policy priority to let live requests "
                        "go first", self.base_url, content[:200].decode(errors="replace"))
            self._refused_priority, self.batch_priority = self.batch_priority, None
        return True

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

    async def _canary(self) -> float | None:
        """Seconds to the first token of one tiny request at live priority (None: failed)."""
        body = {"model": self.model, "prompt": "ping", "max_tokens": 1, "stream": True,
                "priority": 0}
        t0 = time.monotonic()
        try:
            async with self._client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code >= 400:
                    return None
                async for _ in resp.aiter_bytes():
                    return time.monotonic() - t0
        except httpx.HTTPError as e:
            log.debug("%s: canary failed: %r", self.base_url, e)
        return None

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
            if self.batch_priority is not None:
                body.setdefault("priority", self.batch_priority)
            sends.append(Send(i, path, body, keep))
        if self.follower is not None:
            await self.follower.start()
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
