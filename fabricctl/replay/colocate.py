"""Batch beside live traffic on one simulated vLLM server: the window controller rehearsed.

Contract: `simulate(trace, policy, costs)` runs one server step by step as vLLM's V1
scheduler does with `--scheduling-policy priority`: running requests (at most
`max_num_seqs`) take their tokens first, a decode one token, a prefill a chunk of what is left
of `max_num_batched_tokens`, in priority order (live 0 before batch); a waiting live request
that finds every slot taken preempts the latest batch request, whose work is lost and
recomputed (counted). A step lasts `SimCosts.step_seconds`. Live requests arrive at the
trace's times; the batch client keeps `policy`'s window of batch requests in the server:
`Fixed(w)`, `Controlled` (`core.colocate.Colocation`, one reading every `interval_s`: the
server's running and waiting requests and the live first-token times since the last reading),
`Oracle` (knows the live arrivals of the next interval, keeps no headroom) or `Alone` (no
batch). `ColocateResult` holds the live times to first token and the batch work done.
Arrivals: `poisson` (a rate) and `diurnal` (a rate that swings over a period), seeded.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from fabricctl.core.colocate import Colocation, ServerLoad
from fabricctl.engines.costs import SimCosts

LIVE, BATCH = 0, 100  # vLLM priorities: lower runs first


@dataclass(frozen=True, slots=True)
class Trace:
    """Why: one run's live arrivals and request sizes, the same for every policy compared."""

    live_arrivals: tuple[float, ...]
    duration_s: float
    live_prompt: int = 512
    live_output: int = 64
    batch_prompt: int = 1024
    batch_output: int = 128


@dataclass(slots=True)
class _Req:
    """Why: one request's progress inside the simulated server."""

    priority: int
    arrival: float
    prompt: int
    output: int
    computed: int = 0  # prompt tokens prefilled
    generated: int = 0

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt


@dataclass(frozen=True, slots=True)
class Fixed:
    """A fixed number of batch requests in the server."""

    window: int


@dataclass(frozen=True, slots=True)
class Controlled:
    """The window `core.colocate.Colocation` sizes from a reading every `interval_s`."""

    target_s: float | None
    interval_s: float = 0.25
    min_window: int = 0


@dataclass(frozen=True, slots=True)
class Oracle:
    """Knows the next interval's live arrivals: leaves them their slots, nothing more."""

    interval_s: float = 0.25


@dataclass(frozen=True, slots=True)
class Alone:
    """No batch: the live service as it runs today."""


Policy = Fixed | Controlled | Oracle | Alone


@dataclass(slots=True)
class ColocateResult:
    """Why: what the live service saw and what the batch got, per policy."""

    ttft_s: list[float] = field(default_factory=list)
    live_done: int = 0
    batch_done: int = 0
    batch_tokens: int = 0  # prompt + output tokens of the batch requests completed
    recomputed_tokens: int = 0  # preempted batch work done again
    duration_s: float = 0.0

    def pct(self, q: float) -> float:
        """The q-th percentile of the live times to first token (0 when none)."""
        if not self.ttft_s:
            return 0.0
        xs = sorted(self.ttft_s)
        return xs[min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1)]

    @property
    def batch_per_s(self) -> float:
        return self.batch_done / self.duration_s if self.duration_s else 0.0


def poisson(rate: float, duration_s: float, seed: int = 1) -> tuple[float, ...]:
    rng, t = random.Random(seed), 0.0
    out: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return tuple(out)
        out.append(t)


def diurnal(mean_rate: float, duration_s: float, swing: float = 0.8, periods: float = 2.0,
            seed: int = 1) -> tuple[float, ...]:
    """Arrivals whose rate swings between (1 - swing) and (1 + swing) x the mean (thinning)."""
    peak = mean_rate * (1 + swing)
    rng = random.Random(seed)
    return tuple(t for t in poisson(peak, duration_s, seed) if rng.random() * peak <= mean_rate
                 * (1 + swing * math.sin(2 * math.pi * periods * t / duration_s)))


def _window(policy: Policy, cap: int) -> int:
    if isinstance(policy, Fixed):
        return policy.window
    return 0 if isinstance(policy, Alone) else cap


def simulate(trace: Trace, policy: Policy, costs: SimCosts) -> ColocateResult:
    """Run `trace` under `policy` for `trace.duration_s` simulated seconds."""
    cap = costs.max_num_seqs
    out = ColocateResult(duration_s=trace.duration_s)
    ctl = (Colocation(capacity=cap, max_window=cap, min_window=policy.min_window,
                      target_s=policy.target_s) if isinstance(policy, Controlled) else None)
    interval = policy.interval_s if isinstance(policy, Controlled | Oracle) else math.inf
    window = _window(policy, cap)
    running: list[_Req] = []
    waiting: list[_Req] = []
    arrivals = trace.live_arrivals
    nxt, t, next_reading = 0, 0.0, 0.0
    since: list[float] = []  # live first-token times since the last reading
    while t < trace.duration_s:
        while nxt < len(arrivals) and arrivals[nxt] <= t:
            waiting.append(_Req(LIVE, arrivals[nxt], trace.live_prompt, trace.live_output))
            nxt += 1
        if t >= next_reading:
            next_reading = t + interval
            batch_in = sum(r.priority == BATCH for r in (*running, *waiting))
            if ctl is not None:
                window = ctl.update(ServerLoad(len(running), len(waiting), batch_in,
                                               max(since) if since else None))
            elif isinstance(policy, Oracle):
                coming = bisect.bisect_right(arrivals, t + interval) - nxt
                live_in = len(running) + len(waiting) - batch_in
                window = max(0, cap - live_in - coming)
            since = []
        batch_in = sum(r.priority == BATCH for r in (*running, *waiting))
        waiting.extend(_Req(BATCH, t, trace.batch_prompt, trace.batch_output)
                       for _ in range(window - batch_in))
        _admit(running, waiting, cap, out)
        if not running:
            t = min(trace.duration_s, arrivals[nxt] if nxt < len(arrivals) else math.inf)
            if waiting:  # only batch waits and no slot ever frees: cannot happen (cap >= 1)
                raise AssertionError("requests wait beside an empty server")
            continue
        t = _step(running, costs, t, out, since)
    return out


def _admit(running: list[_Req], waiting: list[_Req], cap: int, out: ColocateResult) -> None:
    """Waiting requests into free slots, live first; a live one preempts the latest batch
    request when none is free (its work is lost: recomputed later)."""
    waiting.sort(key=lambda r: (r.priority, r.arrival))
    while waiting:
        if len(running) < cap:
            running.append(waiting.pop(0))
            continue
        head = waiting[0]
        victims = [r for r in running if r.priority > head.priority]
        if not victims:
            return
        victim = max(victims, key=lambda r: (r.priority, r.arrival))
        running.remove(victim)
        out.recomputed_tokens += victim.computed + victim.generated
        victim.computed = victim.generated = 0
        waiting.append(victim)
        running.append(waiting.pop(0))
        waiting.sort(key=lambda r: (r.priority, r.arrival))


def _step(running: list[_Req], costs: SimCosts, t: float, out: ColocateResult,
          since: list[float]) -> float:
    """One scheduler step over the running requests; returns the time it ends."""
    running.sort(key=lambda r: (r.priority, r.arrival))
    budget = costs.max_num_batched_tokens
    prefill = decode = context = 0
    plan: list[tuple[_Req, int]] = []
    for r in running:
        if budget <= 0:
            break
        if r.prefilling:
            chunk = min(r.prompt - r.computed, budget)
            prefill += chunk
        else:
            chunk = 1
            decode += 1
            context += r.prompt + r.generated
        budget -= chunk
        plan.append((r, chunk))
    end = t + costs.step_seconds(prefill, 0, decode, context)
    for r, chunk in plan:
        if r.prefilling:
            r.computed += chunk
            if r.prefilling:
                continue
            if r.priority == LIVE:  # the step that ends its prefill samples its first token
                out.ttft_s.append(end - r.arrival)
                since.append(end - r.arrival)
        r.generated += 1
        if r.generated >= r.output:
            running.remove(r)
            if r.priority == LIVE:
                out.live_done += 1
            else:
                out.batch_done += 1
                out.batch_tokens += r.prompt + r.output
    return end


def live_capacity(trace: Trace, costs: SimCosts, seconds: float = 20.0) -> float:
    """Live requests per second the server completes when overloaded (its saturation)."""
    flood = Trace(poisson(10 * costs.max_num_seqs, seconds, seed=99), seconds,
                  trace.live_prompt, trace.live_output, trace.batch_prompt, trace.batch_output)
    return simulate(flood, Alone(), costs).live_done / seconds
