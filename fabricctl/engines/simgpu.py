"""A deterministic discrete-event simulated GPU with vLLM-style continuous batching. SIMULATED.

Contract: `SimGPU` owns a simulated clock `now` (seconds); nothing reads the wall clock.
Time moves only when the caller steps it: `step()` runs one scheduler step, `advance_to(t)`
runs steps while `now < t` (an idle GPU jumps to t), `drain()` runs until idle; a request
added mid-step waits for the next one. Scheduling follows vLLM V1's fcfs scheduler: running
requests first (decodes one token, partial prefills a chunk), each allocating KV blocks;
when allocation fails the latest running request is preempted (freed, recomputed later,
first in the waiting queue); with nobody preempted, waiting requests are admitted in order
within `max_num_seqs`, the token budget (`max_num_batched_tokens`, chunked prefill) and the
free blocks. The cache is `PrefixCache`, looked up once per request (hits <= L-1); a
request finishes after `max_out` tokens (clipped to `max_model_len`); a pooling request
(`add(..., pooling=True)`) finishes in the step that computes its last prompt token. Step
time is `SimCosts.step_seconds`; a (lane, epoch) key builds a CUDA graph on first use;
decode-only runs that neither allocate nor finish are fast-forwarded with identical results.
With `SimCosts.request_s` > 0 a request reaches the waiting queue `request_s` after the front
end is free (one at a time); `queued` counts both.
Two uses: batch mode (`simbatch.run_work`, `endpoints` limiting what its model serves) and
request mode (`add`, `advance_to`, per-request `finish_time`). A `max_model_len` that does
not fit the KV pool, or a `max_input_len` not below it, is a `UsageError`; a step that can
schedule nothing and preempted nothing is an `EngineError`. vLLM's scheduler as the
simulator follows it: docs/engine-notes.md, sections 1 and 3.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from fabricctl.core.defaults import MAX_INPUT_LEN
from fabricctl.engines.costs import DEFAULT_COSTS, SimCosts
from fabricctl.engines.prefix_cache import PrefixCache
from fabricctl.engines.simendpoints import endpoint_of
from fabricctl.engines.simrequest import LENGTH_EXCEEDED, SimCounters, SimRequest
from fabricctl.errors import EngineError, UsageError


@dataclass(slots=True)
class _StepPlan:
    """Why: what one step's scheduling passes decide, handed to its costing and compute."""

    budget: int  # tokens left of max_num_batched_tokens
    sched: list[tuple[SimRequest, int]] = field(default_factory=list)  # (request, tokens)
    prefill: int = 0  # uncached prompt tokens computed
    cached: int = 0  # prompt tokens admitted from the prefix cache
    decodes: int = 0  # decode sequences
    context: int = 0  # context tokens of the decode sequences
    graphs: int = 0  # graph keys built
    preempted: bool = False


class SimGPU:
    """Why: one simulated GPU whose cache, batching and timing behave like a vLLM server."""

    def __init__(
        self,
        costs: SimCosts = DEFAULT_COSTS,
        *,
        max_input_len: int = MAX_INPUT_LEN,
        max_model_len: int | None = None,
        fast_forward: bool = True,
        endpoints: frozenset[str] | None = None,
    ) -> None:
        self.costs = costs
        # the endpoints its model serves (canonical); None: every one the simulator answers
        self.endpoints = None if endpoints is None else frozenset(map(endpoint_of, endpoints))
        self.block_size = costs.block_size
        self.cache = PrefixCache(costs.num_blocks, costs.block_size)
        self.max_model_len = costs.kv_tokens if max_model_len is None else max_model_len
        if self.max_model_len - 1 > costs.kv_tokens:
            raise UsageError("max_model_len does not fit in the KV pool")
        if max_input_len >= self.max_model_len:
            raise UsageError("max_input_len must be below max_model_len (room for one token)")
        self.max_input_len = max_input_len
        self.fast_forward = fast_forward
        self.now = 0.0
        self.counters = SimCounters()
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.graphs: OrderedDict[Hashable, None] = OrderedDict()
        self._done: list[SimRequest] = []  # finished without running, reported next step
        self._front: deque[tuple[float, SimRequest]] = deque()  # (reaches the scheduler at, r)
        self._front_free = 0.0  # when the front end has finished every request handed to it

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self._done or self._front)

    @property
    def queued(self) -> int:
        """Requests not running yet: waiting, or still in the front end."""
        return len(self.waiting) + len(self._front)

    # -- request mode ------------------------------------------------------------------------
    def add(
        self, rid: str, hashes: Sequence[int], prompt_len: int, max_tokens: int, *,
        key: Hashable | None = None, arrival: float | None = None, tag: object = None,
        pooling: bool = False,
    ) -> SimRequest:  # fmt: skip
        """Queue a request now (its `arrival` may be earlier: it came in mid-step); a pooling
        request computes its prompt and finishes, generating nothing (`max_tokens` unused)."""
        prompt_len = max(1, prompt_len)
        max_out = 0 if pooling else max(1, min(max_tokens, self.max_model_len - prompt_len))
        r = SimRequest(rid, hashes, prompt_len, max_out, key, self.now, tag)
        if arrival is not None:
            r.arrival = arrival
        if prompt_len > self.max_input_len:
            r.finish_reason, r.finish_time = LENGTH_EXCEEDED, self.now
            self.counters.length_exceeded += 1
            self.counters.requests += 1
            self._done.append(r)
        elif self.costs.request_s > 0:
            self._front_free = max(self.now, self._front_free) + self.costs.request_s
            self._front.append((self._front_free, r))
        else:
            self.waiting.append(r)
        return r

    def step(self) -> list[SimRequest]:
        """Run one scheduler step; returns the requests that finished in it."""
        return self._step(math.inf, single=True)

    def advance_to(self, t: float) -> list[SimRequest]:
        """Run steps while now < t; an idle GPU's clock jumps to t. Returns finished requests."""
        finished: list[SimRequest] = []
        while self.now < t and self.busy:
            finished.extend(self._step(t))
        if self.now < t:
            self.now = t
        return finished

    def drain(self) -> list[SimRequest]:
        """Run until nothing is queued or running; returns the finished requests."""
        finished: list[SimRequest] = []
        while self.busy:
            finished.extend(self._step(math.inf))
        return finished

    def finish(self, pending: set[SimRequest]) -> None:
        """Run steps until every request of `pending` has finished (it is emptied)."""
        while pending:
            pending.difference_update(self._step(math.inf))

    def build_graph(self, key: Hashable) -> bool:
        """Capture the graph for `key` now if it is not cached (a pre-warm); True if built."""
        if not self._use_graph(key):
            return False
        dt = self.costs.graph_build_s
        self.now += dt
        self.counters.busy_s += dt
        return True

    # -- the scheduler -----------------------------------------------------------------------
    def _use_graph(self, key: Hashable) -> int:
        graphs = self.graphs
        if key in graphs:
            graphs.move_to_end(key)
            return 0
        graphs[key] = None
        if self.costs.graph_cache_size and len(graphs) > self.costs.graph_cache_size:
            graphs.popitem(last=False)
        self.counters.graph_builds += 1
        return 1

    def _preempt(self, r: SimRequest) -> None:
        self.cache.free(r.seq)
        r.num_computed = 0
        r.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(r)

    def _step(self, until: float, single: bool = False) -> list[SimRequest]:
        """One scheduler step (or a fast-forwarded run of them); returns the finished."""
        finished, self._done = self._done, []
        if not self._take_front(until) or not (self.running or self.waiting):
            return finished
        if self.fast_forward and not single and not self._front:
            k = self._fast_forward_steps()
            if k > 1:
                return finished + self._fast_forward(k, until)
        plan = _StepPlan(self.costs.max_num_batched_tokens)
        self._schedule_running(plan)
        if not plan.preempted:
            self._admit_waiting(plan)
        if not plan.sched:
            if not plan.preempted:
                raise EngineError("simulated scheduler stalled: a request cannot fit")
            return finished
        finished.extend(self._run(plan))
        return finished

    def _take_front(self, until: float) -> bool:
        """Queue what the front end has handed over by now; False if idle past `until`."""
        front = self._front
        if not front:
            return True
        if not self.running and not self.waiting and front[0][0] > self.now:
            if front[0][0] > until:
                self.now = until
                return False
            self.now = front[0][0]
        while front and front[0][0] <= self.now:
            self.waiting.append(front.popleft()[1])
        return True

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Schedule the running requests in order, each a decode token or a prefill chunk."""
        running, bs = self.running, self.block_size
        budget = plan.budget
        prefill = decodes = context = 0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            total = r.prompt_len + r.out
            n = min(total - r.num_computed, budget)
            slots = r.num_computed + n
            seq = r.seq
            if (slots > len(seq.blocks) * bs or slots // bs > seq.num_hashed) and (
                not self._make_room(r, slots, plan)
            ):
                break
            if n == 1 and r.out and slots == total:
                decodes += 1
                context += slots
            else:
                prefill += n
            plan.sched.append((r, n))
            budget -= n
            i += 1
        plan.budget = budget
        plan.prefill += prefill
        plan.decodes += decodes
        plan.context += context

    def _make_room(self, r: SimRequest, slots: int, plan: _StepPlan) -> bool:
        """Give `r` KV blocks for `slots`, preempting from the back; False if `r` went too."""
        seq, running = r.seq, self.running
        while not self.cache.allocate(seq, slots):
            victim = running.pop()
            self._preempt(victim)
            plan.preempted = True
            if victim is r:
                break
        return bool(seq.blocks)

    def _admit_waiting(self, plan: _StepPlan) -> None:
        """Admit waiting requests in order while seats, token budget and blocks allow."""
        running, waiting, cache, bs = self.running, self.waiting, self.cache, self.block_size
        max_num_seqs = self.costs.max_num_seqs
        budget = plan.budget
        prefill = cached = graphs = 0
        while waiting and budget > 0 and len(running) < max_num_seqs:
            r = waiting[0]
            num_tokens = r.prompt_len + r.out
            hit = cache.match(r.seq, num_tokens)
            computed = len(hit) * bs
            n = min(num_tokens - computed, budget)
            if not cache.allocate(r.seq, computed + n, hit):
                break
            waiting.popleft()
            if not r.admitted:
                self._first_admission(r, num_tokens, computed)
            r.num_computed = computed
            cached += computed
            prefill += n
            if r.key is not None:
                graphs += self._use_graph(r.key)
            running.append(r)
            plan.sched.append((r, n))
            budget -= n
        plan.budget = budget
        plan.prefill += prefill
        plan.cached += cached
        plan.graphs += graphs

    def _first_admission(self, r: SimRequest, num_tokens: int, computed: int) -> None:
        """Count a request's prefix-cache lookup, once: on its first admission only."""
        r.admitted = True
        r.cached_tokens = computed
        self.cache.record(num_tokens, computed)
        self.counters.prefix_cache_queries += num_tokens
        self.counters.prefix_cache_hits += computed

    def _run(self, plan: _StepPlan) -> list[SimRequest]:
        """Charge the step's time, write its tokens' KV and emit tokens; returns the finished."""
        c = self.counters
        dt = self.costs.step_seconds(plan.prefill, plan.cached, plan.decodes, plan.context,
                                     plan.graphs)
        self.now += dt
        c.busy_s += dt
        c.steps += 1
        now = self.now
        finished: list[SimRequest] = []
        for r, n in plan.sched:
            r.num_computed += n
            if r.num_computed == r.prompt_len + r.out:
                if r.out == 0:
                    r.first_token_time = now
                    c.prompt_tokens += r.prompt_len
                    if not r.max_out:  # pooling: the prefill was the whole request
                        self._finish(r, now, "stop")
                        finished.append(r)
                        continue
                r.out += 1
                c.generation_tokens += 1
                if r.out >= r.max_out:
                    self._finish(r, now)
                    finished.append(r)
        if finished:
            self.running = [r for r in self.running if r.finish_time is None]
        return finished

    def _finish(self, r: SimRequest, now: float, reason: str = "length") -> None:
        r.finish_time, r.finish_reason = now, reason
        self.cache.free(r.seq)
        r.seq.hashes = []  # a long replay keeps its requests: drop what only the cache needed
        self.counters.requests += 1

    def _fast_forward_steps(self) -> int:
        """Decode-only steps that can run with no allocation, admission, or finish but the last."""
        running, costs = self.running, self.costs
        budget_left = costs.max_num_batched_tokens - len(running)
        if not running or budget_left < 0:
            return 0
        bs = self.block_size
        k = 1 << 62
        for r in running:
            out = r.out
            computed = r.num_computed
            if not out or computed != r.prompt_len + out - 1:
                return 0
            room = len(r.seq.blocks) * bs - computed  # steps before it needs a new block
            if room < k:
                k = room
            left = r.max_out - out  # steps before it finishes
            if left < k:
                k = left
        if k > 1 and self.waiting and len(running) < costs.max_num_seqs and budget_left > 0:
            # admission stays impossible while no block is freed (none is, until a finish)
            head, cache = self.waiting[0], self.cache
            num_tokens = head.prompt_len + head.out
            hit = cache.match(head.seq, num_tokens)
            computed = len(hit) * bs
            chunk = min(num_tokens - computed, budget_left)
            if cache.can_allocate(head.seq, computed + chunk, hit):
                return 0
        return k

    def _fast_forward(self, k: int, until: float) -> list[SimRequest]:
        running, costs, c = self.running, self.costs, self.counters
        n = len(running)
        base = sum(r.num_computed for r in running)
        j = 0
        while j < k:
            j += 1
            dt = costs.step_seconds(0, 0, n, base + n * j, 0)
            self.now += dt
            c.busy_s += dt
            if self.now >= until:
                break
        c.steps += j
        c.generation_tokens += n * j
        now, finished = self.now, []
        for r in running:
            r.num_computed += j
            r.out += j
            if r.num_computed // self.block_size > r.seq.num_hashed:
                self.cache.allocate(r.seq, r.num_computed)  # registers newly full blocks
        for r in running:
            if r.out >= r.max_out:
                self._finish(r, now)
                finished.append(r)
        if finished:
            self.running = [r for r in running if r.finish_time is None]
        return finished

