"""The `fabricctl` command line: Typer commands only; the work is done in the modules they call.

Exit codes (one IntEnum, `fabricctl.errors.ExitCode`): 0 ok, 1 runtime error, 2 usage or
config error, 3 backend missing (no broker, no engine), 4 timeout, 130 interrupted.
Diagnostics go to stderr as one `fabricctl: error: ...` line; data goes to stdout.
Logs (`up`, `consume`, `run -v`) go to stderr through `setup_logging`: fabricctl's own
loggers at INFO (DEBUG with `-v`), every other library (httpx, httpcore, asyncio, ...) at
WARNING unless `-v`, so a health probe's request line never fills the broker's log.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from fabricctl import __version__
from fabricctl.cli.client_commands import register_client_commands
from fabricctl.cli.support import ConfigFile, DataDir, fail, guarded
from fabricctl.errors import ExitCode, FabricError

EXIT_CODES_HELP = (
    "Exit status: 0 ok, 1 runtime error, 2 usage or config error, 3 backend missing "
    "(no broker or engine), 4 timeout, 130 interrupted."
)

app = typer.Typer(
    name="fabricctl",
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


FABRIC_LOGGER = "fabricctl"  # every fabricctl module logs under it ("fabricctl.server", ...)


def setup_logging(verbose: bool = False) -> None:
    """Rich log lines on stderr: fabricctl's own at INFO, third-party loggers at WARNING
    (the root's level, which they inherit); with `verbose` everything at DEBUG."""
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(message)s", datefmt="[%X]", handlers=[handler], force=True)
    logging.getLogger(FABRIC_LOGGER).setLevel(logging.DEBUG if verbose else logging.INFO)


def load(config: Path | None, **flags: object):  # type: ignore[no-untyped-def]
    from fabricctl.config import load_config

    return guarded(lambda: load_config(config, flags))


def run_async(coro: object, run: Callable[[Any], object] = asyncio.run) -> object:
    from fabricctl.store.errors import StoreError

    try:
        return run(coro)
    except FabricError as e:
        raise fail(str(e), e.exit_code) from None
    except StoreError as e:  # e.g. another broker owns the data dir
        raise fail(str(e), ExitCode.RUNTIME) from None
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None


@app.command()
def up(
    data_dir: Path | None = DataDir,
    config: Path | None = ConfigFile,
    engine: str | None = typer.Option(None, "--engine", "-e",
                                      help="auto, sim, vllm or openai (auto: vllm when NVML "
                                      "finds GPUs, else simulated GPUs)."),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indices, e.g. 0,1."),
    model: str | None = typer.Option(None, "--model", "-m", help="Model to serve."),
    listen: str | None = typer.Option(None, "--listen", help="Also listen on HOST:PORT (TCP, "
                                      "needs server.token) for consumers on other hosts."),
    metrics_port: int | None = typer.Option(None, "--metrics-port",
                                            help="Serve Prometheus metrics on this port."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the broker with one engine and consumer per GPU (simulated GPUs when none)."""
    from fabricctl.cli.up import serve_forever
    from fabricctl.server import eventloop

    setup_logging(verbose)
    flags: dict[str, object] = {"data_dir": data_dir, "engine": engine, "model": model}
    if gpus:
        flags["gpus"] = [int(g) for g in gpus.split(",") if g.strip()]
    cfg = _with_sections(load(config, **flags), listen=listen, metrics_port=metrics_port)
    raise typer.Exit(int(run_async(serve_forever(cfg), eventloop.run)))  # type: ignore[arg-type]


def _with_sections(cfg, listen: str | None = None, metrics_port: int | None = None):  # type: ignore[no-untyped-def]
    import dataclasses

    if listen is not None:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, listen=listen))
    if metrics_port is not None:
        cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(
            cfg.metrics, prometheus_port=metrics_port))
    return cfg


@app.command()
def run(
    file: Path = typer.Argument(..., help="JSONL (native or OpenAI batch), or - for stdin."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Where to write results "
                                       "(default: stdout)."),
    config: Path | None = ConfigFile,
    engine: str | None = typer.Option(None, "--engine", "-e"),
    model: str | None = typer.Option(None, "--model", "-m"),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON: on stdout "
                                  "with --output, else on stderr after the results."),
    ordered: bool = typer.Option(False, "--ordered", help="Write the results in input order "
                                 "(as vllm run-batch does) instead of as they complete; each "
                                 "is written once every earlier line's result has been. "
                                 "Rejected lines have no result."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """One-shot batch job: embedded broker and engines; submit, wait, write results, summarise.

    Results are written in completion order, or in input order with --ordered. Token counts
    come from [producer] tokenizer, else the model directory's tokenizer.json (--model
    DIR), else an estimate of 4 bytes a token; the --json summary names it (token_counter).
    """
    import msgspec

    from fabricctl.cli.render import print_run_summary
    from fabricctl.cli.run import run_job

    setup_logging(verbose) if verbose else logging.basicConfig(level=logging.WARNING)
    cfg = load(config, engine=engine, model=model)
    if str(file) != "-" and not file.is_file():
        raise fail(f"{file}: no such file", ExitCode.USAGE)
    out = output.open("wb") if output else sys.stdout.buffer
    try:
        summary = run_async(run_job(cfg, file, out, ordered=ordered))
    finally:
        if output:
            out.close()
    if json_out:
        (sys.stdout if output else sys.stderr).write(msgspec.json.encode(summary).decode() + "\n")
    else:
        print_run_summary(summary)  # type: ignore[arg-type]


@app.command()
def consume(
    broker: str = typer.Option(..., "--broker", "-b", help="HOST:PORT of a broker's --listen, "
                               "or its data dir / socket path."),
    engine: str = typer.Option("sim", "--engine", "-e", help="sim or openai."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="OpenAI-compatible base URL "
                                        "(engine openai)."),
    model: str | None = typer.Option(None, "--model", "-m"),
    name: str | None = typer.Option(None, "--name", help="Consumer name (default: host-gpu)."),
    gpu: int | None = typer.Option(None, "--gpu"),
    token: str | None = typer.Option(None, "--token", envvar="FABRICCTL_TOKEN"),
    config: Path | None = ConfigFile,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run one consumer against a broker (for example on another GPU host)."""
    from fabricctl.cli.consume import run_consumer

    setup_logging(verbose)
    cfg = load(config, model=model)
    run_async(run_consumer(cfg, broker, engine, endpoint, name, gpu,
                           token if token is not None else cfg.server.token))


@app.command()
def replay(
    workload: Path = typer.Argument(..., help="JSONL workload (native or OpenAI batch)."),
    gpus: int = typer.Option(2, "--gpus", "-g", min=1, help="Simulated GPUs."),
    policy: str = typer.Option("all", "--policy", "-p", help="fabric, round-robin, "
                               "prefix-affinity, pow2-buckets, all, or a comma list "
                               "(ablations: fabric-no-lanes, fabric-no-prewarm, "
                               "fabric-no-lifecycle, fabric-per-model)."),
    kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="KV capacity per GPU."),
    pressure: float | None = typer.Option(None, "--pressure", help="Size the KV capacity so "
                                          "distinct prefix tokens / free KV = this."),
    rate: float = typer.Option(0.0, "--rate", help="Poisson arrivals per simulated second "
                               "(0: all at once, an offline batch job)."),
    seed: int = typer.Option(0, "--seed"),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", help="Running sequences per GPU."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object keyed by policy."),
) -> None:
    """Replay a workload through fabric and the schedulers users run instead (simulated)."""
    from fabricctl.cli.replay import run_replay

    raise typer.Exit(run_replay(workload, gpus, policy, json_out, kv_tokens, pressure, rate,
                                seed, max_num_seqs))


register_client_commands(app)


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
