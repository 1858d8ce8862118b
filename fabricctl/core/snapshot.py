"""The observer's view of a broker: plain msgspec Structs, cheap to encode and send.

Contract: `take_snapshot(broker, now)` copies everything a dashboard or `--json` reader needs
(shapes with state, epoch, staged/pending tokens, lanes, batches, waste; lanes with target,
items, waste, oldest age, starving/quiescing; models; consumers; recent events; counters;
the ledger). `lanes` selects which shapes carry their lane list: all, none, or some keys.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

import msgspec

from fabricctl.core.events import Event
from fabricctl.core.ledger import Ledger
from fabricctl.core.shape import SHAPE_STATES, Shape, ShapeState
from fabricctl.core.stats import BATCH_BUCKETS

if TYPE_CHECKING:
    from fabricctl.core.broker import Broker


class LaneView(msgspec.Struct, array_like=True):
    """One lane as the lanes view draws it."""

    id: int
    target: int
    items: int
    tokens: int
    waste: float
    oldest_age: float
    starving: bool
    quiescing: bool
    inflight: int


class ShapeView(msgspec.Struct):
    """One shape as the shapes table shows it."""

    model: str
    signature: int
    label: str
    state: str
    epoch: int
    tokens: int  # queued (staged or dispatchable) input tokens
    items: int
    inflight_tokens: int
    inflight_items: int
    lanes_in_use: int
    batches: int
    waste: float
    age: float
    threshold: float  # the lane pressure threshold now
    starving: int
    percentiles: dict[str, float]
    history: list[tuple[float, str]]
    lanes: list[LaneView] | None = None
    cache_hit_rate: float = 0.0  # what the engines really report for this shape
    cache_achievable: float = 0.0  # what its declared prefixes allow
    cache_flagged: bool = False  # the cache-truth audit's verdict


class ModelView(msgspec.Struct):
    """A model's current and warming shape, its epoch and switch counts."""

    name: str
    budget: int
    current: int | None
    current_state: str | None
    warming: int | None
    epoch: int
    switches: int
    midstream_switches: int


class ConsumerView(msgspec.Struct):
    """A registered consumer and what it has done."""

    name: str
    model: str
    max_batch_size: int
    max_batch_tokens: int
    max_input_len: int
    batches_inflight: int
    batches_done: int
    items_done: int
    tokens_done: int
    joined: float


class Counters(msgspec.Struct):
    """Monotonic counters and gauges of the whole broker."""

    lanes_in_use: int
    lane_reuses: int
    new_lanes: int
    lane_releases: int
    recycled_lane_ids: int
    force_fits: int
    starving_lanes: int
    batches: int
    shapes_finished: int
    thrash_events: int
    events: dict[str, int]


class BatchesHistogramView(msgspec.Struct):
    """Batches each finished shape ran, bucketed, with the thrash line."""

    buckets: list[int]
    counts: list[int]
    samples: list[int]
    thrash_line: int


class Snapshot(msgspec.Struct):
    """Everything an observer needs at one instant."""

    t: float
    shapes: list[ShapeView]
    models: list[ModelView]
    consumers: list[ConsumerView]
    ledger: Ledger
    difference: tuple[int, int]
    states: dict[str, int]
    counters: Counters
    batches_histogram: BatchesHistogramView
    events: list[Event]
    simulated: bool = False
    extra: dict[str, object] = {}


def lane_views(shape: Shape, now: float, starve_s: float) -> list[LaneView]:
    out = []
    for lane in sorted(shape.lanes.lanes.values(), key=lambda la: la.target):
        age = lane.oldest_age(now)
        out.append(LaneView(lane.id, lane.target, len(lane.queue), lane.tokens,
                            round(lane.waste_fraction(), 4), round(age, 3), age > starve_s,
                            lane.quiescing, lane.inflight))
    return out


def shape_view(shape: Shape, now: float, starve_s: float, with_lanes: bool) -> ShapeView:
    hist = shape.stats or shape.lengths
    real, achievable, flagged = shape.audit()
    return ShapeView(
        shape.model, shape.signature, shape.label, shape.state.value, shape.epoch, shape.tokens,
        shape.items, shape.inflight_tokens, shape.inflight_items, len(shape.lanes),
        shape.batches, round(shape.waste(), 4), round(now - shape.created, 3),
        round(shape.lanes.threshold(), 4), shape.lanes.starving(now),
        hist.percentiles(), list(shape.history),
        lane_views(shape, now, starve_s) if with_lanes else None,
        round(real, 4), round(achievable, 4), flagged,
    )


def take_snapshot(
    broker: Broker, now: float, lanes: str | Container[tuple[str, int]] = "all", events: int = 100
) -> Snapshot:
    cfg = broker.cfg
    shapes = broker.shapes()
    views = []
    for s in shapes:
        with_lanes = lanes == "all" or (not isinstance(lanes, str) and s.key in lanes)
        views.append(shape_view(s, now, cfg.starve_s, with_lanes))
    states = {st.value: 0 for st in SHAPE_STATES}
    for s in shapes:
        states[s.state.value] += 1
    states[ShapeState.FINISHED.value] = broker.batches_hist.total
    models = []
    for ms in broker.models.values():
        cur = ms.current
        models.append(ModelView(
            ms.name, ms.budget, cur.signature if cur else None, cur.state.value if cur else None,
            ms.warming.signature if ms.warming else None, ms.epoch, ms.switches,
            ms.midstream_switches))
    consumers = [
        ConsumerView(c.name, c.contract.model, c.contract.max_batch_size,
                     c.contract.max_batch_tokens, c.contract.max_input_len, len(c.batches),
                     c.batches_done, c.items_done, c.tokens_done, c.joined)
        for c in broker.consumers.values()
    ]
    lc = broker.lane_counters
    hist = broker.batches_hist
    counters = Counters(
        sum(len(s.lanes) for s in shapes), lc.reuses, lc.new_lanes, lc.releases, lc.recycled_ids,
        lc.force_fits, broker.starving_lanes, broker.batches_total, hist.total, hist.thrashed,
        dict(broker.events.counts),
    )
    return Snapshot(
        now, views, models, consumers, msgspec.structs.replace(broker.ledger),
        broker.ledger.difference(), states, counters,
        BatchesHistogramView(list(BATCH_BUCKETS), list(hist.counts), list(hist.samples[-200:]),
                             hist.thrash_line),
        broker.events.recent(events),
    )
