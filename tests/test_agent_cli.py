"""`fabricctl consume --gpus`: the agent's configuration and its usage errors (exit 2).

`--gpus` takes distinct indices; `--engine` is sim, vllm or openai; sim gets one simulated
GPU per index, openai one endpoint per GPU (from `--endpoint` or `vllm.endpoints`), vllm
the indices as the GPUs to launch on. A TLS CA file that does not exist is a usage error
before anything connects.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import clean_env, fabricctl

from fabricctl.cli.consume import agent_config
from fabricctl.cli.support import parse_gpus
from fabricctl.config import AppConfig, VllmSettings
from fabricctl.errors import UsageError


def test_gpus_are_distinct_indices() -> None:
    assert parse_gpus("0,1") == [0, 1]
    assert parse_gpus(" 3 ") == [3]
    for bad in ("", "a", "0,0", "-1", ","):
        with pytest.raises(UsageError, match="--gpus"):
            parse_gpus(bad)


def test_each_engine_gets_one_engine_per_gpu() -> None:
    cfg = AppConfig()
    sim = agent_config(cfg, "sim", [2, 5], None)
    assert sim.sim.gpus == 2 and sim.gpus == [2, 5] and sim.engine == "sim"
    vllm = agent_config(cfg, "vllm", [0, 1], None)
    assert vllm.gpus == [0, 1] and vllm.engine == "vllm"
    oa = agent_config(cfg, "openai", [0, 1], "http://a:1, http://b:2")
    assert oa.vllm.endpoints == ["http://a:1", "http://b:2"]
    conf = AppConfig(vllm=VllmSettings(endpoints=["http://c:3"]))
    assert agent_config(conf, "openai", [4], None).vllm.endpoints == ["http://c:3"]
    with pytest.raises(UsageError, match="one endpoint per GPU"):
        agent_config(cfg, "openai", [0, 1], "http://a:1")
    with pytest.raises(UsageError, match="--engine must be one of sim, vllm, openai"):
        agent_config(cfg, "auto", [0], None)


def test_usage_errors_exit_2_before_connecting(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    bad = fabricctl("consume", "--broker", "127.0.0.1:9", "--gpus", "0,0", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and b"distinct NVML GPU indices" in bad.stderr, bad.stderr
    ca = fabricctl("consume", "--broker", "127.0.0.1:9", "--gpus", "0", "--tls-ca",
                   str(tmp_path / "none.crt"), env=env, cwd=tmp_path)
    assert ca.returncode == 2 and b"TLS CA file" in ca.stderr, ca.stderr
