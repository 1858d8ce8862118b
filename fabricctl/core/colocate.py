"""Batch work beside a live service on a shared server: how many batch requests to keep there.

Contract: `Colocation.update(load)` takes one `ServerLoad` reading (the server's running and
waiting requests, the batch requests this consumer has outstanding on it, and the time to
first token a live request saw, when measured) and returns the batch window until the next
reading: the smaller of two bounds, never under `min_window` nor over `max_window`.
Occupancy: live work holds `running + waiting - batch_outstanding` of the server's
`capacity` slots (its `--max-num-seqs`); the batch may take what is left but `headroom`
slots kept free for live arrivals. Pace (`cwnd`, as TCP's congestion window): it starts at
one and doubles at each reading until a live answer is slow; a live time to first token over
`target_s` halves it; one under `calm` x `target_s` (or any reading without a target) adds
one. So a batch never floods a server whose live answers it has not yet seen. Pure: the
reading is the only input; there is no clock. `shared_note` says a reading in words.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One reading of a shared server (its /metrics gauges, and what this consumer knows)."""

    running: int  # vllm:num_requests_running
    waiting: int  # vllm:num_requests_waiting
    batch_outstanding: int  # batch requests this consumer has sent there and not had back
    live_ttft_s: float | None = None  # a live request's time to first token, when measured

    @property
    def live(self) -> int:
        """Slots the live service holds (all requests there less the batch's own)."""
        return max(0, self.running + self.waiting - self.batch_outstanding)


@dataclass(slots=True)
class Colocation:
    """Why: no fixed window is right at every live load; this one follows the server's."""

    capacity: int
    max_window: int
    min_window: int = 0
    target_s: float | None = None  # the live time to first token to keep under; None: none
    calm: float = 0.7
    headroom: int = 1  # slots kept free for the next live arrivals
    cwnd: int = 1  # the pace bound (see the module contract)
    slow_start: bool = True  # doubling until the first slow live answer
    window: int = field(init=False, default=0)
    live: int = field(init=False, default=0)  # the last reading's live slots

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.max_window < 0 or not 0 <= self.min_window <= self.max_window:
            raise ValueError(f"a colocation needs capacity >= 1 and 0 <= min_window <= "
                             f"max_window, not {self.capacity}, {self.min_window}, "
                             f"{self.max_window}")
        if self.target_s is not None and self.target_s <= 0:
            raise ValueError(f"a live latency target must be positive, not {self.target_s}")

    def update(self, load: ServerLoad) -> int:
        """The window until the next reading."""
        ttft = load.live_ttft_s
        if self.target_s is not None and ttft is not None and ttft > self.target_s:
            self.cwnd = max(1, self.cwnd // 2)
            self.slow_start = False
        elif self.target_s is None or ttft is None or ttft < self.calm * self.target_s:
            grown = 2 * self.cwnd if self.slow_start else self.cwnd + 1
            self.cwnd = min(self.max_window, grown)
        self.live = load.live
        free = self.capacity - load.live - self.headroom
        self.window = max(self.min_window, min(self.max_window, free, self.cwnd))
        return self.window

    def paused(self) -> bool:
        """Whether the batch sends nothing new (live traffic holds the server, or its pace)."""
        return self.window == 0


def shared_note(capacity: int, window: int, live: int, live_ttft_s: float | None,
                target_s: float | None) -> str:
    """`shared: batch 10 of 16 slots, live 5, first token 120 ms (target 150 ms)`, or the
    pause: `shared: batch paused, live traffic holds 16 of 16 slots`."""
    if window == 0:
        head = f"shared: batch paused, live traffic holds {live} of {capacity} slots"
    else:
        head = f"shared: batch {window} of {capacity} slots, live {live}"
    if live_ttft_s is not None:
        head += f", first token {1000 * live_ttft_s:.0f} ms"
        if target_s is not None:
            head += f" (target {1000 * target_s:.0f} ms)"
    return head
