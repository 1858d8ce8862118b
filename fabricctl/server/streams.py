"""The results stream: a `FollowResults` subscription answered by `ResultsPush` frames.

Contract: `stream_results(state, peer, frame)` first pushes where the stream starts (`seq`:
the request's `since`, or with -1 the store's result sequence number now), then every
result stored after it (of job number `frame.job`; 0: of every job), in storage order,
`PAGE` at most per push, each with its sequence number, as the commits that store them
land: it waits on the broker's wake-up (notified after every commit and tick), never on a
client's poll. For a job, the push that finds it ended (or finalizing: every item has its
outcome) carries its record in `ended` and is the last; the job's state is read before its
results, so that push holds every result it has. A job number the store does not know is
answered by an `Error` (`not_found`). The stream ends with its peer, or at a `StopFollow`
of its rid (`stop_stream`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fabricctl.core.jobs import JobRecord, JobState
from fabricctl.wire.protocol import Error
from fabricctl.wire.queries import FollowResults, ResultsPush, StopFollow

if TYPE_CHECKING:
    from fabricctl.server.peer import Peer
    from fabricctl.server.state import ServerState

PAGE = 2000
IDLE_S = 1.0  # a wake-up missed (none should be) costs at most this long


def _ended(state: ServerState, job: int) -> JobRecord | None:
    """The job's record once it has every outcome, else None."""
    rec = state.store.job(job)
    if rec is not None and (rec.ended or rec.state is JobState.FINALIZING):
        return rec
    return None


def stop_stream(peer: Peer, frame: StopFollow) -> None:
    """End the peer's stream of that rid, if it still runs."""
    task = peer.streams.pop(frame.rid, None)
    if task is not None:
        task.cancel()


async def stream_results(state: ServerState, peer: Peer, frame: FollowResults) -> None:
    task = asyncio.current_task()
    if task is not None:
        peer.streams[frame.rid] = task
    try:
        await _stream(state, peer, frame)
    finally:
        peer.streams.pop(frame.rid, None)


async def _stream(state: ServerState, peer: Peer, frame: FollowResults) -> None:
    store, job, rid = state.store, frame.job, frame.rid
    if job and store.job(job) is None:
        peer.send(Error("not_found", f"no job {job}", rid))
        return
    seq = store.meta.rseq if frame.since < 0 else frame.since
    if not peer.send(ResultsPush(rid, seq)):
        return
    while not peer.closed:
        ended = _ended(state, job) if job else None  # before the results: they are all in
        page = store.results_since(seq, PAGE)
        if page:
            seq = page[-1][0]
        rows = [(s, r) for s, r in page if not job or r.job == job]
        full = len(page) == PAGE
        last = ended if not full else None
        if (rows or last is not None) and (
                not peer.send(ResultsPush(rid, seq, rows, last)) or last is not None):
            return
        if rows or full:
            await peer.drain()  # a commit may land meanwhile: read again before waiting
            continue
        await state.wakeup.wait(IDLE_S)
