"""The observer's view of a broker: plain msgspec Structs, cheap to encode and send.

Contract: `take_snapshot(now, ...)` copies everything a dashboard or `--json` reader needs
(shapes with state, epoch, staged/pending tokens, lanes, batches, waste; lanes with target,
items, waste, oldest age, starving/quiescing; models; consumers, each with its current and
next shape (its own in "consumer" scope, the model's in "model" scope) and how many of the
batches it holds are settling (their completion received); recent events;
counters; the ledger) out of the pieces it is handed, never a broker: it reads them and changes
nothing. `lanes` selects which shapes carry their lane list: all, none, or some keys.
`finished_view(shape)` is the record kept of a finished shape: its `ShapeView` as of its
finish (lanes none, `finished_at`, `thrashed` and `thrash` set from the lifecycle's verdict),
what the store persists.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import TYPE_CHECKING

import msgspec

from fabricctl.core.events import Event
from fabricctl.core.forecast import JobView
from fabricctl.core.jobs import JobRecord
from fabricctl.core.ledger import Ledger
from fabricctl.core.shape import SHAPE_STATES, Shape, ShapeState
from fabricctl.core.stats import BATCH_BUCKETS

if TYPE_CHECKING:
    from fabricctl.core.events import EventLog
    from fabricctl.core.lanes import LaneCounters
    from fabricctl.core.model_state import ModelState
    from fabricctl.core.stats import BatchesHistogram
    from fabricctl.core.tracking import ConsumerState


class LaneView(msgspec.Struct, array_like=True):
    """Why: the lanes view draws each lane of a shape as one row; this is that row."""

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
    """Why: the shapes table shows each shape's state and figures, without the live object."""

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
    served_items: int = 0  # items sent to consumers in batches, all told
    served_tokens: int = 0  # their real input tokens
    consumers: list[str] = []  # the consumers its batches went to
    gpus: list[int] = []  # the GPUs its completed batches ran on
    finished_at: float | None = None  # a finished shape's record: when it finished
    thrashed: bool = False  # a finished shape's record: it thrashed (`stats.thrash_reason`)
    thrash: str = ""  # ... and why, with what to change


class ModelView(msgspec.Struct):
    """Why: a model's current and warming shape and its switch counts are its switch cost."""

    name: str
    budget: int
    current: int | None  # "consumer" scope: the first consumer's that has one
    current_state: str | None
    warming: int | None  # "consumer" scope: likewise
    epoch: int
    switches: int
    midstream_switches: int


class ConsumerView(msgspec.Struct):
    """Why: an operator sees each registered consumer's contract and what it has done."""

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
    current: int | None = None  # the signature of the shape it pulls from now
    next: int | None = None  # the signature of the shape warming for it
    # of batches_inflight, those whose completion the broker already holds (settling): the
    # rest are what go back to their lanes if this consumer is lost now
    batches_settling: int = 0
    names: list[str] = []  # the other names its server answers (LoRA adapters)
    serving: str = ""  # the name it pulls from now (`model` unless it serves several)
    name_switches: int = 0  # moves between its names, each a shape switch on its server


class Counters(msgspec.Struct):
    """Why: broker-wide counters and gauges (lanes, batches, thrash) show churn at a glance."""

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
    """Why: short shapes show as finished shapes that ran few batches (below the thrash line);
    `thrashed` counts those of them that thrashed (`stats.thrash_reason`), not every short one."""

    buckets: list[int]
    counts: list[int]
    samples: list[int]
    thrash_line: int
    thrashed: int = 0


class Snapshot(msgspec.Struct):
    """Why: everything an observer needs at one instant, in one copy cheap to encode."""

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
    jobs: list[JobRecord] = []  # the live jobs, then the last ended ones (the server's pick)
    job_views: list[JobView] = []  # each job with queued items: waits, shares, predictions


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
        shape.served_items, shape.routed_tokens, sorted(shape.consumers), sorted(shape.gpus),
        shape.finished_at,
    )


def finished_view(shape: Shape) -> ShapeView:
    """The record kept of a shape that finished: its view as of its finish, without lanes."""
    at = shape.finished_at if shape.finished_at is not None else shape.created
    view = shape_view(shape, at, 0.0, False)
    view.thrashed, view.thrash = bool(shape.thrash), shape.thrash
    return view


def take_snapshot(
    now: float, *, shapes: list[Shape], models: Iterable[ModelState],
    consumers: Iterable[ConsumerState], ledger: Ledger, log: EventLog,
    lane_counters: LaneCounters, batches_hist: BatchesHistogram, starving_lanes: int,
    batches_total: int, starve_s: float, lanes: str | Container[tuple[str, int]] = "all",
    events: int = 100, job_views: list[JobView] | None = None,
    settling: Container[int] = frozenset(),
) -> Snapshot:
    """The snapshot of the live `shapes` and the rest, with the `events` most recent events;
    `settling` names the batches whose completion was received (each consumer's count)."""
    views = []
    for s in shapes:
        with_lanes = lanes == "all" or (not isinstance(lanes, str) and s.key in lanes)
        views.append(shape_view(s, now, starve_s, with_lanes))
    states = {st.value: 0 for st in SHAPE_STATES}
    for s in shapes:
        states[s.state.value] += 1
    states[ShapeState.FINISHED.value] = batches_hist.total
    by_name = {ms.name: ms for ms in models}
    model_views = []
    for ms in by_name.values():
        cur = ms.current or next((s.current for s in ms.slots.values() if s.current), None)
        warm = ms.warming or next((s.warming for s in ms.slots.values() if s.warming), None)
        model_views.append(ModelView(
            ms.name, ms.budget, cur.signature if cur else None, cur.state.value if cur else None,
            warm.signature if warm else None, ms.epoch, ms.switches, ms.midstream_switches))
    consumer_views = []
    for c in consumers:
        model = by_name.get(c.serving)
        holder = None if model is None else model.slots.get(c.name, model)  # "model" scope
        cur, nxt = (None, None) if holder is None else (holder.current, holder.warming)
        consumer_views.append(ConsumerView(
            c.name, c.contract.model, c.contract.max_batch_size, c.contract.max_batch_tokens,
            c.contract.max_input_len, len(c.batches), c.batches_done, c.items_done,
            c.tokens_done, c.joined, cur.signature if cur else None,
            nxt.signature if nxt else None, sum(b in settling for b in c.batches),
            list(c.contract.names), c.serving, c.name_switches))
    lc = lane_counters
    hist = batches_hist
    counters = Counters(
        sum(len(s.lanes) for s in shapes), lc.reuses, lc.new_lanes, lc.releases, lc.recycled_ids,
        lc.force_fits, starving_lanes, batches_total, hist.total, hist.thrashed,
        dict(log.counts),
    )
    return Snapshot(
        now, views, model_views, consumer_views, msgspec.structs.replace(ledger),
        ledger.difference(), states, counters,
        BatchesHistogramView(list(BATCH_BUCKETS), list(hist.counts), list(hist.samples[-200:]),
                             hist.thrash_line, hist.thrashed),
        log.recent(events), job_views=job_views or [],
    )
