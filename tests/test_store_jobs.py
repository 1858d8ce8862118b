"""Jobs in the durable store (issue 17): ids scoped per job, job-pure segments, results per
job in input order, cancel and expiry (queued items get error results, in-flight ones
finish), the tick's settling, and a restart that keeps every job and count; a job's usage
(input, cached, output tokens of its successful results, each item's once: a duplicate
completion or a result already stored adds nothing) and its model (its first line's),
kept across a restart."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest
from store_helpers import MODEL, store

from fabricctl.core.jobs import JobState, job_usage
from fabricctl.core.records import usage_of
from fabricctl.core.types import Item, ItemResult, Work
from fabricctl.errors import JobRefused
from fabricctl.store.durable import DurableBroker
from fabricctl.store.ingest import Refused
from fabricctl.store.keys import entry_key_of


def items(n: int, prefix: str = "request-", sig: int = 7, first_line: int = 1) -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, sig, 20 + k % 5, 4, f"p{k}".encode(),
                 line=first_line + k) for k in range(n)]


def answer(w: Work, text: str = "ok", fail: set[str] = frozenset()) -> list[ItemResult]:  # type: ignore[assignment]
    return [ItemResult(it.id, text=text, error="boom" if it.id in fail else None)
            for it in w.items]


def pull_all(s: DurableBroker, now: float = 101.0) -> list[Work]:
    out = []
    while (w := s.pull("gpu0", now)) is not None:
        out.append(w)
    return out


def test_ids_are_scoped_per_job(tmp_path: Path) -> None:
    s = store(tmp_path)
    a = s.open_job("api", 100.0, name="file-a")
    b = s.open_job("api", 100.0, name="file-b")
    assert s.submit(items(4), 100.0, job=a.number) == ([], 0)
    assert s.submit(items(4), 100.0, job=b.number) == ([], 0)  # the same custom_ids
    assert s.submit(items(2), 100.0) == ([], 0)  # and in no job
    dup = s.submit(items(3), 100.0, job=a.number)  # a repeat in its own job
    assert dup == ([Refused(i, f"duplicate id 'request-{i}'") for i in range(3)], 0)
    rejects, skipped = s.submit(items(6), 100.0, job=a.number, resume=True)
    assert (rejects, skipped) == ([], 4)
    assert s.job(a.number).total == 6 and s.job(b.number).total == 4  # type: ignore[union-attr]
    nul = s.submit([Item("x\x00y", MODEL, 7, 5, 4)], 100.0, job=a.number)
    assert nul == ([Refused(0, "id must not contain NUL")], 0)
    # the id index of job 0 is the plain id, as before jobs
    with s.env.read() as txn:
        assert txn.get(b"request-0", db=s.env.dbs["ids"]) is not None
        assert txn.get(b"\x00" + a.number.to_bytes(4, "big") + b"request-0",
                       db=s.env.dbs["ids"]) is not None
    # every segment is job-pure
    jobs_of = {}
    for w in pull_all(s):
        for it in w.items:
            jobs_of.setdefault(it.job, set()).add(it.id)
    assert jobs_of == {0: {"request-0", "request-1"},
                       a.number: {f"request-{k}" for k in range(6)},
                       b.number: {f"request-{k}" for k in range(4)}}
    assert {h.job for h in s.segs.values()} == {0, a.number, b.number}
    s.close()


def test_results_per_job_in_input_order(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("submit", 100.0, name="in.jsonl")
    its = items(30) + items(10, prefix="other-", sig=8, first_line=31)
    assert s.submit(its, 100.0, job=j.number) == ([], 0)
    s.seal_job(j.number, 40, 100.0)
    works = pull_all(s)
    assert len(works) > 3
    for w in reversed(works):  # completed newest first: storage order is not input order
        s.complete(w.id, answer(w, fail={"request-3"}), 102.0)
    rec = s.job(j.number)
    assert rec is not None
    assert (rec.total, rec.completed, rec.failed, rec.cancelled) == (40, 39, 1, 0)
    assert rec.state is JobState.FINALIZING  # the last result's commit settled it
    results = s.job_results(j.number)
    assert [r.line for r in results] == list(range(1, 41))
    assert [r.id for r in results] == [it.id for it in its]
    assert [r.error for r in results].count("boom") == 1
    assert [r.line for r in s.job_results(j.number, after_line=35, limit=3)] == [36, 37, 38]
    assert s.segs == {}  # every segment resolved and deleted; the results stay readable
    assert s.tick_jobs(103.0)[0].state is JobState.COMPLETED  # type: ignore[union-attr]
    assert s.tick_jobs(104.0) == []
    s.close()


def test_cancel_queued_cancelled_in_flight_finish(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("submit", 100.0)
    other = s.open_job("submit", 100.0)
    s.submit(items(40), 100.0, job=j.number)
    s.submit(items(5, prefix="keep-"), 100.0, job=other.number)
    held = s.pull("gpu0", 101.0)
    assert held is not None and held.items[0].job == j.number
    n_held = len(held.items)
    rec = s.cancel_job(j.number, 102.0)
    assert rec.state is JobState.CANCELLING and rec.sealed
    assert (rec.cancelled, rec.queued) == (40 - n_held, n_held)
    assert s.view.ledger.consistent()
    rest = pull_all(s, 103.0)  # only the other job's items are left to dispatch
    assert {it.job for w in rest for it in w.items} == {other.number}
    assert s.complete(held.id, answer(held), 104.0) == n_held  # in flight: it finishes
    rec = s.job(j.number)
    assert rec is not None and rec.state is JobState.CANCELLED
    assert (rec.total, rec.completed, rec.failed, rec.cancelled) == (40, n_held, 0, 40 - n_held)
    results = s.job_results(j.number, limit=100)
    assert [r.line for r in results] == list(range(1, 41))
    assert [r.error for r in results] == [None] * n_held + ["cancelled"] * (40 - n_held)
    assert {r.finish_reason for r in results[n_held:]} == {"cancelled"}
    for w in rest:
        s.complete(w.id, answer(w), 105.0)
    assert s.view.ledger.consistent() and s.view.ledger.items_completed == 45
    assert s.job(other.number).completed == 5  # type: ignore[union-attr]
    assert s.segs == {}
    # a cancel of an ended job changes nothing
    assert s.cancel_job(j.number, 106.0).cancelled == 40 - n_held
    s.close()


def test_expiry_cancels_queued_items_as_expired(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("api", 100.0, window_s=10.0)
    s.submit(items(20), 100.0, job=j.number)
    held = s.pull("gpu0", 101.0)
    assert held is not None
    assert s.tick_jobs(109.0) == []  # not due yet
    [rec] = s.tick_jobs(110.0)
    assert not isinstance(rec, str)
    assert rec.expired and rec.state is JobState.IN_PROGRESS  # waits for its in-flight items
    assert rec.cancelled == 20 - len(held.items)
    s.complete(held.id, answer(held), 111.0)
    rec2 = s.job(j.number)
    assert rec2 is not None and rec2.state is JobState.EXPIRED
    assert list(rec2.times) == ["in_progress", "expired"]
    errors = [r.error for r in s.job_results(j.number)]
    assert errors == [None] * len(held.items) + ["expired"] * (20 - len(held.items))
    # a job still validating at its deadline expires once it runs
    v = s.open_job("api", 200.0, window_s=5.0, validating=True)
    assert s.tick_jobs(206.0) == []
    s.submit(items(2, prefix="v-"), 206.0, job=v.number)
    assert s.seal_job(v.number, 2, 206.0).state is JobState.IN_PROGRESS
    [late] = s.tick_jobs(207.0)
    assert not isinstance(late, str) and late.state is JobState.EXPIRED
    assert (late.cancelled, list(late.times)) == (2, ["validating", "in_progress", "expired"])
    s.close()


def test_sealed_and_unknown_jobs_take_no_items(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("submit", 100.0)
    s.submit(items(2), 100.0, job=j.number)
    s.seal_job(j.number, 2, 100.0)
    rejects, skipped = s.submit(items(3), 100.0, job=j.number, resume=True)
    assert skipped == 2 and rejects == [Refused(2, f"job {j.id} is sealed: no more items join it")]
    assert s.submit(items(1), 100.0, job=77) == ([Refused(0, "no job 77")], 0)
    with pytest.raises(JobRefused):
        s.seal_job(77, 1, 100.0)
    s.close()


def test_restart_keeps_jobs_counts_and_a_cancel(tmp_path: Path) -> None:
    s = store(tmp_path)
    done = s.open_job("submit", 100.0, name="f", sha256="ab" * 32)
    s.submit(items(12), 100.0, job=done.number)
    for w in pull_all(s):
        s.complete(w.id, answer(w), 101.0)
    going = s.open_job("run", 100.0, name="g")
    s.submit(items(30), 100.0, job=going.number)
    held = s.pull("gpu0", 102.0)
    assert held is not None
    s.complete(held.id, answer(held), 103.0)
    held2 = s.pull("gpu0", 103.0)
    assert held2 is not None
    s.cancel_job(going.number, 104.0)  # held2 is in flight when the store goes
    before = {n: s.job(n) for n in (done.number, going.number)}
    s.close()

    s = store(tmp_path, 200.0)
    assert s.recovery.ledger_ok
    for n, rec in before.items():
        assert s.job(n) == rec
    assert s.attach_to("submit", "f", "ab" * 32) == done.number
    assert [r.id for r in s.recent_jobs()] == [going.id, done.id]
    assert s.find_jobs(going.id[:-1]) == [going.number]
    # held2's items came back to a lane: the tick withdraws them again
    [rec] = s.tick_jobs(201.0)
    assert not isinstance(rec, str) and rec.state is JobState.CANCELLED
    assert rec.outcomes == rec.total == 30
    assert len(s.job_results(going.number)) == 30
    assert pull_all(s) == []
    s.close()
    s = store(tmp_path, 300.0)  # a third start: the same again, numbers go on
    assert s.job(going.number) == rec
    assert s.open_job("submit", 300.0).number == going.number + 1
    s.close()


def test_a_data_dir_without_the_job_tables_opens(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.submit(items(3), 100.0) == ([], 0)
    s.close()
    env = lmdb.open(str(tmp_path / "data" / "fabric.lmdb"), max_dbs=16, subdir=True)
    with env.begin(write=True) as txn:  # as a data dir written before jobs
        for name in (b"jobs", b"jres"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
    env.close()
    s = store(tmp_path, 200.0)
    assert s.recovery.items == 3 and s.recent_jobs() == []
    j = s.open_job("submit", 200.0)
    assert j.number == 1
    s.close()


def test_recent_jobs_page_by_number_and_kind(tmp_path: Path) -> None:
    s = store(tmp_path)
    nums = [s.open_job("api" if k % 3 else "submit", 100.0, name=f"f{k}").number
            for k in range(10)]
    api = [n for k, n in enumerate(nums) if k % 3][::-1]
    assert [r.number for r in s.recent_jobs()] == nums[::-1]
    assert [r.number for r in s.recent_jobs(3, kind="api")] == api[:3]
    assert [r.number for r in s.recent_jobs(3, before=api[2], kind="api")] == api[3:6]
    assert [r.number for r in s.recent_jobs(10, before=nums[0])] == []
    assert [r.number for r in s.recent_jobs(2, before=nums[-1] + 50)] == nums[::-1][:2]
    assert s.recent_jobs(5, kind="none") == []


def usage_answer(w: Work) -> list[ItemResult]:
    """Engine usage per item (prompt 30+n, 2+n%3 out, 16 cached on even lines); `fail-`
    items are error results, `long-` ones were too long to send: they add no usage."""
    out = []
    for it in w.items:
        n = int(it.id.rsplit("-", 1)[1])
        if it.id.startswith("fail-"):
            out.append(ItemResult(it.id, error="boom", finish_reason="error"))
        elif it.id.startswith("long-"):
            out.append(ItemResult(it.id, finish_reason="length_exceeded"))
        else:
            out.append(ItemResult(it.id, text="ok", tokens_out=2 + n % 3,
                                  cached_tokens=16 if n % 2 == 0 else None,
                                  prompt_tokens=30 + n))
    return out


def test_usage_is_summed_once_per_item_and_kept_across_a_restart(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("api", 100.0, name="file-u")
    assert (j.model, j.input_tokens, j.cached_tokens, j.output_tokens) == ("", 0, 0, 0)
    its = (items(20) + items(2, prefix="fail-", first_line=21)
           + items(2, prefix="long-", first_line=23))
    s.submit(its, 100.0, job=j.number)
    s.seal_job(j.number, 24, 100.0)
    works = pull_all(s)
    for w in works:
        assert s.complete(w.id, usage_answer(w), 102.0) == len(w.items)
    assert s.complete(works[0].id, usage_answer(works[0]), 102.5) == -1  # a duplicate
    assert s.complete_many([(works[1].id, usage_answer(works[1]), None)], 102.5) == [-1]
    rec = s.job(j.number)
    assert rec is not None and rec.model == MODEL
    want = (sum(30 + n for n in range(20)), 16 * 10, sum(2 + n % 3 for n in range(20)))
    assert (rec.input_tokens, rec.cached_tokens, rec.output_tokens) == want
    assert (rec.completed, rec.failed) == (22, 2)  # too long: completed, without usage
    # the sums are those of the stored results the output file is written from
    got = [usage_of(r) for r in s.job_results(j.number, limit=100)]
    assert tuple(map(sum, zip(*got, strict=True))) == want
    assert job_usage(rec).total_tokens == want[0] + want[2]
    s.close()

    s = store(tmp_path, 200.0)
    again = s.job(j.number)
    assert again is not None
    assert (again.model, again.input_tokens, again.cached_tokens, again.output_tokens) == (
        MODEL, *want)
    s.close()


def test_a_result_already_stored_adds_no_usage_again(tmp_path: Path) -> None:
    """The one-put-at-a-time path (an entry that somehow has a result): only the results
    this commit stores count."""
    s = store(tmp_path)
    j = s.open_job("api", 100.0)
    s.submit(items(4), 100.0, job=j.number)
    w = s.pull("gpu0", 101.0)
    assert w is not None and len(w.items) == 4
    first = entry_key_of(s.view.inflight[w.id].batch.entries[0].key)  # w.items[0]'s
    s.env.write(lambda txn: txn.put(first, b"\x90", db=s.env.dbs["results"]))
    assert s.complete(w.id, usage_answer(w), 102.0) == 3
    rec = s.job(j.number)
    assert rec is not None and rec.completed == 3
    stored = [int(it.id.rsplit("-", 1)[1]) for it in w.items[1:]]
    assert rec.input_tokens == sum(30 + n for n in stored)
    s.close()


def test_the_jobs_model_is_its_first_lines(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("submit", 100.0)
    later = [Item("b-2", MODEL, 7, 20, 4, b"x", line=2)]
    first = [Item("a-1", "other-model", 8, 20, 4, b"y", line=1)]
    s.submit(later + first, 100.0, job=j.number)  # line 2 arrives first in the chunk
    assert s.job(j.number).model == "other-model"  # type: ignore[union-attr]
    s.submit([Item("c-0", MODEL, 7, 20, 4, b"z", line=3)], 100.0, job=j.number)
    assert s.job(j.number).model == "other-model"  # type: ignore[union-attr]
    s.close()


def test_a_job_committed_but_not_applied_is_not_listed_yet(tmp_path: Path) -> None:
    """The server commits on a thread and applies on its loop: between the two, a job is in
    LMDB but not in the id index. A listing then must not show a job that `find` (`jobs show
    ID`) does not know (seen as "no job matches" right after `jobs` listed it)."""
    from fabricctl.store.jobplan import JobPlan, OpenOp

    s = store(tmp_path)
    table = s.jobs
    plan = JobPlan(100.0)
    number = table.open(OpenOp("submit", name="f.jsonl"), 100.0, plan)
    s.env.write(lambda txn: table.write(txn, plan, 100.0))  # durable, not yet applied
    assert table.recent(10) == [] and table.find(plan.new[number].id) == []
    table.committed()
    [rec] = table.recent(10)
    assert rec.number == number and table.find(rec.id) == [number]
    s.close()
