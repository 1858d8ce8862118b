"""kill -9 of `fabricctl up` in the middle of a job (issue 17): the job's state and counts
survive exactly.

One job of 960 lines is submitted (in chunks, each submit a resumed one: what a rerun does;
each life sends its share more of the lines) into `fabricctl up --engine sim` while its
simulated GPU runs it; the broker is killed with
SIGKILL, by a fault point inside an ingest or a completion commit or by the harness once
results flow. After every death the data dir is opened directly (the dead broker holds no
lock): the job's results equal its completed + failed + cancelled counts, its total equals
those plus the entries still queued on disk, and no line has two results. The next life
attaches to the job by its sha256 and sends every chunk again with resume (stored lines are
skipped, not refused). A last life without faults seals it and runs it to `completed`: one
result per line, 1..960, none lost or doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

from rel_broker import CLIENT_ERRORS, CONFIG, BrokerProc, write_config
from rel_history import MODEL, TOTALS

from fabricctl.core.config import CoreConfig
from fabricctl.core.jobs import JobState
from fabricctl.core.types import Item
from fabricctl.store.durable import DurableBroker
from fabricctl.wire.client import Client

LINES = 960
CHUNK = 40
SHA = "5e" * 32
LIVES = [  # (fault point and probability, or None: the harness kills once results flow)
    "ingest_before_commit:0.3", "complete_results:0.3", None, "ingest_after_commit:0.3",
    "segment_delete:0.5", "complete_after_commit:0.3",
]
SLOW = CONFIG.replace("time_scale = 0.0002", "time_scale = 0.004")  # work left for each life


def line_item(line: int) -> Item:
    return Item(f"request-{line}", MODEL, 0x10B + line % 3, 30 + line % 50, 8,
                f"line {line}".encode(), line=line)


def check_on_disk(data: Path) -> tuple[int, int]:
    """Open the dead broker's data dir: the job's counts agree with what is stored.
    Returns (total, outcomes)."""
    store = DurableBroker(data, time.time(), CoreConfig())
    try:
        assert store.recovery.ledger_ok, store.recovery
        jobs = store.recent_jobs()
        if not jobs:
            return 0, 0
        [job] = jobs  # attached every time: one job
        results = store.job_results(job.number, 0, 10 * LINES)
        lines = [r.line for r in results]
        assert len(lines) == len(set(lines)), "a line has two results"
        assert len(results) == job.completed + job.failed + job.cancelled, (job, len(results))
        assert job.failed == job.cancelled == 0
        queued = sum(h.count - h.deleted for h in store.segs.values() if h.job == job.number)
        assert job.total == len(results) + queued, (job, len(results), queued)
        assert {r.id for r in results} == {f"request-{n}" for n in lines}
        return job.total, len(results)
    finally:
        store.close()


async def one_life(c: Client, bp: BrokerProc, fault: str | None, last: bool, upto: int
                   ) -> None:
    """Attach (or open) the job, send every chunk of lines up to `upto` with resume (the
    stored ones are skipped); the last life seals it."""
    reply = await c.open_job("run", name="work.jsonl", sha256=SHA)
    number = reply.job.number
    sent = 0
    for first in range(1, upto + 1, CHUNK):
        chunk = [line_item(n) for n in range(first, min(first + CHUNK, upto + 1))]
        ack = await c.submit(chunk, job=number, resume=True)
        assert ack.rejects == [], ack.rejects
        assert ack.accepted + ack.skipped == len(chunk)
        sent += len(chunk)
    if last:
        sealed = await c.seal_job(number, LINES)
        assert sealed.job.total == LINES
    elif fault is None:  # the harness kills once results flow in this life
        start = (await c.job(reply.job.id)).job.completed
        while (await c.job(reply.job.id)).job.completed < min(start + CHUNK, upto):
            await asyncio.sleep(0.02)
        bp.kill()


async def test_job_state_and_counts_survive_kill9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write_config(tmp_path, SLOW)
    kills = faults = 0
    for n, fault in enumerate([*LIVES, "last"]):
        last = fault == "last"
        armed = None if last else fault
        bp = BrokerProc.up(data, config, tmp_path, tmp_path / f"jobs-life{n}.log", armed, 1000 + n)
        ready = await bp.start()
        if ready:
            c = None
            try:
                c = await Client.connect(data, "producer", "jobs-kill")
                upto = LINES if last else min(LINES, (n + 1) * LINES // (len(LIVES) + 1))
                await one_life(c, bp, armed, last, upto)
                if last:
                    async def done(cl: Client = c) -> bool:
                        return (await cl.jobs())[0].state is JobState.COMPLETED
                    deadline = time.monotonic() + 60
                    while not await done():
                        assert time.monotonic() < deadline, bp.tail()
                        await asyncio.sleep(0.05)
                    await c.shutdown()
            except CLIENT_ERRORS:
                assert not last, bp.tail()
            finally:
                if c is not None:
                    await c.close()
        if last:
            assert await bp.wait(30.0) == 0, bp.tail()
        else:
            if await bp.wait(5.0) is None:  # the fault did not fire in time: kill it here
                bp.kill()
            rc = await bp.wait()
            assert rc == -signal.SIGKILL, f"life {n} exited {rc}:\n{bp.tail()}"
            kills += 1
            TOTALS.kills += 1
            if not bp.killed_by_us:
                faults += 1
                TOTALS.faults += 1
        assert not any("Traceback" in ln or "LEDGER DIFFERENCE" in ln for ln in bp.lines), \
            bp.tail()
        total, outcomes = check_on_disk(data)
        assert outcomes <= total <= LINES
        how = "stopped" if last else "killed by " + ("us" if bp.killed_by_us else "its fault")
        print(f"life {n} ({fault}): {how}, "
              f"{total} items stored, {outcomes} with results")
    assert kills == len(LIVES)
    store = DurableBroker(data, time.time(), CoreConfig())
    with contextlib.closing(store):
        [job] = store.recent_jobs()
        assert job.state is JobState.COMPLETED and job.sealed and job.lines == LINES
        assert (job.total, job.completed, job.failed, job.cancelled) == (LINES, LINES, 0, 0)
        results = store.job_results(job.number, 0, 10 * LINES)
        assert [r.line for r in results] == list(range(1, LINES + 1))
        assert [r.id for r in results] == [f"request-{n}" for n in range(1, LINES + 1)]
        assert list(job.times) == ["in_progress", "finalizing", "completed"]
