"""One consumer per GPU: registers its engine's contract, pulls, runs, completes, heartbeats.

Contract: `Consumer.run(stop)` connects to a broker (Unix socket, or TCP with a token),
registers `Contract(model, *engine.limits())` (with the other names its server answers),
heartbeats every `heartbeat_s` with the engine's counters, its `host` and its GPU's NVML
sample when `gpu_sample` gives one, and loops: handle pre-warm pushes first (`on_prewarm`
is told of each one the engine took), pull (long-poll), run the batch, complete it. With
`window` None it runs one batch at a time (the simulated engine); with a window of W
requests (a real server) it pulls the next batch as soon as fewer than W of its items are in
the engine. A lost broker is retried with backoff until `stop` is set; a refusal no retry
changes (`REFUSALS`: token, certificate, TLS, protocol version; a plain TCP connection
closed unanswered before any session) ends `run` with that `BrokerError`. When `stop` is
set it cuts a pending long-poll short, finishes the batches in hand and returns; nothing it
held is lost. Engine failures are isolated: a batch whose run raises `EngineError` (or runs
past `run_timeout_s`) or answers "abort" has those items run one at a time, up to
`isolate_attempts` tries each; none succeeding fails the batch back (the engine is down:
the consumer pauses), some succeeding quarantines the others with an error result (poison).
How and why: ARCHITECTURE.md, "Consumers: failures isolated".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from fabricctl.core.types import Contract, ItemResult, Prewarm, Work
from fabricctl.engines.base import Engine
from fabricctl.engines.request import ABORT
from fabricctl.errors import BackendMissing, BrokerError, EngineError
from fabricctl.supervisor.evidence import cache_evidence, result_evidence
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import PrewarmPush

log = logging.getLogger("fabricctl.consumer")
# broker answers that no retry changes: the run ends with them (`fabricctl consume` exits)
REFUSALS = frozenset({"auth", "tls", "version"})


class Consumer:
    """Why: the broker is math-only; this is the part that knows an engine exists."""

    def __init__(
        self, address: str | Path, name: str, model: str, engine: Engine,
        gpu: int | None = None, token: str = "", pull_wait_s: float = 1.0,
        run_timeout_s: float | None = None, isolate_attempts: int = 2,
        window: int | None = None, tls: ssl.SSLContext | None = None, host: str = "",
        gpu_sample: Callable[[], Any] | None = None, group: Sequence[int] = (),
        group_sample: Callable[[], list[Any]] | None = None,
    ) -> None:
        self.address = address
        self.tls = tls  # TLS over TCP (`fabricctl.wire.tls.client_context`), or None
        self.host = host  # reported with each heartbeat: views group GPUs by host
        self.gpu_sample = gpu_sample  # this GPU's latest NVML sample (or None), per heartbeat
        self.group = list(group)  # the GPUs its server spans, when more than `gpu` alone
        self.group_sample = group_sample  # the NVML samples of the group's other GPUs
        self.name = name
        self.model = model
        self.engine = engine
        self.gpu = gpu
        self.token = token
        self.pull_wait_s = pull_wait_s
        self.run_timeout_s = run_timeout_s  # None: only the engine's own timeouts apply
        self.isolate_attempts = max(1, isolate_attempts)
        # Items in the engine at once (None: one batch at a time); see the module contract.
        self.window = None if window is None else max(1, window)
        self._in_engine = 0  # items of the batches being run
        self._room = asyncio.Event()  # set when _in_engine falls
        self._running: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.items = 0
        self.failures = 0  # batches failed back because the engine was down
        self.quarantined = 0  # items answered with an error result after isolation
        self.prewarms = 0
        # called with each pre-warm the engine took: `run` counts the prefill it requested
        self.on_prewarm: Callable[[Prewarm], object] | None = None
        self.down_pause_s = 0.0  # pause before the next pull while the engine is down
        self.connected = asyncio.Event()
        self.max_unacked = 4  # completions sent but not yet confirmed durable
        self._unacked: set[asyncio.Task[None]] = set()

    def contract(self) -> Contract:
        lim = self.engine.limits()
        names = tuple(n for n in lim.names if n != self.model)
        return Contract(self.model, lim.max_batch_size, lim.max_batch_tokens, lim.max_input_len,
                        names)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.2
        registered = False  # a session of this run registered once
        while not stop.is_set():
            try:
                await self._session(stop)
                backoff = 0.2
            except (BackendMissing, BrokerError, ConnectionError, OSError) as e:
                if isinstance(e, BrokerError) and (e.code in REFUSALS or (
                        e.code == "no_answer" and not registered)):
                    self.connected.clear()
                    raise  # retrying cannot help: a wrong token, TLS settings or version
                registered = registered or self.connected.is_set()
                if self.connected.is_set():
                    backoff = 0.2  # that session had registered: a new outage starts low
                self.connected.clear()
                if stop.is_set():
                    break
                log.warning("consumer %s: %s; retrying in %.1f s", self.name, e, backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 5.0)

    async def _session(self, stop: asyncio.Event) -> None:
        client = await Client.connect(self.address, "consumer", self.name, self.token,
                                      tls=self.tls)
        try:
            learn = getattr(self.engine, "learn_names", None)  # an engine that asks its server
            if learn is not None:
                await learn()
            reg = await client.register(self.name, self.contract(), self.gpu, self.engine.name,
                                        self.engine.simulated)
            self.connected.set()
            beat = asyncio.get_running_loop().create_task(self._heartbeat(client, reg.heartbeat_s))
            try:
                await self._work(client, stop)
            finally:
                if self._running:  # batches in the engine finish and complete
                    await asyncio.wait(self._running)
                beat.cancel()
                if self._unacked:  # a batch is ours until the broker confirmed it
                    await asyncio.wait(self._unacked)
        finally:
            await client.close()

    def _engine_down(self) -> bool:
        """An engine that knows its server is restarting (vLLM under the launcher)."""
        return getattr(self.engine, "ready", True) is False

    async def _work(self, client: Client, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._engine_down():  # pull nothing while our server restarts: others can
                waiter = getattr(self.engine, "wait_ready", None)
                with contextlib.suppress(EngineError, TimeoutError):
                    if waiter is not None:
                        await asyncio.wait_for(waiter(), self.pull_wait_s * 5)
                    else:
                        await asyncio.wait_for(stop.wait(), self.pull_wait_s)
                continue
            await self._prewarm(client)
            if self.window is not None and self._in_engine >= self.window:
                self._room.clear()
                await self._room.wait()  # a batch in the engine finished
                continue
            work = await self._pull(client, stop)
            if work is None:
                continue
            await self._prewarm(client)
            if self.window is None:
                await self._run(client, work)
            else:
                self._start(client, work)
            if self.down_pause_s:  # the engine is down: let a healthy consumer pull
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.down_pause_s)

    async def _pull(self, client: Client, stop: asyncio.Event) -> Work | None:
        """A bounded long-poll that `stop` cuts short (a fleet shutting down does not wait
        out the poll); a batch answered after the cut is handed back to the broker."""
        pull = asyncio.ensure_future(client.pull(self.pull_wait_s))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((pull, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if pull.done():
            return pull.result()
        pull.add_done_callback(lambda t: self._hand_back(client, t))
        return None

    def _hand_back(self, client: Client, pull: asyncio.Future[Work | None]) -> None:
        """A pull answered after `stop`: its batch goes back (or, the connection gone, the
        broker takes it back as it does a lost consumer's)."""
        if pull.cancelled() or pull.exception() is not None:
            return
        work = pull.result()
        if work is None:
            return

        async def fail() -> None:
            with contextlib.suppress(BackendMissing, BrokerError, ConnectionError, OSError):
                await client.fail(work.id, f"consumer {self.name} is stopping")

        task = asyncio.get_running_loop().create_task(fail())
        self._unacked.add(task)
        task.add_done_callback(self._unacked.discard)

    def _start(self, client: Client, work: Work) -> None:
        """Run a batch beside the ones already in the engine (windowed mode)."""
        n = len(work.items)
        self._in_engine += n
        task = asyncio.get_running_loop().create_task(self._run(client, work))
        self._running.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._running.discard(t)
            self._in_engine -= n
            self._room.set()
            if not t.cancelled() and t.exception() is not None:
                log.error("consumer %s: batch %d: %r", self.name, work.id, t.exception())

        task.add_done_callback(done)

    async def _prewarm(self, client: Client) -> None:
        while not client.pushes.empty():
            push = client.pushes.get_nowait()
            if isinstance(push, PrewarmPush):
                try:
                    await self.engine.prewarm(push.signal)
                    self.prewarms += 1
                    if self.on_prewarm is not None:
                        self.on_prewarm(push.signal)
                except EngineError as e:
                    log.warning("consumer %s: pre-warm failed: %s", self.name, e)

    async def _run(self, client: Client, work: Work) -> None:
        if self._engine_down():  # it went down after the pull: hand the batch straight back
            await client.fail(work.id, f"{self.engine.name}: the server is restarting")
            return
        before = self.engine.stats()
        results, why = await self._execute(work)
        if results is None:
            self.failures += 1
            self.down_pause_s = min(max(self.down_pause_s * 2, 0.2), 5.0)
            log.warning("consumer %s: batch %d failed: %s", self.name, work.id, why)
            await client.fail(work.id, why)
            return
        self.down_pause_s = 0.0
        # Pipelined: the next pull overlaps this completion's durable commit.
        # counter deltas name this batch only when no other batch ran alongside it
        after = self.engine.stats()
        cache = result_evidence(work, results, after.block_size)
        if cache is None and self.window is None:
            cache = cache_evidence(work, before, after)
        task = asyncio.get_running_loop().create_task(
            self._complete(client, work, results, cache))
        self._unacked.add(task)
        task.add_done_callback(self._unacked.discard)
        if len(self._unacked) >= self.max_unacked:
            await asyncio.wait(self._unacked, return_when=asyncio.FIRST_COMPLETED)

    async def _engine_run(self, work: Work) -> list[ItemResult]:
        if self.run_timeout_s is None:
            return await self.engine.run(work)
        try:
            return await asyncio.wait_for(self.engine.run(work), self.run_timeout_s)
        except TimeoutError:
            raise EngineError(f"{self.engine.name}: no answer within {self.run_timeout_s:g} s "
                              "(the consumer's run timeout)", unreachable=True) from None

    async def _execute(self, work: Work) -> tuple[list[ItemResult] | None, str]:
        """(one result per item, "") or (None, why) when the engine is down."""
        try:
            results = await self._engine_run(work)
        except EngineError as e:
            n = len(work.items)
            if n == 1:  # that was the item alone: one attempt spent
                return await self._isolate(work, [None], [0], str(e), self.isolate_attempts - 1)
            log.warning("consumer %s: batch %d failed (%s); running its %d items one by one",
                        self.name, work.id, e, n)
            return await self._isolate(work, [None] * n, list(range(n)), str(e))
        todo = [i for i, r in enumerate(results) if r.finish_reason == ABORT]
        if not todo:
            return results, ""
        out: list[ItemResult | None] = list(results)
        return await self._isolate(work, out, todo, "the engine aborted it")

    async def _isolate(self, work: Work, out: list[ItemResult | None], todo: list[int],
                       reason: str, tries: int | None = None,
                       ) -> tuple[list[ItemResult] | None, str]:
        """Run the items at `todo` one at a time; see the module contract."""
        why = dict.fromkeys(todo, reason)
        unreachable: set[int] = set()  # items whose last try did not reach the server
        alone_ok = 0
        for _ in range(self.isolate_attempts if tries is None else tries):
            if not todo:
                break
            tried = await asyncio.gather(*(self._run_alone(work, i) for i in todo))
            failed = []
            for i, (res, err, down) in zip(todo, tried, strict=True):
                if res is not None:
                    out[i] = res
                    alone_ok += 1
                    unreachable.discard(i)
                else:
                    why[i] = err
                    failed.append(i)
                    if down:
                        unreachable.add(i)
                    else:
                        unreachable.discard(i)
            todo = failed
        if todo and (not alone_ok or unreachable.intersection(todo)):
            first = next((i for i in todo if i in unreachable), todo[0])
            return None, why[first]
        for i in todo:
            self.quarantined += 1
            log.warning("consumer %s: item %r quarantined: %s", self.name, work.items[i].id,
                        why[i])
            out[i] = ItemResult(work.items[i].id, finish_reason="error",
                                error=f"quarantined after {self.isolate_attempts} attempts: "
                                f"{why[i]}")
        return [r for r in out if r is not None], ""

    async def _run_alone(self, work: Work, i: int) -> tuple[ItemResult | None, str, bool]:
        """(result, "", False), or (None, why, whether the server was unreachable)."""
        one = msgspec.structs.replace(work, items=[work.items[i]])
        try:
            res = await self._engine_run(one)
        except EngineError as e:
            return None, str(e), e.unreachable
        if len(res) != 1:
            return None, f"the engine returned {len(res)} results for one item", False
        if res[0].finish_reason == ABORT:
            return None, "the engine aborted it", False
        return res[0], "", False

    async def _complete(self, client: Client, work: Work, results: list[ItemResult],
                        cache: tuple[int, int, int] | None = None) -> None:
        try:
            await client.complete(work.id, results, cache)
        except (BackendMissing, BrokerError, ConnectionError, OSError) as e:
            log.warning("consumer %s: completion of batch %d not confirmed (%s); the broker "
                        "will hand it out again", self.name, work.id, e)
            return
        self.batches += 1
        self.items += len(work.items)

    def beat(self) -> dict[str, Any]:
        """What a heartbeat carries: the engine's counters, this host's name, the GPUs of a
        server spanning a group ("gpus") and, where NVML answers, this GPU's latest sample
        under "nvml" (and the group's other GPUs' under "nvml_group")."""
        stats: dict[str, Any] = msgspec.to_builtins(self.engine.stats())
        if self.host:
            stats["host"] = self.host
        if len(self.group) > 1:
            stats["gpus"] = self.group
        if self.gpu_sample is not None:
            with contextlib.suppress(Exception):  # telemetry must never stop the heartbeat
                sample = self.gpu_sample()
                if sample is not None:
                    stats["nvml"] = msgspec.to_builtins(sample)
                more = [] if self.group_sample is None else self.group_sample()
                if more:
                    stats["nvml_group"] = msgspec.to_builtins([s for s in more if s])
        return stats

    async def _heartbeat(self, client: Client, every: float) -> None:
        while True:
            try:
                await client.heartbeat(self.beat())
            except (BackendMissing, ConnectionError, OSError):
                return
            await asyncio.sleep(every)
