"""No GPU idles while work waits: the timeline of an idle fleet handed several shapes at once.

`timeline(cfg, lines)` starts the real daemon (`daemon.Daemon`: store, server, fleet of
`engine = "openai"` consumers) on `cfg`, waits until every consumer registered and sat idle,
submits the native JSONL `lines` (one durable commit) and records, per engine, when each
batch went to its server and when it came back, until every item has a result. It returns
the submit's acknowledgement time and those spans, all on `time.monotonic()`. `first_wait`
and `longest_idle` read them: how long after the acknowledgement the first batch left, and
the longest stretch an engine spent with nothing in its server while items were queued.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from server_helpers import all_results

from fabricctl.config import AppConfig
from fabricctl.core.types import ItemResult, Work
from fabricctl.daemon import Daemon
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.formats.reader import Parsed, parse_lines
from fabricctl.wire.client import Client


@dataclass
class Timeline:
    """Why: the claim is about time between events, so keep the events' times."""

    acked: float = 0.0  # the submit was durable
    spans: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)  # engine ->
    finished: float = 0.0  # every item had a result

    def first_wait(self) -> float:
        return min(s for spans in self.spans.values() for s, _, _ in spans) - self.acked

    def longest_idle(self) -> float:
        """The longest gap, on any engine, with none of its batches in its server, from the
        acknowledgement until the last batch left (after that nothing waits)."""
        last_start = max(s for spans in self.spans.values() for s, _, _ in spans)
        worst = 0.0
        for spans in self.spans.values():
            busy_until = self.acked
            for start, end, _ in sorted(spans):
                if start > last_start:
                    break
                worst = max(worst, start - busy_until)
                busy_until = max(busy_until, end)
        return worst


async def timeline(cfg: AppConfig, lines: list[bytes], monkeypatch: Any,
                   timeout_s: float = 300.0) -> Timeline:
    tl = Timeline()
    original = OpenAIEngine.run

    async def run(self: OpenAIEngine, work: Work) -> list[ItemResult]:
        start = time.monotonic()
        try:
            return await original(self, work)
        finally:
            tl.spans.setdefault(self.name, []).append((start, time.monotonic(),
                                                       len(work.items)))

    monkeypatch.setattr(OpenAIEngine, "run", run)
    items = [p.item for p in parse_lines(lines) if isinstance(p, Parsed)]
    assert len(items) == len(lines)
    daemon = await Daemon.start(cfg)
    try:
        await daemon.fleet.wait_connected()
        client = await Client.connect(daemon.server.state.cfg.socket_path, "producer", "test")
        try:
            reply = await client.submit(items)
            tl.acked = time.monotonic()
            assert reply.accepted == len(items)
            deadline = tl.acked + timeout_s
            while True:  # a condition with a deadline, polled
                done = len(await all_results(client))
                if done >= len(items):
                    tl.finished = time.monotonic()
                    break
                assert time.monotonic() < deadline, f"{done} of {len(items)} results"
                await asyncio.sleep(0.05)
        finally:
            await client.close()
    finally:
        await daemon.stop()
    return tl
