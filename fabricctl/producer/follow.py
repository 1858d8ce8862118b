"""Following one job's results as the broker stores them, each exactly once, pushed.

Contract: a `JobFollower(client, job_id, number, write, since=N)` writes every result of the
job through `write`, once, and `run()` returns the job's final `JobRecord` when the job has
ended (or is finalizing: every item has its outcome) and every result of it was written:
- it subscribes to the job's result stream (`Client.follow_results`, from sequence number
  `since`; -1, the default: from the moment the broker reads the subscription), so every
  result stored after that point is pushed to it as it is stored: nothing is polled;
- then, once, it sweeps the results the job already had (`job_results`, in input order, a
  page at a time: a rerun that attached to its job gets the earlier run's results too);
- the stream's last push carries the ended job's record.
A result is known by its input line (unique within a job), so what it holds is one int per
result written. With `reconnect` (a coroutine function giving a new client), a lost
connection is followed again from the last sequence number pushed (`seq`): nothing is
missed and nothing is written twice. Timeouts are the caller's (`asyncio.wait_for`).
`results_stored(client)` is the broker's result sequence number now (a stream's start).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol

from fabricctl.core.jobs import JobRecord
from fabricctl.errors import BackendMissing
from fabricctl.formats.results import ResultRecord
from fabricctl.wire.queries import ResultsPush
from fabricctl.wire.questions import pages

PAGE = 2000


class ResultSource(Protocol):
    """Why: the follower needs only these two broker calls, so a test can stand in for one."""

    def follow_results(self, job: int = 0, since: int = -1
                       ) -> AsyncGenerator[ResultsPush, None]: ...

    async def job_results(self, job: str, after_line: int = 0, limit: int = 1000
                          ) -> list[ResultRecord]: ...


async def results_stored(client: ResultSource) -> int:
    """The broker's result sequence number now: a stream from it misses nothing later."""
    stream = client.follow_results(0, -1)
    try:
        return (await anext(stream)).seq
    finally:
        await stream.aclose()


def job_pages(client: ResultSource, job_id: str) -> AsyncIterator[list[ResultRecord]]:
    """A job's stored results in input order, `PAGE` at a time (`wire.questions.pages`)."""
    return pages(lambda after, size: client.job_results(job_id, after_line=after, limit=size),
                 0, lambda rec: rec.line, PAGE)


class JobFollower:
    """Why: submit --wait, run and results --follow --job all need "this job's results,
    once each, until it is done", from two sources that overlap."""

    def __init__(self, client: ResultSource, job_id: str, job_number: int,
                 write: Callable[[ResultRecord], object], *, since: int = -1,
                 reconnect: Callable[[], Awaitable[ResultSource]] | None = None) -> None:
        self.client, self.job_id, self.number = client, job_id, job_number
        self._write = write
        self.seq = since  # the last sequence number the stream pushed
        self.reconnect = reconnect
        self.seen: set[int] = set()  # input lines whose result was written
        self.written = 0
        self.swept = False
        self.job: JobRecord | None = None

    def _take(self, rec: ResultRecord) -> None:
        if rec.line in self.seen:
            return
        self.seen.add(rec.line)
        self.written += 1
        self._write(rec)

    async def _sweep(self) -> None:
        """Every stored result of the job, in input order, that was not written yet."""
        async for page in job_pages(self.client, self.job_id):
            for rec in page:
                self._take(rec)

    async def _follow(self) -> JobRecord | None:
        """One subscription until the job ended (its record) or the stream stopped (None)."""
        stream = self.client.follow_results(self.number, self.seq)
        try:
            async for push in stream:
                for _, rec in push.rows:
                    self._take(rec)
                self.seq = push.seq
                if not self.swept:  # the stream is live: what came before is in the sweep
                    await self._sweep()
                    self.swept = True
                if push.ended is not None:
                    return push.ended
            return None
        finally:
            await stream.aclose()

    async def run(self) -> JobRecord:
        while True:
            try:
                job = await self._follow()
            except BackendMissing:
                if self.reconnect is None:
                    raise
                self.client = await self.reconnect()
                continue
            if job is not None:
                self.job = job
                return job
