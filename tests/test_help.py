"""`fabricctl ... --help` reads as written, for every command and sub-command.

Promises checked, on the help each command prints (rendered in a subprocess, at a fixed
COLUMNS, no colour), for every command found by walking the app (so a new command is
checked without a new test):
- every option and argument has a description, and it is in the rendered help;
- every `[...]` written in a help string is shown (none swallowed as Rich markup);
- paragraphs flow: a paragraph of the source is one line where the terminal is wide enough
  for it, and at 100 columns a description line breaks only where the next word would not
  fit; a `\\b` paragraph (`fabricctl.cli.helpfmt.paragraphs`) keeps its lines;
- a flag shows no type (`<bool>`), and no line is wider than the terminal;
- every command renders through `fabricctl.cli.helpfmt` (the classes that do the above).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import FABRICCTL, ROOT, clean_env

from fabricctl.cli.helpfmt import HelpCommand, HelpGroup, Paragraph, paragraphs

sys.path.insert(0, str(ROOT / "scripts"))
import gen_man  # scripts/: the one walk of the command tree

COLUMNS = 100
WIDE = 2000  # wide enough that no paragraph needs wrapping: any break in one is not forced
MARK = "=== fabricctl help: "
BOX = "│╭╮╰╯─"
BRACKETS = re.compile(r"\[+[^\[\]\n]*\]+")

# One interpreter renders every command's --help through the real entry point, one after
# the other (which also checks that rendering one help leaves the next unchanged).
RENDER = f"""
import sys
from fabricctl.cli.app import app
for arg in sys.argv[1:]:
    print({MARK!r} + arg, flush=True)
    try:
        app([*arg.split(), "--help"], prog_name="fabricctl")
    except SystemExit as e:
        assert e.code in (0, None), (arg, e.code)
    sys.stdout.flush()
"""

TREE = gen_man.commands()
PATHS = [" ".join(path) for path, _, _ in TREE]


def render_all(columns: int, tmp: Path) -> dict[str, str]:
    """Every command's --help at `columns`, by command path ("" is fabricctl itself)."""
    env = clean_env(tmp, COLUMNS=str(columns), TERMINAL_WIDTH=str(columns))
    out = subprocess.run([*FABRICCTL[:1], "-c", RENDER, *PATHS], capture_output=True,
                         env=env, cwd=tmp, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    assert FABRICCTL[1:] == ["-m", "fabricctl"]  # the same interpreter and package
    pages: dict[str, str] = {}
    for block in out.stdout.decode().split(MARK)[1:]:
        path, _, text = block.partition("\n")
        pages[path] = text
    assert sorted(pages) == sorted(PATHS)
    return pages


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return render_all(COLUMNS, tmp_path_factory.mktemp("help"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return render_all(WIDE, tmp_path_factory.mktemp("help-wide"))


def norm(text: str) -> str:
    return " ".join(text.split())


def lines_of(page: str) -> list[str]:
    """The rendered lines, box drawing removed and whitespace normalised."""
    return [norm(ln.strip(BOX)) for ln in page.splitlines()]


def entry(path: str) -> tuple[Any, Any]:
    (cmd, ctx), = [(c, x) for p, c, x in TREE if " ".join(p) == path]
    return cmd, ctx


def params(path: str) -> list[Any]:
    cmd, ctx = entry(path)
    return [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]


def sources(path: str) -> list[tuple[str, Paragraph]]:
    """(where, paragraph) for every piece of help text `fabricctl PATH --help` shows: the
    command's help, each option's and argument's, and a group's commands' summaries."""
    cmd, ctx = entry(path)
    out = [("help", p) for p in paragraphs(cmd.help)]
    for param in params(path):
        out += [(f"help of {param.opts[0]}", p) for p in paragraphs(param.help)]
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += [(f"summary of {name}", p) for p in paragraphs(sub.help)[:1]]
    return out


@pytest.mark.parametrize("path", PATHS)
def test_every_command_renders_its_help_through_helpfmt(path: str) -> None:
    cmd, _ = entry(path)
    expected = HelpGroup if hasattr(cmd, "list_commands") else HelpCommand
    assert isinstance(cmd, expected), (
        f"`fabricctl {path}` is a {type(cmd).__name__}: give cls={expected.__name__} "
        "(fabricctl.cli.helpfmt) where it is declared, so its help is shown as written")


@pytest.mark.parametrize("path", PATHS)
def test_every_option_and_argument_is_described(path: str, wide: dict[str, str]) -> None:
    shown = lines_of(wide[path])
    for param in params(path):
        name = param.opts[0] if param.param_type_name == "option" else param.metavar or param.name
        assert (param.help or "").strip(), f"fabricctl {path}: {name} has no description"
        first = paragraphs(param.help)[0].text.splitlines()[0]
        row = [ln for ln in shown if norm(first) in ln]
        assert row, f"fabricctl {path}: the help of {name} is not shown: {first!r}"


@pytest.mark.parametrize("path", PATHS)
def test_square_brackets_in_help_are_shown_as_written(path: str, wide: dict[str, str]) -> None:
    shown = norm(" ".join(lines_of(wide[path])))
    for where, para in sources(path):
        for bracketed in BRACKETS.findall(para.text):
            assert norm(bracketed) in shown, (
                f"fabricctl {path} --help: {bracketed!r} ({where}) is not shown "
                "(read as Rich markup?)")


@pytest.mark.parametrize("path", PATHS)
def test_paragraphs_flow_on_a_wide_terminal(path: str, wide: dict[str, str]) -> None:
    """At WIDE columns nothing needs wrapping: each paragraph written is one line (a literal
    one: each of its lines is, with its indentation)."""
    shown = lines_of(wide[path])
    raw = wide[path].splitlines()
    for where, para in sources(path):
        if para.literal:
            for line in para.text.splitlines():
                assert any(line.rstrip() in ln for ln in raw), (
                    f"fabricctl {path} --help: this line of the {where} is not shown as "
                    f"written: {line!r}")
            continue
        assert any(norm(para.text) in ln for ln in shown), (
            f"fabricctl {path} --help: this paragraph of the {where} is broken (or garbled) "
            f"where the terminal did not force it: {para.text!r}")


def description(page: str) -> list[str]:
    """The lines of a page between its usage and its first panel."""
    lines = page.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Usage:"))
    while start < len(lines) and lines[start].strip():
        start += 1
    end = next((i for i, ln in enumerate(lines) if ln.startswith("╭")), len(lines))
    return [ln.rstrip() for ln in lines[start:end]]


@pytest.mark.parametrize("path", PATHS)
def test_a_description_line_breaks_only_where_the_width_forces_it(
        path: str, narrow: dict[str, str]) -> None:
    """At 100 columns (98 for the text between Rich's one-column pads) a line followed by
    more of its paragraph must be too full for the next word: else the break came from a
    line break in the docstring, mid-sentence."""
    width = COLUMNS - 2
    cmd, _ = entry(path)
    literal = {norm(ln) for p in paragraphs(cmd.help) if p.literal for ln in p.text.splitlines()}
    desc = description(narrow[path])
    for line, nxt in itertools.pairwise(desc):
        if not line.strip() or not nxt.strip() or norm(line) in literal:
            continue
        room = width - len(line.strip())
        assert len(nxt.split()[0]) + 1 > room, (
            f"fabricctl {path} --help at {COLUMNS} columns: {line.strip()!r} is broken "
            f"before {nxt.split()[0]!r}, which would fit ({room} columns left)")


@pytest.mark.parametrize("path", PATHS)
def test_flags_show_no_type_and_lines_fit(path: str, narrow: dict[str, str]) -> None:
    page = narrow[path]
    assert "<bool>" not in page, f"fabricctl {path} --help shows a flag's type <bool>"
    for line in page.splitlines():
        assert len(line) <= COLUMNS, f"fabricctl {path} --help: {line!r}"


def test_paragraphs_flow_and_a_marked_paragraph_keeps_its_lines() -> None:
    text = """Summary line
    that goes on.

    A paragraph
      written on three
    lines.

    \b
    Examples:
      fabricctl run a.jsonl
      fabricctl run b.jsonl -o out.jsonl
    \f
    Not help.
    """
    assert paragraphs(text) == [
        Paragraph("Summary line that goes on.", literal=False),
        Paragraph("A paragraph written on three lines.", literal=False),
        Paragraph("Examples:\n  fabricctl run a.jsonl\n  fabricctl run b.jsonl -o out.jsonl",
                  literal=True)]
    assert paragraphs(None) == paragraphs("") == []


def test_a_literal_paragraph_keeps_its_lines_and_indentation() -> None:
    """`\\b` after the summary alone: Typer dedents what follows the summary, which would
    take the list's indentation with it."""
    import typer
    from typer.testing import CliRunner

    app = typer.Typer(cls=HelpGroup)

    def example() -> None:
        """Summary [with brackets].

        \b
        Exit status:
          0  ok
          1  [some] refused
        """

    app.command("example", cls=HelpCommand)(example)
    app.command("other", cls=HelpCommand)(example)
    out = CliRunner().invoke(app, ["example", "--help"], prog_name="t",
                             env={"COLUMNS": "60", "TERMINAL_WIDTH": "60", "NO_COLOR": "1"})
    assert out.exit_code == 0, out.output
    lines = [ln.rstrip() for ln in out.output.splitlines()]
    assert " Summary [with brackets]." in lines
    at = lines.index(" Exit status:")
    assert lines[at + 1:at + 3] == ["   0  ok", "   1  [some] refused"]
