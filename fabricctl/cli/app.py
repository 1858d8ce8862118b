"""The `fabricctl` command line: the root Typer app; each command lives in its own module.

Contract: this module builds the root app (`--version`, the help text) and registers, in
help order, the command of each module of `fabricctl.cli`: `up`, `run`, `table`, `consume`,
`replay`, `calibrate`, `submit`, `results`, `status`, `doctor`, `down`, `top`, and the groups
`jobs`, `shapes` and `config` (`configcmd`), each with `fabricctl.cli.helpfmt`'s classes (`cls=`:
`--help` shows the text as written, flowing). Each module declares its command as `command` (a
group as `group`) next to the logic it calls, and imports its heavy dependencies (Rich tables, the
server, the store, Textual) only when the command runs, so building the app stays cheap and
never loads Textual.
`main` is the console-script entry point; `setup_logging` is `fabricctl.cli.support`'s.

Exit codes (one IntEnum, `fabricctl.errors.ExitCode`, one mapping, `errors.exit_code_of`,
applied by `support.guarded`): 0 ok, 1 runtime error, 2 usage or config error, 3 backend
missing (no broker, no engine), 4 timeout, 130 interrupted.
Diagnostics go to stderr as one `fabricctl: error: ...` line; data goes to stdout.
"""

from __future__ import annotations

import sys

import typer

from fabricctl import __version__
from fabricctl.cli import (
    calibrate,
    configcmd,
    consume,
    doctor,
    down,
    jobs,
    replay,
    results,
    run,
    shapes,
    status,
    submit,
    table,
    top,
    up,
)
from fabricctl.cli.helpfmt import HelpCommand, HelpGroup
from fabricctl.cli.support import setup_logging

__all__ = ["EXIT_CODES_HELP", "app", "main", "setup_logging"]

EXIT_CODES_HELP = (
    "Exit status: 0 ok, 1 runtime error, 2 usage or config error, 3 backend missing "
    "(no broker or engine), 4 timeout, 5 engine failed, 6 inference server did not start, "
    "130 interrupted."
)

app = typer.Typer(
    name="fabricctl",
    cls=HelpGroup,
    help="Shape-aware batch inference on your own GPUs: broker, supervisor and dashboard.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fabricctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Shape-aware batch inference on your own GPUs: broker, supervisor and dashboard."""


COMMANDS = {"up": up, "run": run, "table": table, "consume": consume, "replay": replay,
            "calibrate": calibrate, "submit": submit,
            "results": results, "status": status, "doctor": doctor, "down": down, "top": top}
GROUPS = {"jobs": jobs, "shapes": shapes, "config": configcmd}

for _name, _module in COMMANDS.items():
    app.command(_name, cls=HelpCommand)(_module.command)
for _name, _module in GROUPS.items():
    app.add_typer(_module.group, name=_name)


def main() -> None:
    """Entry point; a reader that went away (`| head`) ends fabricctl quietly with status 0."""
    try:
        app(prog_name="fabricctl")
    except BrokenPipeError:
        import os

        # Python docs, "Note on SIGPIPE": point stdout at devnull so the flush at exit
        # does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0) from None


if __name__ == "__main__":
    main()
