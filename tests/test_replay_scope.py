"""The lifecycle's "consumer" scope (the replay's fabric): a current shape per consumer.

Each consumer drains its own shape (shape-pure, sticky); two consumers run two shapes when two
are staged; a consumer with nothing staged joins another's shape only when that shape has
join_multiple x B queued; a departed consumer's shapes are adopted; pre-warms go to the
consumer the shape warms for (the default scope). The "model" scope is covered by test_lifecycle.
"""

from __future__ import annotations

import itertools
import random

import pytest
from test_broker_sim import CONTRACTS, Sim

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.shape import ShapeState
from fabricctl.core.types import Batch, Contract, Item

A, B, C = 0xA, 0xB, 0xC
_ids = itertools.count(1)


def items(sig: int, n: int, tokens: int = 100) -> list[Item]:
    return [Item(f"i{next(_ids)}", "m", sig, tokens, 16, label=f"s{sig:x}") for _ in range(n)]


def broker(cfg: CoreConfig | None = None, consumers: int = 2, size: int = 8,
           budget: int = 1000) -> Broker:
    """Consumers c0.. of model "m"; B (the batch token budget) = `budget`."""
    b = Broker(cfg or CoreConfig(shape_scope="consumer"))
    for k in range(consumers):
        b.register(f"c{k}", Contract("m", size, budget, 4096), now=0.0)
    return b


def drain(b: Broker, consumer: str, now: float) -> list[Batch]:
    out = []
    while (batch := b.pull(consumer, now)) is not None:
        out.append(batch)
        b.complete(batch.id, now)
    return out


def test_two_consumers_take_two_shapes() -> None:
    b = broker()
    b.ingest(items(A, 30) + items(B, 25), now=0.0)
    x = b.pull("c0", 0.0)
    assert b.models["m"].slots["c0"].warming is not None  # A is short: B warms for c0 ...
    y = b.pull("c1", 0.0)  # ... but c1 is idle, so c1 takes it
    assert x is not None and y is not None
    assert (x.signature, y.signature) == (A, B)  # the most tokens first, then the next
    assert (x.epoch, y.epoch) == (1, 2)
    assert b.models["m"].slots["c0"].warming is None
    ms = b.models["m"]
    assert ms.slots["c0"].current.signature == A  # type: ignore[union-attr]
    assert ms.slots["c1"].current.signature == B  # type: ignore[union-attr]
    assert ms.current is None  # no model-wide current shape in this scope
    for _ in range(20):  # sticky and shape-pure: each consumer stays on its own shape
        for name, sig in (("c0", A), ("c1", B)):
            batch = b.pull(name, 0.1)
            if batch is not None:
                assert batch.signature == sig


def test_model_scope_gives_both_consumers_the_same_shape() -> None:
    b = broker(CoreConfig(shape_scope="model"))
    b.ingest(items(A, 30) + items(B, 25), now=0.0)
    x, y = b.pull("c0", 0.0), b.pull("c1", 0.0)
    assert x is not None and y is not None
    assert (x.signature, y.signature) == (A, A)


def test_join_only_when_worth_another_prefill() -> None:
    b = broker()  # join_multiple 4 x B = 4000 tokens
    b.ingest(items(A, 60), now=0.0)  # 6000 tokens, the only shape
    x = b.pull("c0", 0.0)
    assert x is not None and x.signature == A  # 5200 queued after it
    y = b.pull("c1", 0.0)
    assert y is not None and y.signature == A  # nothing staged: c1 joins A
    assert y.epoch == x.epoch  # a join is no activation
    assert b.models["m"].holders(b.models["m"].open[A]) == ["c0", "c1"]
    small = broker()
    small.ingest(items(A, 45), now=0.0)  # 4500 tokens: 3700 queued after the first batch
    assert small.pull("c0", 0.0) is not None
    assert small.pull("c1", 0.0) is None  # below 4 x B: one GPU runs it alone


def test_leaving_an_exhausted_shape_finishes_it() -> None:
    b = broker()
    b.ingest(items(A, 4) + items(B, 60), now=0.0)
    assert b.pull("c0", 0.0).signature == B  # type: ignore[union-attr]
    x = b.pull("c1", 0.0)  # c1 is idle: the small staged shape activates for it
    assert x is not None and x.signature == A and len(x.entries) == 4
    a = b.inflight[x.id].shape
    y = b.pull("c1", 0.1)  # A is exhausted, nothing is staged, B has 5200 queued: join B
    assert y is not None and y.signature == B
    assert a.state is ShapeState.FINISHED  # nobody else held A: drained and finished at once
    assert [h for _, h in a.history] == ["staged", "active", "draining", "finished"]
    b.complete(x.id, 0.2)  # its batch in flight settles into the finished shape
    b.ingest(items(A, 1), now=0.3)
    assert b.models["m"].open[A] is not a  # a late arrival stages a new shape
    assert b.models["m"].open[A].state is ShapeState.STAGED
    assert b.ledger.consistent()


def test_prewarm_goes_to_the_consumer_it_warms_for() -> None:
    b = broker(CoreConfig(shape_scope="consumer", activate_when_idle=False))
    b.ingest(items(A, 50), now=0.0)  # c0 runs A
    b.ingest(items(B, 50), now=0.0)  # c1 runs B
    assert b.pull("c0", 0.0).signature == A  # type: ignore[union-attr]
    assert b.pull("c1", 0.0).signature == B  # type: ignore[union-attr]
    b.ingest(items(C, 25), now=0.0)  # staged, 2500 tokens: eligible
    while b.models["m"].slots["c0"].warming is None:
        batch = b.pull("c0", 0.1)
        assert batch is not None and batch.signature == A
    [signal] = b.take_signals()
    assert signal.signature == C
    assert b.prewarm_targets(signal) == ["c0"]
    model = broker(CoreConfig(shape_scope="model"))
    model.ingest(items(A, 50) + items(C, 25), now=0.0)
    while model.models["m"].warming is None:
        assert model.pull("c0", 0.1) is not None
    [signal] = model.take_signals()
    assert model.prewarm_targets(signal) == ["c0", "c1"]


def test_a_departed_consumers_shape_is_adopted() -> None:
    b = broker()
    b.ingest(items(A, 50) + items(B, 40), now=0.0)
    x = b.pull("c0", 0.0)
    assert x is not None and x.signature == A
    y = b.pull("c1", 0.0)
    assert y is not None and y.signature == B
    b.complete(y.id, 0.0)
    assert b.disconnect("c0", 0.1) == len(x.entries)  # A's batch goes back to its lane
    drain(b, "c1", 0.2)  # c1 finishes B, then adopts A rather than leaving it orphaned
    ms = b.models["m"]
    assert ms.slots["c0"].current is None
    assert ms.open.get(A) is None or ms.open[A].items == 0
    assert b.ledger.items_completed == 90
    assert b.ledger.consistent()


class ConsumerScopeSim(Sim):
    """The randomized broker simulation (failures, disconnects) in "consumer" scope."""

    def check_batch(self, batch: Batch, contract: Contract) -> None:
        ms = self.b.models[batch.model]
        slot = ms.slots[batch.consumer]
        assert self.b.inflight[batch.id].shape is slot.current  # the consumer's own shape
        saved, ms.current = ms.current, slot.current
        try:
            super().check_batch(batch, contract)  # every other batch invariant
        finally:
            ms.current = saved

    def check_states(self) -> None:
        b = self.b
        for s in b.shapes():
            self.seen_states[s.state.value] += 1
            assert s.state is not ShapeState.FINISHED
            assert s.items >= 0 and s.tokens >= 0
        for ms in b.models.values():
            active = {id(s) for s in b.shapes() if s.model == ms.name
                      and s.state in (ShapeState.ACTIVE, ShapeState.DRAINING)}
            held = {id(sl.current) for sl in ms.slots.values() if sl.current is not None}
            assert active <= held | {id(s) for s in ms.open.values()}
            warming = [s for s in b.shapes() if s.model == ms.name
                       and s.state is ShapeState.WARMING]
            assert len(warming) <= len(ms.slots)
            for sl in ms.slots.values():
                if sl.warming is not None:
                    assert sl.warming.state is ShapeState.WARMING


def test_consumer_scope_randomized_simulation() -> None:
    cfg = CoreConfig(shape_scope="consumer")
    sim = ConsumerScopeSim(random.Random(11), 6_000, {"m1": 8, "m2": 6}, CONTRACTS, cfg=cfg)
    sim.run(max_steps=200_000)
    b = sim.b
    assert len(sim.completed) == 6_000
    assert b.ledger.items_queued == 0
    assert b.inflight == {}
    assert sim.seen_states["warming"] > 0
    assert sim.thrash_events == b.batches_hist.thrashed


@pytest.mark.parametrize("seed", range(8))
def test_consumer_scope_small_simulations(seed: int) -> None:
    """Few shapes, frequent failures and disconnects: joins, leaves, adoptions and idle
    consumers taking a busy one's warming shape all happen here."""
    cfg = CoreConfig(shape_scope="consumer", lanes_max=8, stage_timeout_s=0.5)
    sim = ConsumerScopeSim(random.Random(seed), 1500, {"m1": 3, "m2": 3}, CONTRACTS, cfg=cfg,
                           fail_p=0.05, disconnect_p=0.01)
    sim.run(max_steps=200_000)
    assert len(sim.completed) == 1500
    assert sim.b.ledger.difference() == (0, 0)
