"""The shared-server window controller (`core.colocate`): literal cases, and properties on a
toy server that admits first come, first served, so live requests wait only when the batch
holds the slots they need."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricctl.core.colocate import Colocation, ServerLoad


def test_live_counts_everything_but_the_batch_own() -> None:
    assert ServerLoad(running=10, waiting=3, batch_outstanding=8).live == 5
    assert ServerLoad(running=2, waiting=0, batch_outstanding=4).live == 0


def test_window_is_what_live_work_leaves() -> None:
    c = Colocation(capacity=16, max_window=48, cwnd=48)
    assert c.update(ServerLoad(running=0, waiting=0, batch_outstanding=0)) == 15
    assert c.update(ServerLoad(running=16, waiting=4, batch_outstanding=15)) == 10
    assert c.update(ServerLoad(running=16, waiting=9, batch_outstanding=10)) == 0
    assert c.paused()


def test_the_pace_starts_at_one_and_doubles_until_the_slots_bound_it() -> None:
    c = Colocation(capacity=16, max_window=16)
    idle = ServerLoad(running=0, waiting=0, batch_outstanding=0)
    assert [c.update(idle) for _ in range(5)] == [2, 4, 8, 15, 15]


def test_a_slow_live_answer_halves_the_pace_and_calm_adds_one() -> None:
    c = Colocation(capacity=16, max_window=16, target_s=0.1, cwnd=16)
    slow = ServerLoad(running=0, waiting=0, batch_outstanding=0, live_ttft_s=0.2)
    assert [c.update(slow) for _ in range(3)] == [8, 4, 2]
    calm = ServerLoad(running=0, waiting=0, batch_outstanding=0, live_ttft_s=0.01)
    assert [c.update(calm) for _ in range(3)] == [3, 4, 5]  # no more doubling
    between = ServerLoad(running=0, waiting=0, batch_outstanding=0, live_ttft_s=0.09)
    assert c.update(between) == 5  # neither over the target nor calm: unchanged
    assert [c.update(slow) for _ in range(4)] == [2, 1, 1, 1]  # never under one


def test_min_window_keeps_a_trickle() -> None:
    c = Colocation(capacity=4, max_window=8, min_window=1)
    assert c.update(ServerLoad(running=4, waiting=6, batch_outstanding=0)) == 1


@pytest.mark.parametrize("kw", [dict(capacity=0, max_window=1),
                                dict(capacity=4, max_window=2, min_window=3),
                                dict(capacity=4, max_window=2, target_s=0.0),
                                dict(capacity=4, max_window=2, target_s=-1.0)])
def test_bad_settings_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Colocation(**kw)  # type: ignore[arg-type]


class ToyServer:
    """Why: a server the property can drive step by step: `capacity` slots, batch requests
    one step long, live requests `live_steps` long, admitted in arrival order (the batch
    window is sent at the start of a step, live arrivals come after it)."""

    def __init__(self, capacity: int, live_steps: int) -> None:
        self.capacity = capacity
        self.live_steps = live_steps
        self.live_running: list[int] = []  # steps left, per live request
        self.live_waiting = 0
        self.batch_running = 0

    def reading(self, ttft_s: float | None) -> ServerLoad:
        return ServerLoad(running=len(self.live_running) + self.batch_running,
                          waiting=self.live_waiting, batch_outstanding=self.batch_running,
                          live_ttft_s=ttft_s)

    def step(self, window: int, arrivals: int) -> None:
        self.live_running = [s - 1 for s in self.live_running if s > 1]
        self.batch_running = min(window, self.capacity - len(self.live_running))
        self.live_waiting += arrivals
        admitted = min(self.live_waiting,
                       self.capacity - len(self.live_running) - self.batch_running)
        self.live_running += [self.live_steps] * admitted
        self.live_waiting -= admitted


@given(capacity=st.integers(1, 32), live_steps=st.integers(1, 6),
       arrivals=st.lists(st.integers(0, 12), min_size=1, max_size=60),
       ttfts=st.lists(st.sampled_from([None, 0.01, 0.2]), min_size=1, max_size=60))
def test_only_live_arrivals_beyond_the_headroom_can_wait(
        capacity: int, live_steps: int, arrivals: list[int],
        ttfts: list[float | None]) -> None:
    """Whatever the arrivals, a live request waits behind the batch only when more arrived
    in one step than the headroom kept free (or live work alone overfills the server)."""
    ctl = Colocation(capacity=capacity, max_window=3 * capacity, target_s=0.1)
    server = ToyServer(capacity, live_steps)
    for t, a in enumerate(arrivals):
        waiting_before = server.live_waiting
        window = ctl.update(server.reading(ttfts[t % len(ttfts)]))
        assert 0 <= window <= ctl.max_window
        live_before = len(server.live_running) + waiting_before
        server.step(window, a)
        if server.batch_running:
            assert server.live_waiting <= max(0, a - ctl.headroom), (t, live_before)


@given(capacity=st.integers(1, 32),
       history=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40),
                                  st.sampled_from([None, 0.01, 0.5])), max_size=40))
def test_the_window_recovers_when_live_load_falls(
        capacity: int, history: list[tuple[int, int, int, float | None]]) -> None:
    """After any history, `capacity` calm readings of an idle server refill the window."""
    ctl = Colocation(capacity=capacity, max_window=2 * capacity, target_s=0.1)
    for running, waiting, mine, ttft in history:
        ctl.update(ServerLoad(running, waiting, mine, ttft))
    calm = ServerLoad(running=0, waiting=0, batch_outstanding=0, live_ttft_s=0.01)
    for _ in range(capacity):
        ctl.update(calm)
    assert ctl.window == capacity - ctl.headroom


def test_shared_note_says_the_reading_in_words() -> None:
    from fabricctl.core.colocate import shared_note

    assert shared_note(16, 10, 5, None, None) == "shared: batch 10 of 16 slots, live 5"
    assert shared_note(16, 10, 5, 0.12, 0.15) == (
        "shared: batch 10 of 16 slots, live 5, first token 120 ms (target 150 ms)")
    assert shared_note(16, 0, 16, 0.4, None) == (
        "shared: batch paused, live traffic holds 16 of 16 slots, first token 400 ms")
