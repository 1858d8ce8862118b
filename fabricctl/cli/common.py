"""Plumbing every client command shares: the config, the broker connection, output rules.

Contract:
- `settings(data_dir, config)` is the effective `AppConfig` with `--data-dir` as a flag, so
  a command finds its broker by flag > `FABRICCTL_DATA_DIR` > project `fabric.toml` > user
  file > default; several brokers can therefore run side by side in different data dirs.
- `call(cfg, role, fn)` connects to that broker, awaits `fn(client)` and closes; no broker
  raises `BackendMissing` (exit 3), a broker error `BrokerError` (exit 1).
- Output: `write_json(doc)` writes one compact JSON document and a newline on stdout
  (64-bit shape signatures also appear as 16-hex-digit `shape` strings, since JSON readers
  such as jq lose integers above 2**53); `console()` is a Rich console on stdout that
  never forces colour, so `NO_COLOR`, `TERM=dumb` and pipes get plain text.
- `stdout_is_tty()` decides human tables vs plain TSV (`write_tsv`).
- Numbers, percentages, ages and bytes are formatted by `fabricctl.fmt`, the one
  formatting module the CLI shares with the dashboard; signatures by
  `fabricctl.core.signature.signature_hex`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from fabricctl.config import AppConfig, load_config
from fabricctl.core.signature import signature_hex

T = TypeVar("T")

_json = msgspec.json.Encoder()


def settings(data_dir: Path | None, config: Path | None, **flags: Any) -> AppConfig:
    """The effective configuration; None flags are not given."""
    return load_config(config, {"data_dir": data_dir, **flags})


async def with_client(cfg: AppConfig, role: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    from fabricctl.wire.client import Client

    client = await Client.connect(cfg.data_dir, role, "fabricctl")  # type: ignore[arg-type]
    try:
        return await fn(client)
    finally:
        await client.close()


def call(cfg: AppConfig, role: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run `fn(client)` against the broker of `cfg.data_dir` from synchronous code."""
    return asyncio.run(with_client(cfg, role, fn))


def query(cfg: AppConfig, what: str, arg: str = "", type: Any = Any, **kw: Any) -> Any:
    """One query's answer."""
    return call(cfg, "observer", lambda c: c.query(what, arg, type=type, **kw))


def to_builtins(obj: Any) -> Any:
    """Plain JSON-able data, with a `shape` hex string next to every `signature`."""
    data = msgspec.to_builtins(obj, enc_hook=_enc)
    return _add_hex(data)


def _enc(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _add_hex(data: Any) -> Any:
    if isinstance(data, dict):
        out = {k: _add_hex(v) for k, v in data.items()}
        sig = out.get("signature")
        if isinstance(sig, int) and "shape" not in out:
            out = {"shape": signature_hex(sig), **out}
        return out
    if isinstance(data, list):
        return [_add_hex(v) for v in data]
    return data


def write_json(doc: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.buffer.write(_json.encode(to_builtins(doc)) + b"\n")
    sys.stdout.buffer.flush()


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def console(stderr: bool = False) -> Any:
    """A Rich console; colour only where Rich detects a terminal and NO_COLOR is unset."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def write_tsv(header: list[str], rows: list[list[Any]]) -> None:
    """Plain tab-separated rows for pipes: a header line, then one line per row."""
    out = sys.stdout
    out.write("\t".join(header) + "\n")
    for row in rows:
        out.write("\t".join("" if v is None else str(v) for v in row) + "\n")
    out.flush()
