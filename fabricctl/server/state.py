"""What the broker daemon's parts share: the store, the settings, the clock, the peers.

Contract: `BrokerServer` builds one `ServerState` and hands it to its handlers, its
connections, its views and its pre-warm signals; each reaches the daemon's state only
through it. `view` is the store's core, read only (`DurableBroker.view`: changes go
through the store's methods); `peers` holds every open connection; `consumers`
maps a registered consumer name to its one peer; `wakeup` wakes every long-polling pull;
`metrics` is this broker's Prometheus registry; `extra` holds the snapshot extras
(`Extras`: gpus, processes, host, engine, servers, ray; each a callable read at snapshot
time, the daemon sets those it has); `received` names the batches whose
completion was received and waits for the writer (its `pending_batches`); `started` is the
clock at start; `draining` is set once the stop's drain began (`server.drain`: no batch is
handed out any more), and `departures` then lists the consumers that left holding work.
None of them is replaced after construction (the collections change in place).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import msgspec

from fabricctl.server.departures import Departure
from fabricctl.server.metrics import Metrics
from fabricctl.server.wakeup import Wakeup

if TYPE_CHECKING:
    from fabricctl.server.config import ServerConfig
    from fabricctl.server.peer import Peer
    from fabricctl.store.durable import DurableBroker
    from fabricctl.store.view import CoreView


class EngineNote(msgspec.Struct, omit_defaults=True):
    """Why: the `engine` extra says which engine serves and why it was chosen."""

    kind: str  # sim, vllm, openai, or "none" (the agents bring the GPUs)
    reason: str
    ray: str | None = None  # `up --ray`: the Ray address


@dataclass(eq=False)
class Extras:
    """Why: what the daemon adds to a snapshot is named here, not keyed by strings; a
    snapshot carries those set, in this order, each under its field's name."""

    gpus: Callable[[], Any] | None = None  # the NVML monitor's latest report
    processes: Callable[[], Any] | None = None  # the process monitor's samples
    host: Callable[[], str] | None = None  # the broker's host name
    engine: Callable[[], EngineNote] | None = None
    servers: Callable[[], Any] | None = None  # the vLLM launcher's server views
    ray: Callable[[], Any] | None = None  # the Ray workers' views

    def items(self) -> list[tuple[str, Callable[[], Any]]]:
        """(name, callable) of each extra set, in field order."""
        return [(f.name, fn) for f in fields(self) if (fn := getattr(self, f.name)) is not None]


@dataclass(eq=False)
class ServerState:
    """Why: handlers, connections and views get the daemon's state handed to them by name,
    not as attributes they assume of a server they inherit from."""

    store: DurableBroker
    cfg: ServerConfig
    clock: Callable[[], float]
    received: Callable[[], set[int]] = set  # the writer's received, not yet settled batches
    view: CoreView = field(init=False)
    peers: set[Peer] = field(default_factory=set)
    consumers: dict[str, Peer] = field(default_factory=dict)
    wakeup: Wakeup = field(default_factory=Wakeup)
    metrics: Metrics = field(init=False)
    extra: Extras = field(default_factory=Extras)  # snapshot extras
    started: float = field(init=False)
    draining: bool = False
    departures: list[Departure] = field(default_factory=list)  # while draining

    def __post_init__(self) -> None:
        self.view = self.store.view
        self.metrics = Metrics(self.view, self.live_job_ids, self.clock, self.live_mixes)
        self.started = self.clock()

    def live_job_ids(self) -> dict[int, str]:
        """The jobs not ended, number -> id (the metrics' job labels)."""
        return {j.number: j.id for j in self.store.live_jobs()}

    def live_mixes(self) -> dict[str, dict[str, int]]:
        """The jobs not ended, id -> items per endpoint (`core.mix`; the metrics' mix)."""
        return {j.id: j.endpoints for j in self.store.live_jobs()}
