"""The client commands of `fabricctl` (submit, results, shapes, status, doctor, config, down,
top): Typer declarations only; each calls into `fabricctl.cli`.

Contract: every command finds its broker through `--data-dir`, else `FABRICCTL_DATA_DIR`,
else the config's `data_dir`; data goes to stdout, diagnostics to stderr; `--json` prints
one document. `register_client_commands(app)` adds them to the root app in help order.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from fabricctl.cli.support import ConfigFile, DataDir, JsonOut, fail, guarded, settings
from fabricctl.errors import ExitCode

_COMMANDS: list[Callable[..., Any]] = []


def _command(fn: Callable[..., Any]) -> Callable[..., Any]:
    _COMMANDS.append(fn)
    return fn


@_command
def submit(
    file: str = typer.Argument("-", metavar="FILE|-", help="JSONL, native or OpenAI batch; "
                               "- (the default) reads stdin.", show_default=False),
    wait: bool = typer.Option(False, "--wait", "-w", help="Stay until every accepted item has "
                              "its result and print the results as JSONL on stdout."),
    timeout: float | None = typer.Option(None, "--timeout", "-t", min=0, metavar="SECONDS",
                                         help="With --wait: give up (exit 4) this many "
                                         "seconds after the input ended if results are still "
                                         "missing."),
    ordered: bool = typer.Option(False, "--ordered", help="With --wait: print the results "
                                 "in input order (as vllm run-batch does) instead of as they "
                                 "complete; each is printed once every earlier line's result "
                                 "has been. Refused lines have no result."),
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """Stream JSONL prompts into the running broker.

    Input is read and sent in chunks, so memory stays flat on any input size.
    Each refused line is one "fabricctl: error: line N: reason" on stderr; the rest goes in.
    stdout stays empty unless --wait, which prints each result as JSONL as it completes
    (in input order with --ordered).
    Exit status: 0 all lines accepted, 1 some refused, 3 no broker, 4 --timeout expired.
    """
    from fabricctl.cli.progress import ProgressView, input_size, stderr_is_tty
    from fabricctl.cli.submit import run_submit

    if ordered and not wait:
        raise fail("--ordered orders the results that --wait prints; add --wait",
                   ExitCode.USAGE)
    cfg = settings(data_dir, config)
    if file != "-" and not Path(file).is_file():
        raise fail(f"{file}: no such file", ExitCode.USAGE)
    with open(file, "rb") if file != "-" else contextlib.nullcontext(sys.stdin.buffer) as fp:
        if file == "-" and sys.stdin.isatty():
            sys.stderr.write("fabricctl: reading JSONL from the terminal; end with Ctrl-D\n")
        # A bar only for a person watching stderr, and not over results streaming to them.
        show_bar = stderr_is_tty() and not (wait and sys.stdout.isatty())
        view = ProgressView(input_size(fp)) if show_bar else None

        def body() -> int:
            with view if view is not None else contextlib.nullcontext():
                return asyncio.run(run_submit(cfg, fp, wait=wait, timeout=timeout,
                                              out=sys.stdout.buffer, progress=view,
                                              ordered=ordered))

        code = guarded(body)  # errors are written after the progress bar is gone
    raise typer.Exit(code)


@_command
def results(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new results "
                                "until interrupted."),
    since: int = typer.Option(0, "--since", min=0, metavar="N", help="Only results stored "
                              "after result number N (results are numbered 1, 2, ... as "
                              "stored)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document: {results, since, "
                                  "next} (not with --follow)."),
    ordered: bool = typer.Option(False, "--ordered", help="In ingest order instead (the "
                                 "broker's entry-key order): commit by commit as the broker "
                                 "acknowledged the submits, within a commit grouped by "
                                 "shape. Not with --since or --follow."),
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """Print the broker's stored results as JSONL, in the order they were stored.

    With --ordered, in the order their items were stored (ingest order): the broker's
    entry-key order, which is commit by commit in the order it acknowledged the submits,
    and within one commit (which may hold several submit chunks) grouped by shape, each
    group in input order. One submit's results are in its input order when it had a single
    shape; with several shapes they are grouped by shape within each commit.
    """
    from fabricctl.cli.results import print_results

    if follow and json_out:
        raise fail("--json prints one document and cannot follow; drop one of them",
                   ExitCode.USAGE)
    if ordered and (follow or since):
        raise fail("--ordered lists every stored result in ingest order; it cannot take "
                   "--since or --follow (they count results in storage order)",
                   ExitCode.USAGE)
    cfg = settings(data_dir, config)
    guarded(lambda: asyncio.run(print_results(cfg, sys.stdout.buffer, since=since,
                                              follow=follow, as_json=json_out,
                                              ordered=ordered)))


shapes_app = typer.Typer(help="List and inspect the broker's shapes.", no_args_is_help=True)


@shapes_app.command("list")
def shapes_list(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
                config: Path | None = ConfigFile) -> None:
    """List live shapes: state, epoch, queued items and tokens, lanes, batches, waste.

    A table on a terminal, tab-separated values with a header line when piped.
    """
    from fabricctl.cli.shapes import show_list

    cfg = settings(data_dir, config)
    guarded(lambda: show_list(cfg, json_out))


@shapes_app.command("inspect")
def shapes_inspect(
    shape: str = typer.Argument(..., metavar="SIG|LABEL", help="Shape signature (16 hex "
                                "digits, 0x and leading zeros optional) or label."),
    json_out: bool = JsonOut, data_dir: Path | None = DataDir, config: Path | None = ConfigFile,
) -> None:
    """Show one shape: state history, epoch, lanes, length percentiles, batches, waste, thrash.

    Exit status 1 when no shape matches.
    """
    from fabricctl.cli.shapes import show_inspect

    cfg = settings(data_dir, config)
    guarded(lambda: show_inspect(cfg, shape, json_out))


@_command
def status(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
           config: Path | None = ConfigFile) -> None:
    """Show the broker's ledger, shape states, consumers, store usage and last recovery.

    Also the token counter a `fabricctl submit` with this configuration counts input
    tokens with ("estimate" or "tokenizer:PATH"; --json: token_counter): producers count
    tokens, the broker does not.
    """
    from fabricctl.cli.status import show_status

    cfg = settings(data_dir, config)
    guarded(lambda: show_status(cfg, json_out))


@_command
def doctor(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
           config: Path | None = ConfigFile) -> None:
    """Check the host: config files, NVML and GPUs, vLLM, the data dir, a running broker.

    One line per check: ok, warn or fail. Exit status 0 when no check failed, else 1.
    """
    from fabricctl.cli.doctor import doctor as run_doctor

    raise typer.Exit(guarded(lambda: run_doctor(config, {"data_dir": data_dir}, json_out)))


config_app = typer.Typer(help="Print the configuration as TOML.", no_args_is_help=True)


@config_app.command("show")
def config_show(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
                config: Path | None = ConfigFile) -> None:
    """Print the effective configuration, each key set by a file, env or flag marked so."""
    from fabricctl.cli import configcmd
    from fabricctl.cli.common import write_json

    flags = {"data_dir": data_dir}
    if json_out:
        cfg = settings(data_dir, config)
        guarded(lambda: write_json(cfg))
        return
    sys.stdout.write(guarded(lambda: configcmd.show(config, flags)))


@config_app.command("default")
def config_default(json_out: bool = JsonOut) -> None:
    """Print every setting with its default value."""
    from fabricctl.cli import configcmd
    from fabricctl.cli.common import write_json
    from fabricctl.config import AppConfig

    if json_out:
        write_json(AppConfig())
        return
    sys.stdout.write(configcmd.default())


@_command
def down(data_dir: Path | None = DataDir, config: Path | None = ConfigFile) -> None:
    """Stop the broker: in-flight batches finish, LMDB closes. Exit status 3 if none runs."""
    from fabricctl.cli.status import down as stop_broker

    cfg = settings(data_dir, config)
    guarded(lambda: stop_broker(cfg))


@_command
def top(
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit (no TUI)."),
    json_out: bool = typer.Option(False, "--json", help="Print one snapshot as JSON and exit."),
    interval: float = typer.Option(1.0, "--interval", "-i", min=0.1, metavar="SECONDS",
                                   help="Refresh every SECONDS seconds."),
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
) -> None:
    """The live dashboard: shape states, lanes, thrash histogram, ledger, GPUs.

    Without a terminal (or with --once) it prints one snapshot instead.
    """
    try:
        from fabricctl.cli.top import run_top
    except ModuleNotFoundError as e:
        if e.name and not e.name.startswith("fabricctl"):
            raise
        raise fail("the dashboard is not available in this build (fabricctl.cli.top is "
                   "missing)", ExitCode.BACKEND_MISSING) from None
    cfg = settings(data_dir, config)
    raise typer.Exit(guarded(lambda: run_top(cfg.data_dir, once=once, json_out=json_out,
                                             interval=interval)))


def register_client_commands(app: typer.Typer) -> None:
    for fn in _COMMANDS:
        app.command()(fn)
    app.add_typer(shapes_app, name="shapes")
    app.add_typer(config_app, name="config")
