"""`--help` that shows what was written: the Typer command and group classes every command uses.

Contract: `HelpCommand` and `HelpGroup` (Typer's `TyperCommand` and `TyperGroup`, given as
`cls=` to every `app.command`/`group.command` and `typer.Typer` of `fabricctl.cli`) render
`--help` with Typer's Rich panels, but literally and flowing:
- Help text is never read as Rich markup: every `[...]` written in a docstring or an option's
  help (`[producer] tokenizer`, `[[servers]]`, `fabricctl[ray]`) is shown as written.
- A command's help flows: lines separated by a single newline are one paragraph, wrapped to the
  terminal width; a blank line starts a new paragraph. A paragraph whose first line is `\\b`
  alone (Click's marker) is literal: its line breaks and indentation (relative to its
  first line) are kept (lists, examples). The first paragraph is the summary and always
  flows.
  Option help is flowed by Typer itself (the same rules).
- A flag (`--json`, `--verbose`) shows no type in its row (Typer would print `<bool>`).
The help strings themselves are not changed: the escaped, flowed text is put in place only
while one `--help` renders and the originals are restored after, so `scripts/gen_man.py`,
which reads `cmd.help` and each option's help record, sees the text as written.
`paragraphs(text)` is the one split into paragraphs (flowed or literal) that the rendering,
the man page generator and `tests/test_help.py` share. With Rich absent or another
`rich_markup_mode`, Click's or Typer's own formatting runs unchanged.
Importing this module costs Typer only; Rich is imported when a help is rendered.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from typer import _click as click  # Typer's own Click (typer.core's base classes use it)
from typer.core import HAS_RICH, TyperCommand, TyperGroup

__all__ = ["HelpCommand", "HelpGroup", "Paragraph", "paragraphs"]

LITERAL = "\b"  # Click's marker: a paragraph whose first line is this keeps its line breaks
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class Paragraph:
    """Why: the renderer, the man pages and the help test must agree on what flows."""

    text: str  # flowed: one line; literal: its lines, the marker line dropped
    literal: bool


def paragraphs(help_text: str | None) -> list[Paragraph]:
    """A command's help as paragraphs: dedented (`inspect.cleandoc`), cut at a `\\f` line
    (Click's end of help), split at blank lines; a paragraph opening with a `\\b` line is
    literal, any other has its lines joined by single spaces."""
    text = inspect.cleandoc(help_text or "").partition("\f")[0]
    out: list[Paragraph] = []
    for chunk in _BLANK_LINE.split(text):
        lines = chunk.split("\n")
        if lines[0].strip() == LITERAL:
            body = "\n".join(ln.rstrip() for ln in lines[1:]).strip("\n")
            if body:
                out.append(Paragraph(body, literal=True))
        elif chunk.strip():
            out.append(Paragraph(" ".join(ln.strip() for ln in lines if ln.strip()), False))
    return out


def _literal_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _command_help(help_text: str) -> str:
    """A command's help as Typer's Rich renderer should get it: flowed, escaped, paragraphs
    apart. Typer keeps the line breaks of every paragraph but the first: a literal one
    keeps its lines, a flowed one is a single line already. Typer splits off the summary at
    the first blank line and dedents the rest (`inspect.cleandoc`, which measures from its
    second line): one more newline after the summary makes that second line the rest's
    first, so a literal paragraph that opens the rest keeps its indentation."""
    first, *rest = [_literal_markup(p.text) for p in paragraphs(help_text)] or [""]
    return "\n\n\n".join([first, "\n\n".join(rest)]) if rest else first


@contextmanager
def _rendered_literally(cmd: click.Command, ctx: click.Context) -> Iterator[None]:
    """Put the escaped, flowed help in place on `cmd`, its parameters and (a group) its
    commands for the time of one rendering; restore every attribute after."""
    saved: list[tuple[Any, str, Any]] = []

    def put(obj: Any, attr: str, value: Any) -> None:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    try:
        if cmd.help:
            put(cmd, "help", _command_help(cmd.help))
        for param in cmd.get_params(ctx):
            text = getattr(param, "help", None)  # Typer's options and arguments have it
            if text:  # Typer flows it and keeps `\b` paragraphs
                put(param, "help", _literal_markup(text))
            if getattr(param, "is_flag", False) and param.metavar is None:
                put(param, "metavar", "")  # Typer shows the metavar in place of <bool>
        if isinstance(cmd, TyperGroup):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is None:
                    continue
                if sub.help:
                    put(sub, "help", _command_help(sub.help))
                if sub.short_help:
                    put(sub, "short_help", _literal_markup(sub.short_help))
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def _rich(cmd: TyperCommand | TyperGroup) -> bool:
    return HAS_RICH and cmd.rich_markup_mode == "rich"


class HelpCommand(TyperCommand):
    """Why: Typer reads help as Rich markup and keeps docstring line breaks; this one shows
    the text as written, flowing."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if not _rich(self):
            return super().format_help(ctx, formatter)
        with _rendered_literally(self, ctx):
            return super().format_help(ctx, formatter)


class HelpGroup(TyperGroup):
    """Why: the same for a group's own help and its commands' summaries."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if not _rich(self):
            return super().format_help(ctx, formatter)
        with _rendered_literally(self, ctx):
            return super().format_help(ctx, formatter)
