"""Security, end to end against a real `fabricctl up` process.

- The Unix socket is 0600 and a default `fabricctl up` binds no TCP socket at all.
- With `--listen` (and server.token), a wrong or missing token is refused, and so are a
  garbage first frame and an oversized one from a peer that has not authenticated.
- Nothing is pickled: no pickle/marshal/shelve (or their cousins) is imported anywhere in
  the package, and every value the broker wrote to LMDB decodes with msgspec (or the fixed
  struct layouts of keys.py/meta.py) alone.
- The results `fabricctl submit --wait` writes carry, for each id, that id's own text.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import stat
from pathlib import Path

import lmdb
import msgspec
import psutil
import pytest
from rel_broker import CONFIG, BrokerProc, child_env, fabricctl_cmd, write_config
from rel_history import PREFIXES

from fabricctl.engines.simrequest import sim_text
from fabricctl.errors import BrokerError
from fabricctl.formats.results import ResultRecord
from fabricctl.store import keys
from fabricctl.store.keys import DB_NAMES, entry_decoder, header_decoder
from fabricctl.wire.client import Client
from fabricctl.wire.protocol import HEADER, PROTOCOL_VERSION, Hello, encode, read_frame

PACKAGE = Path(__file__).resolve().parents[2] / "fabricctl"
FORBIDDEN = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
             "joblib", "copyreg"}
TOKEN = "reliability-s3cret"


def inet_sockets(pid: int) -> list[object]:
    return list(psutil.Process(pid).net_connections(kind="inet"))


def test_nothing_in_the_package_imports_a_pickler() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
                names = [getattr(a, "value", "") for a in node.args[:1]]
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {n}"  # type: ignore[attr-defined]
                      for n in names if str(n).split(".")[0] in FORBIDDEN]
    assert found == []


def jsonl(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for k in range(n):
            f.write(json.dumps({"id": f"s{k}", "model": "m",
                                "prefix": list(PREFIXES[k % len(PREFIXES)]),
                                "prompt": f"question number {k}", "max_tokens": 3 + k % 9})
                    + "\n")
    return path


def pickled(value: bytes) -> bool:
    """Looks like a pickle: protocol 2+ opens with PROTO (0x80, version) and ends with STOP."""
    return len(value) > 2 and value[0] == 0x80 and 2 <= value[1] <= 5 and value.endswith(b".")


def decode_store(data: Path) -> dict[str, int]:
    """Every value of every named database, decoded with msgspec/struct only; counts per db."""
    env = lmdb.open(str(data / "fabric.lmdb"), readonly=True, lock=False,
                    max_dbs=len(DB_NAMES) + 1)
    results = msgspec.msgpack.Decoder(ResultRecord)
    decode_run = getattr(keys, "decode_run", None)  # a "runs" db, in layouts that have one
    counts: dict[str, int] = {}
    try:
        dbs = {n.decode(): env.open_db(n, create=False) for n in DB_NAMES}
        with env.begin() as txn:
            for name, db in dbs.items():
                n = 0
                for key, value in txn.cursor(db=db):
                    assert not pickled(value), (name, key)
                    if name == "seg":
                        header_decoder.decode(value)
                    elif name == "data":
                        entry_decoder.decode(value)
                    elif name == "runs" and decode_run is not None:
                        decode_run(value)
                    elif name == "ids":
                        assert len(value) == 12  # an entry key: u64 segment + u32 offset
                    elif name == "rseq":  # a run of entry keys: count the results numbered
                        assert value and len(value) % 12 == 0, (key, value)
                        n += len(value) // 12 - 1
                    elif name == "results":
                        results.decode(value)
                    elif name == "jres":  # a job's line -> its entry, all in the key
                        assert value == b"" and len(key) == 4 + 8 + 12, (key, value)
                    elif name == "meta":
                        assert len(value) % 8 == 0, (key, value)  # packed u64 counters
                    else:
                        msgspec.msgpack.decode(value)  # a new db: msgpack, or this fails
                    n += 1
                counts[name] = n
    finally:
        env.close()
    return counts


async def test_default_up_is_private_and_its_results_and_store_are_clean(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProc.up(data, write_config(tmp_path), tmp_path, tmp_path / "up.log")
    assert await broker.start(), broker.tail()
    assert broker.proc is not None
    try:
        sock = data / "broker.sock"
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(data / "broker.lock").st_mode) == 0o600
        assert inet_sockets(broker.proc.pid) == []  # no TCP listener, no metrics port
        proc = await asyncio.create_subprocess_exec(
            *fabricctl_cmd(), "submit", "--wait", "--timeout", "60", "--data-dir", str(data),
            str(jsonl(tmp_path / "in.jsonl", 90)), cwd=tmp_path, env=child_env(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode == 0, err.decode()
        lines = [json.loads(ln) for ln in out.decode().splitlines()]
        assert sorted(r["id"] for r in lines) == sorted(f"s{k}" for k in range(90))
        for r in lines:  # each result carries its own id's text, never another item's
            assert r["error"] is None, r
            assert r["text"] == sim_text(r["id"], r["usage"]["completion_tokens"]), r
        c = await Client.connect(data, "observer", "security")
        await c.shutdown()
        await c.close()
        assert await broker.wait(30) == 0, broker.tail()
    finally:
        broker.kill()
        await broker.wait(10)
    counts = decode_store(data)
    assert counts["results"] == counts["rseq"] == counts["ids"] == 90


async def raw_tcp(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def refused(reader: asyncio.StreamReader, code: str) -> None:
    frame = await asyncio.wait_for(read_frame(reader), 10)
    assert getattr(frame, "code", None) == code, frame
    assert await asyncio.wait_for(reader.read(), 10) == b""  # and the connection is closed


async def test_tcp_listener_needs_the_token_and_refuses_bad_frames(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write_config(tmp_path, CONFIG.replace("[server]\n", f'[server]\ntoken = "{TOKEN}"\n'))
    broker = BrokerProc.up(data, config, tmp_path, tmp_path / "up.log")
    broker.argv += ["--listen", "127.0.0.1:0"]
    assert await broker.start(), broker.tail()
    assert broker.proc is not None
    try:
        listening = [c for c in inet_sockets(broker.proc.pid)
                     if c.status == psutil.CONN_LISTEN]  # type: ignore[attr-defined]
        assert len(listening) == 1 and listening[0].laddr.ip == "127.0.0.1"  # type: ignore[attr-defined]
        port = listening[0].laddr.port  # type: ignore[attr-defined]
        address = f"127.0.0.1:{port}"
        for token in ("wrong", ""):
            with pytest.raises(BrokerError) as e:
                await Client.connect(address, "consumer", "intruder", token=token)
            assert e.value.code == "auth"
        # a peer that never authenticated: garbage, an oversized header, a non-Hello frame
        reader, writer = await raw_tcp(port)
        writer.write(HEADER.pack(12) + b"\xc1" * 12)
        await refused(reader, "bad_frame")
        writer.close()
        reader, writer = await raw_tcp(port)
        writer.write(HEADER.pack((1 << 32) - 1))  # a 4 GiB frame announced, nothing sent
        await refused(reader, "frame_too_large")
        writer.close()
        reader, writer = await raw_tcp(port)
        writer.write(encode(Hello(PROTOCOL_VERSION + 41, "producer", "x", TOKEN)))
        await refused(reader, "version")
        writer.close()
        ok = await Client.connect(address, "observer", "friend", token=TOKEN)
        status = await ok.status()
        assert status["difference"] == [0, 0]
        await ok.shutdown()
        await ok.close()
        assert await broker.wait(30) == 0, broker.tail()
    finally:
        broker.kill()
        await broker.wait(10)
