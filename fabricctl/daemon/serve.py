"""The daemon served until it is asked to stop, with the OpenAI Batch API beside it.

Contract: `serve_forever(cfg, ...)` starts a `Daemon`, with `[server] api` the OpenAI Batch
API (`fabricctl.api`) in the same event loop once the broker is up (`start_api`: a producer
on the daemon's own socket, its uploads under `<data dir>/files/`, stopped before the
broker), and serves until SIGINT, SIGTERM or a `Shutdown` (`fabricctl down`): then it stops
pulls, lets in-flight batches finish and closes LMDB; a second SIGINT exits at once (LMDB's
durable commits mean nothing acknowledged is lost either way). It returns the exit status:
0, or 130 after an interrupt.

`api_clock()` is the API's clock: `time.time`, shifted by `FABRICCTL_API_CLOCK_SKEW_S`
seconds when that is set (a test seam, like `FABRICCTL_FAULTS`: the end-to-end tests pass
an hour-long `output_expires_after` without waiting an hour; the broker's own clock, which
runs the jobs' windows, is never shifted).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fabricctl.config import AppConfig
from fabricctl.daemon.assembly import Daemon
from fabricctl.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from fabricctl.api.app import ApiServer
    from fabricctl.api.backend import ClientBackend
    from fabricctl.store.files import FileStore

log = logging.getLogger("fabricctl")


class ApiService:
    """Why: the Batch API's server, its broker link and its files store stop together."""

    def __init__(self, server: ApiServer, backend: ClientBackend, files: FileStore) -> None:
        self.server, self.backend, self.files = server, backend, files

    async def stop(self) -> None:
        await self.server.stop()
        await self.backend.close()
        self.files.close()


API_CLOCK_SKEW = "FABRICCTL_API_CLOCK_SKEW_S"


def api_clock() -> Callable[[], float]:
    """The Batch API's clock (see the contract)."""
    text = os.environ.get(API_CLOCK_SKEW, "")
    if not text:
        return time.time
    try:
        skew = float(text)
    except ValueError:
        raise UsageError(f"{API_CLOCK_SKEW} must be a number of seconds, not {text!r}") from None
    return lambda: time.time() + skew


async def start_api(cfg: AppConfig, daemon: Daemon) -> ApiService:
    """The OpenAI Batch API on `server.api`, a producer on the daemon's own socket."""
    from fabricctl.api.address import api_address
    from fabricctl.api.app import ApiServer
    from fabricctl.api.backend import ClientBackend
    from fabricctl.api.service import BatchApi, process_feeder
    from fabricctl.store.files import FileStore

    host, port = api_address(cfg.server.api, cfg.server.token)
    clock = api_clock()
    backend = ClientBackend(daemon.server.state.cfg.socket_path)
    files = FileStore(cfg.data_dir / "files")
    socket_path = daemon.server.state.cfg.socket_path
    feeder = process_feeder(socket_path, cfg.producer.tokenizer, cfg.model,
                            cfg.producer.shapes, cfg.producer.block_size)
    api = BatchApi(backend, files, token=cfg.server.token, feeder=feeder, clock=clock)
    server = ApiServer(api, host, port)
    try:
        await server.start()
    except BaseException:
        await backend.close()
        files.close()
        await daemon.stop()
        raise
    return ApiService(server, backend, files)


async def serve_forever(cfg: AppConfig, local_gpus: bool = True,
                        ray: str | None = None) -> int:
    from fabricctl.server.heap import settle_heap

    daemon = await Daemon.start(cfg, local_gpus=local_gpus, ray=ray)
    api = await start_api(cfg, daemon) if cfg.server.api else None
    settle_heap()  # what recovery and the imports left is never garbage
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    interrupts = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1 and sig == signal.SIGINT:
            log.warning("second interrupt: stopping now")
            os._exit(ExitCode.INTERRUPTED)
        log.info("%s: stopping pulls, finishing in-flight batches (Ctrl-C again to stop now)",
                 sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    waiter = asyncio.ensure_future(stop.wait())
    requested = asyncio.ensure_future(daemon.server.stop_requested.wait())  # fabricctl down
    await asyncio.wait({waiter, requested}, return_when=asyncio.FIRST_COMPLETED)
    if requested.done():
        log.info("stop requested: stopping pulls, finishing in-flight batches")
    waiter.cancel()
    requested.cancel()
    if api is not None:
        await api.stop()
    await daemon.stop()
    log.info("broker stopped; LMDB closed")
    return ExitCode.INTERRUPTED if interrupts else ExitCode.OK
