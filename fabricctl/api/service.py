"""The Batch API's service: the state every request shares, and how a batch's file is fed.

Contract:
- `BatchApi(backend, files, ...)` holds the broker link (`BatchBackend`), the files store and
  the feeds in progress. `start_feed(job, rec)` feeds an uploaded file into its (validating)
  job in a task; a feed that fails fails the job with its error (`feeding the file failed:
  ...`); `stop_feed` / `stop` cancel feeds (the job stays validating and is fed again by
  `resume_feeds` when the API starts next: a file that is gone fails its job). Lookups:
  `batch(id)` (404 `ApiError` unless it is an API batch), `upload(file_id)`, and `virtual` /
  `virtual_size` for a batch's output and error files, whose size is computed once the
  batch ended and kept. `virtual` is a 404 for a file whose batch's `output_expires_after`
  passed by `clock()` (the files are derived from the job's results: nothing runs at the
  moment of expiry, each request checks it; its kept size is dropped then). `clock` is
  the API's time (unix seconds): `time.time` in the daemon, shifted by
  `FABRICCTL_API_CLOCK_SKEW_S` where tests set it (`daemon.serve.api_clock`).
- `process_feeder(...)` is how the daemon feeds: each batch from a child process
  (`fabricctl.api.feeder`), a producer on the daemon's socket, so parsing and token
  counting never hold the broker's GIL; a feeder that fails is a `FeedError` with its last
  stderr line. Without it `BatchApi` feeds in its own loop (`api.batches.feed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from fabricctl.api.backend import BatchBackend
from fabricctl.api.batches import PAGE, content, feed
from fabricctl.api.objects import OUTPUT, has_errors, has_output, output_expired, virtual_file
from fabricctl.core.defaults import BLOCK_TOKENS, SHAPES
from fabricctl.core.jobs import JobRecord, JobState
from fabricctl.errors import ApiError, BrokerError, FeedError
from fabricctl.formats.autoshape import finder_for
from fabricctl.formats.tokens import EstimateCounter, TokenCounter
from fabricctl.store.files import FileRecord, FileStore

log = logging.getLogger("fabricctl.api")


Feeder = Callable[[JobRecord, FileRecord, Path, bool], Awaitable[None]]


def process_feeder(socket_path: Path, tokenizer: str, model: str, shapes: str = SHAPES,
                   block_size: int = BLOCK_TOKENS) -> Feeder:
    """Feed each batch from a `fabricctl.api.feeder` child process (its own GIL)."""

    async def run(job: JobRecord, rec: FileRecord, path: Path, resume: bool) -> None:
        args = [sys.executable, "-m", "fabricctl.api.feeder", str(socket_path),
                str(job.number), job.id, str(path), str(rec.lines), "--tokenizer", tokenizer,
                "--model", model, "--shapes", shapes, "--block-size", str(block_size),
                *(["--resume"] if resume else [])]
        # its own session: a Ctrl-C at `up`'s terminal must not kill it before the API
        # stops it (a feeder that died on its own fails its job)
        proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE,
                                                    start_new_session=True)
        try:
            _, err = await proc.communicate()
        except BaseException:  # the API stops: the job stays validating, fed again later
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise FeedError(lines[-1] if lines else f"the feeder exited {proc.returncode}")

    return run


class BatchApi:
    """Why: the state every request shares: the broker link, the files and the feeds."""

    def __init__(self, backend: BatchBackend, files: FileStore,
                 counter: TokenCounter | None = None, token: str = "",
                 clock: Callable[[], float] = time.time, feeder: Feeder | None = None) -> None:
        self.backend, self.files, self.counter, self.token = backend, files, counter, token
        self.clock = clock
        self.feeds: dict[str, asyncio.Task[None]] = {}
        self.feeder: Feeder = feeder or self._feed_here

    async def _feed_here(self, job: JobRecord, rec: FileRecord, path: Path,
                         resume: bool) -> None:
        """Feed in this process (tests; the daemon uses `process_feeder`)."""
        await feed(self.backend, path, job, self.counter or EstimateCounter(), rec.lines,
                   resume=resume, finder=finder_for(SHAPES))

    # -- feeds ----------

    def start_feed(self, job: JobRecord, rec: FileRecord, resume: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self._feed(job, rec, resume))
        self.feeds[job.id] = task
        task.add_done_callback(lambda _t: self.feeds.pop(job.id, None))

    async def _feed(self, job: JobRecord, rec: FileRecord, resume: bool) -> None:
        try:
            await self.feeder(job, rec, self.files.blob_path(rec.id), resume)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("batch %s: feeding %s failed: %s", job.id, rec.id, e)
            with contextlib.suppress(Exception):
                await self.backend.seal_job(job.number, rec.lines,
                                            errors=[f"feeding the file failed: {e}"],
                                            failed=True)

    async def stop_feed(self, job_id: str) -> None:
        task = self.feeds.get(job_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def resume_feeds(self) -> None:
        """Jobs a stopped daemon left validating: feed their files again (or fail them)."""
        async for job in self.api_jobs():
            if job.state is not JobState.VALIDATING:
                continue
            rec = self.files.get(job.name)
            if rec is None or not self.files.blob_path(rec.id).exists():
                await self.backend.seal_job(job.number, 0, failed=True,
                                            errors=[f"input file {job.name} is gone"])
                continue
            log.info("batch %s: feeding %s again after a restart", job.id, rec.id)
            self.start_feed(job, rec, resume=True)

    async def api_jobs(self) -> AsyncIterator[JobRecord]:
        """Every API batch's record, newest first, read a page at a time."""
        before = 0
        while page := await self.backend.jobs(PAGE, before, "api"):
            for job in page:
                yield job
            before = page[-1].number

    async def stop(self) -> None:
        tasks = list(self.feeds.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    # -- lookups ----------

    async def batch(self, batch_id: str) -> JobRecord:
        try:
            job = (await self.backend.job(batch_id)).job
        except BrokerError:
            job = None
        if job is None or job.id != batch_id or job.kind != "api":
            raise ApiError(404, f"No batch found with id '{batch_id}'.", "batch_id",
                           "not_found")
        return job

    def upload(self, file_id: str) -> FileRecord:
        rec = self.files.get(file_id)
        if rec is None:
            raise ApiError(404, f"No such File object: {file_id}", "id", "not_found")
        return rec

    async def virtual(self, file_id: str) -> tuple[JobRecord, str] | None:
        """(its batch, "output" | "error") of a derived file that exists, else None."""
        v = virtual_file(file_id)
        if v is None:
            return None
        batch_id, which = v
        try:
            job = await self.batch(batch_id)
        except ApiError:
            raise ApiError(404, f"No such File object: {file_id}", "id", "not_found") from None
        exists = has_output(job) if which == OUTPUT else has_errors(job)
        if exists and output_expired(job, self.clock()):
            self.files.drop_size(file_id)  # gone: `output_expires_after` passed
            exists = False
        if not exists:
            raise ApiError(404, f"No such File object: {file_id}", "id", "not_found")
        return job, which

    async def virtual_size(self, file_id: str, job: JobRecord, which: str) -> int:
        size = self.files.size_of(file_id)
        if size is None:
            size = 0
            async for chunk in content(self.backend, job, which):
                size += len(chunk)
            self.files.set_size(file_id, size)  # ended: its content no longer changes
        return size
