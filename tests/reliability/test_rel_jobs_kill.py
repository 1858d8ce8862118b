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
result per line, 1..960, none lost or doubled. In the harness's own kill a second job is
submitted and cancelled at once: on disk it is cancelling or cancelled with counts that add
up, and it ends cancelled with one outcome per line (the items that came back to a lane
after a kill are withdrawn again by the tick).
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
from fabricctl.core.types import Contract, Item
from fabricctl.store.durable import DurableBroker
from fabricctl.wire.client import Client

LINES = 960
CHUNK = 40
CANCELLED = 200  # the lines of a second job, cancelled in the harness's own kill
SHA = "5e" * 32
LIVES = [  # (fault point and probability, or None: the harness kills once results flow)
    "ingest_before_commit:0.3", "complete_results:0.3", None, "ingest_after_commit:0.3",
    "segment_delete:0.5", "complete_after_commit:0.3",
]
SLOW = CONFIG.replace("time_scale = 0.0002", "time_scale = 0.004")  # work left for each life


def line_item(line: int) -> Item:
    return Item(f"request-{line}", MODEL, 0x10B + line % 3, 30 + line % 50, 8,
                f"line {line}".encode(), line=line)


def bp_data(bp: BrokerProc) -> Path:
    """The data dir a `fabricctl up` child serves."""
    return Path(bp.argv[bp.argv.index("--data-dir") + 1])


def check_on_disk(data: Path, sealed: bool) -> tuple[int, int]:
    """Open the dead broker's data dir: each job's counts agree with what is stored.
    Returns (total, outcomes) of the main job."""
    store = DurableBroker(data, time.time(), CoreConfig())
    try:
        assert store.recovery.ledger_ok, store.recovery
        out = (0, 0)
        for job in store.recent_jobs():
            results = store.job_results(job.number, 0, 10 * LINES)
            lines = [r.line for r in results]
            assert len(lines) == len(set(lines)), "a line has two results"
            assert len(results) == job.completed + job.failed + job.cancelled, (job,
                                                                               len(results))
            queued = sum(h.count - h.deleted for h in store.segs.values()
                         if h.job == job.number)
            assert job.total == len(results) + queued, (job, len(results), queued)
            assert {r.id for r in results} == {f"request-{n}" for n in lines}
            assert job.failed == 0
            if job.name == "cancel.jsonl":
                assert job.state in (JobState.CANCELLING, JobState.CANCELLED), job
                assert {r.error for r in results} <= {None, "cancelled"}
                assert job.cancelled == sum(r.error == "cancelled" for r in results)
                print(f"  the cancelled job: {job.state.value}, {job.total} items, "
                      f"{job.cancelled} cancelled, {job.completed} completed, {queued} queued")
            else:
                assert job.cancelled == 0 and job.sealed is sealed  # in the last life only
                assert job.state is (JobState.COMPLETED if sealed else JobState.IN_PROGRESS)
                out = (job.total, len(results))
        return out
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
    elif fault is None:  # the harness kills while a cancelled job waits for in-flight items
        doomed = (await c.open_job("run", name="cancel.jsonl", sha256="c0" * 32)).job
        holder = await Client.connect(bp_data(bp), "consumer", "holder")
        try:
            await holder.register("holder", Contract(MODEL, 16, 4096, 4096))
            await c.submit([line_item(n) for n in range(1, CANCELLED + 1)], job=doomed.number)
            held = False
            deadline = time.monotonic() + 20
            while not held and time.monotonic() < deadline:  # batches it never completes
                w = await holder.pull(0.5)
                held = w is not None and any(it.job == doomed.number for it in w.items)
            cancel = await c.cancel_job(doomed.id)
            if held:  # (the sim GPU may, rarely, have run every one of its items first)
                assert cancel.job.state is JobState.CANCELLING and cancel.job.queued > 0
            assert cancel.job.state in (JobState.CANCELLING, JobState.CANCELLED)
            bp.kill()  # its held items come back queued: the next life's tick cancels them
        finally:
            await holder.close()


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
                        return {j.state for j in await cl.jobs()} == {
                            JobState.COMPLETED, JobState.CANCELLED}
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
        total, outcomes = check_on_disk(data, last)
        assert outcomes <= total <= LINES
        how = "stopped" if last else "killed by " + ("us" if bp.killed_by_us else "its fault")
        print(f"life {n} ({fault}): {how}, "
              f"{total} items stored, {outcomes} with results")
    assert kills == len(LIVES)
    store = DurableBroker(data, time.time(), CoreConfig())
    with contextlib.closing(store):
        job, doomed = store.recent_jobs()[::-1]
        assert doomed.name == "cancel.jsonl" and doomed.state is JobState.CANCELLED
        assert doomed.total == doomed.outcomes == CANCELLED
        assert [r.line for r in store.job_results(doomed.number, 0, 1000)] == list(
            range(1, CANCELLED + 1))
        assert job.state is JobState.COMPLETED and job.sealed and job.lines == LINES
        assert (job.total, job.completed, job.failed, job.cancelled) == (LINES, LINES, 0, 0)
        results = store.job_results(job.number, 0, 10 * LINES)
        assert [r.line for r in results] == list(range(1, LINES + 1))
        assert [r.id for r in results] == [f"request-{n}" for n in range(1, LINES + 1)]
        assert list(job.times) == ["in_progress", "finalizing", "completed"]
