"""The shape choice: the clock, the deadline, the priority and the job reach it (core only,
an explicit clock, the default "consumer" scope)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from core_helpers import each_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.events import Event, EventKind
from fabricctl.core.rate import RateMeter
from fabricctl.core.shape import Shape
from fabricctl.core.terms import JobTerms, check_priority
from fabricctl.core.types import Contract, Item
from fabricctl.core.waiting import Waiting

_ids = itertools.count(1)
BUDGET = 1000  # B: a batch's tokens (10 items of 100)


def items(sig: int, n: int, job: int = 0, tokens: int = 100) -> list[Item]:
    return [Item(f"i{next(_ids)}", "m", sig, tokens, 16, job=job) for _ in range(n)]


def fleet(consumers: int = 2, **cfg: object) -> Broker:
    b = Broker(dataclasses.replace(CoreConfig(), **cfg))  # type: ignore[arg-type]
    for k in range(consumers):
        b.register(f"c{k}", Contract("m", 10, BUDGET, 4096), now=0.0)
    return b


def run(b: Broker, t0: float, t1: float, dt: float = 0.01) -> dict[int, float]:
    """Every consumer pulls and completes at once each `dt`; returns when each signature's
    last item was served."""
    return {batch.signature: t for t, _, batch in each_batch(b, t0, t1, dt)}


# -- the parts, with literal asserts ----------


def test_check_priority() -> None:
    assert check_priority(0) == 0
    assert check_priority("7") == 7
    for bad in (-1, "x", "1.5", 1.5, True, 10**7):
        try:
            check_priority(bad)
        except ValueError as e:
            assert "priority must be a whole number" in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_rate_meter() -> None:
    m = RateMeter(window_s=10)
    assert m.rate(5.0) is None
    m.begin(0.0)
    m.add(2.0, 1000)
    assert m.rate(4.0) == 250.0  # since the first dispatch
    m.add(20.0, 500)
    assert m.rate(20.0) == 50.0  # the first bucket left the window
    assert m.batch_s(20.0, 100, 2) == 4.0


def _shape(sig: int, tokens: int, cfg: CoreConfig, counters: object, job: int = 0) -> Shape:
    from fabricctl.core.lanes import LaneCounters
    s = Shape("m", sig, "", cfg, counters if isinstance(counters, LaneCounters)
              else LaneCounters(), 0.0)
    s.items, s.tokens = 1, tokens
    s.jobs = {job: 1}
    return s


def test_waiting_orders_and_drops_stale_entries() -> None:
    cfg = CoreConfig()
    w = Waiting()
    a, b, c = (_shape(i, t, cfg, None) for i, t in ((1, 50), (2, 500), (3, 5)))
    w.touch(a, 0, None, 3.0)
    w.touch(b, 0, 9.0, 2.0)
    w.touch(c, 1, None, 1.0)
    (p1, top), (p0, low) = list(w.ordered())
    assert (p1, p0) == (1, 0)
    assert top.by_tokens.top() is c
    assert low.by_tokens.top() is b
    assert low.by_age.top() is b and low.by_deadline.top() is b
    b.held = 1  # a consumer took it: no longer a candidate
    assert low.by_tokens.top() is a
    b.held = 0
    a.tokens = 900
    w.touch(a, 0, None, 3.0)  # its old entry is stale now
    assert low.by_tokens.top() is a
    assert [s.signature for s in w.with_job(0)] == sorted([1, 2, 3]) or len(w.with_job(0)) == 3


# -- the rules, through the broker ----------


def test_small_job_behind_big_one_gets_a_gpu_after_amortising() -> None:
    b = fleet(2, amortise_batches=4)
    last = big_then_small(b, 300, 0.5)  # the big job: 6 shapes, 300 items each
    # 30 items = 3 batches; a consumer leaves after amortising (<= 4 batches), so it is done
    # within a few ticks, long before the big job (1,500 items left) ends
    assert last[99] <= 0.5 + 0.01 * 8
    reasons = [e.reason for e in b.events.since(0, limit=10_000) if e.kind is EventKind.SWITCH]
    assert any("fair share" in r for r in reasons)


def switches(b: Broker) -> list[str]:
    return [e.reason for e in b.events.since(0, limit=10_000) if e.kind is EventKind.SWITCH]


def big_then_small(b: Broker, per_shape: int, at: float, until: float = 1.0
                   ) -> dict[int, float]:
    """Job 1 (6 sealed shapes of `per_shape` items) from 0, job 2 (one sealed shape, 99, of
    30 items) from `at`: when each signature's last item was served."""
    for sig in range(1, 7):
        b.ingest(items(sig, per_shape, job=1), 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    run(b, 0.0, at)
    b.ingest(items(99, 30, job=2), at)
    b.set_job_terms(2, JobTerms(sealed=True))
    return run(b, at, until)


def test_a_new_job_takes_the_consumer_at_its_next_batch_boundary() -> None:
    b = fleet(1)  # 6 shapes of 5 batches: no run on one reaches the 8 that amortise a switch
    last = big_then_small(b, 50, 0.12)
    assert last[99] == 0.15  # its 3 batches from the next pull on (0.13-0.15)
    moves = [(e.src, e.dst, e.reason) for e in b.events.since(0, limit=1000)
             if e.kind is EventKind.TRANSITION and e.signature == 99]
    assert moves[0] == ("staged", "active", "new job")  # before shape 3, warming since 0.08
    assert len(last) == 5  # and the big job's shapes all finished after it
    assert b.lifecycle.chooser.served == {1, 2}


def test_a_new_job_leaves_the_current_shape_after_one_batch_not_after_amortising() -> None:
    """Shapes of 2.5 batches: the consumer has just taken shape 2 (shape 3 warming to follow)
    when the new job comes; it leaves shape 2 after one batch, and shape 2 waits."""
    b = fleet(1)
    last = big_then_small(b, 25, 0.04)
    assert last[99] == 0.07
    assert switches(b) == ["c0 left after 1 batches: new job"]
    assert last[2] == max(last.values())  # the shape it left is served last


def test_a_new_job_goes_before_the_shape_pre_warmed_to_follow_a_drained_one() -> None:
    """Shapes of one batch: the consumer's shape drains with its first batch while the next
    is warming; a new job queued then takes the consumer before the warmed shape, which
    stays its next."""
    b = fleet(1)
    for sig in range(1, 7):
        b.ingest(items(sig, 9, job=1), 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    run(b, 0.0, 0.005)
    slot = b.models["m"].slots["c0"]
    assert slot.current is not None and slot.current.state.value == "draining"
    assert slot.warming is not None and slot.warming.signature == 2
    b.ingest(items(99, 30, job=2), 0.005)
    b.set_job_terms(2, JobTerms(sealed=True))
    last = run(b, 0.01, 1.0)
    assert last[99] == 0.04 and last[2] == 0.05  # 99's four batches, then the warmed one
    moves = [(e.signature, e.src, e.dst, e.reason) for e in b.events.since(0, limit=1000)
             if e.kind is EventKind.TRANSITION and e.signature in (2, 99)]
    assert moves[1:3] == [(99, "staged", "active", "new job"),
                          (99, "active", "draining", "below drain threshold")]


def test_a_new_job_waits_when_the_served_one_is_short_or_due_earlier() -> None:
    for terms in (JobTerms(sealed=True), JobTerms(sealed=True, deadline=5.0)):
        b = fleet(1)
        b.ingest(items(1, 50, job=1), 0.0)  # 5 batches
        b.set_job_terms(1, terms)
        run(b, 0.0, 0.02)
        n = 50 * 4 if terms.deadline is None else 60  # 4x longer: job 1 is "short"
        b.ingest(items(2, n, job=2), 0.02)
        b.set_job_terms(2, JobTerms(sealed=True, deadline=None if n == 200 else 9.0))
        last = run(b, 0.02, 0.2)
        assert last[1] < min(t for s, t in last.items() if s != 1)
        assert not any("new job" in r for r in switches(b)), terms


def test_a_served_job_does_not_cut_in_again_until_amortised() -> None:
    """Two jobs submitted together: the one not taken first cuts in once (a switch per job at
    most), and from then on both are served: they take turns only as runs amortise (fair
    share), not every batch."""
    b = fleet(1, amortise_batches=8)
    b.ingest(items(1, 400, job=1), 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    b.ingest(items(2, 400, job=2), 0.0)
    b.set_job_terms(2, JobTerms(sealed=True))
    run(b, 0.0, 0.5)
    first, *taken = switches(b)
    assert first == "c0 left after 1 batches: new job"
    assert len(taken) >= 4 and all(r == "c0 left after 8 batches: fair share" for r in taken)


def test_without_fair_share_the_small_job_waits_for_the_bound() -> None:
    b = fleet(2, amortise_batches=4, fair_share=False, wait_bound_s=0.3)
    for sig in (1, 2):  # one big shape for each consumer: only the small one waits
        b.ingest(items(sig, 900, job=1), 0.0)
    run(b, 0.0, 0.5)
    b.ingest(items(99, 30, job=2), 0.5)
    last = run(b, 0.5, 1.5)
    assert 0.8 <= last[99] <= 0.8 + 0.03  # the bound (0.3 s), then its 3 batches


def test_tokens_only_would_starve_the_small_shape() -> None:
    """The same with a bound too long to matter and no fair share: the big shapes go
    first (what the old scheduler did): the test above can fail."""
    b = fleet(2, amortise_batches=4, fair_share=False, wait_bound_s=1e9)
    for sig in range(1, 7):
        b.ingest(items(sig, 300, job=1), 0.0)
    run(b, 0.0, 0.5)
    b.ingest(items(99, 30, job=2), 0.5)
    last = run(b, 0.5, 3.0)
    assert last[99] > max(t for s, t in last.items() if s != 99) - 0.05


def test_higher_priority_goes_first_and_takes_a_busy_consumer() -> None:
    b = fleet(1, amortise_batches=4)
    b.ingest(items(1, 500, job=1), 0.0)
    run(b, 0.0, 0.1)
    b.ingest(items(2, 50, job=2), 0.1)
    b.set_job_terms(2, JobTerms(priority=5, sealed=True))
    last = run(b, 0.1, 0.5)
    assert last[2] <= 0.1 + 0.01 * 10
    assert b.models["m"].open[1].items > 0  # the low-priority shape still had work


def test_a_priority_change_reaches_waiting_shapes() -> None:
    b = fleet(1, amortise_batches=2, fair_share=False, wait_bound_s=1e9)
    b.ingest(items(1, 500, job=1), 0.0)
    b.ingest(items(2, 400, job=2), 0.0)
    b.ingest(items(3, 300, job=3), 0.0)
    run(b, 0.0, 0.05)  # on shape 1, the biggest
    b.set_job_terms(3, JobTerms(priority=2))
    last = run(b, 0.05, 0.3)
    assert 3 in last and 2 not in last  # 3 jumped the queue; 2 (more tokens) waits


def test_earliest_deadline_first_when_the_deadline_is_due() -> None:
    b = fleet(1, amortise_batches=2, fair_share=False, wait_bound_s=1e9)
    b.ingest(items(1, 400, job=1), 0.0)
    run(b, 0.0, 0.1)  # a rate: 1,000 tokens each 10 ms = 100,000 tokens/s
    b.ingest(items(2, 100, job=2), 0.1)
    b.ingest(items(3, 100, job=3), 0.1)
    # ~30,000 tokens queued: 0.3 s to drain. Job 3's window ends inside it, job 2's long after
    b.set_job_terms(2, JobTerms(deadline=100.0))
    b.set_job_terms(3, JobTerms(deadline=0.3))
    last = run(b, 0.1, 1.0)
    assert last[3] <= 0.3
    assert last[3] < last[2]


def test_a_sealed_small_shape_does_not_wait_to_grow() -> None:
    b = fleet(1, stage_timeout_s=100.0)
    b.ingest(items(1, 2000, job=1), 0.0)
    b.set_job_terms(1, JobTerms(sealed=False))
    b.ingest(items(2, 3, job=2), 0.0)
    ms = b.models["m"]
    ctx = b.lifecycle.context(ms, 0.0, False)
    small = ms.open[2]
    assert b.lifecycle.chooser.eligible(small, ctx) is None  # unsealed, small, young
    b.set_job_terms(2, JobTerms(sealed=True))
    assert b.lifecycle.chooser.eligible(small, ctx) == "input ended"


def test_structureless_work_picks_in_log_time() -> None:
    """10,000 one-item shapes: each pick reads heap tops, not every staged shape."""
    b = fleet(1)
    b.ingest([it for sig in range(1, 10_001) for it in items(sig, 1, job=1)], 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    served = 0
    t = 0.0
    while served < 10_000:
        t += 0.001
        batch = b.pull("c0", t)
        assert batch is not None
        b.complete(batch.id, t)
        served += len(batch.entries)
    assert b.ledger.consistent()


# -- the invariant, for random arrivals ----------

arrivals = st.lists(
    st.tuples(st.integers(0, 200),  # when (ticks of 10 ms)
              st.integers(1, 12),  # signature
              st.integers(1, 300),  # items
              st.integers(1, 3)),  # job
    min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(arrivals=arrivals, consumers=st.integers(1, 4), bound=st.sampled_from([0.05, 0.2, 1.0]),
       amortise=st.integers(1, 6), fair=st.booleans())
def test_no_shape_waits_past_the_bound_while_a_consumer_serves_an_amortised_shape(
        arrivals: list[tuple[int, int, int, int]], consumers: int, bound: float,
        amortise: int, fair: bool) -> None:
    b = fleet(consumers, wait_bound_s=bound, amortise_batches=amortise, fair_share=fair)
    ms = b.model("m")
    by_tick: dict[int, list[tuple[int, int, int]]] = {}
    for tick, sig, n, job in arrivals:
        by_tick.setdefault(tick, []).append((sig, n, job))
    pulls: dict[str, int] = dict.fromkeys(b.consumers, 0)
    for tick in range(400):
        now = tick * 0.01
        for sig, n, job in by_tick.get(tick, []):
            b.ingest(items(sig, n, job), now)
        if tick % 100 == 0:
            b.tick(now)
        for c in list(b.consumers):
            batch = b.pull(c, now)
            if batch is None:
                continue
            pulls[c] += 1
            slot = ms.slots[c]
            if slot.batches - 1 >= amortise:  # it served an amortised shape at this choice
                cur = slot.current
                assert cur is not None
                for prio, level in ms.waiting.ordered():
                    if prio < 0:
                        continue
                    s = level.by_age.top()
                    if s is None:
                        continue
                    since = s.waiting_since()
                    assert since is None or now - since < bound, (
                        f"shape {s.signature} waited {now - since:.2f}s > {bound}s while "
                        f"{c} served an amortised shape")
            b.complete(batch.id, now)
    assert b.ledger.consistent()
    switches = [e for e in b.events.since(0, limit=100_000) if e.kind is EventKind.SWITCH]
    assert len(switches) == ms.preemptions
    # a job nobody served cuts in once at most; every other switch away from a shape with
    # work comes after amortising: the bound forces no more
    cut_ins = sum(1 for e in switches if e.reason.endswith("new job"))
    assert cut_ins <= len({job for *_, job in arrivals})
    assert ms.preemptions - cut_ins <= sum(n // amortise for n in pulls.values())
    if not fair:
        assert all(e.reason.endswith("waited past the bound") for e in switches)


# -- where each job stands (`core.forecast`) ----------


def test_job_views_share_and_predict() -> None:
    from fabricctl.core.forecast import job_views
    from fabricctl.core.lanes import LaneCounters
    cfg = CoreConfig()
    a = _shape(1, 3000, cfg, LaneCounters(), job=1)
    b = _shape(2, 1000, cfg, LaneCounters(), job=2)
    a.staged_since, b.staged_since = 5.0, 8.0
    views = job_views([a, b], {1: 2}, 4, {2: JobTerms(deadline=10.0)}, 100.0, 10.0)
    v1, v2 = views
    assert (v1.job, v1.queued_tokens, v1.holders, v1.share, v1.oldest_wait_s) == (1, 3000, 2, 0.5,
                                                                                   5.0)
    # job 2 has a deadline, so it goes first: 1,000 tokens at 100/s
    assert v2.predicted_finish == 20.0 and v2.at_risk
    assert v1.predicted_finish == 50.0 and not v1.at_risk
    assert job_views([a, b], {}, 4, {}, None, 10.0)[0].predicted_finish is None
    # equal class: processor sharing, each peer counts up to the job's own tokens
    views = job_views([a, b], {}, 4, {}, 100.0, 0.0)
    assert [v.predicted_finish for v in views] == [40.0, 20.0]


def test_a_job_going_to_miss_says_so_before_it_does() -> None:
    def risks(b: Broker) -> list[Event]:
        return [e for e in b.events.since(0, limit=10_000) if e.kind is EventKind.JOB_AT_RISK]

    for prior in (None, 100_000.0):
        b = fleet(1, fair_share=False)
        if prior is not None:  # the pace the last run kept: 100,000 tokens/s per consumer
            b.restore_paces({"m": prior})
        b.ingest(items(1, 200, job=1), 0.0)
        run(b, 0.0, 0.1)  # measured: 100,000 tokens/s; 10,000 tokens left = 0.1 s
        b.ingest(items(2, 500, job=2), 0.1)  # 50,000 tokens: 0.5 s at best
        b.set_job_terms(2, JobTerms(deadline=0.4))
        b.tick(0.1)
        (view,) = [v for v in b.snapshot(0.1).job_views if v.job == 2]
        if prior is None:  # 0.1 s measured is no rate to call a job late by (its floor
            # reads 10,000 tokens/s): a finish is shown, no warning
            assert not risks(b) and not view.at_risk and view.predicted_finish is not None
            continue
        risk = risks(b)
        assert len(risk) == 1 and risk[0].value == 2 and risk[0].critical
        assert "after its deadline" in risk[0].reason
        assert view.at_risk and view.predicted_finish is not None
        # at the kept pace, beside job 1's 11,000 tokens left (hopeless: it has no place
        # before job 1 any more)
        assert view.predicted_finish == pytest.approx(0.1 + 61_000 / 100_000, abs=0.01)
        b.tick(0.2)  # said once
        assert len(risks(b)) == 1


def test_bad_choice_settings_are_refused(tmp_path: object) -> None:
    from pathlib import Path

    import pytest

    from fabricctl.config import load_config
    from fabricctl.errors import UsageError
    assert isinstance(tmp_path, Path)
    for bad in ("amortise_batches = 0", "wait_bound_s = -1"):
        f = tmp_path / "c.toml"
        f.write_text(f"[broker]\n{bad}\n")
        with pytest.raises(UsageError, match="amortise_batches must be >= 1"):
            load_config(config_file=f)
    f.write_text("[broker]\nwait_bound_s = 5.0\namortise_batches = 4\n")
    cfg = load_config(config_file=f)
    assert (cfg.broker.wait_bound_s, cfg.broker.amortise_batches) == (5.0, 4)


def test_a_short_job_may_take_a_second_gpu_and_the_long_one_comes_back() -> None:
    b = fleet(2, amortise_batches=4)
    for sig in (1, 2):
        b.ingest(items(sig, 900, job=1), 0.0)  # the long job: one shape per consumer
    b.set_job_terms(1, JobTerms(sealed=True))
    run(b, 0.0, 0.1)
    b.ingest(items(99, 60, job=2), 0.1)  # 6,000 tokens against ~160,000
    b.set_job_terms(2, JobTerms(sealed=True))
    ms = b.models["m"]
    seen_both = False
    t = 0.1
    while t < 0.3:
        for c in list(b.consumers):
            batch = b.pull(c, t)
            if batch is not None:
                b.complete(batch.id, t)
        t = round(t + 0.01, 6)
        if all(s.current is not None and s.current.signature == 99 for s in ms.slots.values()):
            seen_both = True
    reasons = [e.reason for e in b.events.since(0, limit=10_000) if e.kind is EventKind.SWITCH]
    assert seen_both and any(r.endswith("shortest job") for r in reasons)
    assert 99 not in {s.signature for s in ms.open.values() if s.items}  # done
    assert any(s.current is not None and s.current.signature in (1, 2)
               for s in ms.slots.values())  # the long job is served again


def test_strict_priority_still_ages_a_starved_shape() -> None:
    b = fleet(1, amortise_batches=2, aging_s=0.5, wait_bound_s=1e9)
    b.set_job_terms(1, JobTerms(priority=5))
    b.ingest(items(1, 100, job=1), 0.0)
    b.ingest(items(2, 10, job=2), 0.0)  # low priority, waiting
    t, last = 0.0, {}
    while t < 1.0:  # a stream of high-priority work that never ends
        b.ingest(items(1, 100, job=1), t)  # more than the consumer drains
        b.set_job_terms(1, JobTerms(priority=5))
        last.update(run(b, t, t + 0.05))
        t = round(t + 0.05, 6)
    assert 2 in last and 0.5 <= last[2] <= 0.6


def test_rate_meter_does_not_count_an_idle_window_before_a_new_span() -> None:
    """A job after a rest is forecast at what the fleet does now: the span starts at the
    first dispatch after a window with no completion, not at the very first dispatch (the
    tokens of the new job's first second were spread over the whole window: 30 times too
    slow, a 'finish in 3m22s' for a job that took 28 s)."""
    m = RateMeter(window_s=30)
    m.begin(0.0)
    m.add(4.0, 4000)
    assert m.rate(4.0) == 1000.0
    m.begin(100.0)  # 96 s without a completion: a new span
    m.begin(100.5)  # dispatched before the new span's first completion: the same span
    m.add(102.0, 2000)
    assert m.rate(102.0) == 1000.0  # 2000 in 2 s, not 2000 over the 30 s window
    m.begin(103.0)  # busy: the span goes on
    m.add(104.0, 2000)
    assert m.rate(104.0) == 1000.0
