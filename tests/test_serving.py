"""Routing by name (core only, an explicit clock): a consumer whose server answers several
names (its base model and LoRA adapters) gets the items of each, one name at a time; a name
it does not serve never reaches it; moving between names is a shape switch that the shape
choice decides as it decides switches within a name."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import msgspec
from core_helpers import each_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricctl.core.broker import Broker
from fabricctl.core.config import CoreConfig
from fabricctl.core.events import EventKind
from fabricctl.core.serving import serves
from fabricctl.core.terms import JobTerms
from fabricctl.core.types import Contract, Item

_ids = itertools.count(1)
BUDGET = 1000  # a batch: 10 items of 100 tokens
LORA = Contract("base", 10, BUDGET, 4096, ("ad-a", "ad-b"))


def items(model: str, sig: int, n: int, job: int = 0) -> list[Item]:
    return [Item(f"i{next(_ids)}", model, sig, 100, 16, job=job) for _ in range(n)]


def broker(**cfg: object) -> Broker:
    return Broker(dataclasses.replace(CoreConfig(), **cfg))  # type: ignore[arg-type]


def drain(b: Broker, t0: float, t1: float, dt: float = 0.01) -> list[tuple[str, str, int]]:
    """Every consumer pulls and completes at once each `dt`: (consumer, model, signature)
    of each batch, in order."""
    return [(c, batch.model, batch.signature) for _, c, batch in each_batch(b, t0, t1, dt)]


def test_contract_served_lists_the_model_first() -> None:
    assert LORA.served() == ("base", "ad-a", "ad-b")
    assert Contract("m", 1, 1, 1).served() == ("m",)


def test_one_consumer_serves_its_model_and_its_adapters() -> None:
    b = broker()
    b.register("c0", LORA, now=0.0)
    for model, sig in (("base", 1), ("ad-a", 1), ("ad-b", 2)):
        b.ingest(items(model, sig, 30), 0.0)
    order = drain(b, 0.0, 1.0)
    assert Counter(m for _, m, _ in order) == {"base": 4, "ad-a": 4, "ad-b": 4}  # 9 a batch
    runs = [m for m, _ in itertools.groupby(m for _, m, _ in order)]
    assert sorted(runs) == ["ad-a", "ad-b", "base"]  # one run per name: no ping-pong
    assert b.consumers["c0"].name_switches == 2


def test_a_name_the_consumer_does_not_serve_never_reaches_it() -> None:
    b = broker()
    b.register("plain", Contract("base", 10, BUDGET, 4096), now=0.0)
    b.ingest(items("ad-a", 1, 20), 0.0)
    b.ingest(items("base", 1, 20), 0.0)
    order = drain(b, 0.0, 0.5)
    assert {m for _, m, _ in order} == {"base"}
    b.register("lora", LORA, now=0.5)
    order = drain(b, 0.5, 1.0)
    assert {(c, m) for c, m, _ in order} == {("lora", "ad-a")}


def test_the_same_prefix_under_two_names_is_two_shapes() -> None:
    b = broker()
    b.register("c0", LORA, now=0.0)
    b.ingest(items("base", 7, 10), 0.0)
    b.ingest(items("ad-a", 7, 10), 0.0)
    keys = {(s.model, s.signature) for s in b.shapes()}
    assert keys == {("base", 7), ("ad-a", 7)}


def test_a_new_job_on_an_adapter_cuts_in_at_the_next_batch_boundary() -> None:
    """A big base job runs; a small adapter job arrives: the consumer moves to the adapter
    at its next batch boundary (the new-jobs rule across names), then comes back."""
    b = broker()
    b.register("c0", LORA, now=0.0)
    for sig in range(1, 4):
        b.ingest(items("base", sig, 100, job=1), 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    before = drain(b, 0.0, 0.05)
    assert {m for _, m, _ in before} == {"base"}
    b.ingest(items("ad-a", 9, 20, job=2), 0.05)
    b.set_job_terms(2, JobTerms(sealed=True))
    after = drain(b, 0.05, 1.0)
    assert [m for _, m, _ in after[:3]] == ["ad-a"] * 3  # at once, its 3 batches in a row
    assert {m for _, m, _ in after[3:]} == {"base"}
    moves = [e.reason for e in b.events.since(0, limit=1000) if e.kind is EventKind.SWITCH]
    assert any("ad-a: new job" in r for r in moves), moves


def test_an_adapter_waiting_past_the_bound_takes_the_consumer() -> None:
    """A stream keeps the base model's shape full; an adapter's items, queued later by the
    same job, wait at most the bound once the base run has amortised its switch."""
    b = broker(wait_bound_s=0.2)
    b.register("c0", LORA, now=0.0)
    b.ingest(items("base", 1, 50, job=1), 0.0)
    b.ingest(items("ad-b", 2, 10, job=1), 0.01)
    t, served_at = 0.0, None
    while t < 2.0 and served_at is None:
        batch = b.pull("c0", t)
        if batch is not None:
            b.complete(batch.id, t)
            if batch.model == "ad-b":
                served_at = t
        b.ingest(items("base", 1, 10, job=1), t)  # the stream: a batch's worth every tick
        t = round(t + 0.01, 6)
    assert served_at is not None and served_at <= 0.01 + 0.2 + 0.1


def test_the_budget_and_prewarm_targets_count_every_name_served() -> None:
    b = broker()
    b.register("c0", msgspec.structs.replace(LORA, max_batch_tokens=3000), now=0.0)
    assert b.model("ad-b").budget == 3000
    assert serves(b.consumers["c0"], "ad-a") and not serves(b.consumers["c0"], "other")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["base", "ad-a", "ad-b", "other"]),
                          st.integers(1, 4), st.integers(1, 40), st.integers(0, 3),
                          st.integers(0, 30)), min_size=1, max_size=12),
       st.booleans())
def test_every_item_goes_once_to_a_consumer_that_serves_its_name(
        loads: list[tuple[str, int, int, int, int]], plain_too: bool) -> None:
    """Loads (name, shape, items, job, arrival tick) arrive while the consumers pull: each
    item is handed out once, to a consumer that serves its name, in a batch of its name
    alone; every one is served (jobs are sealed once their last load is in, so new jobs cut
    in, amortised runs give way and warming shapes are left behind as they do)."""
    b = broker()
    b.register("lora", LORA, now=0.0)
    if plain_too:
        b.register("plain", Contract("base", 10, BUDGET, 4096), now=0.0)
    sent: Counter[str] = Counter()
    got: Counter[str] = Counter()
    ids: Counter[str] = Counter()
    last_tick = {job: max(k for _, _, _, j, k in loads if j == job) for *_, job, _ in loads}
    tick = 0
    while tick < 2000:
        t = tick / 100
        for model, sig, n, job, at in loads:
            if at == tick:
                b.ingest(items(model, sig, n, job=job), t)
                sent[model] += n
        for job, at in last_tick.items():
            if at == tick and job:
                b.set_job_terms(job, JobTerms(sealed=True))
        progressed = False
        for c in list(b.consumers):
            batch = b.pull(c, t)
            if batch is not None:
                assert serves(b.consumers[c], batch.model)
                assert {e.item.model for e in batch.entries if e.item} <= {batch.model}
                got[batch.model] += len(batch.entries)
                ids.update(e.item.id for e in batch.entries if e.item)
                b.complete(batch.id, t)
                progressed = True
        tick += 1
        if (tick > max(at for *_, at in loads) and not progressed
                and all(got[m] == sent[m] for m in sent if m != "other")):
            break
    assert {m: n for m, n in got.items()} == {m: n for m, n in sent.items() if m != "other"}
    assert not [i for i, n in ids.items() if n > 1]


async def test_the_sim_keeps_an_adapters_blocks_apart_from_the_base_models() -> None:
    """As vLLM hashes an adapter's blocks with its name: the same prefix under the base
    model and under an adapter is computed twice, under the same name once."""
    from fabricctl.core.payload import Payload, encode_payload
    from fabricctl.core.types import Work
    from fabricctl.engines.sim import SimEngine

    engine = SimEngine(names=("ad-a",), time_scale=0)

    def work(model: str, n: int) -> Work:
        its = [Item(f"{model}{k}", model, 1, 80, 1,
                    payload=encode_payload(Payload(["S" * 64], f"q{k}", [64], 16)))
               for k in range(n)]
        return Work(next(_ids), model, 1, 0, 1, 80, 1, 4096, its)

    await engine.run(work("base", 1))
    hits0 = engine.stats().prefix_cache_hits
    await engine.run(work("ad-a", 1))
    assert engine.stats().prefix_cache_hits == hits0  # a new name: its prefix is cold
    await engine.run(work("ad-a", 1))
    assert engine.stats().prefix_cache_hits > hits0  # warm for the same name


def test_status_names_what_each_server_answers() -> None:
    from fabricctl.cli.status import served_names

    assert served_names({"model": "tiny"}) == "tiny"
    assert served_names({"model": "tiny", "names": ["ad-a", "ad-b"], "serving": "ad-a"}) == (
        "tiny +ad-a +ad-b (now ad-a)")


def test_metrics_give_each_consumer_its_names_and_the_one_it_serves() -> None:
    from prometheus_client import generate_latest

    from fabricctl.server.metrics import Metrics

    b = broker()
    b.register("c0", LORA, now=0.0)
    b.ingest(items("ad-b", 1, 10), 0.0)
    drain(b, 0.0, 0.05)
    text = generate_latest(Metrics(b).registry).decode()
    assert 'fabricctl_consumer_names{consumer="c0",model="base",name="ad-b"} 1.0' in text
    assert 'fabricctl_consumer_names{consumer="c0",model="base",name="base"} 0.0' in text
    assert 'fabricctl_consumer_name_switches_total{consumer="c0",model="base"} 1.0' in text


def test_a_shape_warming_for_a_consumer_that_moves_to_another_name_waits_staged() -> None:
    """The consumer leaves the base model for a new adapter job while its next base shape
    warms for it: that shape goes back to staged, in the base model's waiting index, and is
    served later; nothing waits on a promise to a consumer that is elsewhere."""
    from fabricctl.core.shape import ShapeState

    b = broker()
    b.register("c0", LORA, now=0.0)
    b.ingest(items("base", 1, 30, job=1), 0.0)
    b.ingest(items("base", 2, 60, job=1), 0.0)
    b.set_job_terms(1, JobTerms(sealed=True))
    t = 0.0
    while (slot := b.model("base").slots.get("c0")) is None or slot.warming is None:
        batch = b.pull("c0", t)  # until its next shape warms
        assert batch is not None and t < 1.0, "no shape ever warmed"
        b.complete(batch.id, t)
        t = round(t + 0.01, 6)
    warm = b.model("base").slots["c0"].warming
    assert warm is not None and warm.state is ShapeState.WARMING
    b.ingest(items("ad-a", 9, 20, job=2), t)
    b.set_job_terms(2, JobTerms(sealed=True))
    batch = b.pull("c0", t)
    assert batch is not None and batch.model == "ad-a"  # the new job cut in
    b.complete(batch.id, t)
    assert b.model("base").slots["c0"].warming is None
    assert warm.state is ShapeState.STAGED and warm.held == 0
    order = drain(b, round(t + 0.01, 6), 2.0)
    assert Counter(m for _, m, _ in order)["base"] > 0
    assert b.ledger.items_completed == 110
