"""Plumbing every client command shares: the config, the broker connection, output rules.

Contract:
- `settings(data_dir, config)` is the effective `AppConfig` with `--data-dir` as a flag, so a
  command finds its broker by flag > `FABRICCTL_DATA_DIR` > project `fabric.toml` > user file >
  default; several brokers can run side by side in different data dirs.
- `call(cfg, role, fn)` connects to that broker, awaits `fn(client)` and closes; no broker raises
  `BackendMissing` (exit 3), a broker error `BrokerError` (exit 1).
- Output: `write_json(doc)` writes one compact JSON document and a newline on stdout (64-bit shape
  signatures also as 16-hex-digit `shape` strings: jq loses integers above 2**53); `console()` is
  a Rich console on stdout that never forces colour (`NO_COLOR`, `TERM=dumb` and pipes get plain
  text) and on a pipe is `PIPE_WIDTH` wide whatever `COLUMNS` says, so a table takes its natural
  width: no cell cut, no line folded.
- `stdout_is_tty()` decides human tables vs plain TSV (`write_tsv`).
- `fitted_table(cols, rows, width)` is a Rich table that fits `width` columns of a terminal, each
  `Col` saying how it gives way: kept ones (ids, signatures, states, numbers) are never cut;
  shrinkable ones are cut with "…" down to their `shrink` width (never below their header; a
  `tail` one loses its start, so a path keeps its file name); droppable ones are hidden, blank
  ones (only `NOTHING`) first, then the highest `drop`, until the rest fits, and the caption names
  them; a header is never blank or cut. The widths are `fit_widths`'s (pure arithmetic).
- Numbers, percentages, ages and bytes are formatted by `fabricctl.fmt` (shared with the
  dashboard); signatures by `fabricctl.core.signature.signature_hex`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from fabricctl.config import AppConfig, load_config
from fabricctl.core.signature import signature_hex

T = TypeVar("T")

PIPE_WIDTH = 10_000  # the width of a Rich console on a pipe: no table is ever that wide
NOTHING = ("", "-", "0")  # cells that say nothing: a column of only these is hidden first

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
    """A Rich console; colour only where Rich detects a terminal and NO_COLOR is unset. On
    stdout through a pipe it is `PIPE_WIDTH` wide: tables at their natural width."""
    from rich.console import Console

    if not stderr and not stdout_is_tty():
        return Console(highlight=False, width=PIPE_WIDTH)
    return Console(stderr=stderr, highlight=False)


def write_tsv(header: list[str], rows: list[list[Any]]) -> None:
    """Plain tab-separated rows for pipes: a header line, then one line per row."""
    out = sys.stdout
    out.write("\t".join(header) + "\n")
    for row in rows:
        out.write("\t".join("" if v is None else str(v) for v in row) + "\n")
    out.flush()


@dataclass(frozen=True)
class Col:
    """Why: a column of a table a user reads and copies from says how it gives way on a
    narrow terminal (kept whole, cut down to `shrink`, or hidden), so ids never are."""

    header: str
    right: bool = False  # right-justified (numbers)
    shrink: int = 0  # 0: never cut; else the narrowest it may be cut to, with "…"
    drop: int = 0  # 0: always shown; else hidden when the rest does not fit, highest first
    tail: bool = False  # cut at the start ("…/examples/batch.jsonl": a path's file name stays)


def table_width(widths: Sequence[int]) -> int:
    """The columns a Rich `Table` with its default box and padding takes for these content
    widths: one space either side of each cell, a rule between cells and at both edges."""
    return sum(widths) + 3 * len(widths) + 1


def fit_widths(cols: Sequence[Col], natural: Sequence[int], blank: Sequence[bool],
               width: int) -> list[int | None]:
    """Each column's content width (None: hidden) for a table `width` columns wide.

    `natural` is each column's widest cell or header, `blank` whether every cell says
    nothing (`NOTHING`). Each column starts at its least width (its natural one; a
    shrinkable one's `shrink`, but never below its header); droppable columns are hidden,
    blank ones first, then by `drop` from the highest, until the table fits, and blank ones
    still shown too while a shrinkable column would be cut; the space left goes to
    shrinkable columns up to their natural width, the least cut first (so most cells end
    whole). Kept columns that
    still do not fit (a very narrow terminal) keep their natural width: Rich folds them."""
    least = [n if not c.shrink else min(n, max(c.shrink, len(c.header)))
             for c, n in zip(cols, natural, strict=True)]
    shown = [True] * len(cols)

    def used() -> int:
        return table_width([w for w, on in zip(least, shown, strict=True) if on])

    order = sorted((i for i, c in enumerate(cols) if c.drop),
                   key=lambda i: (not blank[i], -cols[i].drop))
    for i in order:
        if used() <= width:
            break
        shown[i] = False
    for i in order:  # a blank column also gives way to a cut one
        if blank[i] and shown[i] and used() + sum(
                n - w for c, n, w, on in zip(cols, natural, least, shown, strict=True)
                if c.shrink and on) > width:
            shown[i] = False
    out: list[int | None] = [w if on else None for w, on in zip(least, shown, strict=True)]
    spare = width - used()
    for i in sorted(range(len(cols)), key=lambda i: natural[i] - least[i]):
        w = out[i]
        if w is not None and cols[i].shrink and spare > 0:
            more = min(spare, natural[i] - w)
            out[i] = w + more
            spare -= more
    return out


def fitted_table(cols: Sequence[Col], rows: Sequence[Sequence[Any]], width: int,
                 hint: str = "", **table: Any) -> Any:
    """A Rich `Table` of `rows` (cells: str or Rich `Text`) that fits `width` columns
    (`fit_widths`), `table` going to `Table`; when columns were hidden to fit, its caption
    names them, then `hint` (where to see them)."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    plain = [[c.plain if isinstance(c, Text) else str(c) for c in r] for r in rows]
    natural = [max([cell_len(c.header), *(cell_len(r[i]) for r in plain)])
               for i, c in enumerate(cols)]
    blank = [all(r[i].strip() in NOTHING for r in plain) for i in range(len(cols))]
    widths = fit_widths(cols, natural, blank, width)
    t = Table(**table)
    for c, w in zip(cols, widths, strict=True):
        if w is not None:
            t.add_column(c.header, justify="right" if c.right else "left", width=w,
                         no_wrap=bool(c.shrink), overflow="ellipsis" if c.shrink else "fold")
    for r in rows:
        t.add_row(*(_tail(v, w) if c.tail else v
                    for c, v, w in zip(cols, r, widths, strict=True) if w is not None))
    hidden = [c.header for c, w in zip(cols, widths, strict=True) if w is None]
    if hidden:
        t.caption = Text(f"hidden at {width} columns: {', '.join(hidden)}{hint}")
        t.caption_justify = "left"
    return t


def _tail(cell: Any, width: int) -> Any:
    """A str cell wider than `width` cut at its start: "…" and its last characters."""
    if isinstance(cell, str) and len(cell) > width:
        return "…" + cell[len(cell) - width + 1:]
    return cell
