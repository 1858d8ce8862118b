"""The shape lifecycle, driven through the Broker with an explicit clock, in shape_scope
"model" (one current shape per model; the default "consumer" scope: test_replay_scope)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import pytest

from fabricctl.core.broker import Broker, ShapeGuardError, UnknownBatchError
from fabricctl.core.config import CoreConfig
from fabricctl.core.events import Event, EventKind
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.types import Batch, Contract, Entry, Item, Prewarm

A, B, C, D = 0xA, 0xB, 0xC, 0xD
_ids = itertools.count(1)


def items(sig: int, n: int, tokens: int = 100, model: str = "m") -> list[Item]:
    return [Item(f"i{next(_ids)}", model, sig, tokens, 16, label=f"s{sig:x}") for _ in range(n)]


def broker(cfg: CoreConfig | None = None, size: int = 8, budget: int = 1000) -> Broker:
    """A broker with one consumer "c1" of model "m"; B (the batch token budget) = `budget`."""
    b = Broker(dataclasses.replace(cfg or CoreConfig(), shape_scope="model"))
    b.register("c1", Contract("m", size, budget, 4096), now=0.0)
    return b


def shape_of(b: Broker, sig: int, model: str = "m") -> Shape:
    return b.models[model].open[sig]


def transitions(b: Broker) -> list[Event]:
    return [e for e in b.events.since(0, limit=100_000) if e.kind is EventKind.TRANSITION]


def moves(b: Broker) -> list[tuple[int, str, str]]:
    return [(e.signature, e.src, e.dst) for e in transitions(b)]


def drain(b: Broker, consumer: str, now: float) -> list[Batch]:
    out = []
    while (batch := b.pull(consumer, now)) is not None:
        out.append(batch)
    return out


def drain_current(b: Broker, consumer: str, now: float, model: str = "m") -> list[Batch]:
    """Pull until the model's current shape has dispatched its last item (no further pull)."""
    out = []
    cur = b.models[model].current
    while cur is not None and cur.items and (batch := b.pull(consumer, now)) is not None:
        out.append(batch)
    return out


# -- staged ------------------------------------------------------------------------------------


def test_staged_until_activate_multiple_of_budget() -> None:
    b = broker(CoreConfig(activate_when_idle=False))
    b.ingest(items(A, 19), now=0.0)  # 1900 tokens < 2 x 1000
    assert b.pull("c1", 0.0) is None
    assert shape_of(b, A).state is ShapeState.STAGED
    b.ingest(items(A, 1), now=0.5)  # 2000 tokens
    batch = b.pull("c1", 0.5)
    assert batch is not None
    assert batch.signature == A
    assert batch.epoch == 1
    shape = shape_of(b, A)
    assert shape.state is ShapeState.ACTIVE
    assert shape.epoch == 1
    [ev] = transitions(b)
    assert (ev.t, ev.model, ev.signature, ev.src, ev.dst, ev.reason) == (
        0.5, "m", A, "staged", "active", "threshold")
    assert ev.label == "sa"


def test_staged_until_stage_timeout() -> None:
    b = broker(CoreConfig(activate_when_idle=False))
    b.ingest(items(A, 1), now=10.0)
    assert b.pull("c1", 11.999) is None
    b.tick(11.999)
    assert shape_of(b, A).state is ShapeState.STAGED
    batch = b.pull("c1", 12.0)  # the oldest staged item is stage_timeout_s old
    assert batch is not None
    assert transitions(b)[-1].reason == "timeout"


def test_stage_timeout_through_tick() -> None:
    b = broker(CoreConfig(activate_when_idle=False))
    b.ingest(items(A, 1), now=0.0)
    b.tick(1.0)
    assert shape_of(b, A).state is ShapeState.STAGED
    b.tick(2.0)
    assert shape_of(b, A).state is ShapeState.ACTIVE
    assert b.models["m"].epoch == 1


def test_idle_consumers_activate_a_small_shape() -> None:
    b = broker()
    b.ingest(items(A, 1), now=0.0)
    batch = b.pull("c1", 0.0)
    assert batch is not None
    assert transitions(b)[-1].reason == "idle"


def test_activation_copies_the_length_histogram() -> None:
    b = broker()
    b.ingest(items(A, 3, tokens=100), now=0.0)
    b.pull("c1", 0.0)
    shape = shape_of(b, A)
    assert shape.stats is not None
    assert shape.stats is not shape.lengths
    assert shape.stats.count == 3
    b.ingest(items(A, 2, tokens=100), now=0.1)
    assert shape.lengths.count == 5
    assert shape.stats.count == 3


def test_place_then_admit_matches_ingest() -> None:
    lengths = [100, 990, 1000, 105, 5000, 4990, 0, 100]
    one, two = broker(), broker()
    batch = [Item(f"x{k}", "m", A, n, 16 + k) for k, n in enumerate(lengths)]
    assert one.ingest(batch, now=1.0) == len(lengths)
    for k, it in enumerate(batch):
        p = two.place("m", A, "", it.input_tokens, 1.0)
        assert p.shape.items == k  # placed, not yet admitted
        two.admit(p, Entry(k, it.input_tokens, it.max_tokens, 1.0, it))
    for b in (one, two):
        shape = shape_of(b, A)
        assert shape.items == 8
        assert shape.tokens == sum(lengths)
        assert shape.staged_since == 1.0
        assert shape.lengths.count == 8
        assert b.ledger.items_received == 8
        assert b.ledger.tokens_received == sum(lengths)
        assert b.ledger.consistent()
    lanes = [sorted((la.target, [e.tokens for e in la.queue])
                    for la in shape_of(b, A).lanes.lanes.values()) for b in (one, two)]
    assert lanes[0] == lanes[1]


def test_ingest_keeps_the_ledger_when_the_source_fails() -> None:
    b = broker()

    def source() -> Iterator[Item]:
        yield from items(A, 3)
        raise RuntimeError("producer went away")

    with pytest.raises(RuntimeError):
        b.ingest(source(), now=0.0)
    assert shape_of(b, A).items == 3
    assert b.ledger.items_received == 3
    assert b.ledger.tokens_received == 300
    assert b.ledger.consistent()
    assert b.ingest(items(A, 1), now=0.0) == 1
    keys = [e.key for la in shape_of(b, A).lanes.lanes.values() for e in la.queue]
    assert len(set(keys)) == 4


def test_tick_drops_a_staged_shape_whose_placement_was_never_admitted() -> None:
    b = broker()
    p = b.place("m", A, "", 100, now=0.0)  # the durable write then failed: no admit
    assert p.shape.state is ShapeState.STAGED
    assert len(p.shape.lanes) == 1
    b.tick(1.0)
    assert A not in b.models["m"].open
    assert b.shapes() == []
    assert b.lane_counters.releases == 1
    assert b.ledger.items_received == 0
    b.ingest(items(A, 1), now=1.0)
    assert shape_of(b, A) is not p.shape


# -- warming, draining, finishing ----------------------------------------------------------------


def warming_setup() -> Broker:
    """A active with 6000 tokens; B (2500) and C (3000) staged above 2000; D (500) below."""
    b = broker(CoreConfig(activate_when_idle=False))
    b.ingest(items(A, 60), now=0.0)
    assert b.pull("c1", 0.0) is not None  # A activates (5200 tokens left)
    b.ingest(items(B, 25), now=0.0)
    b.ingest(items(C, 30), now=0.0)
    b.ingest(items(D, 5), now=0.0)
    return b


def test_warming_is_the_staged_shape_with_most_tokens_below_prewarm() -> None:
    b = warming_setup()
    a = shape_of(b, A)
    assert b.pull("c1", 0.1) is not None  # 4400 left: still above 4 x 1000
    assert b.models["m"].warming is None
    assert b.take_signals() == []
    assert b.pull("c1", 0.2) is not None  # 3600 left
    assert a.tokens == 3600
    assert b.models["m"].warming is None  # transitions happen on the next look
    assert b.pull("c1", 0.3) is not None
    ms = b.models["m"]
    assert ms.warming is shape_of(b, C)
    assert shape_of(b, C).state is ShapeState.WARMING
    assert shape_of(b, B).state is ShapeState.STAGED
    assert shape_of(b, D).state is ShapeState.STAGED
    c = shape_of(b, C)
    lanes = [(lane.id, lane.target) for lane in c.lanes.lanes.values()]
    assert b.take_signals() == [Prewarm("m", C, "sc", 2, lanes)]
    assert b.take_signals() == []
    assert c.epoch == 2
    ev = transitions(b)[-1]
    assert (ev.t, ev.signature, ev.src, ev.dst, ev.reason) == (0.3, C, "staged", "warming",
                                                                "threshold")
    prewarms = [e for e in b.events.since(0) if e.kind is EventKind.PREWARM]
    assert [(e.signature, e.value) for e in prewarms] == [(C, 2)]


def test_one_warming_at_a_time() -> None:
    b = warming_setup()
    drain_current(b, "c1", 1.0)
    states = [(s.signature, s.state) for s in b.shapes()]
    assert sorted(states) == [(A, ShapeState.DRAINING), (B, ShapeState.STAGED),
                              (C, ShapeState.WARMING), (D, ShapeState.STAGED)]
    assert len(b.take_signals()) == 1


def test_active_stays_active_without_a_warming_shape() -> None:
    b = broker(CoreConfig(activate_when_idle=False))
    b.ingest(items(A, 30), now=0.0)
    batches = drain(b, "c1", 0.0)
    assert sum(len(x.entries) for x in batches) == 30
    a = shape_of(b, A)
    assert a.tokens == 0
    assert a.state is ShapeState.ACTIVE
    for x in batches:
        b.complete(x.id, 1.0)
    b.tick(2.0)
    assert a.state is ShapeState.ACTIVE
    assert b.models["m"].current is a


def test_full_switch() -> None:
    b = warming_setup()
    a = shape_of(b, A)
    c = shape_of(b, C)
    out = drain_current(b, "c1", 1.0)
    assert a.state is ShapeState.DRAINING
    assert a.tokens == 0
    assert A not in b.models["m"].open
    assert b.models["m"].current is a
    # a draining shape never takes new items: a late one starts a new staged object
    b.ingest(items(A, 1), now=1.5)
    late = shape_of(b, A)
    assert late is not a
    assert late.state is ShapeState.STAGED
    assert a.items == 0
    inflight = sorted(b.inflight)
    # every lane returned its slot (its last item went out): the next pull finishes A and
    # activates C at once, while A's batches are still in flight — no GPU waits on a tail
    first_c = b.pull("c1", 2.0)
    assert first_c is not None
    assert (first_c.signature, first_c.epoch) == (C, 2)
    assert a.state is ShapeState.FINISHED
    assert a.finished_at == 2.0
    assert c.state is ShapeState.ACTIVE
    assert b.models["m"].epoch == 3  # C's, then the one B's pre-warm reserved (below)
    assert b.models["m"].current is c
    assert b.lifecycle.finished == [a]
    assert a.batches == 1 + len(out)
    assert len(a.lanes) == len({b.inflight[i].lane.id for i in inflight})
    for batch_id in inflight:
        assert b.inflight[batch_id].batch.epoch == 1
        b.complete(batch_id, 3.0)
    assert a.lanes.lanes == {}  # settled batches return their lanes to the finished shape
    # C has under 4000 tokens left: B warms, with the epoch after C's
    assert b.models["m"].warming is shape_of(b, B)
    assert [s.epoch for s in b.take_signals()] == [2, 3]
    assert moves(b)[:6] == [
        (A, "staged", "active"),
        (C, "staged", "warming"),
        (A, "active", "draining"),
        (A, "draining", "finished"),
        (C, "warming", "active"),
        (B, "staged", "warming"),
    ]
    for ev in transitions(b):
        assert ev.model == "m"
        assert ev.reason != ""
    fin = [e for e in transitions(b) if e.dst == "finished"]
    assert [(e.t, e.reason) for e in fin] == [(2.0, "lanes returned")]
    assert [e.t for e in transitions(b) if e.dst == "active"] == [0.0, 2.0]
    b.complete(first_c.id, 3.0)
    assert b.ledger.consistent()


def test_a_failed_batch_of_a_finished_shape_goes_back_to_staging() -> None:
    b = warming_setup()
    a = shape_of(b, A)
    drain_current(b, "c1", 1.0)
    inflight = sorted(b.inflight)
    assert b.pull("c1", 2.0) is not None  # A finishes, C activates
    assert a.state is ShapeState.FINISHED
    lost = b.fail(inflight[0], 2.5)
    again = shape_of(b, A)
    assert again is not a
    assert again.state is ShapeState.STAGED
    assert again.items == len(lost.entries)
    assert b.ledger.consistent()


def thrash_events(b: Broker) -> list[Event]:
    return [e for e in b.events.since(0) if e.kind is EventKind.THRASH]


def test_a_short_shape_that_served_its_whole_prefix_is_not_thrashing() -> None:
    b = warming_setup()
    a = shape_of(b, A)
    drain_current(b, "c1", 1.0)
    for batch_id in sorted(b.inflight):
        b.complete(batch_id, 2.0)
    assert b.pull("c1", 2.0) is not None  # the next pull finishes A, C activates
    assert a.state is ShapeState.FINISHED
    assert a.batches == 8  # under the line of 100, but every item of A ran in this run
    assert thrash_events(b) == []
    assert (a.thrash, b.batches_hist.total, b.batches_hist.thrashed) == ("", 1, 0)
    assert b.batches_hist.samples == [8]


def test_a_short_shape_whose_prefix_is_staged_again_as_it_drains_thrashes() -> None:
    b = warming_setup()
    a = shape_of(b, A)
    drain_current(b, "c1", 1.0)
    assert a.state is ShapeState.DRAINING
    b.ingest(items(A, 3), now=1.5)  # A's prefix keeps arriving: staged again, a new shape
    again = shape_of(b, A)
    assert again is not a and again.state is ShapeState.STAGED
    for batch_id in sorted(b.inflight):
        b.complete(batch_id, 2.0)
    assert b.pull("c1", 2.0) is not None  # the next pull finishes A, C activates
    assert a.state is ShapeState.FINISHED
    [ev] = thrash_events(b)
    assert (ev.t, ev.model, ev.signature, ev.value, ev.critical) == (2.0, "m", A, 8, True)
    assert ev.reason == a.thrash == (
        "finished after 8 batches (< 100) with 3 items of its prefix staged again; to gather "
        "more per run, raise [broker] activate_multiple or stage_timeout_s")
    assert (b.batches_hist.total, b.batches_hist.thrashed) == (1, 1)
    assert b.batches_hist.samples == [8]
    [view] = b.take_finished()
    assert (view.thrashed, view.thrash) == (True, a.thrash)  # the record the store keeps


def run_shape_with_batches(n: int, again: int = 0) -> Broker:
    """Shape A runs n one-item batches then finishes (B waits warming); `again` items of A
    arrive after it drained, before it finishes."""
    b = broker(size=1)
    b.ingest(items(A, n, tokens=5), now=0.0)
    first = b.pull("c1", 0.0)  # A activates (idle)
    assert first is not None
    b.complete(first.id, 0.0)
    b.ingest(items(B, 20, tokens=100), now=0.0)  # 2000 tokens: eligible
    a = shape_of(b, A)
    t = 0.0
    while a.items:
        batch = b.pull("c1", t)
        assert batch is not None
        assert batch.signature == A
        b.complete(batch.id, t)
        t += 0.001
    assert a.state is ShapeState.DRAINING
    if again:
        b.ingest(items(A, again, tokens=5), now=t)
    nxt = b.pull("c1", t)  # A dispatched its last item: this pull finishes it, B runs
    assert nxt is not None
    assert nxt.signature == B
    assert a.state is ShapeState.FINISHED
    return b


def test_no_thrash_at_exactly_100_batches() -> None:
    b = run_shape_with_batches(100, again=2)
    [a] = b.lifecycle.finished
    assert a.batches == 100
    assert thrash_events(b) == []
    assert b.batches_hist.thrashed == 0
    assert b.batches_hist.total == 1
    assert b.models["m"].current is shape_of(b, B)


def test_thrash_at_99_batches_with_its_prefix_staged_again() -> None:
    b = run_shape_with_batches(99, again=2)
    [a] = b.lifecycle.finished
    assert a.batches == 99
    [ev] = thrash_events(b)
    assert (ev.signature, ev.value, ev.critical) == (A, 99, True)
    assert "2 items of its prefix staged again" in ev.reason
    assert b.batches_hist.thrashed == 1


def test_no_thrash_at_99_batches_when_nothing_of_its_prefix_waits() -> None:
    b = run_shape_with_batches(99)
    [a] = b.lifecycle.finished
    assert (a.batches, a.thrash) == (99, "")
    assert thrash_events(b) == []
    assert (b.batches_hist.total, b.batches_hist.thrashed) == (1, 0)


def test_epochs_bump_per_activation() -> None:
    b = broker(size=64, budget=1000)
    epochs = []
    for k, sig in enumerate((A, B, C, D)):
        b.ingest(items(sig, 3), now=float(k))
        batches = drain(b, "c1", float(k))
        if k:  # the previous shape drains once this one warms
            batches += drain(b, "c1", float(k))
        for x in batches:
            epochs.append((x.signature, x.epoch))
            b.complete(x.id, float(k))
    assert epochs == [(A, 1), (B, 2), (C, 3), (D, 4)]
    assert b.models["m"].epoch == 4
    assert [e.value for e in transitions(b) if e.dst == "active"] == [1, 2, 3, 4]


def test_models_are_independent() -> None:
    b = broker()
    b.register("c2", Contract("n", 8, 1000, 4096), now=0.0)
    b.ingest(items(A, 4) + items(A, 4, model="n"), now=0.0)
    x = b.pull("c1", 0.0)
    y = b.pull("c2", 0.0)
    assert x is not None
    assert y is not None
    assert (x.model, x.epoch) == ("m", 1)
    assert (y.model, y.epoch) == ("n", 1)
    assert shape_of(b, A, "m") is not shape_of(b, A, "n")


# -- the lifecycle-off ablation ------------------------------------------------------------------


def test_lifecycle_off_sticky_then_most_tokens() -> None:
    b = broker(CoreConfig(lifecycle=False), size=4)
    b.ingest(items(A, 4), now=0.0)
    b.ingest(items(B, 8), now=0.0)
    assert shape_of(b, A).state is ShapeState.ACTIVE  # no staging
    first = b.pull("c1", 0.0)
    assert first is not None
    assert first.signature == B  # the most tokens
    b.ingest(items(A, 20), now=0.1)  # A now has far more, but B is sticky
    second = b.pull("c1", 0.1)
    assert second is not None
    assert second.signature == B
    third = b.pull("c1", 0.2)
    assert third is not None
    assert third.signature == A  # B is empty: the shape with the most tokens
    b.ingest(items(C, 100), now=0.3)
    assert b.pull("c1", 0.3).signature == A  # type: ignore[union-attr]
    assert [(e.signature, e.reason) for e in transitions(b)] == [
        (B, "most tokens"), (A, "most tokens")]
    assert [x.epoch for x in (first, second, third)] == [1, 1, 2]


# -- the guard, failures and disconnects -----------------------------------------------------------


def test_shape_guard_on_a_poisoned_entry() -> None:
    assert issubclass(ShapeGuardError, BaseException)
    assert not issubclass(ShapeGuardError, Exception)
    b = broker()
    b.ingest(items(A, 3), now=0.0)
    lane = next(iter(shape_of(b, A).lanes.lanes.values()))
    entry = lane.queue[1]
    assert entry.item is not None
    entry.item = Item(entry.item.id, "m", B, entry.tokens, entry.max_tokens)
    lane.queue[1] = entry  # a queue holds its entries' fields, not the objects
    with pytest.raises(ShapeGuardError, match="expected 000000000000000a"):
        b.pull("c1", 0.0)


def test_shape_guard_not_caught_by_except_exception() -> None:
    b = broker()
    b.ingest(items(A, 1), now=0.0)
    lane = next(iter(shape_of(b, A).lanes.lanes.values()))
    entry = lane.queue[0]
    entry.item = Item("x", "m", C, 100, 16)
    lane.queue[0] = entry
    caught = False
    try:
        try:
            b.pull("c1", 0.0)
        except Exception:  # the point: this must not catch the guard
            pytest.fail("the guard was caught by except Exception")
    except ShapeGuardError:
        caught = True
    assert caught


def ids(batch: Batch) -> list[str]:
    return [e.item.id for e in batch.entries if e.item is not None]


def lane_ids(b: Broker, sig: int) -> list[str]:
    [lane] = shape_of(b, sig).lanes.lanes.values()
    return [e.item.id for e in lane.queue if e.item is not None]


def test_fail_requeues_at_the_front() -> None:
    b = broker(size=4)
    b.ingest(items(A, 10), now=0.0)
    order = lane_ids(b, A)
    x = b.pull("c1", 0.0)
    assert x is not None
    a = shape_of(b, A)
    assert a.batches == 1
    back = b.fail(x.id, 0.5)
    assert back is x
    assert lane_ids(b, A) == order
    assert a.batches == 0
    assert a.items == 10
    assert a.inflight_items == 0
    assert b.ledger.consistent()
    assert b.ledger.items_inflight == 0
    y = b.pull("c1", 0.6)
    assert y is not None
    assert ids(y) == ids(x)
    assert y.id != x.id


def test_disconnect_puts_batches_back_in_front_in_order() -> None:
    b = broker(size=3)
    b.register("c2", Contract("m", 2, 1000, 4096), now=0.0)
    b.ingest(items(A, 10), now=0.0)
    order = lane_ids(b, A)
    x1 = b.pull("c1", 0.0)
    y = b.pull("c2", 0.0)
    x2 = b.pull("c1", 0.0)
    assert x1 is not None
    assert y is not None
    assert x2 is not None
    assert ids(x1) + ids(y) + ids(x2) == order[:8]
    assert b.disconnect("c1", 1.0) == 6
    assert "c1" not in b.consumers
    assert lane_ids(b, A) == ids(x1) + ids(x2) + order[8:]
    assert b.ledger.consistent()
    assert b.ledger.items_inflight == 2
    lost = [e for e in b.events.since(0) if e.kind is EventKind.CONSUMER_LOST]
    assert [(e.reason, e.value) for e in lost] == [("c1: disconnected", 6)]
    with pytest.raises(UnknownBatchError):
        b.complete(x1.id, 1.0)
    b.complete(y.id, 1.0)
    assert b.ledger.items_completed == 2
    assert b.disconnect("nobody", 1.0) == 0


def test_a_consumers_view_counts_its_settling_batches_apart() -> None:
    """What a lost consumer gives back is its in-flight batches less those settling (being
    committed, or whose completion a store received): the view shows both counts."""
    b = broker(size=3)
    b.ingest(items(A, 10), now=0.0)
    batches = [b.pull("c1", 0.0) for _ in range(3)]
    x1, x2, x3 = (x for x in batches if x is not None)
    b.settling.add(x1.id)  # its commit is under way
    [view] = b.snapshot(0.5, received={x2.id}).consumers  # x2's completion is queued
    assert (view.batches_inflight, view.batches_settling) == (3, 2)
    assert b.snapshot(0.5).consumers[0].batches_settling == 1
    assert b.disconnect("c1", 1.0, keep={x2.id}) == len(x3.entries)  # what was not answered


def test_disconnect_updates_the_budget() -> None:
    b = broker(budget=1000)
    b.register("big", Contract("m", 8, 5000, 4096), now=0.0)
    b.ingest(items(A, 1), now=0.0)
    assert b.models["m"].budget == 5000
    b.disconnect("big", 0.0)
    assert b.models["m"].budget == 1000


def test_complete_unknown_batch() -> None:
    b = broker()
    with pytest.raises(UnknownBatchError):
        b.complete(12345, 0.0)
    b.ingest(items(A, 2), now=0.0)
    x = b.pull("c1", 0.0)
    assert x is not None
    b.complete(x.id, 0.0)
    with pytest.raises(UnknownBatchError):
        b.complete(x.id, 0.0)
    with pytest.raises(UnknownBatchError):
        b.fail(x.id, 0.0)
    assert issubclass(UnknownBatchError, KeyError)
    assert b.ledger.items_completed == 2


def test_complete_after_a_consumer_left_still_counts() -> None:
    b = broker()
    b.ingest(items(A, 2), now=0.0)
    x = b.pull("c1", 0.0)
    assert x is not None
    b.consumers.pop("c1")  # gone without a disconnect (the server settles it later)
    b.complete(x.id, 0.0)
    assert b.ledger.items_completed == 2
    assert b.ledger.consistent()


# -- lanes inside the broker -----------------------------------------------------------------------


def test_force_drain_of_a_quiescing_lane() -> None:
    b = broker(size=2, budget=100_000)
    b.ingest(items(A, 2, tokens=100) + items(A, 10, tokens=3000), now=0.0)
    a = shape_of(b, A)
    assert sorted(a.lanes.targets()) == [100, 3000]
    big = b.pull("c1", 4.0)  # A activates; its fullest lane goes first
    assert big is not None
    assert [e.tokens for e in big.entries] == [3000, 3000]
    b.tick(5.0)
    small = next(la for la in a.lanes.lanes.values() if la.target == 100)
    assert small.quiescing is True
    [ev] = [e for e in b.events.since(0) if e.kind is EventKind.FORCE_DRAIN]
    assert (ev.signature, ev.value, ev.reason) == (A, small.id, "2 items")
    x = b.pull("c1", 5.0)  # a quiescing lane goes first, though the other has more tokens
    assert x is not None
    assert x.lane == small.id
    assert [e.tokens for e in x.entries] == [100, 100]
    b.complete(x.id, 5.0)
    assert small.id not in a.lanes.lanes
    assert a.lanes.targets() == [3000]
    assert a.lanes.counters.releases == 1


def test_force_drain_is_one_event_per_shape_and_tick() -> None:
    b = broker(size=2, budget=100_000)
    small = (100, 400, 1000, 1600)
    b.ingest([i for t in small for i in items(A, 2, tokens=t)] + items(A, 10, tokens=3000),
             now=0.0)
    a = shape_of(b, A)
    assert len(a.lanes.targets()) == len(small) + 1
    assert b.pull("c1", 4.0) is not None  # A activates; its fullest lane goes first
    b.tick(5.0)
    quiescing = sorted(la.id for la in a.lanes.lanes.values() if la.quiescing)
    assert len(quiescing) == len(small)
    [ev] = [e for e in b.events.since(0) if e.kind is EventKind.FORCE_DRAIN]
    assert (ev.signature, ev.count, ev.value) == (A, len(small), quiescing[0])
    assert ev.reason == f"force-drained {len(small)} lanes, {2 * len(small)} items"
    b.tick(6.0)  # nothing newly quiescing: no second event
    assert b.events.counts["force_drain"] == 1


def test_starving_lanes_counted_on_tick() -> None:
    b = broker(CoreConfig(activate_when_idle=False, stage_timeout_s=100.0))
    b.ingest(items(A, 1), now=0.0)
    b.tick(30.0)
    assert b.starving_lanes == 0
    b.tick(30.001)
    assert b.starving_lanes == 1


def test_ingest_is_place_then_admit_item_by_item() -> None:
    """The grouped hot loop of `ingest` leaves exactly what `place` + `admit` per item does:
    the same shapes in the same order, lanes, queues, counts, labels and histograms."""
    import random

    rng = random.Random(7)
    chunks = [[Item(f"q{c}-{k}", rng.choice(["m", "n"] if c % 2 else ["m"]), rng.choice([A, B, C]),
                    rng.randint(1, 3000), rng.randint(1, 64),
                    label=rng.choice(["", "", "x", "y"])) for k in range(rng.randint(0, 300))]
              for c in range(8)]
    grouped, single = broker(), broker()
    for c, chunk in enumerate(chunks):
        now = 0.5 * c
        assert grouped.ingest(chunk, now) == len(chunk)
        for it in chunk:
            p = single.place(it.model, it.signature, it.label, it.input_tokens, now)
            single.admit(p, Entry(single.intake.next_key, it.input_tokens, it.max_tokens, now,
                                  it))
            single.intake.next_key += 1
        grouped.tick(now + 0.25)
        single.tick(now + 0.25)

    def state(b: Broker) -> list[object]:
        out: list[object] = [list(b.models), b.ledger, b.lane_counters]
        for ms in b.models.values():
            for sig, s in ms.open.items():
                out.append((sig, s.label, s.state, s.items, s.tokens, s.staged_since,
                            s.lengths.counts, s.lengths.count, s.lengths.min, s.lengths.max))
                out.extend((la.id, la.target, la.tokens, la.last_assign,
                            [(e.key, e.tokens, e.max_tokens, e.t, e.item) for e in la.queue])
                           for la in s.lanes.lanes.values())
        return out

    assert state(grouped) == state(single)


def test_a_prewarmed_shape_activates_under_the_epoch_its_prewarm_reserved() -> None:
    """In "consumer" scope another consumer may activate a shape between a pre-warm and its
    activation; the warmed shape keeps the epoch the pre-warm named (the simulated engine
    built its graphs under it) and no two shapes share an epoch."""
    b = Broker(CoreConfig(activate_when_idle=False))
    for c in ("c0", "c1"):
        b.register(c, Contract("m", 8, 1000, 4096), now=0.0)
    b.ingest(items(A, 60), now=0.0)
    assert b.pull("c0", 0.0) is not None  # A on c0: epoch 1
    for sig in (B, C, D):
        b.ingest(items(sig, 30), now=0.0)
    while not (signals := b.take_signals()):
        assert b.pull("c0", 0.1) is not None
    (signal,) = signals
    assert signal.consumer == "c0" and signal.epoch == 2
    other = b.pull("c1", 0.2)  # c1 activates another staged shape meanwhile
    assert other is not None and other.signature != signal.signature and other.epoch == 3
    while (x := b.pull("c0", 0.3)) is not None and x.signature == A:
        pass
    assert x is not None and (x.signature, x.epoch) == (signal.signature, signal.epoch)
    live = [s.epoch for s in b.models["m"].open.values() if s.state is ShapeState.ACTIVE]
    assert len(live) == len(set(live)) == 2
