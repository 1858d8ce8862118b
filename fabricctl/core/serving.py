"""Which consumers serve a name, and which of its names a consumer of several pulls from now.

Contract: a consumer serves every name its contract lists (`Contract.served()`: its model's
and the other names its server answers, such as LoRA adapters). Each name keeps its own
model state (its shapes: the cacheable unit is (name, prefix), as vLLM hashes an adapter's
blocks apart from the base model's), so a consumer of several names pulls from one at a time
(`ConsumerState.serving`), and moving from one to another is a shape switch. `Live(consumers,
name)` answers the lifecycle's "is this consumer here" for the name's model state: connected,
serving the name and pulling from it now. A consumer that moved to another of its names is,
for the name it left, departed: its shape there is adopted by a consumer pulling from that
name, or resumed when it comes back. `serves(consumer, name)` is the routing test every part
uses; `rank(ms, live)` orders a consumer's other names by what waits in them (highest
priority, then the longest wait), None for a name with nothing for it. Pure.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from fabricctl.core.model_state import DISPATCHING, ModelState, orphaned
from fabricctl.core.tracking import ConsumerState


def serves(consumer: ConsumerState, name: str) -> bool:
    """The consumer's server answers items whose `model` is `name`."""
    contract = consumer.contract
    return contract.model == name or name in contract.names


class Live(Container[str]):
    """Why: the lifecycle adopts the shapes of consumers not here; a consumer pulling from
    another of its names is not here for this one."""

    __slots__ = ("consumers", "name")

    def __init__(self, consumers: Mapping[str, ConsumerState], name: str) -> None:
        self.consumers = consumers
        self.name = name

    def __contains__(self, consumer: object) -> bool:
        c = self.consumers.get(consumer) if isinstance(consumer, str) else None
        return c is not None and (c.serving == self.name if c.contract.names
                                  else c.contract.model == self.name)


def rank(ms: ModelState, live: Container[str]) -> tuple[int, float, int] | None:
    """How urgently `ms` wants a consumer that is not pulling from it: (priority, -oldest
    wait start, tokens) of what waits there (its waiting shapes, else a shape a departed
    slot holds, that consumer's own included), higher first; None when nothing does."""
    for priority, level in ms.waiting.ordered():
        oldest = level.by_age.top()
        biggest = level.by_tokens.top()
        if oldest is None or biggest is None:
            continue
        since = oldest.waiting_since()
        return priority, -(oldest.created if since is None else since), biggest.tokens
    for s in orphaned(ms, live):
        cur = s.current
        shape = cur if cur is not None and cur.items and cur.state in DISPATCHING else s.warming
        assert shape is not None  # `orphaned` holds one or the other
        return 0, -shape.created, shape.tokens
    return None
