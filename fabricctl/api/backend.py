"""What the Batch API needs of the broker: the job calls of the wire client, and nothing else.

Contract: `BatchBackend` is the Protocol of those calls (the signatures of
`fabricctl.wire.client.Client`'s job methods, so a connected `Client` is one);
`ClientBackend` is the real one: a producer connection to the daemon's own Unix socket,
opened on first use and opened again when the broker dropped it (the API is a producer
like `submit`: it adds no second path into the store). Tests use an in-memory fake.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol, cast

from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import ResultRecord
from fabricctl.core.types import Item
from fabricctl.errors import BackendMissing
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import Ack, JobReply


class JobView(Protocol):
    """Why: what the API reads of a job's live view: its record and its items in flight."""

    @property
    def job(self) -> JobRecord: ...

    @property
    def in_flight(self) -> int: ...


class BatchBackend(Protocol):
    """Why: the API is written against these calls only, so a fake can stand in for tests."""

    async def open_job(self, kind: str, name: str = "", sha256: str = "", size: int = 0,
                       endpoint: str = "", metadata: dict[str, str] | None = None,
                       window_s: float = 0.0, attach: bool = True, job: str = "",
                       validating: bool = False, priority: int = 0,
                       output_expires_s: int = 0) -> JobReply: ...

    async def submit(self, items: list[Item], job: int = 0, resume: bool = False) -> Ack: ...

    async def seal_job(self, job: int, lines: int, errors: list[str] | None = None,
                       failed: bool = False, sha256: str = "", refused: int = 0
                       ) -> JobReply: ...

    async def cancel_job(self, job: str) -> JobReply: ...

    async def jobs(self, limit: int = 1000, before: int = 0, kind: str = ""
                   ) -> list[JobRecord]: ...

    async def job(self, id: str) -> JobView: ...

    async def job_results(self, job: str, after_line: int = 0,
                          limit: int = 1000) -> list[ResultRecord]: ...


class ClientBackend:
    """Why: one producer connection, reopened after a loss, shared by every API request."""

    def __init__(self, socket_path: Path, name: str = "fabricctl-api") -> None:
        self.socket_path, self.name = socket_path, name
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    async def _conn(self) -> BatchBackend:
        async with self._lock:
            if self._client is None or self._client.closed.is_set():
                self._client = await Client.connect(self.socket_path, "producer", self.name)
            return cast(BatchBackend, self._client)

    async def open_job(self, kind: str, name: str = "", sha256: str = "", size: int = 0,
                       endpoint: str = "", metadata: dict[str, str] | None = None,
                       window_s: float = 0.0, attach: bool = True, job: str = "",
                       validating: bool = False, priority: int = 0,
                       output_expires_s: int = 0) -> JobReply:
        c = await self._conn()
        return await c.open_job(kind, name=name, sha256=sha256, size=size, endpoint=endpoint,
                                metadata=metadata, window_s=window_s, attach=attach, job=job,
                                validating=validating, priority=priority,
                                output_expires_s=output_expires_s)

    async def submit(self, items: list[Item], job: int = 0, resume: bool = False) -> Ack:
        return await (await self._conn()).submit(items, job=job, resume=resume)

    async def seal_job(self, job: int, lines: int, errors: list[str] | None = None,
                       failed: bool = False, sha256: str = "", refused: int = 0
                       ) -> JobReply:
        return await (await self._conn()).seal_job(job, lines, errors=errors, failed=failed,
                                                   sha256=sha256, refused=refused)

    async def cancel_job(self, job: str) -> JobReply:
        return await (await self._conn()).cancel_job(job)

    async def jobs(self, limit: int = 1000, before: int = 0, kind: str = ""
                   ) -> list[JobRecord]:
        try:
            return await (await self._conn()).jobs(limit, before, kind)
        except BackendMissing:  # the broker dropped us: a read is safe to send again
            return await (await self._conn()).jobs(limit, before, kind)

    async def job(self, id: str) -> JobView:
        try:
            return await (await self._conn()).job(id)
        except BackendMissing:
            return await (await self._conn()).job(id)

    async def job_results(self, job: str, after_line: int = 0,
                          limit: int = 1000) -> list[ResultRecord]:
        try:
            return await (await self._conn()).job_results(job, after_line=after_line,
                                                          limit=limit)
        except BackendMissing:
            return await (await self._conn()).job_results(job, after_line=after_line,
                                                           limit=limit)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
