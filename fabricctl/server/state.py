"""What the broker daemon's parts share: the store, the settings, the clock, the peers.

Contract: `BrokerServer` builds one `ServerState` and hands it to its handlers, its
connections, its views and its pre-warm signals; each reaches the daemon's state only
through it. `core` is the store's core; `peers` holds every open connection; `consumers`
maps a registered consumer name to its one peer; `wakeup` wakes every long-polling pull;
`metrics` is this broker's Prometheus registry; `extra` names the snapshot extras (gpus,
processes, ...), each a callable read at snapshot time; `received` names the batches whose
completion was received and waits for the writer (its `pending_batches`); `started` is the
clock at start.
None of them is replaced after construction (the collections change in place).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fabricctl.server.metrics import Metrics
from fabricctl.server.wakeup import Wakeup

if TYPE_CHECKING:
    from fabricctl.core.broker import Broker
    from fabricctl.server.config import ServerConfig
    from fabricctl.server.peer import Peer
    from fabricctl.store.durable import DurableBroker


@dataclass(eq=False)
class ServerState:
    """Why: handlers, connections and views get the daemon's state handed to them by name,
    not as attributes they assume of a server they inherit from."""

    store: DurableBroker
    cfg: ServerConfig
    clock: Callable[[], float]
    received: Callable[[], set[int]] = set  # the writer's received, not yet settled batches
    core: Broker = field(init=False)
    peers: set[Peer] = field(default_factory=set)
    consumers: dict[str, Peer] = field(default_factory=dict)
    wakeup: Wakeup = field(default_factory=Wakeup)
    metrics: Metrics = field(init=False)
    extra: dict[str, Callable[[], Any]] = field(default_factory=dict)  # snapshot extras
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.core = self.store.core
        self.metrics = Metrics(self.core, self.live_job_ids, self.clock, self.live_mixes)
        self.started = self.clock()

    def live_job_ids(self) -> dict[int, str]:
        """The jobs not ended, number -> id (the metrics' job labels)."""
        return {j.number: j.id for j in self.store.live_jobs()}

    def live_mixes(self) -> dict[str, dict[str, int]]:
        """The jobs not ended, id -> items per endpoint (`core.mix`; the metrics' mix)."""
        return {j.id: j.endpoints for j in self.store.live_jobs()}
