"""Where the Batch API may listen: `HOST:PORT`, loopback unless a token guards it.

Contract: `api_address(spec, token)` -> (host, port) for "HOST:PORT" (an IPv6 host in
brackets, `[::1]:8080`; port 0 lets the system pick). A host other than a loopback address
or "localhost" needs `token` (server.token): without one it raises `UsageError` saying so,
since anyone who reaches the port could otherwise run batches on these GPUs.
"""

from __future__ import annotations

import ipaddress

from fabricctl.errors import UsageError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_address(spec: str, token: str) -> tuple[str, int]:
    host, sep, port = spec.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--api {spec!r}: give HOST:PORT, e.g. 127.0.0.1:8000")
    if not is_loopback(host) and not token:
        raise UsageError(f"--api {spec}: {host} is reachable from other hosts; set "
                         f"server.token (clients then send it as their API key) or listen "
                         f"on 127.0.0.1")
    return host, int(port)
