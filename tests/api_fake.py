"""An in-memory `BatchBackend` for the Batch API's unit tests: jobs by `fabricctl.core.jobs`.

It keeps jobs, their items and results in dicts and moves jobs with the same pure functions
the store uses (`new_job`, `start`, `seal`, `request_cancel`, `settle`). `run(n)` answers the
first n queued items (an item whose prompt says "fail" gets an error result; each result
has usage, summed on its job as the store does: `usage_of`); a cancel
withdraws every queued item, answering it as the store does (a "cancelled" record). Results
carry their job and input line, in input order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricctl.core import jobs as J
from fabricctl.core.jobs import JobRecord
from fabricctl.core.payload import decode_payload
from fabricctl.core.records import ResultRecord, Source, usage_of
from fabricctl.core.types import Item
from fabricctl.errors import BrokerError
from fabricctl.wire.protocol import Ack, JobReply, Reject


@dataclass
class View:
    job: JobRecord
    in_flight: int = 0


@dataclass
class FakeBackend:
    jobs_by_number: dict[int, JobRecord] = field(default_factory=dict)
    queued: dict[int, list[Item]] = field(default_factory=dict)
    results: dict[int, list[ResultRecord]] = field(default_factory=dict)
    submits: int = 0
    now: float = 1_700_000_000.0

    def _find(self, id: str) -> JobRecord:
        for j in self.jobs_by_number.values():
            if j.id == id:
                return j
        raise BrokerError("not_found", f"no job {id}")

    async def open_job(self, kind: str, name: str = "", sha256: str = "", size: int = 0,
                       endpoint: str = "", metadata: dict[str, str] | None = None,
                       window_s: float = 0.0, attach: bool = True, job: str = "",
                       validating: bool = False, priority: int = 0,
                       output_expires_s: int = 0) -> JobReply:
        n = len(self.jobs_by_number) + 1
        rec = J.new_job(n, J.job_id_of(n, "f00d"), kind, self.now, validating=validating,
                        window_s=window_s or None, priority=priority, name=name,
                        sha256=sha256, size=size, endpoint=endpoint, metadata=metadata or {},
                        output_expires_s=output_expires_s)
        self.jobs_by_number[n] = rec
        self.queued[n], self.results[n] = [], []
        return JobReply(0, rec)

    async def submit(self, items: list[Item], job: int = 0, resume: bool = False) -> Ack:
        self.submits += 1
        rec = self.jobs_by_number[job]
        rejects = []
        for i, item in enumerate(items):
            if item.model == "refuse-me":
                rejects.append(Reject(i, "model refuse-me is refused"))
                continue
            self.queued[job].append(item)
            rec.total += 1
            rec.model = rec.model or item.model
        return Ack(0, len(items) - len(rejects), rejects)

    async def seal_job(self, job: int, lines: int, errors: list[str] | None = None,
                       failed: bool = False, sha256: str = "", refused: int = 0) -> JobReply:
        rec = self.jobs_by_number[job]
        rec.rejected += max(0, refused)
        if failed:
            J.fail_validation(rec, errors or [], self.now)
            return JobReply(0, rec)
        J.add_errors(rec, errors or [])
        J.start(rec, self.now)
        J.seal(rec, lines, self.now)
        return JobReply(0, rec)

    async def cancel_job(self, job: str) -> JobReply:
        rec = self._find(job)
        if J.request_cancel(rec, self.now):  # the store answers each withdrawn item so
            for item in self.queued[rec.number]:
                self.results[rec.number].append(ResultRecord(
                    item.id, item.model, finish_reason="cancelled", error="cancelled",
                    source=Source(item.source), job=rec.number, line=item.line))
            rec.cancelled += len(self.queued[rec.number])
            self.queued[rec.number] = []
            J.settle(rec, 0, self.now)
        return JobReply(0, rec)

    async def jobs(self, limit: int = 1000, before: int = 0, kind: str = ""
                   ) -> list[JobRecord]:
        recs = sorted(self.jobs_by_number.values(), key=lambda r: r.number, reverse=True)
        return [r for r in recs if (not before or r.number < before)
                and (not kind or r.kind == kind)][:limit]

    async def job(self, id: str) -> View:
        return View(self._find(id))

    async def job_results(self, job: str, after_line: int = 0,
                          limit: int = 1000) -> list[ResultRecord]:
        rec = self._find(job)
        out = sorted((r for r in self.results[rec.number] if r.line > after_line),
                     key=lambda r: r.line)
        return list(out[:limit])

    def run(self, number: int, n: int | None = None) -> None:
        """Answer the first `n` (all) queued items of a job and settle it."""
        rec = self.jobs_by_number[number]
        q = self.queued[number]
        take, self.queued[number] = (q, []) if n is None else (q[:n], q[n:])
        for item in take:
            prompt = decode_payload(item.payload).prompt
            err = "engine said no" if "fail" in prompt else None
            res = ResultRecord(
                item.id, item.model, text=f"answer to {prompt}", error=err,
                source=Source(item.source), created=int(self.now), job=number,
                line=item.line, prompt_tokens=item.input_tokens,
                completion_tokens=3 + item.line % 5, cached_tokens=item.line % 3)
            self.results[number].append(res)
            J.add_usage(rec, *usage_of(res))
            if err:
                rec.failed += 1
            else:
                rec.completed += 1
        while J.settle(rec, 0, self.now):
            pass

