"""Pre-warm pushes: a warming shape's signal goes to the consumers it warms for, with one
of its queued items as a sample, before any batch of that shape is sent.

Contract: `push_signals(state)` takes the core's pending signals, attaches to each a sample
(`sample_item`: the first queued entry of the shape's first non-empty lane, read from the
store; None when the shape is gone or has nothing queued) and sends a `PrewarmPush` to each
connected consumer `Broker.prewarm_targets` names: in "consumer" scope (the default) the one
consumer whose next shape it is, in "model" scope every consumer of the model; and only
where `prewarm_enabled(core.cfg.prewarm, peer.simulated)` (`[broker] prewarm`: "auto" pushes
to simulated engines, not to real ones). A shape whose whole queue is one item with nothing in
flight (`lone_item`: most shapes of a workload with little structure) gets no push: its
pre-warm would prefill exactly the prefix that item's batch prefills anyway (an engine that
took the pre-warm would hit it, at the cost of one more request and, on the simulator, its
own scheduler steps). The lifecycle is the same either way: the shape still warms and
activates as "warmed".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabricctl.core.config import prewarm_enabled
from fabricctl.core.types import Item
from fabricctl.wire.protocol import PrewarmPush

if TYPE_CHECKING:
    from fabricctl.server.state import ServerState
    from fabricctl.store.durable import DurableBroker


def sample_item(store: DurableBroker, model: str, signature: int) -> Item | None:
    """One queued item of a shape, read from the store, for the engine to prefill its prefix."""
    ms = store.view.models.get(model)
    shape = ms.open.get(signature) if ms else None
    if shape is None:
        return None
    for lane in shape.lanes.lanes.values():
        if lane.queue:
            s = store.entry(lane.queue[0].key)
            if s is None:
                return None
            return Item(s.id, model, signature, s.tokens, s.max_tokens, s.payload, shape.label,
                        s.source)
    return None


def lone_item(store: DurableBroker, model: str, signature: int) -> bool:
    """The open shape of `signature` queues exactly one item and has none in flight: its
    first batch is all of it, so a pre-warm of its prefix buys that batch nothing."""
    ms = store.view.models.get(model)
    shape = ms.open.get(signature) if ms else None
    return shape is not None and shape.items == 1 and shape.inflight_items == 0


def push_signals(state: ServerState) -> None:
    """Send every pending pre-warm signal to the consumers it is for."""
    core = state.view
    for signal in state.store.take_signals():
        targets = set(core.prewarm_targets(signal))
        if not targets or lone_item(state.store, signal.model, signal.signature):
            continue
        signal.sample = sample_item(state.store, signal.model, signal.signature)
        for peer in state.consumers.values():
            if peer.consumer is not None and peer.consumer in targets and prewarm_enabled(
                    core.cfg.prewarm, peer.simulated):
                peer.send(PrewarmPush(signal))
