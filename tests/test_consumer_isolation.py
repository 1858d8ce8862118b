"""Isolating a failed batch: poison is quarantined, an unreachable server is not poison."""

from __future__ import annotations

from fabricctl.core.types import Item, ItemResult, Prewarm, Work
from fabricctl.engines.base import EngineLimits, EngineStats
from fabricctl.errors import EngineError
from fabricctl.supervisor.consumer import Consumer


class ScriptedEngine:
    """Why: an engine whose answer depends on which items a run holds."""

    name = "scripted"
    simulated = True

    def __init__(self, poison: set[str], unreachable: set[str]) -> None:
        self.poison = poison
        self.unreachable = unreachable

    def limits(self) -> EngineLimits:
        return EngineLimits(8, 1024, 512)

    async def run(self, work: Work) -> list[ItemResult]:
        ids = {i.id for i in work.items}
        if ids & self.unreachable:
            raise EngineError("srv: connection error: refused", unreachable=True)
        if ids & self.poison:
            raise EngineError("srv: HTTP 500: boom")
        return [ItemResult(id=i.id, tokens_out=1) for i in work.items]

    async def prewarm(self, signal: Prewarm) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats(simulated=True)

    async def close(self) -> None:
        return None


def work(*ids: str) -> Work:
    items = [Item(id=i, model="m", signature=1, input_tokens=4, max_tokens=1) for i in ids]
    return Work(id=1, model="m", signature=1, lane=0, epoch=1, pad_to=8, max_tokens=1,
                max_input_len=512, items=items)


async def test_a_poison_item_is_quarantined_and_the_rest_complete() -> None:
    c = Consumer("/nowhere", "c", "m", ScriptedEngine({"bad"}, set()))
    results, why = await c._execute(work("a", "bad", "b"))
    assert why == "" and results is not None
    assert [r.finish_reason for r in results] == ["stop", "error", "stop"]
    assert (results[1].error or "").startswith("quarantined after 2 attempts: srv: HTTP 500")
    assert c.quarantined == 1


async def test_an_unreachable_server_is_not_poison_the_batch_goes_back() -> None:
    """Some items got through, one found the server gone: fail back, quarantine nothing."""
    c = Consumer("/nowhere", "c", "m", ScriptedEngine(set(), {"late"}))
    results, why = await c._execute(work("a", "late", "b"))
    assert results is None and "refused" in why
    assert c.quarantined == 0
