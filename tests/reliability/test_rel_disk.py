"""Disk faults: the LMDB map at its ceiling, and a real ENOSPC on a small tmpfs.

Ingest is refused with a clear error (Error code "store_full" reaches the producer;
`fabricctl submit` prints it and exits 1), nothing acknowledged is lost, dispatch and
completion keep working on what is stored, and ingest resumes once there is room again:
after completions free segments, after a restart with a larger ceiling, or after a ballast
file on the full disk is deleted, without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from rel_broker import child_env, fabricctl_cmd
from rel_history import MODEL, History, check, make_item
from rel_inproc import FaultyEngine, live_broker, results, settled, until

from fabricctl.core.payload import Payload, decode_payload, encode_payload
from fabricctl.core.types import Item
from fabricctl.errors import BrokerError
from fabricctl.server.app import BrokerServer
from fabricctl.store.durable import StoreConfig
from fabricctl.supervisor.consumer import Consumer
from fabricctl.wire.client import Client

KiB, MiB = 1 << 10, 1 << 20
TINY = StoreConfig(map_size=256 * KiB, map_ceiling=1 * MiB, disk_reserve=0, segment_entries=64)


def big_item(n: int, tag: str = "d") -> Item:
    """A workload item with a 2 KB prompt, so a small map fills in a few hundred items."""
    it = make_item(n, tag)
    p = decode_payload(it.payload)
    payload = Payload(p.components, p.prompt + " " + "x" * 2000, p.component_tokens,
                      p.prompt_tokens)
    return msgspec.structs.replace(it, payload=encode_payload(payload))


class Filler:
    """Submits chunks until the broker refuses with store_full; records what was acked."""

    def __init__(self, hist: History) -> None:
        self.hist = hist
        self.n = 0
        self.refused: list[Item] = []
        self.error: BrokerError | None = None

    async def fill(self, address: Path, chunk: int = 20, limit: int = 5000) -> None:
        c = await Client.connect(address, "producer", "filler")
        try:
            while self.n < limit:
                items = [big_item(k) for k in range(self.n, self.n + chunk)]
                self.hist.invoke([it.id for it in items])
                try:
                    ack = await c.submit(items)
                except BrokerError as e:
                    self.error, self.refused = e, items
                    for it in items:
                        self.hist.refused(it.id, e.code)
                    return
                assert ack.accepted == len(items), ack
                self.hist.ok(it.id for it in items)
                self.n += chunk
        finally:
            await c.close()
        raise AssertionError(f"no store_full after {limit} items")

    async def resubmit(self, address: Path) -> None:
        """The refused chunk again: now it must be taken."""
        c = await Client.connect(address, "producer", "filler")
        try:
            ack = await c.submit(self.refused)
        finally:
            await c.close()
        assert ack.accepted == len(self.refused) and not ack.rejects, ack
        self.hist.ok(it.id for it in self.refused)
        self.n += len(self.refused)


async def drain(server: BrokerServer, n: int) -> None:
    stop = asyncio.Event()
    c = Consumer(server.state.cfg.socket_path, "drainer", MODEL, FaultyEngine("drainer"), gpu=0,
                 pull_wait_s=0.2)
    task = asyncio.ensure_future(c.run(stop))
    try:
        await until(settled(server, n), 30, f"{n} items settled")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def cli_submit(data: Path, tmp: Path, items: list[Item]) -> subprocess.CompletedProcess[str]:
    """`fabricctl submit --data-dir D FILE` as a child, while this loop serves the broker."""
    path = tmp / "more.jsonl"
    with path.open("w") as f:
        for it in items:
            f.write(msgspec.json.encode({"id": it.id, "model": it.model, "prefix": ["sys"],
                                         "prompt": "y" * 3000, "max_tokens": 4}).decode() + "\n")
    proc = await asyncio.create_subprocess_exec(
        *fabricctl_cmd(), "submit", "--data-dir", str(data), str(path), cwd=tmp,
        env=child_env(tmp), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return subprocess.CompletedProcess([], proc.returncode, out.decode(), err.decode())


async def test_map_ceiling_refuses_ingest_then_resumes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    hist = History()
    filler = Filler(hist)
    async with live_broker(data, TINY) as server:
        await filler.fill(server.state.cfg.socket_path)
        assert filler.error is not None and filler.error.code == "store_full"
        assert "ingest refused: the LMDB map reached its ceiling" in filler.error.message
        assert str(data) in filler.error.message
        cli = await cli_submit(data, tmp_path, [big_item(k, "cli") for k in range(40)])
        assert cli.returncode == 1, cli
        assert "fabricctl: error: ingest refused: the LMDB map reached its ceiling" in cli.stderr
        # the refused chunks stored nothing
        assert server.state.view.ledger.items_received == filler.n
        # dispatch and completion still work on a full map; completing frees whole segments
        await drain(server, filler.n)
        assert not server.state.store.segs
        await filler.resubmit(server.state.cfg.socket_path)  # no restart needed
        await drain(server, filler.n)
        res = await results(server.state.cfg.socket_path)
    report = check(hist, res)
    assert report.clean(), str(report)
    assert len(res) == filler.n


async def test_map_ceiling_then_restart_with_a_larger_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    hist = History()
    filler = Filler(hist)
    async with live_broker(data, TINY) as server:
        await filler.fill(server.state.cfg.socket_path)
        assert filler.error is not None and filler.error.code == "store_full"
    bigger = StoreConfig(map_size=256 * KiB, map_ceiling=64 * MiB, disk_reserve=0)
    async with live_broker(data, bigger) as server:
        rec = server.state.store.recovery
        assert rec.items == filler.n and rec.ledger_ok, rec  # everything acked is there
        await filler.resubmit(server.state.cfg.socket_path)
        await drain(server, filler.n)
        res = await results(server.state.cfg.socket_path)
    report = check(hist, res)
    assert report.clean(), str(report)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> object:
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): "
                    f"{(r.stderr or r.stdout).strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.skipif(sys.platform != "linux", reason="tmpfs mounts are a Linux test")
async def test_full_tmpfs_refuses_ingest_until_the_ballast_goes(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "6m") as mnt:
        assert isinstance(mnt, Path)
        ballast = mnt / "ballast"
        ballast.write_bytes(b"\0" * (3 * MiB))
        data = mnt / "data"
        hist = History()
        filler = Filler(hist)
        store = StoreConfig(map_size=32 * MiB, map_ceiling=32 * MiB, disk_reserve=0)
        async with live_broker(data, store) as server:
            await filler.fill(server.state.cfg.socket_path)
            assert filler.error is not None and filler.error.code == "store_full"
            assert "ingest refused: LMDB write failed" in filler.error.message
            # LMDB reports the short write as EIO; the message says where and how much is free
            assert f"data dir {data} has 0 B free" in filler.error.message, filler.error.message
            assert server.state.view.ledger.items_received == filler.n
            ballast.unlink()  # room again, and no restart
            await filler.resubmit(server.state.cfg.socket_path)
            await drain(server, filler.n)
            res = await results(server.state.cfg.socket_path)
        # and it starts again cleanly on the same (no longer full) disk
        async with live_broker(data, store) as server:
            assert server.state.store.recovery.ledger_ok and server.state.store.recovery.items == 0
    report = check(hist, res)
    assert report.clean(), str(report)
