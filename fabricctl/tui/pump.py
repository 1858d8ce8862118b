"""The dashboard's stream: snapshots read and decoded on a worker thread, posted to the UI.

Contract: `Pump.run` is the body of a Textual thread worker: on an event loop of that
thread's own, it reads `source.stream(interval, lanes)` (the wire client's reads and msgpack
decoding) and posts a `SnapshotArrived` per decoded snapshot to the app (`post_message` is
thread-safe). A failing or ended stream posts `StreamLost` (why, the wait, the attempt) and
is retried after a backoff doubling from `retry_min` to `retry_max`, reset by the next
snapshot. `stop`, from any thread, cancels it: the stream is closed (its connection with
it) in the pump's thread, the thread's loop ends and `ended` is set. Each message names its
pump, so the app drops those of a pump it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from textual.app import App
from textual.message import Message

from fabricctl.core.snapshot import Snapshot
from fabricctl.tui.sources import Lanes, SnapshotSource


class SnapshotArrived(Message):
    """Why: a decoded snapshot crosses from the pump's thread to the UI as a message."""

    def __init__(self, pump: Pump, snapshot: Snapshot) -> None:
        super().__init__()
        self.pump, self.snapshot = pump, snapshot


class StreamLost(Message):
    """Why: the pump's thread tells the UI the broker went away and when it tries again."""

    def __init__(self, pump: Pump, reason: str, retry_in: float, attempt: int) -> None:
        super().__init__()
        self.pump = pump
        self.reason, self.retry_in, self.attempt = reason, retry_in, attempt


class Pump:
    """Why: reading and decoding snapshots on the UI loop would stall keys and drawing.

    `run` is the body of a Textual thread worker: on an event loop of that thread's own, it
    reads `source.stream(interval, lanes)` (the wire client's reads and msgpack decoding),
    retrying with the backoff, and posts each decoded snapshot to `app` (`post_message` is
    thread-safe). `stop`, from any thread, cancels it: the stream is closed (its connection
    with it) in the pump's thread, the thread's loop ends and `ended` is set.
    """

    def __init__(self, app: App[int], source: SnapshotSource, interval: float, lanes: Lanes,
                 retry_min: float, retry_max: float) -> None:
        self.app, self.source = app, source
        self.interval, self.lanes = interval, lanes
        self.retry_min, self.retry_max = retry_min, retry_max
        self._lock = threading.Lock()
        self._stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self.ended.set()

    async def _main(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.ensure_future(self._run())
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._loop is not None and self._task is not None:
                with contextlib.suppress(RuntimeError):  # its loop has ended already
                    self._loop.call_soon_threadsafe(self._task.cancel)

    async def _run(self) -> None:
        delay, attempt = self.retry_min, 0
        while True:
            try:
                stream = self.source.stream(self.interval, self.lanes)
                async with contextlib.aclosing(stream):  # type: ignore[type-var]
                    async for snap in stream:
                        delay, attempt = self.retry_min, 0
                        self.app.post_message(SnapshotArrived(self, snap))
                reason = "the stream ended"
            except Exception as e:  # any failure of the source is a lost broker, shown
                reason = f"{type(e).__name__}: {e}"
            attempt += 1
            self.app.post_message(StreamLost(self, reason, delay, attempt))
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max)
