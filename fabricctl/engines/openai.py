"""An Engine for any OpenAI-compatible completions server (vLLM first of all).

Contract (on top of `fabricctl.engines.base.Engine`):
- `run(work)` sends ONE `POST /v1/completions` with the list of prompts of the items that fit
  (`Payload.text()` of each payload), `max_tokens = work.max_tokens`, `temperature 0` and
  `ignore_eos` (vLLM extension; off with `ignore_eos=False`). It returns one ItemResult per
  item in order. Items with `input_tokens > work.max_input_len` are not sent and get an empty
  result with finish_reason "length_exceeded"; an unreadable payload gets an "error" result.
- Connection errors, timeouts, 408/429 and 5xx are retried with exponential backoff
  (`attempts` in all), then `EngineError`. A 4xx for a list is retried one prompt at a time,
  so only the offending item gets an "error" result. Choices with finish_reason "abort"
  (server shutting down) are resent; still aborted after `attempts` -> `EngineError`.
- `cached_tokens` comes from `usage.prompt_tokens_details` only for single-prompt requests:
  for a list vLLM copies the LAST prompt's value, so list results carry None.
- Cache accounting: `/metrics` is scraped before and after each batch;
  `vllm:prefix_cache_{queries,hits}_total` deltas accumulate into `stats()` (a decrease, or a
  new `process_start_time_seconds`, is a restart: the new value is the delta). Block size is
  read once from `vllm:cache_config_info{block_size=...}`. A server without /metrics (404)
  is simply not scraped again.
- `prewarm(signal)` sends the sample item's components joined, `max_tokens 1`; best effort.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from fabricctl.core.payload import decode_payload
from fabricctl.core.types import ItemResult, Prewarm, Work
from fabricctl.engines.base import EngineError, EngineLimits, EngineStats

log = logging.getLogger(__name__)

COUNTERS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}
RETRYABLE_STATUS = frozenset({408, 429})


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


class Rejected(Exception):
    """The server refused a request with a non-retryable 4xx."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:300]
        if "message" in body:
            return str(body["message"])[:300]
    return str(body)[:300]


class OpenAIEngine:
    """Why: one client for vLLM and any other OpenAI-compatible server a fleet may run."""

    simulated = False

    def __init__(self, base_url: str, model: str, *, max_batch_size: int,
                 max_batch_tokens: int, max_input_len: int, name: str = "openai",
                 transport: httpx.AsyncBaseTransport | None = None, timeout_s: float = 120.0,
                 attempts: int = 4, backoff_s: float = 0.5, backoff_max_s: float = 8.0,
                 ignore_eos: bool = True, scrape_metrics: bool = True,
                 api_key: str | None = None, extra_body: dict[str, Any] | None = None) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._limits = EngineLimits(max_batch_size, max_batch_tokens, max_input_len)
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.ignore_eos = ignore_eos
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=self.base_url, transport=transport,
                                         timeout=timeout_s, headers=headers)
        self._stats = EngineStats(simulated=False)
        self._scrape_ok = scrape_metrics
        self._last: dict[str, float] = {}
        # scrapes overlap (a batch's and a pre-warm's); one answered after a later one must
        # not be folded in: its lower counters would read as a restart and count twice
        self._scrapes_sent = 0
        self._scrape_folded = 0
        self._start_time: float | None = None
        self.last_batch_cache: tuple[int, int] = (0, 0)  # (queries, hits) of the latest batch

    def limits(self) -> EngineLimits:
        return self._limits

    def stats(self) -> EngineStats:
        return msgspec.structs.replace(self._stats)

    async def close(self) -> None:
        await self._client.aclose()

    # -- HTTP ---------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * (2**attempt), self.backoff_max_s)

    async def _request(self, prompt: str | list[str], max_tokens: int) -> dict[str, Any]:
        """POST /v1/completions, retrying transient failures; Rejected on a 4xx."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt,
                                "max_tokens": max_tokens, "temperature": 0.0}
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra_body)
        last = ""
        for attempt in range(self.attempts):
            try:
                resp = await self._client.post("/v1/completions", json=body)
            except httpx.TimeoutException:
                last = f"timed out after {self.timeout_s} s"
            except httpx.TransportError as e:
                last = f"connection error: {e!r}"
            else:
                if resp.status_code < 400:
                    try:
                        return resp.json()
                    except ValueError:
                        last = f"HTTP {resp.status_code} with a body that is not JSON"
                elif resp.status_code >= 500 or resp.status_code in RETRYABLE_STATUS:
                    last = f"HTTP {resp.status_code}: {_error_message(resp)}"
                else:
                    raise Rejected(resp.status_code, _error_message(resp))
            if attempt + 1 < self.attempts:
                log.debug("%s: %s; retry %d", self.base_url, last, attempt + 1)
                await asyncio.sleep(self._backoff(attempt))
        raise EngineError(f"{self.base_url}: {last} (after {self.attempts} attempts)")

    async def _complete(self, prompts: list[str], max_tokens: int) -> list[ItemResult]:
        """Run prompts as one request; results (ids blank) in the prompts' order."""
        out: list[ItemResult | None] = [None] * len(prompts)
        todo = list(range(len(prompts)))
        for attempt in range(self.attempts):
            batch = [prompts[i] for i in todo]
            try:
                data = await self._request(batch[0] if len(batch) == 1 else batch, max_tokens)
            except Rejected as e:
                if len(todo) == 1:
                    out[todo[0]] = ItemResult(id="", finish_reason="error", error=str(e))
                else:  # find the bad item(s): one request per prompt
                    singles = await asyncio.gather(
                        *(self._complete([prompts[i]], max_tokens) for i in todo))
                    for i, res in zip(todo, singles, strict=True):
                        out[i] = res[0]
                todo = []
                break
            choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
            if len(choices) != len(todo):
                raise EngineError(f"{self.base_url}: {len(choices)} choices for "
                                  f"{len(todo)} prompts")
            usage = data.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            aborted = []
            for i, ch in zip(todo, choices, strict=True):
                reason = ch.get("finish_reason") or "stop"
                if reason == "abort":
                    aborted.append(i)
                    continue
                if len(todo) == 1:
                    tokens_out = int(usage.get("completion_tokens") or 0)
                    cached = details.get("cached_tokens")
                else:  # list usage is summed, cached_tokens is the last prompt's only
                    tokens_out = max_tokens if reason == "length" else 0
                    cached = None
                out[i] = ItemResult(id="", text=ch.get("text") or "", finish_reason=reason,
                                    tokens_out=tokens_out, cached_tokens=cached)
            todo = aborted
            if not todo:
                break
            if attempt + 1 < self.attempts:
                await asyncio.sleep(self._backoff(attempt))
        if todo:
            raise EngineError(f"{self.base_url}: {len(todo)} prompts aborted "
                              f"after {self.attempts} attempts")
        return [r for r in out if r is not None]

    # -- metrics ------------------------------------------------------------------------

    async def scrape(self) -> MetricsSample | None:
        """Scrape /metrics and fold counter increases into stats(); None when unavailable."""
        if not self._scrape_ok:
            return None
        self._scrapes_sent += 1
        mine = self._scrapes_sent
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
        if mine < self._scrape_folded:
            return sample  # a later scrape already answered: its counters are newer
        self._scrape_folded = mine
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
        send: list[int] = []
        prompts: list[str] = []
        for i, item in enumerate(work.items):
            if item.input_tokens > work.max_input_len:
                results[i] = ItemResult(id=item.id, finish_reason="length_exceeded")
                continue
            try:
                prompts.append(decode_payload(item.payload).text())
            except msgspec.MsgspecError as e:
                results[i] = ItemResult(id=item.id, finish_reason="error",
                                        error=f"unreadable payload: {e}")
                continue
            send.append(i)
        if send:
            await self.scrape()
            before = (self._stats.prefix_cache_queries, self._stats.prefix_cache_hits)
            done = await self._complete(prompts, work.max_tokens)
            await self.scrape()
            self.last_batch_cache = (self._stats.prefix_cache_queries - before[0],
                                     self._stats.prefix_cache_hits - before[1])
            for i, res in zip(send, done, strict=True):
                res.id = work.items[i].id
                results[i] = res
        self._stats.batches += 1
        self._stats.items += len(work.items)
        self._stats.busy_s += time.monotonic() - t0
        return [r for r in results if r is not None]

    async def prewarm(self, signal: Prewarm) -> None:
        if signal.sample is None:
            return
        try:
            prefix = "".join(decode_payload(signal.sample.payload).components)
        except msgspec.MsgspecError as e:
            log.warning("%s: prewarm sample has an unreadable payload: %s", self.name, e)
            return
        if not prefix:
            return
        if not self._last:  # no baseline yet: without one this request's tokens go uncounted
            await self.scrape()
        try:
            await self._request(prefix, 1)
        except (EngineError, Rejected) as e:
            log.warning("%s: prewarm of shape %x failed: %s", self.name, signal.signature, e)
            return
        await self.scrape()
