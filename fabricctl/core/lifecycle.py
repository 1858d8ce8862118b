"""The shape lifecycle of one model: staged -> (warming) -> active -> draining -> finished.

Contract (DESIGN.md, "Shape lifecycle"):
- a new shape is staged: its items are assigned and stored, nothing dispatches;
- a staged shape is eligible to activate when its staged tokens reach activate_multiple x B,
  when its oldest staged item is older than stage_timeout_s, or (activate_when_idle) when
  the model's consumers are idle with nothing else to run;
- with no current shape, the warming shape (or else the best eligible one) activates at once;
  activation bumps the model's epoch and copies the length histogram onto the shape;
- when the active shape's queued tokens fall below prewarm_multiple x B, the eligible staged
  shape with the most tokens above its threshold becomes warming (one at a time) and a
  `Prewarm` signal goes to the model's consumers;
- the active shape drains when its queued tokens fall below drain_multiple x B and a warming
  shape waits; a draining shape is closed to new items;
- a draining shape finishes when every lane has returned its slot, i.e. dispatched its last
  item (its batches in flight settle afterwards, so no GPU waits on another's tail); the
  warming shape then activates at once; a shape finishing after fewer than thrash_batches
  batches is thrashing.
With the lifecycle off (an ablation), shapes dispatch as soon as they exist and the current
shape is sticky: kept while it has queued tokens, then the shape with the most tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.shape import Shape, ShapeState
from fabricctl.core.stats import BatchesHistogram
from fabricctl.core.types import Prewarm


@dataclass(slots=True)
class ModelState:
    """Why: the current shape is one field per model, so every consumer drains the same one."""

    name: str
    budget: int  # B: the model's batch token budget (largest registered contract)
    open: dict[int, Shape] = field(default_factory=dict)  # signature -> staged/warming/active
    current: Shape | None = None  # the active or draining shape consumers pull from
    warming: Shape | None = None
    epoch: int = 0
    switches: int = 0  # activations that replaced a previous shape
    midstream_switches: int = 0  # activations while the previous shape still had work


class Lifecycle:
    """Why: the thresholds that decide when a GPU pays for a shape switch, in one place."""

    def __init__(self, cfg: CoreConfig, log: EventLog, histogram: BatchesHistogram) -> None:
        self.cfg = cfg
        self.log = log
        self.histogram = histogram
        self.finished: list[Shape] = []  # recently finished shapes, newest last (bounded)

    def _transition(self, ms: ModelState, shape: Shape, dst: ShapeState, now: float, why: str):
        src = shape.state
        shape.set_state(dst, now)
        self.log.emit(
            now, EventKind.TRANSITION, model=ms.name, signature=shape.signature,
            label=shape.label, src=src.value, dst=dst.value, reason=why, value=shape.epoch,
        )

    def _threshold(self, ms: ModelState) -> float:
        return self.cfg.activate_multiple * ms.budget

    def eligible(self, ms: ModelState, shape: Shape, now: float, hungry: bool) -> str | None:
        """Why a staged shape may activate now, or None."""
        if shape.items == 0:
            return None
        if shape.tokens >= self._threshold(ms):
            return "threshold"
        if shape.staged_since is not None and now - shape.staged_since >= self.cfg.stage_timeout_s:
            return "timeout"
        if hungry and self.cfg.activate_when_idle:
            return "idle"
        return None

    def pick_staged(self, ms: ModelState, now: float, hungry: bool) -> tuple[Shape, str] | None:
        """The eligible staged shape with the most tokens above its activation threshold."""
        best: tuple[Shape, str] | None = None
        for shape in ms.open.values():
            if shape.state is not ShapeState.STAGED:
                continue
            why = self.eligible(ms, shape, now, hungry)
            if why and (best is None or shape.tokens > best[0].tokens):
                best = (shape, why)
        return best

    def activate(self, ms: ModelState, shape: Shape, now: float, why: str) -> None:
        previous_had_work = ms.current is not None and not ms.current.idle()
        if ms.epoch or ms.switches or ms.current is not None:
            ms.switches += 1
            if previous_had_work:
                ms.midstream_switches += 1
        ms.epoch += 1
        shape.epoch = ms.epoch
        shape.activated_at = now
        shape.stats = shape.lengths.copy()
        self._transition(ms, shape, ShapeState.ACTIVE, now, why)
        ms.current = shape
        if ms.warming is shape:
            ms.warming = None

    def finish(self, ms: ModelState, shape: Shape, now: float) -> None:
        shape.finished_at = now
        self._transition(ms, shape, ShapeState.FINISHED, now, "lanes returned")
        self.histogram.add(shape.batches)
        if shape.batches < self.cfg.thrash_batches:
            self.log.emit(
                now, EventKind.THRASH, model=ms.name, signature=shape.signature,
                label=shape.label, value=shape.batches, critical=True,
                reason=f"finished after {shape.batches} batches (< {self.cfg.thrash_batches})",
            )
        if ms.current is shape:
            ms.current = None
        self.finished.append(shape)
        if len(self.finished) > 200:
            del self.finished[:100]

    def advance(self, ms: ModelState, now: float, hungry: bool = False) -> list[Prewarm]:
        """Apply every transition that is due; returns pre-warm signals to send."""
        signals: list[Prewarm] = []
        for _ in range(4):  # a switch can cascade: drain, finish, activate, pick the next
            if not self._step(ms, now, hungry, signals):
                break
        return signals

    def _step(self, ms: ModelState, now: float, hungry: bool, signals: list[Prewarm]) -> bool:
        cfg = self.cfg
        cur = ms.current
        if cur is not None and cur.state is ShapeState.DRAINING:
            # A lane returns its slot when its last item is dispatched: batches still in flight
            # settle into the finished shape, so no GPU waits for another's tail.
            if cur.items:
                return False
            cur.lanes.release_idle()
            self.finish(ms, cur, now)
            cur = None
        if cur is None:
            if ms.warming is not None:
                self.activate(ms, ms.warming, now, "warmed")
                return True
            pick = self.pick_staged(ms, now, hungry)
            if pick is None:
                return False
            self.activate(ms, pick[0], now, pick[1])
            return True
        # cur is active
        exhausted = cur.items == 0
        if ms.warming is None and cur.tokens < cfg.prewarm_multiple * ms.budget:
            pick = self.pick_staged(ms, now, hungry and exhausted)
            if pick is not None:
                shape = pick[0]
                shape.epoch = ms.epoch + 1
                self._transition(ms, shape, ShapeState.WARMING, now, pick[1])
                ms.warming = shape
                lanes = [(lane.id, lane.target) for lane in shape.lanes.lanes.values()]
                signals.append(Prewarm(ms.name, shape.signature, shape.label, shape.epoch, lanes))
                self.log.emit(
                    now, EventKind.PREWARM, model=ms.name, signature=shape.signature,
                    label=shape.label, value=shape.epoch, reason=f"{len(lanes)} lanes",
                )
        if ms.warming is not None and cur.tokens < cfg.drain_multiple * ms.budget:
            self._transition(ms, cur, ShapeState.DRAINING, now, "below drain threshold")
            if ms.open.get(cur.signature) is cur:
                del ms.open[cur.signature]
            return True
        return False
