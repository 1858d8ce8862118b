"""Uploaded files of the OpenAI Batch API: their records in a small LMDB, their bytes beside it.

Contract: `FileStore(files_dir)` opens (creating) `files_dir/files.lmdb`, an LMDB environment
of its own (the broker's store never sees it), and keeps each file's bytes as one plain file
`files_dir/<id>.jsonl`. An upload is written to `part_path(id)` first; `add(record)` then
fsyncs and renames it into place before the record is committed, so a record always has
its blob (a crash leaves at most an orphaned `.part`, removed at the next open). `get`,
`list` (oldest first), `delete` (record, then blob) and `size_of` / `set_size` / `drop_size`
(the cached sizes of the virtual output files the API derives from a batch) are short
synchronous transactions on the caller's thread. Only the daemon's API uses this, from the
event loop thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import msgspec

from fabricctl.errors import StoreFullError

MiB = 1 << 20
_FILE = b"f:"  # f:<id> -> FileRecord
_SIZE = b"s:"  # s:<virtual file id> -> its size in bytes (known once its batch ended)


class FileRecord(msgspec.Struct, kw_only=True):
    """Why: what files.retrieve reports of an upload, and what batches.create checks it by."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    sha256: str
    lines: int  # input lines, blank ones included (items number their line from 1)
    requests: int  # request lines (not blank)
    urls: dict[str, int] = {}  # each url its lines name -> the first line naming it


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(FileRecord)


class FileStore:
    """Why: uploads must survive restarts, and their metadata must not share the broker's env."""

    def __init__(self, files_dir: Path, map_size: int = 16 * MiB,
                 map_ceiling: int = 1 << 30) -> None:
        self.dir = Path(files_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.map_ceiling = map_ceiling
        self.env = lmdb.open(str(self.dir / "files.lmdb"), map_size=map_size, subdir=True,
                             max_dbs=0, sync=True, metasync=True)
        for stale in self.dir.glob("*.part"):
            stale.unlink(missing_ok=True)

    def blob_path(self, file_id: str) -> Path:
        return self.dir / f"{file_id}.jsonl"

    def part_path(self, file_id: str) -> Path:
        return self.dir / f"{file_id}.part"

    def _write(self, key: bytes, value: bytes | None) -> None:
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    if value is None:
                        txn.delete(key)
                    else:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                size = int(self.env.info()["map_size"])
                if size >= self.map_ceiling:
                    raise StoreFullError(f"the files store in {self.dir} is full") from None
                self.env.set_mapsize(min(size * 2, self.map_ceiling))

    def add(self, record: FileRecord) -> None:
        """Make an upload durable: its `.part` (fsynced by the caller) becomes its blob."""
        os.replace(self.part_path(record.id), self.blob_path(record.id))
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._write(_FILE + record.id.encode(), _enc.encode(record))

    def get(self, file_id: str) -> FileRecord | None:
        with self.env.begin() as txn:
            raw = txn.get(_FILE + file_id.encode())
        return None if raw is None else _dec.decode(raw)

    def list(self) -> list[FileRecord]:
        """Every upload, oldest first."""
        with self.env.begin() as txn:
            cur = txn.cursor()
            out = []
            if cur.set_range(_FILE):
                for key, raw in cur:
                    if not key.startswith(_FILE):
                        break
                    out.append(_dec.decode(raw))
        out.sort(key=lambda r: (r.created_at, r.id))
        return out

    def delete(self, file_id: str) -> bool:
        """Forget an upload and remove its blob; False when there was none."""
        if self.get(file_id) is None:
            return False
        self._write(_FILE + file_id.encode(), None)
        self.blob_path(file_id).unlink(missing_ok=True)
        return True

    def size_of(self, virtual_id: str) -> int | None:
        with self.env.begin() as txn:
            raw = txn.get(_SIZE + virtual_id.encode())
        return None if raw is None else int(raw)

    def set_size(self, virtual_id: str, size: int) -> None:
        self._write(_SIZE + virtual_id.encode(), str(size).encode())

    def drop_size(self, virtual_id: str) -> None:
        """Forget a virtual file's size (the file expired); nothing when none is kept."""
        if self.size_of(virtual_id) is not None:
            self._write(_SIZE + virtual_id.encode(), None)

    def close(self) -> None:
        self.env.close()
