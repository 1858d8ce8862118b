"""kill -9 of the broker: `fabricctl up` (and the light child) killed at every fault point.

The campaign (marked slow; `make test` runs it) kills the broker at least 100 times
(FABRICCTL_RELIABILITY_KILLS for more): one fault point armed per life, in turn, with a new
seed each life, or a plain SIGKILL after a random delay; the smoke test arms each point
once. Lives run back to back on one data dir; `fabricctl up` serves most of them, the light
child (the same Daemon with a small LMDB map) the `map_grow` ones and some plain ones. After
every restart the ledger reads a difference of 0; after a final drain the history has
nothing lost, duplicated or unexpected.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest
from rel_broker import PROBS, Campaign, Life
from rel_history import check

from fabricctl.store.faults import POINTS

KILLS = int(os.environ.get("FABRICCTL_RELIABILITY_KILLS", "104"))


def plan(rng: random.Random, kills: int) -> list[Life]:
    """Every fault point in turn, a plain kill between them; map growth on the light child."""
    lives: list[Life] = []
    points = [p for p in POINTS if p != "map_grow"]
    i = 0
    while len(lives) < kills:
        k = len(lives)
        if k % 6 == 5:
            lives.append(Life("light", "map_grow", PROBS["map_grow"], 2.0))
        elif k % 3 == 2:
            lives.append(Life("up" if k % 2 else "light", None, 0.0, rng.uniform(0.05, 0.6)))
        else:
            p = points[i % len(points)]
            i += 1
            lives.append(Life("up", p, PROBS[p], 2.0))
    return lives


async def campaign(tmp_path: Path, lives: list[Life], rng: random.Random) -> Campaign:
    """Run the lives back to back, drain, check the history; returns the campaign."""
    camp = Campaign(tmp_path, rng)
    clients = [asyncio.ensure_future(camp.producer()),
               *(asyncio.ensure_future(camp.consumer(f"rec{i}")) for i in range(camp.consumers))]
    t0 = time.monotonic()
    try:
        for n, life in enumerate(lives):
            await camp.run_life(life, n)
        results = await camp.drain()
    finally:
        camp.finished = True
        async with camp.changed:
            camp.changed.notify_all()
        if camp.proc is not None:
            camp.proc.kill()
        await asyncio.wait_for(asyncio.gather(*clients, return_exceptions=True), 30)
    report = check(camp.hist, results)
    print(f"\n{camp.kills} kills ({camp.faults} by fault points {camp.points}), "
          f"{camp.starts} starts, {camp.ledger_checks} ledger checks, {report} in "
          f"{time.monotonic() - t0:.1f} s")
    assert report.clean(), str(report)
    assert camp.kills == len(lives)
    assert camp.ledger_checks >= camp.starts // 2  # the rest died while being asked
    return camp


async def test_broker_kill9_smoke(tmp_path: Path) -> None:
    """Each fault point once and one plain kill: the quick version (`-m "not slow"`)."""
    rng = random.Random(77)
    lives = [Life("light" if p == "map_grow" else "up", p, PROBS[p], 2.0) for p in POINTS]
    await campaign(tmp_path, [*lives, Life("up", None, 0.0, 0.3)], rng)


@pytest.mark.slow
async def test_broker_kill9_campaign(tmp_path: Path) -> None:
    """At least 100 kills (FABRICCTL_RELIABILITY_KILLS for more), every fault point hit."""
    rng = random.Random(1010)
    camp = await campaign(tmp_path, plan(rng, KILLS), rng)
    assert camp.kills >= KILLS
    if KILLS >= 50:  # each point is armed in several lives: every one must have fired
        assert set(camp.points) == set(POINTS), camp.points
