"""The fleet's measured rate: input tokens completed per second, per model, over a window.

Contract: `begin(now)` marks the first dispatch; `add(now, tokens)` records a completed
batch; `rate(now)` is the tokens per second over the last `window_s` (or since the first
dispatch, when younger), None before any batch completed; `batch_s(now, budget, consumers)`
is how long one consumer takes for one batch budget at that rate (what the auto wait bound
scales by). Time is an argument; samples are bucketed by whole seconds, so memory stays
bounded by the window.
"""

from __future__ import annotations

from collections import deque


class RateMeter:
    """Why: deadlines and the wait bound are in seconds, the broker counts tokens."""

    __slots__ = ("buckets", "start", "total", "window_s")

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self.buckets: deque[list[float]] = deque()  # [second, tokens], oldest first
        self.total = 0.0
        self.start: float | None = None

    def begin(self, now: float) -> None:
        """Work went out (the first dispatch starts the measured span)."""
        if self.start is None:
            self.start = now

    def add(self, now: float, tokens: int) -> None:
        self.begin(now)
        sec = float(int(now))
        if self.buckets and self.buckets[-1][0] == sec:
            self.buckets[-1][1] += tokens
        else:
            self.buckets.append([sec, float(tokens)])
        self.total += tokens
        self._trim(now)

    def _trim(self, now: float) -> None:
        b = self.buckets
        while b and b[0][0] < now - self.window_s:
            self.total -= b.popleft()[1]

    def rate(self, now: float) -> float | None:
        """Tokens per second completed lately, or None with nothing measured."""
        self._trim(now)
        if self.start is None or self.total <= 0:
            return None
        span = min(self.window_s, now - self.start)
        return self.total / max(span, 1.0)

    def batch_s(self, now: float, budget: int, consumers: int) -> float | None:
        """Seconds one consumer takes for `budget` tokens at the measured rate."""
        r = self.rate(now)
        if r is None or consumers <= 0:
            return None
        return budget / (r / consumers)
