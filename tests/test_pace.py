"""The fleet's pace before it has measured itself (issue 41): a span of the rate meter
ends when the fleet idles, its whole-run pace becomes the prior, the store keeps it for the
next run, and a forecast at a known pace calls a job late from its first second while one
at the first seconds' floored measurement never does."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import SyncStore

from fabricctl.core.config import CoreConfig
from fabricctl.core.forecast import job_views
from fabricctl.core.pace import forecast_rate, known_rate, pace
from fabricctl.core.rate import IDLE_S, RateMeter
from fabricctl.core.terms import JobTerms
from fabricctl.core.types import Contract, Item, ItemResult
from fabricctl.store.durable import StoreConfig

MODEL = "m"
CONTRACT = Contract(MODEL, 16, 4096, 4096)


def test_an_idle_gap_ends_the_span_and_its_pace_becomes_the_prior() -> None:
    m = RateMeter()
    m.begin(0.0, consumers=2)
    m.add(1.0, 1000)
    m.add(2.0, 1000)
    assert m.run_pace() == pytest.approx(2000 / 2.0 / 2)  # per consumer
    m.begin(2.0 + IDLE_S / 2, idle=True, consumers=2)  # a short gap: the span goes on
    assert m.start == 0.0 and m.prior is None
    m.begin(2.0 + 2 * IDLE_S, idle=False, consumers=2)  # busy (work in flight): goes on
    assert m.start == 0.0
    m.begin(3.0, idle=True, consumers=2)  # idle: a new span, the last one's pace kept
    assert m.start == 3.0 and m.prior == pytest.approx(500.0)
    assert m.rate(3.0) is None and m.run_pace() is None  # idle time is not a rate


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 2.0), st.integers(1, 5000)), min_size=1,
                max_size=40), st.integers(1, 8))
def test_a_spans_pace_is_its_tokens_over_its_run_per_consumer(
        steps: list[tuple[float, int]], consumers: int) -> None:
    m = RateMeter()
    m.begin(0.0, consumers=consumers)
    t = 0.0
    for dt, tokens in steps:
        t += dt
        m.add(t, tokens)
    assert m.run_pace() == pytest.approx(sum(n for _, n in steps) / t / consumers)


def _items(n: int, prefix: str = "i", job: int = 0) -> list[Item]:
    return [Item(f"{prefix}{k}", MODEL, 0xC0FFEE, 100, 8, f"p{k}".encode(), job=job)
            for k in range(n)]


def test_the_store_keeps_the_pace_for_the_next_run(tmp_path: Path) -> None:
    s = SyncStore(tmp_path / "d", 0.0, CoreConfig(lifecycle=False),
                      StoreConfig(segment_entries=64))
    s.register("gpu", CONTRACT, 0.0)
    s.ingest(_items(320), 0.0)
    t = 0.0
    while (w := s.pull("gpu", t)) is not None:  # 1,600 tokens every 0.1 s: 16,000/s
        t += 0.1
        s.complete(w.id, [ItemResult(it.id, text="r", tokens_out=1) for it in w.items], t)
    kept = pace(s.view.models[MODEL], 1, t)
    assert kept == pytest.approx(16_000, rel=0.05)
    s.close()

    s = SyncStore(tmp_path / "d", 100.0, CoreConfig(lifecycle=False),
                      StoreConfig(segment_entries=64))
    s.register("gpu", CONTRACT, 100.0)
    s.register("gpu2", CONTRACT, 100.0)
    ms = s.view.models[MODEL]
    assert ms.meter.prior == pytest.approx(kept, rel=0.03)
    # before a batch of this run completed: the kept pace, per consumer, times two GPUs
    assert known_rate(ms, 2, 100.0) == pytest.approx(2 * kept, rel=0.03)
    job = s.open_job("submit", 100.0, name="in.jsonl", size=64_000, window_s=1.0)
    items = _items(640, "j")  # 64,000 tokens at 32,000/s: 2 s
    s.submit(items[:160], 100.0, job=job.number)  # 0.5 s of it in
    (view,) = s.view.job_views(100.0)  # its file is still read: no finish for a part of it
    assert view.predicted_finish is None and not view.at_risk
    s.submit(items[160:], 100.0, job=job.number)
    s.seal_job(job.number, 640, 100.0)
    (view,) = s.view.job_views(100.0)  # whole: 2 s, past its 1 s window, at once
    assert view.predicted_finish == pytest.approx(102.0, abs=0.1) and view.at_risk
    s.close()


def test_a_floored_first_measurement_shows_a_finish_and_calls_no_job_late() -> None:
    from fabricctl.core.broker import Broker
    b = Broker(CoreConfig(lifecycle=False))
    b.register("gpu", CONTRACT, 0.0)
    b.set_job_terms(1, JobTerms(deadline=1.0, sealed=True))
    b.ingest(_items(200, job=1), 0.0)
    w = b.pull("gpu", 0.0)
    assert w is not None
    b.complete(w.id, 0.05)  # one batch: 1,600 tokens, floored over a second
    rate, trusted = forecast_rate(b.models.values(), b.serving, 0.05)
    assert rate is not None and not trusted
    (view,) = b.job_views(0.05)
    assert view.predicted_finish is not None and view.predicted_finish > 1.0
    assert not view.at_risk
    # the same with the last run's pace known: trusted, and late
    b.restore_paces({MODEL: 1_000.0})
    (view,) = b.job_views(0.05)
    assert view.at_risk and forecast_rate(b.models.values(), b.serving, 0.05)[1]


def test_a_job_whose_file_is_still_read_has_no_finish_yet() -> None:
    from fabricctl.core.lanes import LaneCounters
    from fabricctl.core.shape import Shape
    shape = Shape(MODEL, 1, "", CoreConfig(), LaneCounters(), 0.0)
    shape.items, shape.tokens, shape.jobs = 10, 1000, {1: 10}
    reading = {1: JobTerms(deadline=5.0, reading=True)}
    (v,) = job_views([shape], {}, 1, reading, 100.0, 0.0)
    assert v.predicted_finish is None and not v.at_risk
    (v,) = job_views([shape], {}, 1, {1: JobTerms(deadline=5.0, sealed=True)}, 100.0, 0.0)
    assert v.predicted_finish == pytest.approx(10.0) and v.at_risk


def test_a_settled_rate_is_weighed_against_the_prior_by_its_seconds() -> None:
    from fabricctl.core.model_state import ModelState
    from fabricctl.core.pace import PRIOR_S, model_rate
    ms = ModelState(MODEL, 1000)
    ms.meter.prior = 10_000.0  # per consumer: 20,000 tokens/s on two
    assert known_rate(ms, 2, 0.0) == pytest.approx(20_000)
    ms.meter.begin(0.0, consumers=2)
    t = 0.0
    while t < 10.0:  # 10,000 tokens/s measured, half the prior
        t = round(t + 0.1, 6)
        ms.meter.add(t, 1000)
    m = model_rate(ms, 2, t)
    assert m is not None and m.settled and m.rate == pytest.approx(10_000, rel=0.02)
    weighed = (20_000 * PRIOR_S + m.rate * m.span) / (PRIOR_S + m.span)
    assert known_rate(ms, 2, t) == pytest.approx(weighed)
    assert m.rate < weighed < 20_000
    ms.meter.prior = None  # no prior: the settled rate alone
    assert known_rate(ms, 2, t) == pytest.approx(m.rate)


def test_a_window_out_of_reach_is_not_counted_ahead_of_another_before_it_is_judged() -> None:
    from fabricctl.core.broker import Broker
    b = Broker(CoreConfig(lifecycle=False))
    b.register("gpu", CONTRACT, 0.0)
    b.restore_paces({MODEL: 10_000.0})  # the last run's pace: a 4,096-token batch in 0.41 s
    b.set_job_terms(1, JobTerms(deadline=0.5, sealed=True))  # 1 s of work in 0.5 s: no
    b.set_job_terms(2, JobTerms(deadline=2.0, sealed=True))  # 1 s of work in 2 s (2 s behind 1)
    b.ingest([Item(f"d{k}", MODEL, 1, 100, 8, b"p", job=1) for k in range(100)], 0.0)
    b.ingest([Item(f"a{k}", MODEL, 2, 100, 8, b"p", job=2) for k in range(100)], 0.0)
    # no tick and no completion yet: the forecast already serves the feasible window first
    views = {v.job: v for v in b.job_views(0.1)}
    assert views[1].at_risk and not views[2].at_risk, views
    assert views[2].predicted_finish == pytest.approx(1.1)
    assert not b.lifecycle.chooser.hopeless  # a read: the shape choice is judged at its tick
    b.tick(0.1)
    assert b.lifecycle.chooser.hopeless == {1}
