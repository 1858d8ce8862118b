"""The daemon: the composition root of a broker, below the CLI (`up` and `run` start it).

`assembly.Daemon` puts the store, the server, the fleet and the monitors together;
`serve.serve_forever` runs one until it is asked to stop, with the Batch API beside it.
"""

from __future__ import annotations

from fabricctl.daemon.assembly import NO_LOCAL_GPUS, Daemon, server_config
from fabricctl.daemon.serve import serve_forever, start_api

__all__ = ["NO_LOCAL_GPUS", "Daemon", "serve_forever", "server_config", "start_api"]
