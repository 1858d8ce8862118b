"""Write flow control for a frame protocol: wait while the transport's buffer is full.

Contract: a protocol class that inherits `WriteFlow` gets asyncio's `pause_writing` and
`resume_writing` callbacks; `drain()` returns at once unless writing is paused, and then
when it resumes or the connection is lost (`connection_lost` must call `resume_writing`).
"""

from __future__ import annotations

import asyncio


class WriteFlow(asyncio.Protocol):
    """Why: the broker's connections and the client both pace their writes the same way."""

    _writable: asyncio.Future[None] | None = None  # pending while writing is paused

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    async def drain(self) -> None:
        """Wait until the transport takes more (its write buffer fell below the low mark)."""
        if self._writable is not None and not self._writable.done():
            await self._writable
