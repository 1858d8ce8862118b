"""Whether a TCP port can be listened on, and if not, who listens there.

Contract: `port_holder(host, port)` is None when a listener could bind `host:port` now (as
uvicorn binds: SO_REUSEADDR, so connections in TIME_WAIT do not count), else a few words on
who holds it: " by pid N (its command line)" when psutil can see the listening process, ""
when it cannot (another user's process without the rights to read it). It never raises.
"""

from __future__ import annotations

import contextlib
import socket

import psutil


def port_holder(host: str, port: int) -> str | None:
    """None if `host:port` is free to listen on; else who holds it, in words."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None  # a name that does not resolve: the server's own error says it better
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
            return None
        except OSError:
            pass
    return _listener(port)


def _listener(port: int) -> str:
    with contextlib.suppress(psutil.Error, OSError):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                try:
                    cmd = " ".join(psutil.Process(c.pid).cmdline())
                except psutil.Error:
                    cmd = "?"
                return f" by pid {c.pid} ({cmd[:160]})"
    return ""
