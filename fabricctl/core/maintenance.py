"""The broker's upkeep and what observers read: the tick, the cache audit, snapshots.

Contract: `tick(now)` marks quiescing lanes (force-drain events), counts starving lanes,
advances the lifecycle's timeouts for every model (or every consumer slot) and drops empty
staged shapes; `record_cache` feeds a shape's cache-truth audit and emits one critical event
when it first flags; `shapes()`, `waste()` and `snapshot()` read without changing anything.
`Broker` inherits this and owns the state it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fabricctl.core.events import EventKind
from fabricctl.core.lifecycle import ModelState
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.snapshot import Snapshot, take_snapshot
from fabricctl.core.types import Prewarm

if TYPE_CHECKING:
    from fabricctl.core.config import CoreConfig
    from fabricctl.core.events import EventLog
    from fabricctl.core.lifecycle import Lifecycle


class Maintenance:
    """Why: upkeep and observation read and tidy the broker; dispatch lives in `Broker`."""

    cfg: CoreConfig
    models: dict[str, ModelState]
    consumers: dict[str, Any]
    inflight: dict[int, Any]
    events: EventLog
    lifecycle: Lifecycle
    signals: list[Prewarm]
    starving_lanes: int
    padded_tokens: int
    routed_tokens: int

    # -- maintenance and observation -------------------------------------------------------------

    def tick(self, now: float) -> None:
        """The 1 s maintenance tick: quiescing lanes, starvation, lifecycle timeouts."""
        starving = 0
        for ms in self.models.values():
            for shape in self._model_shapes(ms):
                dispatching = shape.state in (ShapeState.ACTIVE, ShapeState.DRAINING)
                newly = shape.lanes.tick(now) if dispatching else []
                for lane in newly:
                    if lane.queue and any(o.queue for o in shape.lanes.lanes.values()
                                          if o is not lane and not o.quiescing):
                        self.events.emit(now, EventKind.FORCE_DRAIN, model=ms.name,
                                         signature=shape.signature, label=shape.label,
                                         value=lane.id, reason=f"{len(lane.queue)} items")
                starving += shape.lanes.starving(now)
            if self.cfg.lifecycle and self.cfg.shape_scope == "consumer":
                for name, slot in list(ms.slots.items()):
                    if name in self.consumers:
                        cur = slot.current
                        self.signals.extend(self.lifecycle.advance(
                            ms, now, cur is None or cur.items == 0, slot, self.consumers))
            elif self.cfg.lifecycle:
                cur = ms.current
                self.signals.extend(self.lifecycle.advance(
                    ms, now, hungry=cur is None or cur.items == 0))
            for sig, shape in list(ms.open.items()):
                if shape.items == 0 and shape.inflight_items == 0 and (
                    shape.state is ShapeState.STAGED
                ):
                    shape.lanes.release_idle()  # the lanes its placements opened
                    del ms.open[sig]  # an empty staged shape (its placement was never admitted)
        self.starving_lanes = starving

    def record_cache(
        self, batch_id: int, queries: int, hits: int, achievable: int, now: float
    ) -> None:
        """An engine's prefix-cache figures for one batch, for the shape's cache-truth audit."""
        f = self.inflight.get(batch_id)
        if f is None:
            return
        shape = f.shape
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

    def waste(self) -> float:
        """Padding fraction of every batch dispatched so far."""
        return 1.0 - self.routed_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def take_signals(self) -> list[Prewarm]:
        out, self.signals = self.signals, []
        return out

    def shapes(self) -> list[Shape]:
        """Every live shape: open ones and a draining current one."""
        out: list[Shape] = []
        for ms in self.models.values():
            out.extend(self._model_shapes(ms))
        return out

    @staticmethod
    def _model_shapes(ms: ModelState) -> list[Shape]:
        """A model's open shapes and its draining current one(s)."""
        out = list(ms.open.values())
        for h in (ms, *ms.slots.values()):
            cur = h.current
            if cur is not None and cur.state is ShapeState.DRAINING and cur not in out:
                out.append(cur)
        return out

    def snapshot(self, now: float, lanes: object = "all", events: int = 100) -> Snapshot:
        """All a dashboard needs; `lanes` is "all", "none" or a set of (model, signature)."""
        return take_snapshot(self, now, lanes, events)  # type: ignore[arg-type]
