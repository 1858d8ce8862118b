"""The daemon's own settings (sockets, heartbeats, group commit), separate from the core's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fabricctl.wire.protocol import DEFAULT_MAX_FRAME, SOCKET_NAME


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Why: every knob of the daemon in one frozen object, defaults an operator can trust."""

    data_dir: Path
    listen: str | None = None  # "HOST:PORT" for consumers on other hosts; off by default
    token: str = ""  # required on the TCP listener
    tls_cert: str = ""  # PEM certificate (chain): the TCP listener speaks TLS; "" plain TCP
    tls_key: str = ""  # its PEM key ("" when the certificate file holds it)
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    max_frame: int = DEFAULT_MAX_FRAME
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    commit_items: int = 512
    commit_wait_s: float = 0.002
    complete_batches: int = 8  # per commit: smaller groups keep the loop's steps short
    writer_thread: bool = True  # commit on a writer thread: the loop dispatches meanwhile
    tick_s: float = 1.0

    @property
    def socket_path(self) -> Path:
        return Path(self.data_dir) / SOCKET_NAME
