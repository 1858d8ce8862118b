"""The daemon's own settings (sockets, heartbeats, group commit), separate from the core's.

Contract: `ServerConfig` is what `BrokerServer` runs with. A knob the configuration file also
has (`[server]` listen, token, tls_cert, tls_key, heartbeat_s, heartbeat_timeout_s; `[broker]`
tick_s) takes its default from there (`fabricctl.config.ServerSettings`, `CoreConfig`), so a
daemon built here and one `up` builds from a default configuration agree; the rest (frame
limit, metrics host, group commit, writer thread) are the daemon's alone and default here.
`metrics_port` is the bound port of the Prometheus endpoint (0: an ephemeral one; None: off),
which `up` derives from `[metrics] prometheus_port` (where 0 is off).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fabricctl.config import ServerSettings
from fabricctl.core.config import CoreConfig
from fabricctl.wire.protocol import DEFAULT_MAX_FRAME, SOCKET_NAME

_SETTINGS = ServerSettings()
_CORE = CoreConfig()

# the group commit's defaults, the daemon's alone: `ServerConfig` and `Writer` read these
COMMIT_ITEMS = 512  # items of waiting submits one commit takes (whole chunks)
COMMIT_WAIT_S = 0.002  # how long a commit waits for company
COMPLETE_BATCHES = 8  # completions per commit: smaller groups keep the loop's steps short


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Why: every knob of the daemon in one frozen object, defaults an operator can trust."""

    data_dir: Path
    listen: str = _SETTINGS.listen  # "HOST:PORT" for consumers on other hosts; "": off
    token: str = _SETTINGS.token  # required on the TCP listener
    tls_cert: str = _SETTINGS.tls_cert  # PEM certificate (chain): the TCP listener speaks TLS
    tls_key: str = _SETTINGS.tls_key  # its PEM key ("" when the certificate file holds it)
    heartbeat_s: float = _SETTINGS.heartbeat_s
    heartbeat_timeout_s: float = _SETTINGS.heartbeat_timeout_s
    max_frame: int = DEFAULT_MAX_FRAME
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    commit_items: int = COMMIT_ITEMS
    commit_wait_s: float = COMMIT_WAIT_S
    complete_batches: int = COMPLETE_BATCHES
    writer_thread: bool = True  # commit on a writer thread: the loop dispatches meanwhile
    tick_s: float = _CORE.tick_s

    @property
    def socket_path(self) -> Path:
        return Path(self.data_dir) / SOCKET_NAME
