"""The replay loop: simulated GPUs, one policy, events in simulated-time order.

Contract: `Simulation(items, policy, gpus, costs).run()` feeds every item to `policy` at its
arrival time and steps the simulated GPUs (vLLM-style continuous batching from
`fabricctl.engines.simgpu`) in global time order, calling the policy back when GPUs finish
requests or may take more work, and ticking it every `tick_s`. Nothing reads the wall clock.
It returns a `PolicyResult` with the figures every policy is compared on. Every policy meets
the same GPUs (fresh ones per run), the same costs and the same arrivals; a GPU that is
handed a request at `now` first catches its clock up to `now`. `handed[g]` records what GPU
g was handed (workload requests and pre-warms) in order, `finished` the workload's requests.
No event left while items are unfinished is a broken invariant (`AssertionError`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from fabricctl.core.defaults import MAX_INPUT_LEN
from fabricctl.engines.costs import SimCosts
from fabricctl.engines.simgpu import SimGPU
from fabricctl.engines.simrequest import SimRequest
from fabricctl.replay.fleet import Handed
from fabricctl.replay.policies import Policy
from fabricctl.replay.report import PolicyResult, summarise
from fabricctl.replay.workload import ReplayItem


class Simulation:
    """Why: every policy must meet the same GPUs, costs and arrivals to be compared fairly."""

    def __init__(self, items: list[ReplayItem], policy: Policy, gpus: int, costs: SimCosts,
                 max_input_len: int = MAX_INPUT_LEN, tick_s: float = 1.0) -> None:
        self.items = sorted(items, key=lambda r: r.arrival)
        self.policy = policy
        self.costs = costs
        self.gpus = [SimGPU(costs, max_input_len=max_input_len) for _ in range(gpus)]
        self.tick_s = tick_s
        # per GPU, every request in the order it was handed over (FCFS: the order of first
        # admission), pre-warms included (flag True): what the report reads
        self.handed: list[list[Handed]] = [[] for _ in range(gpus)]
        self.finished: list[tuple[int, ReplayItem, SimRequest]] = []
        self.prewarms = 0
        self.now = 0.0
        self._finished_early: list[tuple[int, SimRequest]] = []  # from catching a GPU up

    # -- what policies call ----------
    def submit(self, g: int, r: ReplayItem, now: float, max_tokens: int | None = None,
               key: Hashable | None = None, tag: object = None) -> None:
        gpu = self._catch_up(g, now)
        req = gpu.add(r.item.id, r.hashes, r.tokens, max_tokens or r.item.max_tokens, key=key,
                      arrival=r.arrival, tag=(r, tag))
        self.handed[g].append(Handed(r, req, False, now))

    def wants(self, g: int, out: int = 1) -> bool:
        """Whether GPU g's consumer should hand it more: fewer requests wait than one step
        admits in steady state (max_num_seqs / `out`, the output tokens, i.e. steps, of a
        request), at least one."""
        gpu = self.gpus[g]
        return gpu.queued < max(1, -(-self.costs.max_num_seqs // max(1, out)))

    def prewarm(self, g: int, r: ReplayItem, now: float) -> None:
        """Run a shape's prefix (from one of its items) as one request of max_tokens 1."""
        blocks = r.prefix // self.costs.block_size
        if blocks == 0:
            return
        gpu = self._catch_up(g, now)
        req = gpu.add(f"prewarm-{self.prewarms}", r.hashes[:blocks],
                      blocks * self.costs.block_size, 1, tag=None)
        self.handed[g].append(Handed(r, req, True, now))
        self.prewarms += 1

    def _catch_up(self, g: int, now: float) -> SimGPU:
        """Bring GPU g's clock to `now` before it takes a request (keeping what finished)."""
        gpu = self.gpus[g]
        if gpu.now < now:
            self._finished_early.extend((g, req) for req in gpu.advance_to(now))
        return gpu

    # -- the loop ----------
    def run(self) -> PolicyResult:
        policy, gpus, items = self.policy, self.gpus, self.items
        policy.attach(self)
        ai, n = 0, len(items)
        next_tick = self.tick_s
        done = 0
        while done < n:
            t_arr = items[ai].arrival if ai < n else math.inf
            busy = [i for i, g in enumerate(gpus) if g.busy]
            gi = min(busy, key=lambda i: gpus[i].now) if busy else -1
            t_gpu = gpus[gi].now if gi >= 0 else math.inf
            t = min(t_arr, t_gpu, next_tick)
            if t == math.inf:
                raise AssertionError(f"replay stalled with {n - done} items unfinished")
            self.now = t
            if t == t_arr:
                while ai < n and items[ai].arrival <= t:
                    policy.arrive(items[ai], t)
                    ai += 1
                self._feed_idle(t)
            elif t == next_tick and (t < t_gpu or not busy):
                policy.tick(t)
                next_tick += self.tick_s
                self._feed_idle(t)
            else:
                self._finished_early.extend((gi, req) for req in gpus[gi].step())
                policy.feed(gi, gpus[gi].now)  # a consumer keeps its engine's queue filled
            while self._finished_early:
                batch, self._finished_early = self._finished_early, []
                for g, req in batch:
                    r, tag = req.tag if isinstance(req.tag, tuple) else (None, None)
                    if r is None:
                        continue  # a pre-warm request
                    self.finished.append((g, r, req))
                    done += 1
                    assert req.finish_time is not None  # it finished in this step
                    policy.finished(g, r, tag, req.finish_time)
                for g in {g for g, _ in batch}:
                    policy.feed(g, gpus[g].now)
                self._feed_idle(self.now)
            if ai >= n and not any(g.busy for g in gpus) and done < n:
                next_tick = max(next_tick, self.now)  # only ticks can move the lifecycle on
        return summarise(self)

    def _feed_idle(self, now: float) -> None:
        for i, g in enumerate(self.gpus):
            if not g.busy:
                self.policy.feed(i, max(now, g.now))
