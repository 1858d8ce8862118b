"""The light broker child: `fabricctl up`'s Daemon (broker + one simulated GPU's consumer)
with a small LMDB map, so the map grows (and the `map_grow` fault point fires) in a short run.

    python tests/reliability/rel_child.py DATA_DIR CONFIG_TOML MAP_SIZE SEGMENT_ENTRIES

It logs to stderr like `fabricctl up` ("broker listening on ..." once the socket is bound)
and runs until it is killed or a client sends Shutdown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from pathlib import Path

from fabricctl.config import load_config
from fabricctl.daemon import Daemon
from fabricctl.store.durable import StoreConfig


async def main(data: Path, config: Path, map_size: int, segment_entries: int) -> int:
    cfg = load_config(config, {"data_dir": str(data), "engine": "sim"})
    cfg = dataclasses.replace(cfg, store=StoreConfig(map_size=map_size,
                                                     segment_entries=segment_entries))
    daemon = await Daemon.start(cfg)
    await daemon.server.stop_requested.wait()
    await daemon.stop()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    sys.exit(asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]),
                              int(sys.argv[4]))))
