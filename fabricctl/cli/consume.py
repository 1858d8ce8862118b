"""`fabricctl consume`: one consumer on this host against a broker elsewhere (TCP + token).

Contract: the `consume` command (`command`) builds the engine (simulated, or an
OpenAI-compatible endpoint) and runs one `Consumer` until SIGINT/SIGTERM, after which it
finishes the batch in its hands and exits. The token is `--token`, else `FABRICCTL_TOKEN`,
else the config's `server.token`; a bad `--engine` is exit 2. The supervisor and the
engines are imported when the consumer starts.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fabricctl.cli.support import ConfigFile, Verbose, load, run_async, setup_logging
from fabricctl.config import AppConfig
from fabricctl.errors import UsageError

if TYPE_CHECKING:
    from fabricctl.engines.base import Engine


def command(
    broker: str = typer.Option(..., "--broker", "-b", help="HOST:PORT of a broker's --listen, "
                               "or its data dir / socket path."),
    engine: str = typer.Option("sim", "--engine", "-e", help="sim or openai."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="OpenAI-compatible base URL "
                                        "(engine openai)."),
    model: str | None = typer.Option(None, "--model", "-m"),
    name: str | None = typer.Option(None, "--name", help="Consumer name (default: host-gpu)."),
    gpu: int | None = typer.Option(None, "--gpu"),
    token: str | None = typer.Option(None, "--token", envvar="FABRICCTL_TOKEN"),
    config: Path | None = ConfigFile,
    verbose: bool = Verbose,
) -> None:
    """Run one consumer against a broker (for example on another GPU host)."""
    setup_logging(verbose)
    cfg = load(config, model=model)
    run_async(run_consumer(cfg, broker, engine, endpoint, name, gpu,
                           token if token is not None else cfg.server.token))


def build_engine(cfg: AppConfig, engine: str, endpoint: str | None) -> Engine:
    from fabricctl.supervisor.fleet import build_sim_engines, consumer_window

    if engine == "sim":
        return build_sim_engines(cfg)[0]
    if engine == "openai":
        if not endpoint:
            raise UsageError("--engine openai needs --endpoint URL")
        from fabricctl.engines.openai import OpenAIEngine

        c = cfg.consumer
        return OpenAIEngine(endpoint, cfg.model_name, max_batch_size=c.max_batch_size,
                            max_batch_tokens=c.max_batch_tokens, max_input_len=c.max_input_len,
                            window=consumer_window(cfg, "openai") or 0)
    raise UsageError(f"--engine must be sim or openai, not {engine!r}")


async def run_consumer(cfg: AppConfig, broker: str, engine: str, endpoint: str | None,
                       name: str | None, gpu: int | None, token: str) -> None:
    from fabricctl.supervisor.consumer import Consumer
    from fabricctl.supervisor.fleet import consumer_window

    eng = build_engine(cfg, engine, endpoint)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    consumer = Consumer(broker, name or f"{socket.gethostname()}-gpu{gpu or 0}",
                        cfg.model_name, eng, gpu, token,
                        window=consumer_window(cfg, engine))
    try:
        await consumer.run(stop)
    finally:
        await eng.close()
