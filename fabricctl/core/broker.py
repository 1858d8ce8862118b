"""The memory-mode broker: shapes, lanes, packing, lifecycle and ledger composed.

Contract: `ingest(items, now)` assigns every item to a lane of its shape and makes it
dispatchable; `pull(consumer, now)` returns a batch of one lane of the model's current shape
or None; `complete` and `fail(batch_id, now)` settle a batch (a failed one goes back to the
front of its lane); `disconnect` fails every batch a consumer holds but those in `settling`
(their completion is being committed) and those it is told to `keep`; `tick(now)` runs lane
maintenance, the lifecycle's timeouts and `judge_windows` (also at a completion `JUDGE_S`
after the last); `snapshot(now)` is all an observer needs; `take_finished()` hands over the
records of the shapes finished since it was last called. Time is always an argument. A batch
whose entry belongs to another shape raises `ShapeGuardError` (a BaseException, so no
`except Exception` hides it).
The durable store's API (`Intake` has the rules): `open_shape`, `place`, `admit`,
`admit_all`, `admit_shape` and `placement_live` are ingest in two steps around its commit;
`restore_shape` re-queues one shape it recorded (lanes reopened with their ids and targets),
`restore_epochs` gives each model back its epoch, `restore_ledger` puts the persisted counts
over what was re-admitted and returns the difference ((0, 0): they agree). `withdraw`,
`settle_withdrawn` and `return_withdrawn` take a cancelled job's entries out unrun.
Structure: the broker owns the models, consumers, ledger, event log, lifecycle and pre-warm
outbox, and composes the parts acting on that state, each handed what it uses: `Intake`
(items in), `Dispatcher` (which batch a pull gets, whom a pre-warm is for), `Settlement`
(batches in flight), `Maintenance` (the tick, the cache audit, the live shapes) and
`Windows` (the measured rate, the deadlines it can meet, each job's forecast). Its methods
of those names are thin delegations, so callers see one `Broker`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from fabricctl.core.config import CoreConfig
from fabricctl.core.dispatch import Dispatcher
from fabricctl.core.entry_queue import EntryQueue
from fabricctl.core.events import EventKind, EventLog
from fabricctl.core.forecast import JobView
from fabricctl.core.intake import Intake
from fabricctl.core.lanes import Lane, LaneCounters
from fabricctl.core.ledger import Ledger
from fabricctl.core.lifecycle import Lifecycle
from fabricctl.core.maintenance import Maintenance, model_shapes
from fabricctl.core.model_state import ModelState
from fabricctl.core.serving import serves
from fabricctl.core.settlement import Settlement
from fabricctl.core.shape import Shape
from fabricctl.core.snapshot import ShapeView, Snapshot, finished_view, take_snapshot
from fabricctl.core.stats import BatchesHistogram
from fabricctl.core.terms import NO_TERMS, JobTerms
from fabricctl.core.tracking import (
    ConsumerState,
    InFlight,
    Placement,
    ShapeGuardError,
    UnknownBatchError,
    guard_signature,
)
from fabricctl.core.types import Batch, Contract, Entry, Item, Prewarm
from fabricctl.core.windows import Windows
from fabricctl.core.withdrawal import Withdrawn, return_withdrawn, settle_withdrawn, withdraw

__all__ = ["Broker", "ConsumerState", "InFlight", "Placement", "ShapeGuardError",
           "UnknownBatchError", "guard_signature"]


JUDGE_S = 0.1  # windows are judged at completions this often, besides the tick


class Broker:
    """Why: one object that owns every scheduling decision, with no I/O and no clock."""

    def __init__(self, cfg: CoreConfig | None = None) -> None:
        self.cfg = cfg or CoreConfig()
        self.models: dict[str, ModelState] = {}
        self.consumers: dict[str, ConsumerState] = {}
        self.ledger = Ledger()
        self.events = EventLog(self.cfg.events_kept)
        self.lane_counters = LaneCounters()
        self.batches_hist = BatchesHistogram(self.cfg.thrash_batches)
        self.terms: dict[int, JobTerms] = {}  # job number -> what the shape choice knows of it
        self.intake = Intake(self.cfg, self.models, self.model, self.lane_counters, self.ledger,
                             self.queued)
        self.lifecycle = Lifecycle(self.cfg, self.events, self.batches_hist, self.terms,
                                   self._unfinished_tokens, self.models, self.intake.open_swept)
        self.signals: list[Prewarm] = []  # pre-warm signals not yet sent by the server
        self.settlement = Settlement(self.consumers, self.ledger, self.intake.place, self.queued)
        self.maintenance = Maintenance(self.cfg, self.models, self.consumers, self.lifecycle,
                                       self.events, self.signals)
        self.dispatcher = Dispatcher(self.cfg, self.models, self.consumers, self.lifecycle,
                                     self.settlement, self.signals)
        self.windows = Windows(self.cfg, self.models, self.consumers, self.terms, self.intake,
                               self.lifecycle, self.events, self.shapes)

    # -- models and consumers ------------------------------------------------------------

    def model(self, name: str) -> ModelState:
        ms = self.models.get(name)
        if ms is None:
            ms = ModelState(name, self._budget(name))
            self.models[name] = ms
        return ms

    def _budget(self, model: str) -> int:
        budgets = [c.contract.max_batch_tokens for c in self.consumers.values()
                   if serves(c, model)]
        return max(budgets) if budgets else self.cfg.default_batch_tokens

    def register(self, name: str, contract: Contract, now: float) -> None:
        if name in self.consumers:
            self.disconnect(name, now, "re-registered")
        self.consumers[name] = ConsumerState(name, contract, now)
        for served in contract.served():
            self.model(served).budget = self._budget(served)
        also = f" (also {', '.join(contract.names)})" if contract.names else ""
        self.events.emit(now, EventKind.CONSUMER_JOINED, model=contract.model,
                         reason=name + also)

    def disconnect(self, name: str, now: float, why: str = "disconnected",
                   keep: frozenset[int] | set[int] = frozenset()) -> int:
        """Forget a consumer; every batch it held goes back to the front of its lane, except
        those whose completion is settling or was received (`keep`): they settle later."""
        c = self.consumers.pop(name, None)
        if c is None:
            return 0
        items = 0
        back = c.batches - self.settlement.settling - keep
        for batch_id in sorted(back, reverse=True):  # newest first: oldest ends in front
            items += len(self.fail(batch_id, now).entries)
        for served in c.contract.served():
            ms = self.models.get(served)
            if ms is not None:
                ms.budget = self._budget(served)
        self.events.emit(now, EventKind.CONSUMER_LOST, model=c.contract.model,
                         reason=f"{name}: {why}", value=items)
        return items

    def set_job_terms(self, job: int, terms: JobTerms | None) -> None:
        """A job's priority, deadline and sealed flag as the shape choice should see them
        (None: the job ended, forget it); its waiting shapes are indexed again."""
        if terms is None:
            self.lifecycle.chooser.forget(job)
        if terms is None or terms == NO_TERMS:
            if self.terms.pop(job, None) is None:
                return
        elif self.terms.get(job) == terms:
            return
        else:
            self.terms[job] = terms
        self.lifecycle.chooser.terms_changed()
        for ms in self.models.values():
            for shape in ms.waiting.with_job(job):
                self.lifecycle.index(ms, shape)

    def queued(self, shape: Shape) -> None:
        """Items were queued in `shape` (admitted, failed back, returned): a shape nobody
        holds enters the waiting index under its new counts."""
        if shape.held == 0:
            ms = self.models.get(shape.model)
            if ms is not None:
                self.lifecycle.index(ms, shape)

    def _unfinished_tokens(self) -> int:
        led = self.ledger
        return led.tokens_received - led.tokens_completed

    # -- intake and restore (`Intake`) ----------

    def open_shape(self, model: str, signature: int, label: str, now: float) -> Shape:
        """The key's open shape, made when there is none (a draining shape is no longer open)."""
        return self.intake.open_shape(model, signature, label, now)

    def place(self, model: str, signature: int, label: str, tokens: int, now: float) -> Placement:
        """Assign an item to a lane (first step of ingest); it is not dispatchable yet."""
        return self.intake.place(model, signature, label, tokens, now)

    def placement_live(self, shape: Shape, lane: Lane) -> bool:
        return self.intake.placement_live(shape, lane)

    def admit(self, placement: Placement, entry: Entry) -> None:
        """Make a placed item dispatchable (second step, after its durable commit)."""
        self.intake.admit(placement, entry)

    def admit_all(self, admits: list[tuple[Shape, Lane, Entry]], now: float) -> None:
        self.intake.admit_all(admits, now)

    def admit_shape(self, shape: Shape, lanes: list[Lane], entries: list[Entry], now: float,
                    releases: int) -> None:
        """`admit_all` for one shape's placements (`Intake.admit_shape`)."""
        self.intake.admit_shape(shape, lanes, entries, now, releases)

    def ingest(self, items: Iterable[Item], now: float) -> int:
        """Memory mode: place and admit each item at once; returns how many went in."""
        return self.intake.ingest(items, now)

    def restore_shape(self, model: str, signature: int, label: str,
                      lanes: Iterable[tuple[int, int, Sequence[Entry] | EntryQueue]],
                      now: float) -> tuple[int, int]:
        return self.intake.restore_shape(model, signature, label, lanes, now)

    def restore_epochs(self, epochs: Mapping[str, int]) -> None:
        self.intake.restore_epochs(epochs)

    def restore_ledger(self, items_received: int, tokens_received: int, items_completed: int,
                       tokens_completed: int) -> tuple[int, int]:
        return self.intake.restore_ledger(items_received, tokens_received, items_completed,
                                          tokens_completed)

    # -- dispatch (`Dispatcher`) ----------

    def pull(self, consumer: str, now: float) -> Batch | None:
        """The next batch for a consumer, or None when its model has nothing dispatchable."""
        return self.dispatcher.pull(consumer, now)

    def prewarm_targets(self, signal: Prewarm) -> list[str]:
        """The consumers a pre-warm signal is for (`Dispatcher.prewarm_targets`)."""
        return self.dispatcher.prewarm_targets(signal)

    # -- settlement (`Settlement`) ----------

    @property
    def inflight(self) -> dict[int, InFlight]:
        """Batches out with consumers, by id."""
        return self.settlement.inflight

    @property
    def settling(self) -> set[int]:
        """Batches in flight whose completion is being committed (a store adds and drops)."""
        return self.settlement.settling

    @property
    def batches_total(self) -> int:
        return self.settlement.batches_total

    def complete(self, batch_id: int, now: float) -> Batch:
        b = self.settlement.complete(batch_id, now)
        ms = self.models.get(b.model)
        if ms is not None:
            ms.meter.add(now, b.tokens)
        if now >= self.windows.judged + JUDGE_S and self.lifecycle.chooser.windows():
            self.windows.judge(now)  # (a window out of reach is said early, not at a tick,
            self.windows.risk.update(self.windows.job_views(now), now)  # and a job at risk)
        return b

    def fail(self, batch_id: int, now: float) -> Batch:
        return self.settlement.fail(batch_id, now)

    def split(self, batch_id: int, indexes: list[int]) -> Batch:
        return self.settlement.split(batch_id, indexes)

    def waste(self) -> float:
        """Padding fraction of every batch dispatched so far."""
        return self.settlement.waste()

    # -- withdrawal (`fabricctl.core.withdrawal`) ----------

    def withdraw(self, pick: Callable[[Entry], bool], models: Iterable[str] | None = None
                 ) -> list[Withdrawn]:
        """Take the queued entries `pick` accepts (of `models`' shapes; None: every model)
        out of their lanes, booked out in the ledger until `settle_withdrawn` or
        `return_withdrawn`; in-flight entries are never taken."""
        names = self.models.keys() if models is None else models
        shapes = [s for m in names if (ms := self.models.get(m)) is not None
                  for s in model_shapes(ms)]
        return withdraw(shapes, self.ledger, pick)

    def settle_withdrawn(self, withdrawn: list[Withdrawn]) -> None:
        """Withdrawn entries have a durable outcome: the ledger counts them completed."""
        settle_withdrawn(self.ledger, withdrawn)

    def return_withdrawn(self, withdrawn: list[Withdrawn], now: float) -> None:
        """Withdrawn entries go back to the front of their lanes (their commit failed)."""
        return_withdrawn(self.intake.place, self.ledger, withdrawn, now)

    # -- maintenance and observation (`Maintenance`, `take_snapshot`) ----------

    @property
    def starving_lanes(self) -> int:
        return self.maintenance.starving_lanes

    def tick(self, now: float) -> None:
        """The 1 s maintenance tick: quiescing lanes, starvation, lifecycle timeouts, the
        windows that cannot be met (`judge_windows`), and a critical event for each job
        newly predicted to miss its deadline."""
        self.maintenance.tick(now)
        if any(t.deadline is not None for t in self.terms.values()):
            self.windows.judge(now)
            self.windows.risk.update(self.windows.job_views(now), now)

    def serving(self, model: str) -> int:
        return self.windows.serving(model)

    def paces(self, now: float) -> dict[str, float]:
        return self.windows.paces(now)

    def restore_paces(self, paces: Mapping[str, float]) -> None:
        """The paces a store kept from the last run: each model's prior until it measures."""
        for model, p in paces.items():
            self.model(model).meter.prior = p

    def judge_windows(self, now: float) -> None:
        self.windows.judge(now)

    def job_views(self, now: float) -> list[JobView]:
        return self.windows.job_views(now)

    def record_cache(
        self, batch_id: int, queries: int, hits: int, achievable: int, now: float
    ) -> None:
        """An engine's prefix-cache figures for one batch, for the shape's cache-truth audit."""
        f = self.settlement.inflight.get(batch_id)
        if f is not None:
            self.maintenance.record_cache(f.shape, queries, hits, achievable, now)

    def take_signals(self) -> list[Prewarm]:
        out = self.signals.copy()  # the list itself is shared with `maintenance`
        self.signals.clear()
        return out

    def take_finished(self) -> list[ShapeView]:
        """The records of the shapes that finished since the last call, oldest first
        (`finished_view`: for the store to keep); the outbox is emptied."""
        out = self.lifecycle.finished_out
        views = [finished_view(s) for s in out]
        out.clear()
        return views

    def shapes(self) -> list[Shape]:
        """Every live shape: open ones and a draining current one."""
        return self.maintenance.shapes()

    def snapshot(self, now: float, lanes: object = "all", events: int = 100,
                 received: frozenset[int] | set[int] = frozenset()) -> Snapshot:
        """All a dashboard needs; `lanes` is "all", "none" or a set of (model, signature);
        `received` names batches whose completion a store received and has not yet begun
        to commit: with `settling`, each consumer's settling batches."""
        return take_snapshot(
            now, shapes=self.shapes(), models=self.models.values(),
            consumers=self.consumers.values(), ledger=self.ledger, log=self.events,
            lane_counters=self.lane_counters, batches_hist=self.batches_hist,
            starving_lanes=self.starving_lanes, batches_total=self.batches_total,
            starve_s=self.cfg.starve_s, lanes=lanes, events=events,  # type: ignore[arg-type]
            job_views=self.job_views(now), settling=self.settling | received,
        )
