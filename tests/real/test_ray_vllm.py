"""`fabricctl up --ray auto` with engine vllm: a Ray GPU worker in front of the real CPU vLLM.

One logical GPU, so one `GpuWorker` actor, which launches the CPU build of vLLM with the
tiny model through its launcher. A small workload gets one real result per item; then the
actor's process is SIGKILLed. Its vLLM server (tethered to the actor: the kernel sends it
SIGTERM) and the server's EngineCore must exit, and Ray's restart of the actor must start
a new server on the same port (an orphan would still hold it) that serves the next
workload. `down` then stops it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import SERVER_ARGS, VENV
from ports import free_port_pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the Ray and agent helpers

from agent_helpers import agent_items, all_gone
from test_ray_fleet import RayUp, assert_exactly_one_each, submit, until, wait_all_results

from fabricctl.config import AppConfig, ConsumerSettings, ServerSettings, VllmSettings, to_toml
from fabricctl.supervisor.launch_spec import vllm_cpu_spec

pytest.importorskip("ray")
pytestmark = [pytest.mark.real_vllm]
START_S = 240.0


def ray_config(tmp: Path, model: Path) -> str:
    cpu = vllm_cpu_spec(VENV, str(model), "tiny", tmp / "logs")
    return to_toml(AppConfig(
        engine="vllm", model=str(model), served_model_name="tiny", gpus=[0],
        vllm=VllmSettings(command=list(cpu.command), model_flag=cpu.model_flag,
                          port_base=free_port_pair(), ready_timeout_s=START_S,
                          restart_backoff_s=[1.0], extra_args=list(SERVER_ARGS),
                          env=dict(cpu.env)),
        consumer=ConsumerSettings(max_batch_size=16, max_batch_tokens=16 * 512,
                                  max_input_len=1000),
        server=ServerSettings(heartbeat_s=0.5, heartbeat_timeout_s=5.0)))


async def test_a_sigkilled_ray_worker_leaves_no_vllm_and_its_restart_serves(
        tiny_model: Path, tmp_path: Path) -> None:
    up = RayUp(tmp_path, ray_config(tmp_path, tiny_model), gpus=1)
    tree: list[psutil.Process] = []
    try:
        st = await up.wait_ready(START_S)
        worker = st["extra"]["ray"][0]
        tree += psutil.Process(worker["pid"]).children(recursive=True)
        assert any("vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
                   for p in tree), "the Ray worker launched no vLLM server"
        await _served(up, "r")

        os.kill(worker["pid"], signal.SIGKILL)
        await until(lambda: all_gone(tree), 60, "the killed worker's vLLM processes")

        async def restarted() -> dict[str, Any] | None:
            st = await up.status()
            w = st["extra"]["ray"][0]
            back = w["alive"] and w["connected"] and w["pid"] != worker["pid"]
            return st if back and st["consumers"] == 1 else None

        st = await until(restarted, START_S, "Ray restarting the worker and its vLLM")
        assert st["extra"]["ray"][0]["restarts"] == 1
        await _served(up, "s")
        assert st["difference"] == [0, 0]
        assert await asyncio.to_thread(up.stop) == 0, up.logs()
    finally:
        up.close()
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()


async def _served(up: RayUp, tag: str) -> None:
    """A small workload, one real vLLM answer per item."""
    items = agent_items(24, tag, model="tiny")
    await submit(up, items)
    by_id = await wait_all_results(up, [it.id for it in items])
    assert_exactly_one_each(by_id, [it.id for it in items])
    for [rec] in by_id.values():
        assert rec.error is None and rec.completion_tokens > 0, rec

