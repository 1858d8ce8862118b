"""One settings model: every knob has one default, and the lower layers' settings agree.

Promises checked: a default `AppConfig` translates into the daemon's `ServerConfig` and the
launcher's `LaunchSpec` with exactly their own defaults (the shared knobs take theirs from
the configuration), so no layer runs with a default of its own for a knob the file has;
`[store]` is the store's `StoreConfig` and a value set in TOML reaches the store `up` and
`run` open; bad `[store]`, `[vllm] restart_backoff_s` and `start_attempts` values are
usage errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from fabricctl.config import AppConfig, ServerSettings, VllmSettings, load_config
from fabricctl.daemon import Daemon, server_config
from fabricctl.errors import UsageError
from fabricctl.server.config import ServerConfig
from fabricctl.store.config import MiB, StoreConfig
from fabricctl.supervisor.launch_spec import LaunchSpec
from fabricctl.supervisor.vllm_fleet import launch_spec


def test_a_default_config_gives_the_daemon_and_the_launcher_their_defaults(
        tmp_path: Path) -> None:
    cfg = dataclasses.replace(AppConfig(), data_dir=tmp_path)
    assert server_config(cfg) == ServerConfig(tmp_path)
    assert launch_spec(cfg) == LaunchSpec(model=cfg.model, served_model_name=cfg.model_name,
                                          logs_dir=str(tmp_path / "logs"))
    assert ServerConfig(tmp_path).heartbeat_timeout_s == ServerSettings().heartbeat_timeout_s
    spec, vllm = LaunchSpec(model="m", served_model_name="m", logs_dir="x"), VllmSettings()
    assert (spec.port_base, spec.ready_timeout_s, list(spec.restart_backoff_s),
            spec.start_attempts) == (vllm.port_base, vllm.ready_timeout_s,
                                     vllm.restart_backoff_s, vllm.start_attempts)


def test_a_store_knob_set_in_toml_reaches_the_store(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[store]\nmap_size = {8 * MiB}\n'
        "segment_entries = 32\nmax_deliveries = 2\n")
    cfg = load_config(cwd=tmp_path, env={})
    assert cfg.store == StoreConfig(map_size=8 * MiB, segment_entries=32, max_deliveries=2)

    async def opened() -> tuple[StoreConfig, int]:
        daemon = await Daemon.start(cfg, with_fleet=False)
        try:
            return daemon.store.store_cfg, daemon.store.env.map_size
        finally:
            await daemon.stop()

    store_cfg, map_size = asyncio.run(opened())
    assert store_cfg == cfg.store and map_size == 8 * MiB


@pytest.mark.parametrize(("toml", "said"), [
    ("[store]\nmap_size = 0", "store.map_size must be > 0"),
    ("[store]\ndisk_reserve = -1", "store.disk_reserve must be >= 0"),
    ("[store]\nsegment_entries = 1.5", "store.segment_entries must be int"),
    ("[store]\nmap_sise = 1", "unknown key store.map_sise"),
    ("[vllm]\nrestart_backoff_s = []", "vllm.restart_backoff_s must be a list"),
    ("[vllm]\nrestart_backoff_s = [1, -2]", "vllm.restart_backoff_s must be a list"),
    ('[vllm]\nrestart_backoff_s = ["1"]', "vllm.restart_backoff_s must be a list"),
    ("[vllm]\nstart_attempts = 0", "vllm.start_attempts must be an integer >= 1"),
])
def test_bad_store_and_backoff_settings_are_usage_errors(tmp_path: Path, toml: str,
                                                        said: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(toml + "\n")
    with pytest.raises(UsageError, match=said):
        load_config(config_file=f, cwd=tmp_path, env={})


def test_a_backoff_schedule_in_toml_reaches_the_launcher(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[vllm]\nrestart_backoff_s = [0.5, 3]\nready_timeout_s = 42\n"
                 "start_attempts = 5\n")
    spec = launch_spec(load_config(config_file=f, cwd=tmp_path, env={}))
    assert (spec.restart_backoff_s, spec.ready_timeout_s, spec.start_attempts) == (
        (0.5, 3.0), 42, 5)
