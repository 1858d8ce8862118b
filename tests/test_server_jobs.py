"""Jobs through a real daemon socket with the wire client (issue 17): open, submit into a
job, seal, results in input order, attach by sha256 and resume, cancel, expiry, and the
errors of unknown or ambiguous ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_helpers import CONTRACT, MODEL, SIG_A, SIG_B, WireConsumer, running_server, wait_until

from fabricctl.core.jobs import JobState
from fabricctl.core.types import Item
from fabricctl.errors import BrokerError
from fabricctl.wire.client import Client


def job_items(n: int, prefix: str = "request-", sig: int = SIG_A, first_line: int = 1
              ) -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, sig, 50 + k % 7, 8, f"p{k}".encode(),
                 line=first_line + k) for k in range(n)]


async def drain(wc: WireConsumer, text: str, want: int, reverse: bool = False) -> int:
    """Pull and complete until `want` items were stored (batches completed newest first
    when `reverse`, so results land out of input order)."""
    done = 0
    while done < want:
        works = []
        while (w := await wc.pull(0.3)) is not None:
            works.append(w)
            if len(works) >= 3:
                break
        for w in reversed(works) if reverse else works:
            done += max(0, await wc.complete(w, text))
    return done


async def state_of(c: Client, job_id: str, want: JobState, timeout: float = 10.0) -> None:
    async def reached() -> bool:
        return (await c.job(job_id)).job.state is want
    await wait_until(reached, timeout)


async def test_open_submit_seal_results_in_line_order(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        reply = await c.open_job("submit", name="in.jsonl", sha256="aa" * 32, size=123)
        job = reply.job
        assert not reply.attached
        assert job.id.startswith("batch_") and job.state is JobState.IN_PROGRESS
        items = job_items(40) + job_items(20, sig=SIG_B, prefix="b-", first_line=41)
        ack = await c.submit(items, job=job.number)
        assert (ack.accepted, ack.rejects, ack.skipped) == (60, [], 0)
        sealed = await c.seal_job(job.number, 61, errors=["line 61: not JSON"])
        assert sealed.job.sealed and sealed.job.lines == 61 and sealed.job.rejected == 1
        assert sealed.job.errors == ["line 61: not JSON"]
        wc = await WireConsumer.connect(server.state.cfg.socket_path, "gpu0", CONTRACT)
        assert await drain(wc, "ok", 60, reverse=True) == 60
        await state_of(c, job.id, JobState.COMPLETED)
        view = await c.job(job.id)
        rec = view.job
        assert (rec.total, rec.completed, rec.failed, rec.cancelled) == (60, 60, 0, 0)
        assert list(rec.times) == ["in_progress", "finalizing", "completed"]
        assert view.in_flight == 0 and view.eta_s is None and view.items_per_s > 0
        assert {(s.model, s.signature) for s in view.shapes} == {
            (MODEL, f"{SIG_A:016x}"), (MODEL, f"{SIG_B:016x}")}
        results = await c.job_results(job.id)
        assert [r.line for r in results] == list(range(1, 61))
        assert [r.id for r in results] == [it.id for it in items]
        assert all(r.job == job.number and r.text == "ok" for r in results)
        # paging: after a line, a limit
        page = await c.job_results(job.id[:10], after_line=30, limit=5)
        assert [r.line for r in page] == [31, 32, 33, 34, 35]
        listed = await c.jobs()
        assert [j.id for j in listed] == [job.id]
        await wc.close()
        await c.close()


async def test_same_ids_in_two_jobs_attach_and_resume(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        one = (await c.open_job("api", name="file-1", sha256="11" * 32)).job
        two = (await c.open_job("api", name="file-2", sha256="22" * 32)).job
        assert one.number != two.number
        for j in (one, two):  # OpenAI allows the same custom_id in two batches
            ack = await c.submit(job_items(5), job=j.number)
            assert ack.accepted == 5 and not ack.rejects
        again = await c.submit(job_items(5), job=one.number)  # no resume: duplicates
        assert again.accepted == 0 and [r.index for r in again.rejects] == list(range(5))
        assert all(r.reason.startswith("duplicate id") for r in again.rejects)
        # the same input again attaches to its job; resume skips what is stored
        att = await c.open_job("api", name="file-1", sha256="11" * 32)
        assert att.attached and att.job.number == one.number
        more = job_items(8)
        ack = await c.submit(more, job=one.number, resume=True)
        assert (ack.accepted, ack.skipped, ack.rejects) == (3, 5, [])
        # attach by id prefix; attach=False makes a new job of the same input
        assert (await c.open_job("api", job=two.id[:-2])).job.number == two.number
        fresh = await c.open_job("api", name="file-1", sha256="11" * 32, attach=False)
        assert not fresh.attached and fresh.job.number not in (one.number, two.number)
        assert (await c.job(one.id)).job.total == 8
        assert (await c.job(two.id)).job.total == 5
        await c.close()


async def test_cancel_queued_cancelled_in_flight_finishes(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        job = (await c.open_job("submit", name="big")).job
        assert (await c.submit(job_items(60), job=job.number)).accepted == 60
        await c.seal_job(job.number, 60)
        wc = await WireConsumer.connect(server.state.cfg.socket_path, "gpu0", CONTRACT)
        held = await wc.pull(1.0)
        assert held is not None and 0 < len(held.items) < 60
        cancel = await c.cancel_job(job.id)
        rec = cancel.job
        assert rec.state is JobState.CANCELLING
        assert rec.cancelled == 60 - len(held.items) and rec.queued == len(held.items)
        assert await wc.pull(0.2) is None  # nothing of it is dispatchable any more
        assert (await c.job(job.id)).in_flight == len(held.items)
        assert await wc.complete(held, "late") == len(held.items)  # in flight: it finishes
        await state_of(c, job.id, JobState.CANCELLED)
        rec = (await c.job(job.id)).job
        assert (rec.completed, rec.cancelled, rec.total) == (len(held.items),
                                                             60 - len(held.items), 60)
        assert list(rec.times) == ["in_progress", "cancelling", "cancelled"]
        results = await c.job_results(job.id, limit=100)
        assert [r.line for r in results] == list(range(1, 61))  # every line has an outcome
        errors = [r.error for r in results]
        assert errors.count("cancelled") == 60 - len(held.items)
        assert errors.count(None) == len(held.items)
        # a second cancel changes nothing
        assert (await c.cancel_job(job.id)).job.cancelled == 60 - len(held.items)
        ledger = await c.ledger()
        assert ledger["difference"] == [0, 0]
        await wc.close()
        await c.close()


async def test_expiry_cancels_queued_items(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        job = (await c.open_job("api", name="f", window_s=0.3)).job
        assert job.deadline is not None
        assert (await c.submit(job_items(10), job=job.number)).accepted == 10
        await state_of(c, job.id, JobState.EXPIRED)
        rec = (await c.job(job.id)).job
        assert rec.expired and (rec.cancelled, rec.completed) == (10, 0)
        results = await c.job_results(job.id)
        assert [r.error for r in results] == ["expired"] * 10
        await c.close()


async def test_status_lists_active_jobs(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        job = (await c.open_job("run", name="w.jsonl")).job
        await c.submit(job_items(3), job=job.number)
        status = await c.status()
        [summary] = status["jobs"]
        wait = summary.pop("oldest_wait_s")
        assert summary == {"id": job.id, "kind": "run", "name": "w.jsonl",
                           "state": "in_progress", "total": 3, "queued": 3,
                           "completed": 0, "failed": 0, "cancelled": 0, "deadline": None,
                           "holders": 0, "share": 0.0, "predicted_finish": None,
                           "at_risk": False, "endpoints": {"unknown": 3}}  # built by hand
        assert 0.0 <= wait < 10.0
        await c.close()


@pytest.mark.parametrize("call", ["job", "job_results", "cancel"])
async def test_unknown_and_ambiguous_ids(tmp_path: Path, call: str) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        a = (await c.open_job("submit", name="a")).job
        b = (await c.open_job("submit", name="b")).job

        async def ask(ref: str) -> object:
            if call == "job":
                return await c.job(ref)
            if call == "job_results":
                return await c.job_results(ref)
            return await c.cancel_job(ref)

        with pytest.raises(BrokerError) as e:
            await ask("batch_nope")
        assert e.value.code == "not_found" and "batch_nope" in str(e.value)
        with pytest.raises(BrokerError) as e:
            await ask("batch_")
        assert e.value.code == "ambiguous"
        assert a.id in str(e.value) and b.id in str(e.value)
        assert await ask(a.id) is not None  # the full id still works
        await c.close()


async def test_items_for_a_sealed_or_unknown_job_are_refused(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        job = (await c.open_job("submit")).job
        await c.submit(job_items(2), job=job.number)
        await c.seal_job(job.number, 2)
        late = await c.submit(job_items(3), job=job.number, resume=True)
        assert late.skipped == 2 and late.accepted == 0
        assert [(r.index, r.reason) for r in late.rejects] == [
            (2, f"job {job.id} is sealed: no more items join it")]
        nowhere = await c.submit(job_items(1), job=999)
        assert nowhere.accepted == 0 and nowhere.rejects[0].reason == "no job 999"
        with pytest.raises(BrokerError) as e:
            await c.seal_job(999, 1)
        assert e.value.code == "not_found"
        await c.close()


async def test_open_job_validating_then_started_or_failed(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        c = await Client.connect(server.state.cfg.data_dir, "producer", "p")
        ok = (await c.open_job("api", validating=True)).job
        assert ok.state is JobState.VALIDATING
        bad = (await c.open_job("api", validating=True)).job
        failed = (await c.seal_job(bad.number, 0, errors=["not JSONL"], failed=True)).job
        assert failed.state is JobState.FAILED and failed.errors == ["not JSONL"]
        await c.submit(job_items(1), job=ok.number)
        started = (await c.seal_job(ok.number, 1, sha256="ff" * 32)).job
        assert started.state is JobState.IN_PROGRESS and started.sha256 == "ff" * 32
        assert list(started.times) == ["validating", "in_progress"]
        await c.close()
