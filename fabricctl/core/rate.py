"""The fleet's measured rate: input tokens completed per second, per model, over a window.

Contract: `begin(now)` marks a dispatch: the first one, or the first after a window with no
batch completed (`window_s`: the fleet was idle), starts the measured span; `add(now,
tokens)` records a completed batch; `rate(now, floor_s)` is the tokens per second over the
last `window_s` (or since the span's start, when younger, but over at least `floor_s`: idle
time before it is not counted), None before any batch completed; `steady(now)` is the rate
since the span's first completion (the pipeline's filling left out) and how long that is;
`peak(now)` the most completed in one whole second of the window; `batch_s(now, budget,
consumers)` is how long one consumer takes for one batch budget at `rate` (what the auto
wait bound scales by). `begin(now, idle=True, consumers)` (nothing of the model in flight)
after `IDLE_S` without a completion also starts a new span: idle time is not a rate. A
span's whole-run pace (`run_pace`: tokens per second per consumer from its first dispatch
to its last completion, the pipeline's filling in it) becomes `prior` when the next span
starts; a store may set `prior` from the last run it kept. Time is an argument; samples are
bucketed by whole seconds, so memory stays bounded by the window.
"""

from __future__ import annotations

from collections import deque

IDLE_S = 0.25  # a fleet with nothing in flight this long after its last completion was idle


class RateMeter:
    """Why: deadlines and the wait bound are in seconds, the broker counts tokens."""

    __slots__ = ("buckets", "consumers", "done", "done_at", "first", "prior", "start", "total",
                 "window_s")

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self.buckets: deque[list[float]] = deque()  # [second, tokens], oldest first
        self.total = 0.0
        self.start: float | None = None
        self.done_at: float | None = None  # the last completion (None: none since `start`)
        self.first: tuple[float, float] | None = None  # (when, tokens): the span's first
        self.done = 0.0  # every token completed in the span (never trimmed)
        self.consumers = 1  # consumers serving the model when the span started
        self.prior: float | None = None  # tokens/s per consumer of the last span (or store)

    def begin(self, now: float, idle: bool = False, consumers: int = 1) -> None:
        """Work went out: the first dispatch, or the first after an idle window (or after
        `IDLE_S` with nothing in flight: `idle`), starts the measured span (else a job after
        a pause was forecast at its tokens over the whole pause)."""
        gap = None if self.done_at is None else now - self.done_at
        if self.start is None or (gap is not None and (
                gap > self.window_s or (idle and gap > IDLE_S))):
            pace = self.run_pace()
            if pace is not None:
                self.prior = pace
            self.start = now
            self.done_at = None
            self.first = None
            self.done = 0.0
            self.consumers = max(1, consumers)
            self.buckets.clear()
            self.total = 0.0

    def run_pace(self) -> float | None:
        """Tokens per second per consumer over the span, from its first dispatch to its last
        completion (the pipeline's filling counted): what a job starting cold can expect.
        None before a completion."""
        if self.start is None or self.done_at is None or self.done_at <= self.start:
            return None
        return self.done / (self.done_at - self.start) / self.consumers

    def add(self, now: float, tokens: int) -> None:
        if self.start is None:
            self.start = now
        self.done_at = now
        sec = float(int(now))
        if self.buckets and self.buckets[-1][0] == sec:
            self.buckets[-1][1] += tokens
        else:
            self.buckets.append([sec, float(tokens)])
        self.total += tokens
        self.done += tokens
        if self.first is None:
            self.first = (now, float(tokens))
        self._trim(now)

    def _trim(self, now: float) -> None:
        b = self.buckets
        while b and b[0][0] < now - self.window_s:
            self.total -= b.popleft()[1]

    def rate(self, now: float, floor_s: float = 1.0) -> float | None:
        """Tokens per second completed lately, or None with nothing measured (over at least
        `floor_s` seconds: the default damps the first second's noise by understating it)."""
        self._trim(now)
        if self.start is None or self.total <= 0:
            return None
        span = min(self.window_s, now - self.start)
        return self.total / max(span, floor_s, 1e-9)

    def peak(self, now: float) -> float | None:
        """The most tokens completed in one whole second of the window (seconds before the
        current one), None without one: the best rate shown lately."""
        self._trim(now)
        whole = [tokens for sec, tokens in self.buckets if sec + 1 <= now]
        return max(whole) if whole else None

    def steady(self, now: float) -> tuple[float, float] | None:
        """(tokens per second, seconds) since the first completion: the time the first
        batches took to come back (the pipeline filling) left out. None before a second
        completion."""
        if self.first is None:
            return None
        t, tokens = self.first
        if now <= t or self.done <= tokens:
            return None
        return (self.done - tokens) / (now - t), now - t

    def batch_s(self, now: float, budget: int, consumers: int) -> float | None:
        """Seconds one consumer takes for `budget` tokens at the measured rate."""
        r = self.rate(now)
        if r is None or consumers <= 0:
            return None
        return budget / (r / consumers)
