"""The life of a job as pure logic (fabricctl.core.jobs): literal transitions, and a
property: whatever the order of ingest, outcome, cancel, expiry, seal and settle events, the
counts add up and the state only moves along the OpenAI Batch API's order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.jobs import (
    MAX_ERRORS,
    MAX_SHAPES,
    JobShape,
    JobState,
    add_errors,
    add_shapes,
    expire_due,
    fail_validation,
    job_id_of,
    mark_expired,
    new_job,
    request_cancel,
    seal,
    settle,
    start,
)

S = JobState
NEXT: dict[JobState, set[JobState]] = {  # the moves OpenAI's batch statuses make
    S.VALIDATING: {S.IN_PROGRESS, S.FAILED, S.CANCELLING},
    S.IN_PROGRESS: {S.FINALIZING, S.CANCELLING, S.EXPIRED},
    S.FINALIZING: {S.COMPLETED, S.CANCELLING},
    S.CANCELLING: {S.CANCELLED},
    S.COMPLETED: set(), S.FAILED: set(), S.EXPIRED: set(), S.CANCELLED: set(),
}


def test_ids_and_new_jobs() -> None:
    assert job_id_of(26, "abc123") == "batch_1aabc123"
    j = new_job(3, "batch_3x", "submit", 100.0, name="in.jsonl")
    assert (j.state, j.times, j.deadline, j.name) == (S.IN_PROGRESS, {"in_progress": 100.0},
                                                      None, "in.jsonl")
    v = new_job(4, "batch_4x", "api", 100.0, validating=True, window_s=60.0)
    assert (v.state, v.deadline) == (S.VALIDATING, 160.0)
    start(v, 101.0)
    assert v.state is S.IN_PROGRESS and v.times == {"validating": 100.0, "in_progress": 101.0}
    start(v, 102.0)  # only from validating
    assert v.times["in_progress"] == 101.0


def test_a_job_runs_to_completed_in_two_settles() -> None:
    j = new_job(1, "b", "submit", 0.0)
    j.total = 3
    assert not settle(j, 0, 1.0)  # not sealed
    seal(j, 4, 2.0)
    assert j.sealed and j.lines == 4 and j.state is S.IN_PROGRESS  # 3 to go
    j.completed, j.failed = 2, 1
    assert j.queued == 0 and j.outcomes == 3
    assert settle(j, 0, 3.0) and j.state is S.FINALIZING
    assert settle(j, 0, 4.0) and j.state is S.COMPLETED
    assert not settle(j, 0, 5.0)
    assert list(j.times) == ["in_progress", "finalizing", "completed"]


def test_cancel_waits_for_in_flight_items() -> None:
    j = new_job(1, "b", "run", 0.0)
    j.total = 10
    assert request_cancel(j, 1.0) and j.state is S.CANCELLING and j.sealed
    assert not request_cancel(j, 1.5)
    j.cancelled, j.completed = 8, 1  # one still with an engine
    assert not settle(j, 1, 2.0) and j.state is S.CANCELLING
    j.completed = 2
    assert settle(j, 0, 3.0) and j.state is S.CANCELLED
    assert not request_cancel(j, 4.0)


def test_expiry() -> None:
    j = new_job(1, "b", "api", 0.0, window_s=10.0)
    j.total = 5
    assert not expire_due(j, 9.9) and expire_due(j, 10.0)
    mark_expired(j)
    assert j.expired and j.sealed and not expire_due(j, 11.0)
    j.completed, j.cancelled = 2, 3
    assert settle(j, 0, 12.0) and j.state is S.EXPIRED
    nowin = new_job(2, "c", "api", 0.0)
    assert not expire_due(nowin, 1e12)


def test_validation_failure_and_errors_kept() -> None:
    j = new_job(1, "b", "api", 0.0, validating=True)
    fail_validation(j, [f"e{i}" for i in range(30)], 1.0)
    assert j.state is S.FAILED and j.sealed and len(j.errors) == MAX_ERRORS
    k = new_job(2, "c", "submit", 0.0)
    add_errors(k, ["a", "b"])
    add_errors(k, [f"x{i}" for i in range(30)])
    assert k.rejected == 32 and k.errors[:3] == ["a", "b", "x0"] and len(k.errors) == MAX_ERRORS


def test_shapes() -> None:
    j = new_job(1, "b", "submit", 0.0)
    add_shapes(j, {JobShape("m", 2), JobShape("m", 1)})
    add_shapes(j, {JobShape("m", 1), JobShape("n", 0, "x")})
    assert j.shapes == [JobShape("m", 1), JobShape("m", 2), JobShape("n", 0, "x")]
    add_shapes(j, {JobShape("z", i) for i in range(100)})
    assert len(j.shapes) == MAX_SHAPES


events = st.lists(st.one_of(
    st.tuples(st.just("ingest"), st.integers(1, 5)),
    st.tuples(st.just("dispatch"), st.integers(1, 5)),
    st.tuples(st.just("outcome"), st.sampled_from(["completed", "failed"])),
    st.tuples(st.just("cancel"), st.just(0)),
    st.tuples(st.just("expire"), st.just(0)),
    st.tuples(st.just("seal"), st.integers(0, 50)),
    st.tuples(st.just("start"), st.just(0)),
    st.tuples(st.just("settle"), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events, st.booleans())
def test_any_order_counts_add_up_and_states_follow_openai(
        evs: list[tuple[str, int | str]], validating: bool) -> None:
    """A model store beside the record: items queued (in a lane) or in flight; a cancel or
    an expiry takes the queued ones; settle gets the in-flight count. After every event the
    record's counts match the model and each state change is one of OpenAI's."""
    j = new_job(1, "b", "api", 0.0, validating=validating, window_s=10.0)
    lane = flying = 0
    now = 0.0
    seen = [j.state]

    def check() -> None:
        assert j.total == j.completed + j.failed + j.cancelled + lane + flying
        assert j.queued == lane + flying >= 0
        if j.state is not seen[-1]:
            assert j.state in NEXT[seen[-1]], (seen, j.state)
            seen.append(j.state)
        assert list(j.times) == [s.value for s in seen]

    for kind, arg in evs:
        now += 1.0
        if kind == "ingest" and not j.sealed and j.state is not S.VALIDATING:
            assert isinstance(arg, int)
            j.total += arg
            lane += arg
        elif kind == "dispatch":
            assert isinstance(arg, int)
            k = min(arg, lane)
            lane, flying = lane - k, flying + k
        elif kind == "outcome" and flying:
            flying -= 1
            if arg == "completed":
                j.completed += 1
            else:
                j.failed += 1
        elif kind == "cancel" and request_cancel(j, now):
            j.cancelled += lane
            lane = 0
        elif kind == "expire":
            if expire_due(j, now):
                mark_expired(j)
                j.cancelled += lane
                lane = 0
        elif kind == "seal":
            assert isinstance(arg, int)
            if j.state is S.VALIDATING:
                start(j, now)
                check()
            seal(j, arg, now)
        elif kind == "start":
            start(j, now)
        elif kind == "settle":
            settle(j, flying, now)
        check()
    # the input ends and every item gets its outcome: the job ends (or waits validating)
    now += 1.0
    if j.state is not S.VALIDATING and not j.ended:
        if not j.sealed:
            seal(j, 0, now)
            check()
        j.completed += lane + flying
        lane = flying = 0
        check()
        for _ in range(2):
            settle(j, 0, now)
            check()
        assert j.ended, seen
        assert j.state is (S.CANCELLED if S.CANCELLING in seen else
                           S.EXPIRED if j.expired else S.COMPLETED)
