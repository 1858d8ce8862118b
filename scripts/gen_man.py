#!/usr/bin/env python3
"""Generate fabricctl's man pages from its Typer app: one page per command and subcommand.

Contract: `build_pages()` walks `typer.main.get_command(fabricctl.cli.app)` by duck typing
(`list_commands`/`get_command`, hidden commands and options skipped) and returns
{file name: roff text} for `fabricctl.1`, `fabricctl-<cmd>.1` and `fabricctl-<group>-<cmd>.1`.
NAME, SYNOPSIS, DESCRIPTION, OPTIONS and COMMANDS come from the app (the same help records
`--help` shows); EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES and SEE ALSO are hand-written in
`man_prose.py`. The header carries the fixed `MAN_DATE` and the package version, never
today's date, so generation is deterministic: the same app gives the same bytes.

    python scripts/gen_man.py            # rewrite man/
    python scripts/gen_man.py --out DIR  # write elsewhere (the test compares DIR with man/)
    python scripts/gen_man.py --check    # exit 1 if man/ is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import man_prose  # noqa: E402

MAN_DATE = "2026-11-29"  # bump by hand with a release; never today's date
MANUAL = "fabricctl Manual"


def esc(text: str) -> str:
    """Escape text for roff: backslashes, hyphens (as minus signs), a leading . or '."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in out.split("\n"):
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _description(help_text: str | None) -> list[str]:
    """A command's help as roff, split into paragraphs as `--help` splits it
    (`fabricctl.cli.helpfmt.paragraphs`): a flowed one is filled, a literal (`\\b`) one keeps
    its lines."""
    from fabricctl.cli.helpfmt import paragraphs

    r: list[str] = []
    for i, p in enumerate(paragraphs(help_text)):
        if i:
            r.append(".PP")
        if p.literal:
            r += [".nf", *(esc(line) for line in p.text.splitlines()), ".fi"]
        else:
            r.append(esc(p.text))
    return r


def _term(record: str, is_argument: bool) -> str:
    """A help record's first column as roff: names bold, metavar italic."""
    if is_argument:
        name, _, metavar = record.partition(" ")
        return f"\\fI{esc(name)}\\fR"
    names = record.split(", ")
    last, _, metavar = names[-1].partition(" ")
    names[-1] = last
    term = ", ".join(f"\\fB{esc(n)}\\fR" for n in names)
    return term + (f" \\fI{esc(metavar)}\\fR" if metavar else "")


def _walk(cmd: Any, ctx: Any, path: list[str], out: list[tuple[list[str], Any, Any]]) -> None:
    import typer

    out.append((path, cmd, ctx))
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            _walk(sub, typer.Context(sub, info_name=name, parent=ctx), [*path, name], out)


def commands() -> list[tuple[list[str], Any, Any]]:
    """(path, command, context) for the root and every command below it, in help order."""
    import typer

    from fabricctl.cli.app import app

    root = typer.main.get_command(app)
    out: list[tuple[list[str], Any, Any]] = []
    _walk(root, typer.Context(root, info_name="fabricctl"), [], out)
    return out


def page_name(path: list[str]) -> str:
    return "-".join(["fabricctl", *path])


def render(path: list[str], cmd: Any, ctx: Any, version: str, pages: list[str]) -> str:
    name = page_name(path)
    key = " ".join(path)
    full = " ".join(["fabricctl", *path])
    short = cmd.get_short_help_str(limit=200) if path else (cmd.help or "").split("\n")[0]
    r = [f'.TH "{esc(name.upper())}" "1" "{MAN_DATE}" "fabricctl {version}" "{MANUAL}"',
         ".SH NAME", f"{esc(name)} \\- {esc(short.rstrip('.'))}",
         ".SH SYNOPSIS", f".B {esc(full)}"]
    r.append(esc(" ".join(cmd.collect_usage_pieces(ctx))))
    r.append(".SH DESCRIPTION")
    r += _description(cmd.help)
    extra = man_prose.DESCRIPTION.get(key)
    if extra:
        r += [".PP", extra.strip()]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    args = [p for p in params if p.param_type_name == "argument"]
    opts = [p for p in params if p.param_type_name != "argument"]
    for title, group in (("ARGUMENTS", args), ("OPTIONS", opts)):
        records = [(p, p.get_help_record(ctx)) for p in group]
        records = [(p, rec) for p, rec in records if rec is not None]
        if records:
            r.append(f".SH {title}")
            for p, (first, text) in records:
                r += [".TP", _term(first, p.param_type_name == "argument"),
                      esc(text) if text else "(no description)"]
    if hasattr(cmd, "list_commands"):
        r.append(".SH COMMANDS")
        for sub_name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, sub_name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            r += [".TP", f"\\fB{esc(sub_name)}\\fR",
                  esc(sub.get_short_help_str(limit=200)),
                  f"See \\fB{esc(page_name([*path, sub_name]))}\\fR(1)."]
    r += [".SH EXIT STATUS", man_prose.exit_status(key).strip()]
    r += [".SH ENVIRONMENT", man_prose.ENVIRONMENT.strip()]
    r += [".SH FILES", man_prose.FILES.strip()]
    examples = man_prose.EXAMPLES.get(key, [])
    if examples:
        r.append(".SH EXAMPLES")
        for what, cmdline in examples:
            r += [".PP", esc(what), ".PP", ".RS 4", ".nf", esc(cmdline), ".fi", ".RE"]
    r += [".SH SEE ALSO", man_prose.see_also(name, pages)]
    return "\n".join(r) + "\n"


def build_pages() -> dict[str, str]:
    from fabricctl import __version__

    found = commands()
    names = [page_name(path) for path, _, _ in found]
    return {page_name(path) + ".1": render(path, cmd, ctx, __version__, names)
            for path, cmd, ctx in found}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "man", help="directory (default: man/)")
    ap.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = ap.parse_args(argv)
    pages = build_pages()
    out: Path = args.out
    if args.check:
        stale = sorted(n for n, text in pages.items()
                       if not (out / n).is_file() or (out / n).read_text() != text)
        extra = sorted(p.name for p in out.glob("*.1") if p.name not in pages)
        for n in stale + extra:
            print(f"man page out of date: {out / n}", file=sys.stderr)
        if stale or extra:
            print("run `python scripts/gen_man.py` and commit man/", file=sys.stderr)
        return 1 if stale or extra else 0
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.1"):
        if old.name not in pages:
            old.unlink()
    for n, text in pages.items():
        (out / n).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
