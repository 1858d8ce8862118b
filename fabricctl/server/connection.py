"""One client connection as the event loop sees it: bytes in, frames dispatched, bytes out.

Contract: the first frame must be `Hello` (its router's `welcome` answers it); every later
frame is handed to the router's `dispatch` from the read callback itself, in order. A frame
longer than the maximum, malformed, or of an unknown type gets an `Error` and the connection
is closed after what is queued for it has been sent; so is one whose handler closed it. The
end of the stream or a socket error drops the peer at once (a consumer's batches go back to
their lanes: the router's `drop`). `drain()` waits while the transport's write buffer is
over its high mark. A connection knows its server only as a `Router` and the shared
`ServerState` (settings, clock, the set of peers).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol, cast

import msgspec

from fabricctl.server.peer import Peer
from fabricctl.wire.flow import WriteFlow
from fabricctl.wire.protocol import Error, FrameReader, FrameTooLarge

if TYPE_CHECKING:
    from fabricctl.server.state import ServerState

log = logging.getLogger("fabricctl.server")


class Router(Protocol):
    """Why: a connection hands its frames to the server without importing it."""

    def welcome(self, peer: Peer, hello: object) -> bool: ...

    def dispatch(self, peer: Peer, frame: object) -> None: ...

    def drop(self, peer: Peer, why: str, graceful: bool = False) -> None: ...


class Connection(WriteFlow):
    """Why: a frame is handled in the callback that read it, with no task per connection."""

    def __init__(self, state: ServerState, router: Router, kind: str) -> None:
        self.state = state
        self.router = router
        self.kind = kind
        self.frames = FrameReader(state.cfg.max_frame)
        self.peer: Peer | None = None
        self.welcomed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = Peer(cast(asyncio.Transport, transport),  # uvloop's are not subclasses
                         self.kind, last_seen=self.state.clock(), drain=self.drain)
        self.state.peers.add(self.peer)

    def data_received(self, data: bytes) -> None:
        peer, router, clock = self.peer, self.router, self.state.clock
        if peer is None or peer.closed:
            return
        try:
            for frame in self.frames.feed(data):
                if not self.welcomed:
                    self.welcomed = router.welcome(peer, frame)
                    if not self.welcomed:
                        peer.closed = True
                else:
                    peer.last_seen = clock()
                    router.dispatch(peer, frame)
                if peer.closed:
                    break
        except FrameTooLarge as e:
            peer.send(Error("frame_too_large", str(e), fatal=True))
            peer.closed = True
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            peer.send(Error("bad_frame", f"malformed or unknown frame: {e}", fatal=True))
            peer.closed = True
        except Exception:
            log.exception("connection from %s failed", peer.name or self.kind)
            peer.closed = True
        if peer.closed:
            router.drop(peer, "connection closed", graceful=True)

    def eof_received(self) -> bool:
        return False  # the peer is done: close our side too, which drops it

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        if self.peer is not None:
            self.router.drop(self.peer, "connection closed", graceful=True)
