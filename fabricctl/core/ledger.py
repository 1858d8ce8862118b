"""The conservation ledger: every item and token received is queued, in flight or completed.

Contract: received = routed + queued and routed = in_flight + completed, for items and for
tokens; `difference()` is received - routed - queued and must read zero at every moment.
Each counter moves on its own operation, so a lost or double-counted item shows up here.
`restore(...)` is a restart's rule: received and completed come back as persisted, nothing is
in flight (routed = completed), and queued is what the restart re-admitted.
"""

from __future__ import annotations

import msgspec


class Ledger(msgspec.Struct):
    """Why: "nothing lost" is a number an operator can watch, not a promise."""

    items_received: int = 0
    tokens_received: int = 0
    items_queued: int = 0
    tokens_queued: int = 0
    items_routed: int = 0  # dispatched and not put back: in flight or completed
    tokens_routed: int = 0
    items_inflight: int = 0
    tokens_inflight: int = 0
    items_completed: int = 0
    tokens_completed: int = 0

    def receive(self, items: int, tokens: int) -> None:
        self.items_received += items
        self.tokens_received += tokens
        self.items_queued += items
        self.tokens_queued += tokens

    def dispatch(self, items: int, tokens: int) -> None:
        self.items_queued -= items
        self.tokens_queued -= tokens
        self.items_routed += items
        self.tokens_routed += tokens
        self.items_inflight += items
        self.tokens_inflight += tokens

    def requeue(self, items: int, tokens: int) -> None:
        self.items_inflight -= items
        self.tokens_inflight -= tokens
        self.items_routed -= items
        self.tokens_routed -= tokens
        self.items_queued += items
        self.tokens_queued += tokens

    def complete(self, items: int, tokens: int) -> None:
        self.items_inflight -= items
        self.tokens_inflight -= tokens
        self.items_completed += items
        self.tokens_completed += tokens

    def restore(self, items_received: int, tokens_received: int, items_completed: int,
                tokens_completed: int) -> None:
        """A restart: the persisted counts, over the entries re-admitted since (`receive`)."""
        self.items_received, self.tokens_received = items_received, tokens_received
        self.items_routed = self.items_completed = items_completed
        self.tokens_routed = self.tokens_completed = tokens_completed

    def difference(self) -> tuple[int, int]:
        """(items, tokens) unaccounted for: must be (0, 0)."""
        return (
            self.items_received - self.items_routed - self.items_queued,
            self.tokens_received - self.tokens_routed - self.tokens_queued,
        )

    def consistent(self) -> bool:
        return (
            self.difference() == (0, 0)
            and self.items_routed == self.items_inflight + self.items_completed
            and self.tokens_routed == self.tokens_inflight + self.tokens_completed
        )
