"""What code outside the store may read of the core it owns: a read-only view, and the run's
figures.

Contract: `CoreView` is the store's core seen through its reads only (its settings, models,
consumers, ledger, events, lane and batch counters, job terms, batches in flight and
settling, live shapes, job views, snapshot, padding waste, pre-warm targets): the server's
views, metrics and handlers read the core through `DurableBroker.view` and change it only
through the store's own methods (`register`, `tick`, `record_cache`, `take_signals`, the
writes' steps, `pull`, `fail`, `disconnect`). Reading it does not change the core; type
checking refuses a write through it. `Figures` is the broker's side of a run's summary
(`DurableBroker.figures()`): shape switches, mid-stream switches, padding waste, thrash
events and the ledger's difference, copied out at the call; `Counters` the store's own
(`DurableBroker.counters()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fabricctl.core.config import CoreConfig
    from fabricctl.core.events import EventLog
    from fabricctl.core.forecast import JobView
    from fabricctl.core.lanes import LaneCounters
    from fabricctl.core.ledger import Ledger
    from fabricctl.core.model_state import ModelState
    from fabricctl.core.shape import Shape
    from fabricctl.core.snapshot import Snapshot
    from fabricctl.core.stats import BatchesHistogram
    from fabricctl.core.terms import JobTerms
    from fabricctl.core.tracking import ConsumerState, InFlight
    from fabricctl.core.types import Prewarm


class CoreView(Protocol):
    """Why: the core's state is the store's; everyone else gets its reads, not its writes."""

    @property
    def cfg(self) -> CoreConfig: ...
    @property
    def models(self) -> Mapping[str, ModelState]: ...
    @property
    def consumers(self) -> Mapping[str, ConsumerState]: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def lane_counters(self) -> LaneCounters: ...
    @property
    def batches_hist(self) -> BatchesHistogram: ...
    @property
    def terms(self) -> Mapping[int, JobTerms]: ...
    @property
    def inflight(self) -> Mapping[int, InFlight]: ...
    @property
    def settling(self) -> set[int]: ...
    @property
    def batches_total(self) -> int: ...
    @property
    def starving_lanes(self) -> int: ...

    def shapes(self) -> list[Shape]: ...
    def job_views(self, now: float) -> list[JobView]: ...
    def waste(self) -> float: ...
    def prewarm_targets(self, signal: Prewarm) -> list[str]: ...
    def snapshot(self, now: float, lanes: object = ..., events: int = ...,
                 received: frozenset[int] | set[int] = ...) -> Snapshot: ...


@dataclass(frozen=True, slots=True)
class Figures:
    """Why: a run's summary reads the broker's counters as values, not its core."""

    shape_switches: int
    midstream_switches: int
    padding_waste: float
    thrash_events: int
    ledger_difference: tuple[int, int]


@dataclass(frozen=True, slots=True)
class Counters:
    """Why: the store's own counters of this run, read as values."""

    results_stored: int
    duplicate_completions: int  # completions dropped: the batch was not in flight
    quarantined: int  # entries given an error result after `max_deliveries`


def figures(core: CoreView) -> Figures:
    """The broker's side of a run's summary, from its core now."""
    models = core.models.values()
    return Figures(
        shape_switches=sum(m.switches for m in models),
        midstream_switches=sum(m.midstream_switches for m in models),
        padding_waste=core.waste(), thrash_events=core.batches_hist.thrashed,
        ledger_difference=core.ledger.difference(),
    )
