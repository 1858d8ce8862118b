"""Typed event records and the bounded log observers read with "events since N".

Contract: every shape transition, pre-warm, force-drain (one per shape and tick, however
many lanes), thrash event and consumer join/loss is one `Event` with a monotonically
increasing `seq`; the log keeps the most recent `events_kept` and counts every kind ever
emitted.
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum

import msgspec


class EventKind(StrEnum):
    """Why: the dashboard colours and filters events by what happened, not by text."""

    TRANSITION = "transition"
    PREWARM = "prewarm"
    FORCE_DRAIN = "force_drain"
    THRASH = "thrash"
    CONSUMER_JOINED = "consumer_joined"
    CONSUMER_LOST = "consumer_lost"
    GUARD = "guard"
    SWITCH = "switch"  # a consumer left a shape with work for a waiting one (the choice)
    JOB_AT_RISK = "job_at_risk"  # a job is predicted to finish after its deadline
    JOB_HOPELESS = "job_hopeless"  # a job cannot meet its window even served first
    SWEEP = "sweep"  # a job's loose shapes moved into its swept shape (`core.sweep`)


class Event(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why: observers filter what happened (at simulated or wall time `t`) by field, not text."""

    seq: int
    t: float
    kind: EventKind
    model: str = ""
    signature: int = 0
    label: str = ""
    src: str = ""  # the state before (transitions)
    dst: str = ""  # the state after (transitions)
    reason: str = ""
    value: int = 0  # e.g. batches run (thrash), lowest lane id (force-drain), epoch (pre-warm)
    count: int = 0  # force-drain: how many lanes of the shape this one event covers
    critical: bool = False


class EventLog:
    """Why: observers poll for what changed since they last looked, without unbounded memory."""

    __slots__ = ("_events", "counts", "seq")

    def __init__(self, kept: int = 10_000) -> None:
        self._events: deque[Event] = deque(maxlen=kept)
        self.seq = 0
        self.counts: dict[str, int] = {}

    def emit(self, t: float, kind: EventKind, **fields: object) -> Event:
        self.seq += 1
        event = Event(seq=self.seq, t=t, kind=kind, **fields)  # type: ignore[arg-type]
        self._events.append(event)
        self.counts[kind.value] = self.counts.get(kind.value, 0) + 1
        return event

    def since(self, seq: int, limit: int = 1000) -> list[Event]:
        """Events with seq > `seq`, oldest first, at most `limit`."""
        out = [e for e in self._events if e.seq > seq]
        return out[:limit]

    def recent(self, n: int) -> list[Event]:
        return list(self._events)[-n:] if n > 0 else []
