"""One GPU-host agent in front of the real CPU vLLM, joining a broker with no GPUs over TLS.

`fabricctl up --gpus none --listen --tls-cert --tls-key --token` and `fabricctl consume
--gpus 0 --engine vllm --tls-ca` whose config launches the CPU build of vLLM with the tiny
model: the agent starts the server through its launcher (logs in its own data dir), its
consumer joins the broker, a small workload gets exactly one real result per item, and
SIGKILL of the agent stops its vLLM server with it (the server is tethered to the agent: the
kernel sends it SIGTERM, and it stops its EngineCore). The graceful SIGTERM of an agent is
tested on the fake server (`tests/test_agents.py`); here only the case a supervisor cannot
clean up after itself runs, to keep the real-engine suite within CI's time.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import SERVER_ARGS, VENV
from ports import free_port, free_port_pair

from fabricctl.wire.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the multi-host helpers

from agent_helpers import (
    TOKEN,
    Child,
    agent_items,
    all_gone,
    child_env,
    consumers,
    done_items,
    fabricctl_cmd,
    make_cert,
    needs_openssl,
    results,
    submit,
    wait_until,
)

from fabricctl.config import AppConfig, ConsumerSettings, VllmSettings, to_toml
from fabricctl.supervisor.launch_spec import vllm_cpu_spec

pytestmark = [pytest.mark.real_vllm, needs_openssl]


def agent_config(tmp: Path, model: Path) -> Path:
    cpu = vllm_cpu_spec(VENV, str(model), "tiny", tmp / "agent-data" / "logs")
    cfg = AppConfig(
        data_dir=tmp / "agent-data", engine="vllm", model=str(model), served_model_name="tiny",
        vllm=VllmSettings(command=list(cpu.command), model_flag=cpu.model_flag,
                          port_base=free_port_pair(), ready_timeout_s=240.0,
                          restart_backoff_s=[1.0], extra_args=list(SERVER_ARGS),
                          env=dict(cpu.env)),
        consumer=ConsumerSettings(max_batch_size=16, max_batch_tokens=16 * 512,
                                  max_input_len=1000))
    path = tmp / "agent.toml"
    path.write_text(to_toml(cfg))
    return path


async def test_one_agent_in_front_of_the_real_vllm(tiny_model: Path, tmp_path: Path) -> None:
    stop = signal.SIGKILL
    cert, key = make_cert(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    data = tmp_path / "data"
    broker_cfg = tmp_path / "broker.toml"
    broker_cfg.write_text('model = "tiny"\n[server]\nheartbeat_s = 0.5\n'
                          'heartbeat_timeout_s = 30.0\n')
    broker = Child([*fabricctl_cmd(), "up", "--gpus", "none", "--listen", address,
                    "--tls-cert", str(cert), "--tls-key", str(key), "--token", TOKEN,
                    "--data-dir", str(data), "--config", str(broker_cfg)],
                   child_env(tmp_path), tmp_path, tmp_path / "broker.log")
    agent = Child([*fabricctl_cmd(), "consume", "--broker", address, "--gpus", "0",
                   "--engine", "vllm", "--name", "real", "--tls-ca", str(cert),
                   "--config", str(agent_config(tmp_path, tiny_model))],
                  child_env(tmp_path, FABRICCTL_TOKEN=TOKEN), tmp_path,
                  tmp_path / "agent.log")
    servers: list[psutil.Process] = []
    try:
        await broker.start()
        await broker.wait_line("broker listening on", 60)
        await agent.start()
        await wait_until(lambda: _eq(consumers(data), ["real-gpu0"]), 240, "the agent's vLLM")
        assert agent.proc is not None
        servers += psutil.Process(agent.proc.pid).children(recursive=True)  # and workers
        assert any("vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
                   for p in servers), "the agent launched no vLLM server"
        items = agent_items(48, "v", model="tiny")
        await submit(data, items)
        await wait_until(lambda: _ge(done_items(data), len(items)), 120, "the workload")
        recs = await results(data)
        assert Counter(r.id for r in recs) == Counter(it.id for it in items)
        for r in recs:
            assert r.error is None, r
            assert r.finish_reason in ("stop", "length"), r
            assert r.completion_tokens > 0 and r.gpu == 0, r
        doc = await _status(data)
        eng = doc["extra"]["engines"]["real-gpu0"]
        assert eng["host"] and not eng["simulated"], eng
        agent.signal(stop)
        assert await agent.wait(60) == -stop, agent.tail()
        # SIGKILL: the tethered server gets SIGTERM from the kernel and stops its EngineCore
        await wait_until(lambda: all_gone(servers), 60, "the agent's vLLM processes")
        gone = await broker.wait_line("consumer real-gpu0 l", 30)
        assert "(connection closed)" in gone, gone
    finally:
        agent.kill()
        broker.kill()
        for p in servers:  # in their own sessions: a killed agent leaves them behind
            with contextlib.suppress(psutil.Error):
                p.kill()
        for c in (agent, broker):
            if c.proc is not None:
                await c.wait(30)



async def _eq(value: object, want: object) -> bool:
    return await value == want  # type: ignore[misc]


async def _ge(value: object, n: int) -> bool:
    return await value >= n  # type: ignore[misc, operator]


async def _status(data: Path) -> Any:
    from agent_helpers import query

    return await query(data, Client.status)
