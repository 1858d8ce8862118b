"""The ids a reader has seen, with the line each first stood on, in bounded memory.

Contract: `SeenIds.first(id)` is the line number `add(id, line)` recorded for `id`, or None.
The newest `ram_max` ids stay in a dict; past that the dict is written, in one transaction,
to a temporary LMDB environment (keys: the id's 128-bit xxh3 digest, so any id fits a key)
and emptied, so a reader of a file of any length holds at most `ram_max` ids in RAM plus
LMDB's mapped pages. `close()` removes the environment (a reader that was never past
`ram_max` made none). Why: `drafts` refuses a repeated id by naming its first line, and a
dict of every id cost about 135 bytes a line.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    import lmdb

RAM_MAX = 1 << 18  # ids kept in the dict before it is spilled (about 35 MiB)
_LINE = struct.Struct("<Q")
_MAP_START = 1 << 26  # the environment's first map size; doubled whenever it is full


class SeenIds:
    """Why: refusing a duplicate id needs every id seen; RAM must not grow with the file."""

    def __init__(self, ram_max: int | None = None) -> None:
        self.ram_max = RAM_MAX if ram_max is None else ram_max
        self._ram: dict[str, int] = {}
        self._dir: Path | None = None
        self._env: lmdb.Environment | None = None
        self._txn: lmdb.Transaction | None = None  # the read view of what was spilled

    def first(self, id_: str) -> int | None:
        line = self._ram.get(id_)
        if line is None and self._txn is not None:
            raw = self._txn.get(_key(id_))
            if raw is not None:
                return int(_LINE.unpack(raw)[0])
        return line

    def add(self, id_: str, line: int) -> None:
        self._ram[id_] = line
        if len(self._ram) >= self.ram_max:
            self._spill()

    def _spill(self) -> None:
        import lmdb  # only a reader past `ram_max` ids needs it

        pack = _LINE.pack
        if self._env is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fabricctl-ids-"))
            self._env = lmdb.open(str(self._dir), map_size=_MAP_START, subdir=True,
                                  sync=False, metasync=False, lock=False, readahead=False,
                                  writemap=True)
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        while True:
            try:
                with self._env.begin(write=True) as txn:  # rows made as they are put
                    txn.cursor().putmulti(((_key(i), pack(n)) for i, n in self._ram.items()),
                                          overwrite=False)
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self._ram.clear()
        self._txn = self._env.begin(buffers=False)

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._env is not None:
            self._env.close()
            self._env = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _key(id_: str) -> bytes:
    return xxhash.xxh3_128_digest(id_.encode("utf-8", "surrogatepass"))
