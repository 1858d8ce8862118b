"""The fleet's pace: the rate a forecast and a window's verdict go by, measured or known.

Contract: `model_rate(ms, consumers, now)` is a model's measured `ModelRate` (tokens per
second, seconds a consumer takes for a batch budget, settled), None before a batch of the
current span completed. Settled: measured since the span's first completion
(`RateMeter.steady`: the first batches' return left out) over `SETTLED_BATCHES` batch times
and at least `SETTLED_S` (the meter's window once longer); before, it is `RateMeter.rate`'s
(since the first dispatch, over at least a second: mostly the pipeline filling, understated).
`known_rate(ms, consumers, now)` is the rate a forecast may trust: the model's `prior` (the
whole-run pace of its last span, or of the last run a store kept: per consumer, times the
consumers serving it now) until the rate settled, then the settled rate weighed against the
prior as if the prior were `PRIOR_S` seconds of measurement (the first seconds' measurement,
noisy while inputs are read, does not throw a good prior away); None with neither.
`forecast_rate(models, serving, now)` sums the models' rates for the forecast: (rate,
trusted), trusted when every model's rate is known (an unsettled, floored measurement only
shows a finish, it never calls a job late). `pace(ms, consumers, now)` is what a store
keeps of a model for the next run: the current span's whole-run pace per consumer once
settled, else the prior. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fabricctl.core.model_state import ModelState

SETTLED_BATCHES = 4  # a rate is settled once measured over this many batch times
SETTLED_S = 0.5  # and this long
PRIOR_S = 5.0  # a prior weighs as much as this many seconds of settled measurement


@dataclass(frozen=True, slots=True)
class ModelRate:
    """Why: the forecast, the verdict on windows and the switch cost read one measurement."""

    rate: float  # tokens per second, the model's whole fleet
    batch_s: float  # seconds one consumer takes for a batch budget at that rate
    settled: bool  # measured long enough to go by (`SETTLED_BATCHES`, `SETTLED_S`)
    span: float = 0.0  # seconds the settled rate was measured over


def model_rate(ms: ModelState, consumers: int, now: float) -> ModelRate | None:
    """The model's measured rate (see the module contract); None before a completion."""
    meter = ms.meter
    r = meter.rate(now)
    if r is None:
        return None
    consumers = max(1, consumers)
    steady = meter.steady(now)
    if steady is not None:
        rate, span = steady
        if span > meter.window_s:
            rate = meter.rate(now, floor_s=0.0) or rate
        batch_s = ms.budget * consumers / rate
        if span >= max(SETTLED_S, SETTLED_BATCHES * batch_s):
            return ModelRate(rate, batch_s, True, span)
    return ModelRate(r, ms.budget * consumers / r, False)


def known_rate(ms: ModelState, consumers: int, now: float) -> float | None:
    """The prior pace times the consumers serving the model, weighed with the settled rate
    once there is one (see the module contract); None with neither: a rate a job may be
    called late by."""
    m = model_rate(ms, consumers, now)
    prior = None if ms.meter.prior is None else ms.meter.prior * max(1, consumers)
    if m is None or not m.settled:
        return prior
    if prior is None:
        return m.rate
    return (prior * PRIOR_S + m.rate * m.span) / (PRIOR_S + m.span)


def forecast_rate(models: Iterable[ModelState], serving: Callable[[str], int], now: float
                  ) -> tuple[float | None, bool]:
    """(the fleet's rate for the forecast, whether it is trusted): each model's known
    rate, else its unsettled measurement (untrusted); (None, False) with neither."""
    total, trusted, any_rate = 0.0, True, False
    for ms in models:
        n = serving(ms.name)
        r = known_rate(ms, n, now)
        if r is None:
            m = model_rate(ms, n, now)
            if m is None:
                continue
            r, trusted = m.rate, False
        total += r
        any_rate = True
    return (total, trusted) if any_rate else (None, False)


def pace(ms: ModelState, consumers: int, now: float) -> float | None:
    """Tokens per second per consumer to keep for the next run: the current span's
    whole-run pace once its rate settled, else the prior (None: nothing measured)."""
    m = model_rate(ms, consumers, now)
    if m is not None and m.settled:
        run = ms.meter.run_pace()
        if run is not None:
            return run
    return ms.meter.prior
