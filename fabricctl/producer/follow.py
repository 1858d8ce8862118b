"""Following one job's results as the broker stores them, each exactly once.

Contract: a `JobFollower(client, job_id, write, since=N)` writes every result of the job
through `write`, once, and `run()` returns the job's final `JobRecord` when the job has
ended and every result of it has been written:
- first the results the job already has (`job_results`, in input order, a page at a time:
  a rerun that attached to its job gets the earlier run's results too);
- then the broker's result stream from sequence number `since` (taken by the caller before
  the job was opened, so nothing stored in between is missed), keeping only this job's
  results (`rec.job`) and skipping those already written;
- when the stream runs dry it asks for the job (every `poll_s`); once the job has ended
  (or is finalizing: every item has its outcome) it
  sweeps `job_results` a last time for any result it has not written (a cancel writes its
  results in one commit) and returns.
A result is known by its input line (unique within a job), so what it holds is one int per
result written. Timeouts are the caller's (`asyncio.wait_for`); `nudge()` wakes the poll
early (the submitter calls it after each ack).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from fabricctl.core.jobs import JobRecord, JobState
from fabricctl.formats.results import ResultRecord
from fabricctl.wire.client import Client

PAGE = 2000
POLL_S = 0.1  # the broker has no result push: the stream is polled this often when dry


async def results_stored(client: Client) -> int:
    """How many results the broker has stored (its result sequence number): a follower
    started from it misses nothing stored later."""
    status = await client.query("status")
    return int(status.get("extra", {}).get("store", {}).get("results", 0))


class JobFollower:
    """Why: submit --wait, run and results --follow --job all need "this job's results,
    once each, until it is done", from two sources that overlap."""

    def __init__(self, client: Client, job_id: str, job_number: int,
                 write: Callable[[ResultRecord], object], *, since: int,
                 poll_s: float = POLL_S) -> None:
        self.client, self.job_id, self.number = client, job_id, job_number
        self._write = write
        self.seq = since
        self.poll_s = poll_s
        self.seen: set[int] = set()  # input lines whose result was written
        self.written = 0
        self.job: JobRecord | None = None
        self._wake = asyncio.Event()

    def nudge(self) -> None:
        self._wake.set()

    def _take(self, rec: ResultRecord) -> None:
        if rec.line in self.seen:
            return
        self.seen.add(rec.line)
        self.written += 1
        self._write(rec)

    async def _sweep(self) -> None:
        """Every stored result of the job, in input order, that was not written yet."""
        after = 0
        while True:
            page = await self.client.job_results(self.job_id, after_line=after, limit=PAGE)
            for rec in page:
                self._take(rec)
            if len(page) < PAGE:
                return
            after = page[-1].line

    async def _drain_stream(self) -> bool:
        """This job's results from the stream since `seq`; True when a page came."""
        got = False
        while True:
            page = await self.client.query("results", since=self.seq, limit=PAGE,
                                           type=list[tuple[int, ResultRecord]])
            for s, rec in page:
                self.seq = s
                if rec.job == self.number:
                    self._take(rec)
            got = got or bool(page)
            if len(page) < PAGE:
                return got

    async def run(self) -> JobRecord:
        await self._sweep()
        while True:
            if await self._drain_stream():
                continue
            view = await self.client.job(self.job_id)
            self.job = view.job
            if self.job.ended or self.job.state is JobState.FINALIZING:  # all outcomes in
                await self._drain_stream()
                await self._sweep()
                return self.job
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
