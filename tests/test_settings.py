"""One settings model: every knob has one default, and the lower layers' settings agree.

Promises checked: `[store]` is the store's `StoreConfig` and a value set in TOML reaches the
store `up` and `run` open; bad `[store]` values are usage errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabricctl.cli.up import Daemon
from fabricctl.config import load_config
from fabricctl.errors import UsageError
from fabricctl.store.config import MiB, StoreConfig


def test_a_store_knob_set_in_toml_reaches_the_store(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[store]\nmap_size = {8 * MiB}\n'
        "segment_entries = 32\nmax_deliveries = 2\n")
    cfg = load_config(cwd=tmp_path, env={})
    assert cfg.store == StoreConfig(map_size=8 * MiB, segment_entries=32, max_deliveries=2)

    async def opened() -> tuple[StoreConfig, int]:
        daemon = Daemon(cfg, with_fleet=False)
        await daemon.start()
        try:
            assert daemon.store is not None
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
])
def test_bad_store_settings_are_usage_errors(tmp_path: Path, toml: str,
                                                          said: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(toml + "\n")
    with pytest.raises(UsageError, match=said):
        load_config(config_file=f, cwd=tmp_path, env={})
