"""The sockets the broker daemon listens on: its Unix socket, an optional TCP listener, and
the Prometheus endpoint.

Contract: `open()` binds the Unix socket in the data dir (the socket file is replaced, since
the data dir's lock proves no live broker owns it, and is readable and writable by its owner
only), the TCP listener on `cfg.listen` ("HOST:PORT", "127.0.0.1" when HOST is empty) when
it is set (TLS when `cfg.tls_cert` is set: `fabricctl.wire.tls.server_context`, whose failed
handshakes are refused with one log line), and the metrics endpoint on
`cfg.metrics_host:metrics_port` when that is set; each accepted connection becomes a
`Connection` over the shared state and the router. `close()` stops accepting (open
connections stay) and removes the socket file. `tcp_port()` and `metrics_port()` are the
bound ports (useful with port 0), or None."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING

from fabricctl.errors import UsageError
from fabricctl.server.connection import Connection

SUN_PATH_MAX = 107  # Linux's sockaddr_un holds 108 bytes, the path's NUL included

if TYPE_CHECKING:
    from fabricctl.server.connection import Router
    from fabricctl.server.state import ServerState


class Listeners:
    """Why: which sockets the daemon accepts on, and with what rights, is one concern."""

    def __init__(self, state: ServerState, router: Router) -> None:
        self.state = state
        self.router = router
        self._servers: list[asyncio.AbstractServer] = []
        self._tcp: asyncio.AbstractServer | None = None
        self._metrics: asyncio.AbstractServer | None = None

    async def open(self) -> None:
        st, router = self.state, self.router
        path = st.cfg.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # the data dir's lock proves no live broker owns it
        if len(os.fsencode(path)) > SUN_PATH_MAX:
            raise UsageError(f"the data dir's socket path {path} is {len(os.fsencode(path))} "
                             f"bytes, over the {SUN_PATH_MAX} a Unix socket allows: give a "
                             "shorter --data-dir (or FABRICCTL_DATA_DIR)")
        old = os.umask(0o177)
        try:
            srv = await loop.create_unix_server(lambda: Connection(st, router, "unix"),
                                                str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._servers.append(srv)
        if st.cfg.listen:
            host, _, port = st.cfg.listen.rpartition(":")
            tls = None
            if st.cfg.tls_cert:
                from fabricctl.wire.tls import server_context

                tls = server_context(st.cfg.tls_cert, st.cfg.tls_key or None)
            self._tcp = await loop.create_server(lambda: Connection(st, router, "tcp"),
                                                 host or "127.0.0.1", int(port), ssl=tls,
                                                 ssl_handshake_timeout=10.0 if tls else None)
            self._servers.append(self._tcp)
        if st.cfg.metrics_port is not None:
            self._metrics = await st.metrics.serve(st.cfg.metrics_host, st.cfg.metrics_port)
            self._servers.append(self._metrics)

    def close(self) -> None:
        for srv in self._servers:
            srv.close()
        if self._servers:  # ours while the data dir's lock is held: a stopped broker leaves
            # no socket for `doctor` or a client to find and be refused on
            with contextlib.suppress(FileNotFoundError):
                self.state.cfg.socket_path.unlink()

    def tcp_port(self) -> int | None:
        return _bound_port(self._tcp)

    def metrics_port(self) -> int | None:
        return _bound_port(self._metrics)


def _bound_port(srv: asyncio.AbstractServer | None) -> int | None:
    for sock in getattr(srv, "sockets", None) or ():
        if sock.family.name.startswith("AF_INET"):
            return int(sock.getsockname()[1])
    return None
