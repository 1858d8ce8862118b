"""The `fabricctl` command line: Typer commands only, no logic of their own."""

from __future__ import annotations

import typer

from fabricctl import __version__

app = typer.Typer(
    name="fabricctl",
    help="Shape-aware batch inference on your own GPUs: broker, supervisor and dashboard.",
    no_args_is_help=True,
    add_completion=False,
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
