"""The vLLM engine: an OpenAIEngine bound to one launcher-managed vLLM server (one per group).

It lives in the supervisor, not in `engines`: it follows a supervised server through its
restarts, and engines know nothing of the processes behind them.

Contract: same as `OpenAIEngine` (one request per item, counters from /metrics), plus
the server's lifecycle: `run` and `prewarm` first wait up to `ready_timeout_s` (by default
the launch spec's, `[vllm] ready_timeout_s`) for the server's /health readiness (it may be
restarting) and raise `EngineError` if it does not come back, so the broker puts the batch
back. The URL, the served model name and the names it answers (the served name and its
LoRA adapters', `names`) come from the `ServerProcess`'s launch spec, never from separate
config; adapters passed in `extra_args` (`--lora-modules`) are learnt from /v1/models.
"""

from __future__ import annotations

from typing import Any

from fabricctl.core.types import ItemResult, Prewarm, Work
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.errors import EngineError, LaunchError
from fabricctl.supervisor.launcher import ServerProcess


class VllmEngine(OpenAIEngine):
    """Why: a consumer's engine must follow its GPU group's server through restarts."""

    def __init__(self, server: ServerProcess, *, max_batch_size: int, max_batch_tokens: int,
                 max_input_len: int, ready_timeout_s: float | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("name", f"vllm:gpu{server.gpu}")
        if "names" not in kwargs:  # adapters given in extra_args: learnt from /v1/models
            lora_args = any(a.split("=")[0] == "--lora-modules" for a in server.spec.extra_args)
            kwargs["names"] = None if lora_args else server.spec.names
        super().__init__(server.base_url, server.spec.served_model_name,
                         max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                         max_input_len=max_input_len, **kwargs)
        self.server = server
        self.ready_timeout_s = (server.spec.ready_timeout_s if ready_timeout_s is None
                                else ready_timeout_s)

    @property
    def ready(self) -> bool:
        """True while the server answers /health (as last seen by the launcher)."""
        return self.server.ready.is_set()

    async def wait_ready(self) -> None:
        """Wait for the server's readiness; EngineError if it is not back in time."""
        try:
            await self.server.wait_ready(self.ready_timeout_s)
        except LaunchError as e:
            raise EngineError(str(e)) from None

    async def run(self, work: Work) -> list[ItemResult]:
        await self.wait_ready()
        return await super().run(work)

    async def prewarm(self, signal: Prewarm) -> None:
        if self.ready:
            await super().prewarm(signal)
