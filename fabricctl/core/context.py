"""What a model's shape choice sees: the wait bound, the drain horizon and the jobs held.

Contract (pure functions of the settings, the model's state and the clock):
- `bound(cfg, ms, now)`: seconds a shape may wait while a GPU serves an amortised shape: the
  setting `wait_bound_s`, else `bound_batches` batch times at the model's measured rate
  (rotating that rarely costs at most 1/`bound_batches` in switches; at least
  `bound_min_s`), `bound_cold_s` before any batch completed. With the derived bound a shape
  is also never overdue before arrival order would have served it (`Shape.fifo_by`, set
  from the drain horizon when it began to wait): under a finite backlog the choice reaches
  every shape by then anyway, so the bound forces no switch that costs the cache for
  nothing.
- `horizon(ms, now, queued_tokens)`: seconds the model needs to finish `queued_tokens`
  (queued and in flight) at its measured rate (inf before a rate is known): a deadline
  sooner than this is due.
- `held_jobs(cfg, ms, live)`: job -> live holders whose current shape holds its queued items.
- `choice_context(...)`: all of them, with the activation threshold, as the `Context` the
  `Chooser` takes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container

from fabricctl.core.choice import Context
from fabricctl.core.config import CoreConfig
from fabricctl.core.model_state import ModelState


def bound(cfg: CoreConfig, ms: ModelState, now: float) -> float:
    if cfg.wait_bound_s > 0:
        return cfg.wait_bound_s
    consumers = max(1, len(ms.slots)) if cfg.shape_scope == "consumer" else 1
    batch_s = ms.meter.batch_s(now, ms.budget, consumers)
    if batch_s is None:
        return cfg.bound_cold_s
    return max(cfg.bound_min_s, cfg.bound_batches * batch_s)


def horizon(ms: ModelState, now: float, queued_tokens: int) -> float:
    rate = ms.meter.rate(now)
    if rate is None:
        return float("inf")
    return queued_tokens / rate


def held_jobs(cfg: CoreConfig, ms: ModelState, live: Container[str] | None = None
              ) -> Counter[int]:
    held: Counter[int] = Counter()
    currents = ([ms.current] if cfg.shape_scope != "consumer" else
                [s.current for c, s in ms.slots.items() if live is None or c in live])
    for cur in currents:
        if cur is not None:
            held.update(cur.jobs.keys())
    return held


def choice_context(cfg: CoreConfig, ms: ModelState, now: float, hungry: bool,
                   queued_tokens: int, live: Container[str] | None = None) -> Context:
    return Context(now, hungry, bound(cfg, ms, now), horizon(ms, now, queued_tokens),
                   held_jobs(cfg, ms, live), cfg.activate_multiple * ms.budget)
