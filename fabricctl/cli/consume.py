"""`fabricctl consume`: one consumer on this host against a broker elsewhere (TCP + token).

Contract: builds the engine (simulated, or an OpenAI-compatible endpoint) and runs one
`Consumer` until SIGINT/SIGTERM, after which it finishes the batch in its hands and exits.
"""

from __future__ import annotations

import asyncio
import signal
import socket

from fabricctl.config import AppConfig
from fabricctl.engines.base import Engine
from fabricctl.errors import UsageError
from fabricctl.supervisor.consumer import Consumer
from fabricctl.supervisor.fleet import build_sim_engines, consumer_window


def build_engine(cfg: AppConfig, engine: str, endpoint: str | None) -> Engine:
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
