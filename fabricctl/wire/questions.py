"""The observers' questions as typed methods of the client, one per `wire.queries` request.

Contract: `Questions` is the part of `wire.client.Client` that asks the broker questions:
each method sends its own request Struct through the client's `request` and decodes the
`Answer` as that question's result type (a Struct, or for `ledger` and `status`, the
daemon's summaries, JSON-ready data). No question is named by a string.
`pages(fetch, start, cursor, size)` reads a paged question to its end, a page at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from fabricctl.core.events import Event
from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import ResultRecord
from fabricctl.core.snapshot import ConsumerView, ShapeView, Snapshot
from fabricctl.wire import queries as q
from fabricctl.wire.protocol import Answer, JobView

C = TypeVar("C")
R = TypeVar("R")


class Questions:
    """Why: one typed method per question, so no caller names a question by a string."""

    async def request(self, build: Any) -> Any:
        raise NotImplementedError

    async def _ask(self, build: Callable[[int], q.Query], type: Any) -> Any:
        """Ask one question (`build(rid)`) and decode its answer as `type` (each method
        names its result type)."""
        ans: Answer = await self.request(build)
        return msgspec.msgpack.decode(ans.data, type=type)

    async def shapes(self, all: bool = False) -> list[ShapeView]:
        """The live shapes; with `all`, then the finished shapes' records, newest first."""
        return await self._ask(lambda rid: q.ShapesQuery(rid, all), list[ShapeView])

    async def shape(self, ref: str) -> ShapeView:
        """The one shape `ref` names (hex, label or unique hex prefix); `BrokerError`
        `not_found` or `ambiguous` otherwise."""
        return await self._ask(lambda rid: q.ShapeQuery(rid, ref), ShapeView)

    async def consumers(self) -> list[ConsumerView]:
        return await self._ask(q.ConsumersQuery, list[ConsumerView])

    async def ledger(self) -> dict[str, Any]:
        """`ledger`, its `difference` and the `persisted` ledger, as JSON-ready data."""
        return await self._ask(q.LedgerQuery, dict[str, Any])

    async def events(self, since: int = 0, limit: int = 1000) -> list[Event]:
        return await self._ask(lambda rid: q.EventsQuery(rid, since, limit), list[Event])

    async def results(self, since: int = 0, limit: int = 1000
                      ) -> list[tuple[int, ResultRecord]]:
        """Stored results after sequence number `since`, in storage order, with their seq."""
        return await self._ask(lambda rid: q.ResultsQuery(rid, since, limit),
                               list[tuple[int, ResultRecord]])

    async def results_by_key(self, after: str = "", limit: int = 1000
                             ) -> list[tuple[str, ResultRecord]]:
        """Stored results in entry-key order after key `after` ("": the first), with keys."""
        return await self._ask(lambda rid: q.ResultsByKeyQuery(rid, after, limit),
                               list[tuple[str, ResultRecord]])

    async def result(self, id: str, job: int = 0) -> ResultRecord | None:
        """The stored result of item `id` of job number `job` (0: of no job), or None."""
        return await self._ask(lambda rid: q.ResultQuery(rid, id, job), ResultRecord | None)

    async def snapshot(self, all_lanes: bool = False) -> Snapshot:
        return await self._ask(lambda rid: q.SnapshotQuery(rid, all_lanes), Snapshot)

    async def status(self) -> dict[str, Any]:
        """The broker's summary as `fabricctl status --json` prints it (JSON-ready data)."""
        return await self._ask(q.StatusQuery, dict[str, Any])

    async def jobs(self, limit: int = 1000, before: int = 0, kind: str = ""
                   ) -> list[JobRecord]:
        """The newest `limit` jobs numbered below `before` (0: any) of `kind` ("": any),
        newest first."""
        return await self._ask(lambda rid: q.JobsQuery(rid, kind, before, limit),
                               list[JobRecord])

    async def job_views(self) -> list[JobPlace]:
        """Each job with queued items: its oldest wait, share and predicted finish."""
        return await self._ask(q.JobViewsQuery, list[JobPlace])

    async def job(self, id: str) -> JobView:
        """One job (id or unique prefix): its record, in flight, shapes, rate, ETA."""
        return await self._ask(lambda rid: q.JobQuery(rid, id), JobView)

    async def job_results(self, job: str, after_line: int = 0, limit: int = 1000
                          ) -> list[ResultRecord]:
        """A job's results of lines after `after_line`, in input order, `limit` at most."""
        return await self._ask(lambda rid: q.JobResultsQuery(rid, job, after_line, limit),
                               list[ResultRecord])


async def pages(fetch: Callable[[C, int], Awaitable[list[R]]], start: C,
                cursor: Callable[[R], C], size: int) -> AsyncIterator[list[R]]:
    """Each non-empty page `fetch(after, size)` gives, from `after = start`, the next asked
    after its last row's `cursor`; a page shorter than `size` is the last."""
    after = start
    while True:
        page = await fetch(after, size)
        if page:
            after = cursor(page[-1])
            yield page
        if len(page) < size:
            return
