"""The stop's drain: every consumer, local or remote, finishes the batches it holds.

Contract: `drain(state, drop, drain_s)` runs as the daemon stops (SIGINT, SIGTERM, `fabricctl
down`), beside its own fleet's stop:
- from its first step the broker hands out no batch (`ServerState.draining`: a pull waits
  out its long-poll and is answered with none); completions are taken as before;
- it waits, woken by every commit and departure, until no consumer holds a batch whose
  completion the broker has not received, or `drain_s` (`[server] drain_s`) has passed;
- a consumer still holding work then is dropped (`drop`): its batches go back to their
  lanes, because it did not answer them within drain_s (and when it was last heard from);
- every consumer that left holding work during the drain (that, a heartbeat timeout, a
  closed connection) is a `Departure` of the `DrainReport`: who, how many batches and items
  went back, why, and how long before it had last been heard from. The report is written
  to `<data dir>/drain.json` (`REPORT`) when it has one (a stale one is removed first),
  which `fabricctl down` reads back (`departures.read_report`) and says.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from fabricctl.server.departures import REPORT, DrainReport

if TYPE_CHECKING:
    from fabricctl.server.peer import Peer
    from fabricctl.server.state import ServerState

log = logging.getLogger("fabricctl.server")

POLL_S = 0.1  # the drain looks again at least this often between wake-ups


def held(state: ServerState) -> dict[str, int]:
    """Each consumer's batches whose completion the broker has not received, when any."""
    core, done = state.view, state.view.settling | state.received()
    out = {name: len(c.batches - done) for name, c in core.consumers.items()}
    return {name: n for name, n in out.items() if n}


async def drain(state: ServerState, drop: Callable[[Peer, str], None],
                drain_s: float) -> DrainReport:
    """Stop dispatching and wait for the consumers' batches (see the contract)."""
    path = Path(state.cfg.data_dir) / REPORT
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    state.draining = True
    state.wakeup.notify()  # long-polling pulls look again, and find nothing
    start = time.monotonic()
    heard: dict[str, float] = {}
    if waiting := held(state):
        log.info("draining for up to %g s: %s", drain_s,
                 ", ".join(f"{n} holds {b} batches" for n, b in sorted(waiting.items())))
    while held(state) and (left := start + drain_s - time.monotonic()) > 0:
        heard.update({n: p.last_seen for n, p in state.consumers.items()})
        await state.wakeup.wait(min(left, POLL_S))
    heard.update({n: p.last_seen for n, p in state.consumers.items()})
    for name, batches in held(state).items():
        peer = state.consumers.get(name)
        if peer is not None:
            drop(peer, f"did not answer its {batches} batch{'es' if batches != 1 else ''} "
                       f"within server.drain_s ({drain_s:g} s)")
    report = DrainReport(drain_s, round(time.monotonic() - start, 3), [
        msgspec.structs.replace(d, last_heard_s=round(d.at - heard[d.consumer], 3))
        if d.consumer in heard else d for d in state.departures])
    if report.departures:
        path.write_bytes(msgspec.json.encode(report))
    return report
