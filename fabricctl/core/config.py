"""Every threshold of the broker core in one frozen object, each default with its reason.

Contract: `CoreConfig` holds every core knob (`[broker]` keys in the config file);
`SHAPE_SCOPES` and `PREWARM_MODES` are the values `shape_scope` and `prewarm` accept; and
`prewarm_enabled(mode, simulated)` is the one place the pre-warm mode becomes a yes or no
for a consumer: "on" and "off" mean what they say, "auto" (the default) pre-warms simulated
engines (their pre-warm also builds the CUDA graphs they model) and not real ones (measured on
vLLM with bench/vllm_bench.py: a pre-warm there is one more prefill of a prefix the shape's
first batch computes again when it is sent before the pre-warm finished, or after its blocks
were evicted, and buys nothing vLLM's prefix cache does not already give the first batch).
"""

from __future__ import annotations

from dataclasses import dataclass

SHAPE_SCOPES = ("consumer", "model")
PREWARM_MODES = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Why: one place for every constant, so tests and the app config override them alike."""

    lanes_max: int = 2048
    threshold_min: float = 0.01  # waste-fraction threshold with no lanes in use
    threshold_span: float = 0.09  # added linearly as lanes in use approach lanes_max
    waste_floor: int = 16  # a new lane needs at least this much waste (with the threshold)
    waste_cap: int = 128  # above this waste a new lane opens regardless
    quiesce_items: int = 4  # a lane with fewer items ...
    quiesce_s: float = 5.0  # ... and no assignment for this long is quiescing
    starve_s: float = 30.0  # a lane whose oldest item waited longer is starving
    tick_s: float = 1.0  # the maintenance tick
    pad_multiple: int = 8
    activate_multiple: float = 2.0  # staged -> active at this many batch budgets
    prewarm_multiple: float = 4.0  # pick a warming shape below this many budgets pending
    drain_multiple: float = 1.0  # active -> draining below this many budgets pending
    stage_timeout_s: float = 2.0  # a staged shape this old may activate regardless of size
    activate_when_idle: bool = True  # a staged shape may activate when consumers sit idle
    lifecycle: bool = True  # off: every shape dispatches at once (an ablation)
    # "consumer" (the default of up, run and replay alike): each consumer has its own current
    # shape (each GPU still shape-pure), so a small shape costs one prefill on one GPU instead
    # of one on every GPU of the model; "model": one current shape per model, every consumer
    # drains it (the seed's rule, kept as an ablation)
    shape_scope: str = "consumer"
    prewarm: str = "auto"  # "auto" | "on" | "off": push pre-warms (`prewarm_enabled`)
    join_multiple: float = 4.0  # "consumer": join another's shape with this many budgets queued
    thrash_batches: int = 100  # a shape finishing with fewer batches while items of its
    # prefix were staged again is thrashing (`stats.thrash_reason`)
    # The clock and the job (ARCHITECTURE.md, "The shape choice"). A switch costs about one
    # batch (the new shape's first batch computes its prefix; the sim also builds graphs), so:
    amortise_batches: int = 8  # a consumer's run has paid for its switch after this many
    # batches (<= 1/8 of the run); only then may it leave a shape that still has work
    wait_bound_s: float = 0.0  # no shape's oldest item waits longer while a GPU serves an
    # amortised shape; 0: bound_batches x the model's measured batch time (auto)
    bound_batches: float = 64.0  # auto bound: rotating every 64 batch times costs <= 1/64
    bound_min_s: float = 2.0  # the auto bound is never shorter (nor before a rate is measured:
    bound_cold_s: float = 30.0  # this one, until the model has completed a batch)
    fair_share: bool = True  # jobs of equal priority share the fleet (off: biggest first)
    aging_s: float = 600.0  # a shape of any priority waiting this long goes first: no job
    # waits forever behind a stream of higher-priority work
    short_ratio: float = 4.0  # fair share: a job with this many times less queued than the
    # job a consumer serves may take it too (shortest first), however many GPUs it holds
    sweep: bool = True  # loose shapes (sealed, unheld, half a batch at most: `core.sweep`)
    # share their job's swept shape instead of each taking a GPU for one batch (off: ablation)
    rate_window_s: float = 30.0  # the completed-token rate is measured over this window
    default_batch_tokens: int = 8192  # B for a model no consumer has registered yet
    events_kept: int = 10_000  # recent events kept for observers


def prewarm_enabled(mode: str, simulated: bool) -> bool:
    """Whether a consumer whose engine is `simulated` (or real) gets pre-warm pushes."""
    if mode not in PREWARM_MODES:
        raise ValueError(f"prewarm must be one of {', '.join(PREWARM_MODES)}, not {mode!r}")
    return mode == "on" or (mode == "auto" and simulated)
