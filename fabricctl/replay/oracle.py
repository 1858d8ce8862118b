"""The oracle: what an omniscient shape scheduler would do on the same simulated GPUs.

Contract: `Oracle(items)` is a `Policy` that knows the whole workload in advance (its
items, not their arrival times' future: it hands a GPU only what has arrived). It is the
reference `replay` reports fabric against ("the limit"), built to reach the bound the issue
names: each shape's prefix computed once per GPU that serves it, and no GPU idle while work
waits.
- Placement: shapes go to GPUs longest-processing-time first by their work (prompt and
  output tokens, the prefix once), so each shape has one home GPU and the homes' totals are
  balanced; a shape whose work is over a GPU's fair share is split over as many GPUs as
  that takes (its items dealt out in turn), which costs one more prefix per extra GPU.
- Order: a GPU drains one shape at a time (the one it started, while it has arrived items
  waiting; then the one with the most waiting), so its prefix stays cached while the shape
  runs. A GPU whose own queue is empty takes the waiting items of the other GPU's shape
  with the most of them (no GPU idles while work waits; each steal costs one prefix).
- Its consumers fill the engine's queue exactly as fabric's do (`SimFleet.wants`), pad
  nothing, and send no pre-warm.
- Jobs (`Oracle(items, jobs)`): queues per shape and job, the most urgent first (priority,
  then earliest deadline, then its current queue and shape, then the most items); steals
  likewise, so a window is served by every GPU, earliest deadline first. It sees an item's
  job only once it arrived. With one job (or none) this is the order above.
Pure and deterministic: ties break by shape order, and nothing reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from fabricctl.replay.jobs import JobSpec
from fabricctl.replay.policies import _Base
from fabricctl.replay.workload import ReplayItem

Shape = tuple[str, int]
Unit = tuple[Shape, int]  # a shape's items of one job


def shape_work(items: list[ReplayItem]) -> dict[Shape, int]:
    """Tokens of work per shape: every item's own prompt tokens and output, the prefix once."""
    work: dict[Shape, int] = {}
    prefix: dict[Shape, int] = {}
    for r in items:
        work[r.shape] = work.get(r.shape, 0) + r.tokens - r.prefix + r.item.max_tokens
        prefix[r.shape] = max(prefix.get(r.shape, 0), r.prefix)
    return {s: w + prefix[s] for s, w in work.items()}


def place(work: dict[Shape, int], gpus: int) -> dict[Shape, list[int]]:
    """Home GPUs per shape: LPT on work; a shape over the fair share gets ceil(work/share)
    GPUs (the least loaded), its work shared evenly among them."""
    share = max(1, -(-sum(work.values()) // gpus))
    load = [0] * gpus
    homes: dict[Shape, list[int]] = {}
    for s in sorted(work, key=lambda s: (-work[s], s)):
        k = min(gpus, max(1, -(-work[s] // share)))
        chosen = sorted(range(gpus), key=lambda g: (load[g], g))[:k]
        for g in chosen:
            load[g] += work[s] // k
        homes[s] = sorted(chosen)
    return homes


class Oracle(_Base):
    """Why: a ratio to "the best any shape scheduler could do here" says how far fabric is
    from the limit, on any workload and pressure, where a baseline only says it is ahead."""

    name = "oracle"

    def __init__(self, items: list[ReplayItem], jobs: Mapping[int, JobSpec] | None = None
                 ) -> None:
        self.items = items
        self.jobs = dict(jobs or {})
        self.out = 1  # output tokens of the last request handed out (for `wants`)

    def urgency(self, unit: Unit) -> tuple[int, float]:
        """(priority, -deadline): greater is more urgent."""
        spec = self.jobs.get(unit[1])
        if spec is None:
            return (0, -math.inf)
        deadline = spec.deadline
        return (spec.priority, -math.inf if deadline is None else -deadline)

    def attach(self, sim: object) -> None:
        super().attach(sim)  # type: ignore[arg-type]
        gpus = len(self.sim.gpus)
        self.homes = place(shape_work(self.items), gpus)
        self.dealt: dict[Shape, int] = {}
        self.queues: list[dict[Unit, deque[ReplayItem]]] = [{} for _ in range(gpus)]
        self.current: list[Unit | None] = [None] * gpus

    def arrive(self, r: ReplayItem, now: float) -> None:
        homes = self.homes.get(r.shape) or [0]
        i = self.dealt.get(r.shape, 0)
        self.dealt[r.shape] = i + 1
        g = homes[i % len(homes)]
        self.queues[g].setdefault((r.shape, r.item.job), deque()).append(r)

    def _next_shape(self, g: int) -> Unit | None:
        own = self.queues[g]
        cur = self.current[g]
        def top(v: int) -> tuple[tuple[int, float], int]:
            qs = self.queues[v]
            return max(((self.urgency(u), len(q)) for u, q in qs.items()),
                       default=((0, -math.inf), 0))

        victim = max(range(len(self.queues)), key=lambda v: (*top(v), -v))
        if own and top(g)[0] >= top(victim)[0]:  # nothing more urgent waits elsewhere
            return max(own, key=lambda u: (self.urgency(u), u == cur,
                                           cur is not None and u[0] == cur[0], len(own[u]), u))
        theirs = self.queues[victim]
        if not theirs:
            return None
        s = max(theirs, key=lambda u: (self.urgency(u), len(theirs[u]), u))
        q = theirs[s]
        if victim != g and self.current[victim] == s and len(q) > 1:
            take = deque(q.popleft() for _ in range(len(q) // 2))  # share a running shape
            own[s] = take
        else:
            own[s] = theirs.pop(s)
        return s

    def feed(self, g: int, now: float) -> None:
        while self.sim.wants(g, self.out):
            s = self._next_shape(g)
            if s is None:
                return
            self.current[g] = s
            q = self.queues[g][s]
            r = q.popleft()
            if not q:
                del self.queues[g][s]
            self.out = r.item.max_tokens
            self.sim.submit(g, r, now)
