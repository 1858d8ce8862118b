"""The broker's upkeep: the maintenance tick, the cache-truth audit, the live shapes.

Contract: `tick(now)` marks quiescing lanes (one force-drain event per shape and tick,
with the count of lanes it force-drained), counts starving lanes
(`starving_lanes`), advances the lifecycle's timeouts for every model (or every consumer
slot), appending the pre-warm signals due to the broker's outbox, and drops empty staged
shapes; `record_cache(shape, ...)` feeds a shape's cache-truth audit and emits one critical
event when it first flags; `shapes()` (every live shape) and `model_shapes(ms)` read without
changing anything. `Maintenance` owns only the starving-lane gauge; the broker hands it its
config, models, consumers, lifecycle, event log and signal outbox.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.lanes import Lane
from fabricctl.core.lifecycle import Lifecycle
from fabricctl.core.model_state import ModelState
from fabricctl.core.serving import Live
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.tracking import ConsumerState
from fabricctl.core.types import Prewarm


def model_shapes(ms: ModelState) -> list[Shape]:
    """A model's open shapes and its draining current one(s)."""
    out = list(ms.open.values())
    for cur in (ms.current, *(s.current for s in ms.slots.values())):
        if cur is not None and cur.state is ShapeState.DRAINING and cur not in out:
            out.append(cur)
    return out


class Maintenance:
    """Why: upkeep runs on the clock, not on traffic; dispatch and settlement live apart."""

    def __init__(self, cfg: CoreConfig, models: dict[str, ModelState],
                 consumers: Mapping[str, ConsumerState], lifecycle: Lifecycle,
                 events: EventLog,
                 signals: list[Prewarm]) -> None:
        self.cfg = cfg
        self.models = models  # the broker's, read and tidied, never rebound
        self.consumers = consumers  # the connected consumers, by name
        self.lifecycle = lifecycle
        self.events = events
        self.signals = signals  # the broker's outbox of pre-warm signals
        self.starving_lanes = 0

    def tick(self, now: float) -> None:
        """The 1 s maintenance tick: quiescing lanes, starvation, lifecycle timeouts.

        One pass over each model's shapes (thousands of one-item shapes at scale): a
        dispatching shape's lanes tick (only a newly quiescing lane can force-drain), every
        lane whose oldest item waited past `starve_s` counts, and the empty staged shapes
        are noted; after the lifecycle advanced, those still open, staged and empty go."""
        starving = 0
        limit = self.cfg.starve_s
        staged, active, draining = ShapeState.STAGED, ShapeState.ACTIVE, ShapeState.DRAINING
        for ms in self.models.values():
            empty: list[Shape] = []
            for shape in model_shapes(ms):
                lanes = shape.lanes
                state = shape.state
                if state is active or state is draining:
                    newly = lanes.tick(now)
                    if newly:
                        self._force_drained(shape, newly, now)
                elif state is staged and not shape.items and not shape.inflight_items:
                    empty.append(shape)
                for lane in lanes.lanes.values():  # `LaneSet.starving`, inline
                    q = lane.queue
                    if now - q.head > limit:  # (inf when empty)
                        starving += 1
            if self.cfg.lifecycle and self.cfg.shape_scope == "consumer":
                live = Live(self.consumers, ms.name)
                for name, slot in list(ms.slots.items()):
                    if name in live:
                        cur = slot.current
                        self.signals.extend(self.lifecycle.advance(
                            ms, now, cur is None or cur.items == 0, slot, live))
            elif self.cfg.lifecycle:
                cur = ms.current
                self.signals.extend(self.lifecycle.advance(
                    ms, now, hungry=cur is None or cur.items == 0))
            for shape in empty:  # the lifecycle adds no shape and queues nothing: re-checked
                sig = shape.signature
                if ms.open.get(sig) is shape and shape.items == 0 and (
                    shape.inflight_items == 0 and shape.state is staged
                ):
                    shape.lanes.release_idle()  # the lanes its placements opened
                    del ms.open[sig]  # an empty staged shape (its placement was never admitted)
        self.starving_lanes = starving

    def _force_drained(self, shape: Shape, newly: list[Lane], now: float) -> None:
        """One force-drain event for the lanes of `shape` this tick marked quiescing.

        A lane counts when it still holds items and another, not quiescing, lane of the
        shape does too. One lane: `value` its id, `reason` "N items". Several: `value` the
        lowest id, `count` how many, `reason` "force-drained K lanes, N items".
        """
        lanes = [la for la in newly if la.queue and any(
            o.queue for o in shape.lanes.lanes.values() if o is not la and not o.quiescing)]
        if not lanes:
            return
        queued = sum(len(la.queue) for la in lanes)
        reason = (f"{queued} items" if len(lanes) == 1
                  else f"force-drained {len(lanes)} lanes, {queued} items")
        self.events.emit(now, EventKind.FORCE_DRAIN, model=shape.model,
                         signature=shape.signature, label=shape.label,
                         value=min(la.id for la in lanes), count=len(lanes), reason=reason)

    def record_cache(self, shape: Shape, queries: int, hits: int, achievable: int, now: float
                     ) -> None:
        """An engine's prefix-cache figures for one batch of `shape`, for its audit."""
        was = shape.audit()[2]
        shape.cache_queries += queries
        shape.cache_hits += hits
        shape.cache_achievable += achievable
        real, achievable_rate, flagged = shape.audit()
        if flagged and not was:
            self.events.emit(
                now, EventKind.GUARD,
                model=shape.model, signature=shape.signature, label=shape.label, critical=True,
                reason=f"cache-truth audit: engines hit {real:.0%} of prompt tokens, the "
                f"declared prefixes allow {achievable_rate:.0%} — the declared components are "
                "not a token-identical prefix",
            )

    def shapes(self) -> list[Shape]:
        """Every live shape: open ones and a draining current one."""
        out: list[Shape] = []
        for ms in self.models.values():
            out.extend(model_shapes(ms))
        return out
