"""A long randomized simulation of the memory-mode broker, checking its invariants at every step.

Two models, 24 shapes with Zipf popularity, lognormal lengths, arrivals in waves, four
consumers with different contracts, random completion order and latency, failed batches and
consumer disconnects — all on a fake clock with a seeded random.Random. In shape_scope "model"
(every consumer of a model drains the model's current shape, which the invariants check);
the default "consumer" scope has its own simulation in tests/test_replay_scope.py and the
daemon's in tests/test_scope_e2e.py.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind
from fabricctl.core.lanes import Lane
from fabricctl.core.packing import round_up
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.signature import signature
from fabricctl.core.types import Batch, Contract, Item

ALLOWED = {
    ("staged", "active"),
    ("staged", "warming"),
    ("warming", "active"),
    ("active", "draining"),
    ("draining", "finished"),
}
ABLATION = {("active", "active")}  # the current shape moves; states do not
LIFECYCLES = (
    ["staged", "active", "draining", "finished"],
    ["staged", "warming", "active", "draining", "finished"],
)


@dataclass
class Pending:
    """A batch out with a consumer, due back at `due`."""

    batch: Batch
    due: float


@dataclass
class Sim:
    """Drives a Broker with random traffic and checks every invariant as it goes."""

    rng: random.Random
    items_total: int
    shapes_per_model: dict[str, int]
    contracts: dict[str, Contract]
    cfg: CoreConfig = field(default_factory=lambda: CoreConfig(shape_scope="model"))
    dt: float = 0.01
    fail_p: float = 0.01
    disconnect_p: float = 0.0004

    def __post_init__(self) -> None:
        self.b = Broker(self.cfg)
        self.now = 0.0
        self.sent = 0
        self.keys: list[tuple[str, int, float]] = []  # (model, signature, zipf weight)
        for model, n in self.shapes_per_model.items():
            for k in range(n):
                sig = signature([f"{model} system prompt {k}", f"few-shot {k % 3}"])
                self.keys.append((model, sig, 1.0 / (k + 1) ** 1.1))
        self.weights = [w for _, _, w in self.keys]
        for name, contract in self.contracts.items():
            self.b.register(name, contract, self.now)
        self.event_seq = self.b.events.seq  # the joins above
        self.away: dict[str, float] = {}  # disconnected consumer -> when it returns
        self.pending: dict[int, Pending] = {}
        self.placed_shape: dict[str, Shape] = {}
        self.placed_lane: dict[str, Lane] = {}
        self.tokens_of: dict[str, int] = {}
        self.inflight_ids: set[str] = set()
        self.completed: set[str] = set()
        self.dispatches = 0
        self.requeued: Counter[int] = Counter()  # id(shape) -> items put back this step
        self.draining_items: dict[int, tuple[Shape, int]] = {}
        self.finished_seen = 0
        self.epochs: dict[str, int] = {}
        self.reserved: dict[str, dict[int, int]] = {}  # model -> warming signature -> epoch
        self.finished_batches: list[int] = []
        self.finished_thrashed = 0  # of them, those whose verdict was thrashing
        self.thrash_events = 0
        self.seen_states: Counter[str] = Counter()
        self.next_wave = 0.0
        self.steps = 0

    # -- traffic ----------------------------------------------------------------------------

    def length(self) -> int:
        if self.rng.random() < 0.002:
            return 0
        return max(1, min(6000, int(self.rng.lognormvariate(math.log(300), 0.6))))

    def wave(self) -> None:
        """A burst of arrivals dominated by a few shapes, then a random gap."""
        n = min(self.items_total - self.sent, self.rng.randint(50, 1500))
        focus = self.rng.choices(range(len(self.keys)), weights=self.weights, k=3)
        batch: list[Item] = []
        for _ in range(n):
            if self.rng.random() < 0.7:
                k = self.rng.choice(focus)
            else:
                k = self.rng.choices(range(len(self.keys)), weights=self.weights)[0]
            model, sig, _ = self.keys[k]
            tokens = self.length()
            item = Item(f"q{self.sent}", model, sig, tokens, self.rng.choice((16, 64, 256)))
            self.tokens_of[item.id] = tokens
            batch.append(item)
            self.sent += 1
        self.ingest(batch)
        self.next_wave = self.now + self.rng.choice((0.05, 0.2, 0.5, 1.0, 3.0, 8.0))

    def ingest(self, items: list[Item]) -> None:
        b = self.b
        assert b.ingest(items, self.now) == len(items)
        new = {it.id for it in items}
        touched: dict[int, Shape] = {}
        for it in items:
            shape = b.models[it.model].open[it.signature]
            # a draining (or finished) shape never takes a new item
            assert shape.state in (ShapeState.STAGED, ShapeState.WARMING, ShapeState.ACTIVE)
            self.placed_shape[it.id] = shape
            touched[id(shape)] = shape
        for shape in touched.values():
            for lane in shape.lanes.lanes.values():
                for e in reversed(lane.queue):
                    if e.item is None or e.item.id not in new:
                        break
                    assert not lane.quiescing
                    self.placed_lane[e.item.id] = lane
        assert all(i in self.placed_lane for i in new)

    # -- consumers ----------------------------------------------------------------------------

    def pull(self, name: str) -> Batch | None:
        b = self.b
        batch = b.pull(name, self.now)
        if batch is None:
            return None
        self.check_batch(batch, self.contracts[name])
        self.pending[batch.id] = Pending(batch, self.now + self.rng.uniform(0.005, 0.4))
        return batch

    def check_batch(self, batch: Batch, contract: Contract) -> None:
        f = self.b.inflight[batch.id]
        shape, lane = f.shape, f.lane
        ms = self.b.models[batch.model]
        assert batch.model == contract.model
        assert shape is ms.current
        assert shape.state in (ShapeState.ACTIVE, ShapeState.DRAINING)
        assert (shape.model, shape.signature, shape.epoch) == (
            batch.model, batch.signature, batch.epoch)
        assert lane.id == batch.lane
        assert shape.lanes.lanes.get(lane.id) is lane
        n = len(batch.entries)
        assert 1 <= n <= contract.max_batch_size
        assert batch.pad_to % 8 == 0
        assert batch.pad_to == max(round_up(max(e.tokens for e in batch.entries), 8), 8)
        if n > 1:
            assert n * batch.pad_to <= contract.max_batch_tokens
        assert batch.tokens == sum(e.tokens for e in batch.entries)
        assert batch.max_tokens == max(e.max_tokens for e in batch.entries)
        assert batch.max_input_len == contract.max_input_len
        for e in batch.entries:
            it = e.item
            assert it is not None
            assert it.signature == batch.signature
            assert it.model == batch.model
            assert e.tokens == it.input_tokens == self.tokens_of[it.id]
            assert e.tokens <= batch.pad_to
            assert self.placed_shape[it.id] is shape  # no batch mixes shapes ...
            assert self.placed_lane[it.id] is lane  # ... or lanes
            assert it.id not in self.inflight_ids
            assert it.id not in self.completed
            self.inflight_ids.add(it.id)
        self.dispatches += n

    def settle(self, p: Pending) -> None:
        batch = p.batch
        ids = [e.item.id for e in batch.entries if e.item is not None]
        if self.rng.random() < self.fail_p:
            f = self.b.inflight[batch.id]
            assert self.b.fail(batch.id, self.now) is batch
            self.requeued[id(self.relocate(batch, f.shape))] += len(ids)
            self.inflight_ids.difference_update(ids)
            return
        assert self.b.complete(batch.id, self.now) is batch
        for i in ids:
            assert i in self.inflight_ids
            assert i not in self.completed  # completed exactly once
            self.inflight_ids.discard(i)
            self.completed.add(i)

    def relocate(self, batch: Batch, old: Shape) -> Shape:
        """Where a failed batch's items went: their lane, or (their shape had finished
        dispatching) a lane of the key's open shape, staged again like late arrivals."""
        if old.state is not ShapeState.FINISHED:
            return old
        shape = self.b.models[batch.model].open[batch.signature]
        assert shape.state in (ShapeState.STAGED, ShapeState.WARMING, ShapeState.ACTIVE)
        first = batch.entries[0]
        [lane] = [la for la in shape.lanes.lanes.values()
                  if any(e.key == first.key for e in la.queue)]
        for e in batch.entries:
            assert e.item is not None
            self.placed_shape[e.item.id] = shape
            self.placed_lane[e.item.id] = lane
        return shape

    def disconnect(self, name: str) -> None:
        mine = [p for p in self.pending.values() if p.batch.consumer == name]
        olds = {p.batch.id: self.b.inflight[p.batch.id].shape for p in mine}
        put_back = self.b.disconnect(name, self.now, "socket error")
        for p in mine:
            self.requeued[id(self.relocate(p.batch, olds[p.batch.id]))] += len(p.batch.entries)
        assert put_back == sum(len(p.batch.entries) for p in mine)
        for p in mine:
            del self.pending[p.batch.id]
            self.inflight_ids.difference_update(
                e.item.id for e in p.batch.entries if e.item is not None)
            assert p.batch.id not in self.b.inflight
        self.away[name] = self.now + self.rng.uniform(0.5, 5.0)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> None:
        rng = self.rng
        self.steps += 1
        self.now = round(self.now + self.dt, 6)
        if self.sent < self.items_total and self.now >= self.next_wave:
            self.wave()
            self.check()
        for name, back in list(self.away.items()):
            if self.now >= back:
                del self.away[name]
                self.b.register(name, self.contracts[name], self.now)
        due = [p for p in self.pending.values() if p.due <= self.now]
        rng.shuffle(due)
        for p in due:
            del self.pending[p.batch.id]
            self.settle(p)
            self.check()
        names = [n for n in self.contracts if n not in self.away]
        rng.shuffle(names)
        for name in names:
            held = sum(1 for p in self.pending.values() if p.batch.consumer == name)
            for _ in range(3 - held):
                if self.pull(name) is None:
                    break
                self.check()
            if rng.random() < self.disconnect_p:
                self.disconnect(name)
                self.check()
        if self.steps % round(self.cfg.tick_s / self.dt) == 0:
            self.b.tick(self.now)
            self.check()
        self.check()
        self.requeued.clear()
        self.draining_items = {
            id(s): (s, s.items) for s in self.b.shapes() if s.state is ShapeState.DRAINING}

    def done(self) -> bool:
        return self.sent == self.items_total and len(self.completed) == self.items_total

    def run(self, max_steps: int) -> None:
        while not self.done():
            assert self.steps < max_steps, "the broker stopped making progress"
            self.step()

    # -- invariants ------------------------------------------------------------------------------

    def check(self) -> None:
        b = self.b
        led = b.ledger
        assert led.difference() == (0, 0)
        assert led.consistent()
        assert led.items_received == self.sent
        assert led.items_inflight == len(self.inflight_ids)
        assert led.items_completed == len(self.completed)
        self.check_states()
        self.check_events()
        self.check_finished()

    def check_states(self) -> None:
        b = self.b
        per_model: dict[str, Counter[ShapeState]] = {m: Counter() for m in b.models}
        for s in b.shapes():
            per_model[s.model][s.state] += 1
            self.seen_states[s.state.value] += 1
            if s.state is ShapeState.DRAINING:
                prev = self.draining_items.get(id(s))
                if prev is not None:  # a draining shape's items only rise by its own requeues
                    assert s.items <= prev[1] + self.requeued[id(s)]
            assert s.items >= 0
            assert s.tokens >= 0
        if not self.cfg.lifecycle:  # the ablation: every shape is active from the start
            assert all(set(c) <= {ShapeState.ACTIVE} for c in per_model.values())
            return
        for model, counts in per_model.items():
            assert counts[ShapeState.ACTIVE] + counts[ShapeState.DRAINING] <= 1
            assert counts[ShapeState.WARMING] <= 1
            assert counts[ShapeState.FINISHED] == 0
            ms = b.models[model]
            if counts[ShapeState.ACTIVE] + counts[ShapeState.DRAINING]:
                assert ms.current is not None
                assert ms.current.state in (ShapeState.ACTIVE, ShapeState.DRAINING)
            if counts[ShapeState.WARMING]:
                assert ms.warming is not None
                assert ms.warming.state is ShapeState.WARMING

    def check_events(self) -> None:
        new = self.b.events.since(self.event_seq, limit=1_000_000)
        for ev in new:
            assert ev.seq == self.event_seq + 1
            self.event_seq = ev.seq
            assert ev.t == self.now
            if ev.kind is EventKind.TRANSITION:
                assert ev.model in self.shapes_per_model
                assert ev.reason
                assert (ev.src, ev.dst) in (ALLOWED if self.cfg.lifecycle else ABLATION)
                # each activation takes the next epoch, unless its pre-warm reserved one
                reserved = self.reserved.setdefault(ev.model, {})
                if ev.dst == "active" and reserved.get(ev.signature) == ev.value:
                    del reserved[ev.signature]
                elif ev.dst in ("active", "warming"):
                    assert ev.value == self.epochs.get(ev.model, 0) + 1
                    self.epochs[ev.model] = ev.value
                    if ev.dst == "warming":
                        reserved[ev.signature] = ev.value
            elif ev.kind is EventKind.THRASH:
                assert ev.critical
                self.thrash_events += 1
        thrash = Counter((e.model, e.signature, e.value) for e in new
                         if e.kind is EventKind.THRASH)
        total = self.b.batches_hist.total
        fresh = self.b.lifecycle.finished[len(self.b.lifecycle.finished) - (
            total - self.finished_seen):] if total > self.finished_seen else []
        self.finished_seen = total
        expected = Counter((s.model, s.signature, s.batches) for s in fresh if s.thrash)
        assert thrash == expected  # a thrash event exactly when a shape's verdict says so
        reasons = Counter(e.reason for e in new if e.kind is EventKind.THRASH)
        assert reasons == Counter(s.thrash for s in fresh if s.thrash)
        for s in fresh:
            # thrashing: under the line, with items of its prefix staged again (stats)
            assert not s.thrash or (s.batches < self.cfg.thrash_batches
                                    and "of its prefix staged again" in s.thrash)
            self.finished_batches.append(s.batches)
            self.finished_thrashed += bool(s.thrash)
            assert s.state is ShapeState.FINISHED
            assert s.items == 0  # finished = every lane dispatched its last item
            for lane in s.lanes.lanes.values():  # a lane stays only while a batch is out
                assert not lane.queue
                assert lane.inflight > 0
            assert [st for _, st in s.history] in LIFECYCLES

    def check_finished(self) -> None:
        hist = self.b.batches_hist
        assert hist.total == len(self.finished_batches)
        assert hist.thrashed == self.finished_thrashed


CONTRACTS = {
    "g0": Contract("m1", 16, 4096, 2048),
    "g1": Contract("m1", 64, 16384, 4096),
    "g2": Contract("m2", 32, 8192, 4096),
    "g3": Contract("m2", 8, 2048, 1024),
}


def test_long_simulation() -> None:
    sim = Sim(random.Random(20250611), 50_000, {"m1": 14, "m2": 10}, CONTRACTS)
    sim.run(max_steps=400_000)
    b = sim.b
    assert len(sim.completed) == 50_000
    assert b.ledger.items_completed == 50_000
    assert b.ledger.items_queued == 0
    assert b.ledger.items_inflight == 0
    assert b.ledger.tokens_completed == sum(sim.tokens_of.values())
    assert b.inflight == {}
    # the run exercised what it claims to check
    assert sim.dispatches > 50_000  # failed and disconnected batches went out again
    assert len(sim.finished_batches) >= 20
    assert any(n < 100 for n in sim.finished_batches)
    assert any(n >= 100 for n in sim.finished_batches)
    assert sim.thrash_events == b.batches_hist.thrashed
    # waves of arrivals stage prefixes again as their shapes drain: some short shapes thrash,
    # and the short ones that served their whole prefix in one run do not
    assert 0 < b.batches_hist.thrashed < sum(1 for n in sim.finished_batches if n < 100)
    assert sim.seen_states["warming"] > 0
    assert sim.seen_states["draining"] > 0
    assert b.lane_counters.recycled_ids > 0
    assert b.events.counts.get("consumer_lost", 0) > 0
    assert sum(b.models[m].epoch for m in ("m1", "m2")) == sum(sim.epochs.values())


def test_simulation_lifecycle_off() -> None:
    cfg = CoreConfig(lifecycle=False, shape_scope="model")
    sim = Sim(random.Random(7), 5_000, {"m1": 6, "m2": 4}, CONTRACTS, cfg=cfg)
    sim.run(max_steps=100_000)
    assert len(sim.completed) == 5_000
    assert sim.b.batches_hist.total == 0  # shapes never finish in the ablation


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=3))
def test_small_simulations(seed: int, shapes: int) -> None:
    cfg = CoreConfig(lanes_max=8, stage_timeout_s=0.5, shape_scope="model")
    sim = Sim(random.Random(seed), 600, {"m1": shapes, "m2": shapes}, CONTRACTS, cfg=cfg,
              fail_p=0.05, disconnect_p=0.01)
    sim.run(max_steps=100_000)
    assert len(sim.completed) == 600
