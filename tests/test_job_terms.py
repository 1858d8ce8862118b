"""A job's terms (priority, window, sealed) reach the core broker (`Broker.set_job_terms`).

Promises checked: the one window parser (core) and the API's wrapper of it and of
`metadata.priority`; `JobRecord.priority` defaults to 0 and a record stored before it
existed reads as priority 0; the durable store gives the core every live job's terms when it
opens, seals, changes priority, and forgets them when it ends; a priority change of an ended
or unknown job is refused with why; after a restart the core has every live job's terms
before recovery restores a single entry, and an ended job's none.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from store_helpers import MODEL, store

from fabricctl.api.objects import parse_priority
from fabricctl.core import jobs as J
from fabricctl.core.broker import Broker
from fabricctl.core.jobs import JobRecord, JobState
from fabricctl.core.terms import MAX_PRIORITY, JobTerms
from fabricctl.core.types import Item, ItemResult
from fabricctl.errors import ApiError, JobRefused
from fabricctl.store.durable import DurableBroker


def items(n: int, prefix: str = "r") -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, 7, 20, 4, b"p", line=k + 1) for k in range(n)]


def run_all(s: DurableBroker, now: float) -> None:
    while (w := s.pull("gpu0", now)) is not None:
        s.complete(w.id, [ItemResult(it.id, text="ok") for it in w.items], now)


# ---- core ----------------------------------------------------------------------------------


def test_the_window_parser_takes_hours_minutes_seconds_and_nothing_else() -> None:
    assert (J.parse_window("24h"), J.parse_window("90m"), J.parse_window("30s")) == (
        86400.0, 5400.0, 30.0)
    for bad in ("0h", "0s", "", "24", "1d", "1.5h", "-1h", " 2h", "2H", None, 24):
        with pytest.raises(ValueError, match="whole number of hours, minutes or seconds"):
            J.parse_window(bad)


def test_the_api_wraps_the_parsers_in_its_400s() -> None:
    assert parse_priority({}) == 0 and parse_priority({"owner": "x"}) == 0
    assert parse_priority({"priority": "7"}) == 7
    assert parse_priority({"priority": str(MAX_PRIORITY)}) == MAX_PRIORITY
    for bad in ("high", "-1", "1.5", "", str(MAX_PRIORITY + 1)):
        with pytest.raises(ApiError) as e:
            parse_priority({"priority": bad})
        assert (e.value.status, e.value.param, e.value.code) == (
            400, "metadata.priority", "invalid_value")


def test_a_record_stored_before_priority_existed_reads_as_priority_0() -> None:
    rec = J.new_job(3, "batch_3x", "submit", 10.0, window_s=60, priority=4)
    assert (rec.priority, rec.deadline) == (4, 70.0)
    old = msgspec.msgpack.encode({k: v for k, v in msgspec.structs.asdict(rec).items()
                                  if k != "priority"})
    back = msgspec.msgpack.decode(old, type=JobRecord)
    assert back.priority == 0 and back.deadline == 70.0 and back.number == 3


def test_terms_of_a_job_and_its_priority_change() -> None:
    rec = J.new_job(1, "batch_1x", "run", 10.0, window_s=7200, priority=5)
    assert J.terms_of(rec) == JobTerms(5, 7210.0, False)
    assert J.set_priority(rec, 9) and J.terms_of(rec) == JobTerms(9, 7210.0, False)
    J.seal(rec, 0, 11.0)  # nothing in it: finalizing, still live
    assert J.terms_of(rec) == JobTerms(9, 7210.0, True)
    J.settle(rec, 0, 12.0)
    assert rec.state is JobState.COMPLETED and J.terms_of(rec) is None
    assert not J.set_priority(rec, 1) and rec.priority == 9


# ---- the durable store feeds the core ------------------------------------------------------


def test_open_seal_priority_and_end_reach_the_core(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("submit", 100.0, name="in.jsonl", priority=5, window_s=7200)
    assert (j.priority, j.deadline) == (5, 7300.0)
    assert s.view.terms[j.number] == JobTerms(5, 7300.0, False)
    plain = s.open_job("submit", 100.0)  # the default terms: nothing for the core to keep
    assert plain.number not in s.view.terms
    s.submit(items(20), 100.0, job=j.number)
    assert s.view.terms[j.number] == JobTerms(5, 7300.0, False)
    s.seal_job(j.number, 20, 100.5)
    assert s.view.terms[j.number] == JobTerms(5, 7300.0, True)
    got = s.set_job_priority(j.number, 9, 101.0)
    assert got.priority == 9 and s.job(j.number).priority == 9  # type: ignore[union-attr]
    assert s.view.terms[j.number] == JobTerms(9, 7300.0, True)
    lift = s.set_job_priority(plain.number, 3, 101.0)  # from the default terms
    assert lift.priority == 3 and s.view.terms[plain.number] == JobTerms(3, None, False)
    run_all(s, 102.0)
    s.tick_jobs(103.0)  # finalizing -> completed
    assert s.job(j.number).state is JobState.COMPLETED  # type: ignore[union-attr]
    assert j.number not in s.view.terms  # ended: forgotten
    with pytest.raises(JobRefused, match="has ended \\(completed\\)"):
        s.set_job_priority(j.number, 1, 104.0)
    assert s.job(j.number).priority == 9  # type: ignore[union-attr]
    with pytest.raises(JobRefused, match="no job 99"):
        s.set_job_priority(99, 1, 104.0)
    s.cancel_job(plain.number, 105.0)  # cancelled with nothing queued: ends at once
    assert plain.number not in s.view.terms
    s.close()


def test_a_cancelling_job_keeps_its_terms_sealed_until_it_ends(tmp_path: Path) -> None:
    s = store(tmp_path)
    j = s.open_job("run", 100.0, priority=2)
    s.submit(items(10), 100.0, job=j.number)
    held = s.pull("gpu0", 101.0)
    assert held is not None
    rec = s.cancel_job(j.number, 102.0)
    assert rec.state is JobState.CANCELLING
    assert s.view.terms[j.number] == JobTerms(2, None, True)
    s.complete(held.id, [ItemResult(it.id, text="ok") for it in held.items], 103.0)
    assert s.job(j.number).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert j.number not in s.view.terms
    s.close()


def test_a_restart_gives_the_core_the_terms_before_any_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store(tmp_path)
    done = s.open_job("run", 100.0, priority=4)
    s.submit(items(3, "d"), 100.0, job=done.number)
    s.seal_job(done.number, 3, 100.1)
    run_all(s, 100.2)
    s.tick_jobs(100.3)
    assert s.job(done.number).state is JobState.COMPLETED  # type: ignore[union-attr]
    live = s.open_job("submit", 100.0, priority=7, window_s=86400)
    s.submit(items(12), 100.0, job=live.number)
    s.set_job_priority(live.number, 8, 100.5)
    sealed = s.open_job("api", 100.0, priority=1)
    s.submit(items(5, "a"), 100.0, job=sealed.number)
    s.seal_job(sealed.number, 5, 100.6)
    before = dict(s.view.terms)
    assert before == {live.number: JobTerms(8, 86500.0, False),
                      sealed.number: JobTerms(1, None, True)}
    s.close()

    seen: list[dict[int, JobTerms]] = []
    restore = Broker.restore_shape

    def spy(self: Broker, *a: object, **kw: object) -> tuple[int, int]:
        seen.append(dict(self.terms))
        return restore(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Broker, "restore_shape", spy)
    s = store(tmp_path, 200.0)
    assert s.recovery.items == 17
    assert seen and all(t == before for t in seen)  # the terms came before every entry
    assert s.view.terms == before
    assert s.job(live.number).priority == 8  # type: ignore[union-attr]
    s.set_job_priority(live.number, 2, 201.0)
    s.close()
    s = store(tmp_path, 300.0)  # and the change after the restart is kept too
    assert s.view.terms[live.number] == JobTerms(2, 86500.0, False)
    s.close()
