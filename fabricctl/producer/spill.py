"""A sort of more records than memory holds: sorted runs spilled to temporary files, merged.

Contract: `SpillSort.add(key, payload)` takes records in any order; iterating the sort gives
every record once, by `key` (ties in the order they were added), whatever their number,
holding at most `run_bytes` of payload (plus one record per run while merging) in memory.
A key is any msgpack-encodable value whose decoded form compares as the original does
(tuples come back as lists: compare like with like). Runs go to `dir` (default: the
system's temporary directory) as length-prefixed msgpack records and are deleted when the
iteration ends or `close()` is called. The table producer sorts its rows by their planned
place, and its answers back into input order, with it.
"""

from __future__ import annotations

import heapq
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

RUN_BYTES = 64 << 20  # what records hold (estimated) before a run is sorted and spilled
RECORD_BYTES = 160  # a record's Python objects beyond its payload and key text
_LEN = struct.Struct("<I")


class SpillSort:
    """Why: the table producer orders tens of millions of rows in flat memory."""

    def __init__(self, run_bytes: int = RUN_BYTES, dir: Path | None = None) -> None:
        self.run_bytes, self.dir = run_bytes, dir
        self._buf: list[tuple[Any, int, bytes]] = []
        self._held = 0
        self._seq = 0  # keeps equal keys in the order they came
        self._runs: list[IO[bytes]] = []
        self._enc = msgspec.msgpack.Encoder()
        self.count = 0

    def add(self, key: Any, payload: bytes) -> None:
        self._buf.append((key, self._seq, payload))
        self._seq += 1
        self.count += 1
        self._held += len(payload) + _size(key) + RECORD_BYTES
        if self._held >= self.run_bytes:
            self._spill()

    def _spill(self) -> None:
        self._buf.sort()  # (key, seq, payload): seq is unique, payloads never compared
        # kept open until the merge ends: one run
        fp = tempfile.TemporaryFile(dir=self.dir, prefix="fabricctl-sort-")  # noqa: SIM115
        for rec in self._buf:
            data = self._enc.encode(rec)
            fp.write(_LEN.pack(len(data)))
            fp.write(data)
        fp.flush()
        fp.seek(0)
        self._runs.append(fp)
        self._buf, self._held = [], 0

    def __iter__(self) -> Iterator[tuple[Any, bytes]]:
        """Every record by key, once; the runs are deleted after."""
        try:
            if not self._runs:
                self._buf.sort()  # (key, seq, payload): seq is unique, payloads never compared
                for key, _, payload in self._buf:
                    yield key, payload
            else:
                if self._buf:
                    self._spill()
                runs = [_read_run(fp) for fp in self._runs]
                for key, _, payload in heapq.merge(*runs):
                    yield key, payload
        finally:
            self.close()

    def close(self) -> None:
        for fp in self._runs:
            fp.close()
        self._runs, self._buf = [], []


def _read_run(fp: IO[bytes]) -> Iterator[tuple[Any, int, bytes]]:
    dec = msgspec.msgpack.Decoder()
    read = fp.read
    while head := read(_LEN.size):
        key, seq, payload = dec.decode(read(_LEN.unpack(head)[0]))
        yield _frozen(key), seq, payload


def _frozen(key: Any) -> Any:
    """A decoded key as the tuple it was added as (msgpack gives lists back)."""
    return tuple(_frozen(k) for k in key) if isinstance(key, list) else key


def _size(key: Any) -> int:
    """A key's text bytes, roughly (its strings and bytes, and 8 a number)."""
    if isinstance(key, str | bytes):
        return len(key) + 50
    if isinstance(key, tuple | list):
        return sum(_size(k) for k in key) + 56
    return 28
