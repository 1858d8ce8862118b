"""Typer pieces every fabricctl command shares: the common options, logging, error handling.

Contract:
- `check_input(file)`: an input argument's one check (stdin, a file or a pipe; else exit 2);
  `input_name(path)` the name its job keeps.
- `fail(msg, code)` writes one `fabricctl: error: msg` line on stderr and returns the
  `typer.Exit` to raise; `report(e)` writes that line for a `FabricError` and returns its
  exit status, for bodies that return one (`top`).
- `guarded(fn)` runs a command's body and applies `fabricctl.errors.exit_code_of`, the one
  error-to-exit-code mapping: a `FabricError` (store, engine and launch errors included)
  becomes that line and its `exit_code`, Ctrl-C exit 130. `run_async(coro)` is `guarded`
  around an event loop (`asyncio.run`, or the one given). Every command goes through them.
- `EngineFlags`: --engine, --model, --gpus, --vllm-python and --device, the options a
  command that starts engines takes (with `optgroup.takes`); `.config()` as configuration
  flags.
- `settings(data_dir, config)` / `load(config, **flags)`: the effective configuration, its
  errors guarded (a bad config is exit 2).
- `setup_logging(verbose)`: logs (`up`, `consume`, `run -v`) go to stderr as Rich lines:
  fabricctl's own loggers at INFO (DEBUG with `-v`), every other library (httpx, httpcore,
  asyncio, ...) at WARNING unless `-v`, so a health probe's request line never fills the
  broker's log. `job_logging(verbose)`: the one-shot jobs' (`run`, `table`): with `-v` that,
  else only warnings, as plain `fabricctl: message` lines.
Importing this module costs Typer only (Rich is imported when logging is set up).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import typer

from fabricctl.cli.optgroup import group_option
from fabricctl.errors import ExitCode, FabricError, UsageError, exit_code_of

if TYPE_CHECKING:
    from fabricctl.config import AppConfig

T = TypeVar("T")

DataDir = typer.Option(None, "--data-dir", "-d", metavar="DIR",
                       help="Broker data dir (LMDB, socket, logs); default: "
                       "$FABRICCTL_DATA_DIR, else the config's data_dir.", show_default=False)
ConfigFile = typer.Option(None, "--config", "-c", metavar="FILE",
                          help="A fabric.toml to read (overrides the project and user files).",
                          show_default=False)
JsonOut = typer.Option(False, "--json", help="Print one JSON document instead of a table.")
Verbose = typer.Option(False, "--verbose", "-v", help="Debug logs on stderr: fabricctl's own, "
                       "and those of the libraries it uses (httpx, asyncio, ...).")
Shapes = typer.Option(None, "--shapes", metavar="auto|declared",
                      help="Lines that declare no shape (OpenAI lines without body.prefix): "
                      "auto gives each the prefix it shares with earlier lines of the job, "
                      "cut at producer.block_size tokens; declared leaves them unshaped "
                      "(producer.shapes, default auto).", show_default=False)

Engine = typer.Option(None, "--engine", "-e", metavar="auto|sim|vllm|openai",
                      help="The engine: vllm launches vLLM servers, sim simulates GPUs, openai "
                      "sends to the servers of vllm.endpoints; auto (the default): vllm when "
                      "NVML finds GPUs, else sim.", show_default=False)
Model = typer.Option(None, "--model", "-m", help="The model the vLLM servers load (a directory "
                     "or a model id) and the name items ask for by default.",
                     show_default=False)
Gpus = typer.Option(None, "--gpus", metavar="0,1", help="The NVML indices of the GPUs to run "
                    "one vLLM server each on (the gpus setting; [[servers]] name their groups "
                    "instead). With --device cpu, each is one server on the CPU.",
                    show_default=False)
VllmPython = typer.Option(None, "--vllm-python", metavar="PYTHON",
                          help="The Python of the environment vLLM is installed in, e.g. "
                          ".venv-vllm/bin/python: its servers run as PYTHON -m "
                          "vllm.entrypoints.openai.api_server (vllm.python; default: the "
                          "vllm command on PATH).", show_default=False)
Device = typer.Option(None, "--device", metavar="gpu|cpu",
                      help="cpu runs vLLM's CPU build, no NVIDIA GPU needed, for trying "
                      "things out (vllm.device; default gpu).", show_default=False)


def parse_gpus(gpus: str, also: str = "") -> list[int]:
    """`--gpus` as distinct GPU indices (`0,1`); else a usage error naming `also`, what else
    the command takes."""
    try:
        out = [int(g) for g in gpus.split(",") if g.strip()]
    except ValueError:
        out = []
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise UsageError(f"--gpus takes distinct NVML GPU indices such as 0,1{also}, not "
                         f"{gpus!r} (nvidia-smi -L lists them)")
    return out


@dataclass(frozen=True)
class EngineFlags:
    """Why: the options that choose and launch engines mean the same in every command that
    takes them (`optgroup.takes`)."""

    engine: str | None = group_option(Engine)
    model: str | None = group_option(Model)
    gpus: str | None = group_option(Gpus)
    vllm_python: str | None = group_option(VllmPython)
    device: str | None = group_option(Device)

    @property
    def no_gpus(self) -> bool:
        """`--gpus none`: no local engine (`up`)."""
        return (self.gpus or "").strip().lower() == "none"

    def config(self, none: bool = False) -> dict[str, object]:
        """The given flags as configuration flags; a bad `--gpus` is a usage error (exit 2);
        with `none`, `--gpus none` sets no GPUs (the caller starts no local engine)."""
        flags: dict[str, object] = {k: v for k, v in (("engine", self.engine),
                                                      ("model", self.model)) if v is not None}
        if self.gpus is not None and not (none and self.no_gpus):
            gpus = self.gpus
            flags["gpus"] = guarded(lambda: parse_gpus(gpus, ", or none" if none else ""))
        vllm = {k: v for k, v in (("python", self.vllm_python), ("device", self.device))
                if v is not None}
        if vllm:
            flags["vllm"] = vllm
        return flags


UNSET = EngineFlags()  # a command's `EngineFlags` parameter's default (`takes` replaces it)


def shapes_flag(shapes: str | None) -> dict[str, object]:
    """`--shapes` as a configuration flag (`producer.shapes`), or nothing when not given."""
    return {} if shapes is None else {"producer": {"shapes": shapes}}

FABRIC_LOGGER = "fabricctl"  # every fabricctl module logs under it ("fabricctl.server", ...)


def check_input(file: str | Path, what: str = "a JSONL file") -> None:
    """An input argument that is "-" (stdin), a file, or a stream the shell made (`<(cmd)`,
    a named pipe); else a one-line usage error (exit 2): no such file, or a directory."""
    if str(file) == "-":
        return
    path = Path(file)
    if path.is_dir():
        raise fail(f"{file}: is a directory, not {what}", ExitCode.USAGE)
    if not path.exists():
        raise fail(f"{file}: no such file", ExitCode.USAGE)


def input_name(path: Path) -> str:
    """The name a job keeps of its input: a file's absolute path; a pipe's as given
    (`/dev/fd/63`: where it leads is no name)."""
    return str(path.resolve()) if path.is_file() else str(path)


def fail(message: str, code: int = ExitCode.RUNTIME) -> typer.Exit:
    sys.stderr.write(f"fabricctl: error: {message}\n")
    return typer.Exit(code)


def report(e: FabricError) -> int:
    """Write `e` as the one error line on stderr; its exit status."""
    sys.stderr.write(f"fabricctl: error: {e}\n")
    return exit_code_of(e)


def guarded(fn: Callable[[], T]) -> T:
    """Run a command's body: fabricctl's errors become one stderr line and their exit code."""
    try:
        return fn()
    except FabricError as e:
        raise typer.Exit(report(e)) from None
    except KeyboardInterrupt as e:
        raise typer.Exit(exit_code_of(e)) from None


def run_async(coro: Coroutine[Any, Any, T],
              run: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run) -> T:
    """`guarded(lambda: run(coro))`: a command body that is a coroutine."""
    return guarded(lambda: run(coro))


def settings(data_dir: Path | None, config: Path | None) -> AppConfig:
    from fabricctl.cli.common import settings as load_settings

    return guarded(lambda: load_settings(data_dir, config))


def load(config: Path | None, **flags: object) -> AppConfig:
    from fabricctl.config import load_config

    return guarded(lambda: load_config(config, flags))


def setup_logging(verbose: bool = False) -> None:
    """Rich log lines on stderr: fabricctl's own at INFO, third-party loggers at WARNING
    (the root's level, which they inherit); with `verbose` everything at DEBUG."""
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(message)s", datefmt="[%X]", handlers=[handler], force=True)
    logging.getLogger(FABRIC_LOGGER).setLevel(logging.DEBUG if verbose else logging.INFO)


def job_logging(verbose: bool) -> None:
    """A one-shot job's logs: `setup_logging` with `verbose`, else warnings alone, plain."""
    if verbose:
        setup_logging(verbose)
    else:
        logging.basicConfig(level=logging.WARNING, format="fabricctl: %(message)s")


def stdin_binary() -> BinaryIO:
    """stdin for a feed's reader thread: a buffered reader of its own on a duplicate of fd 0,
    never to be closed. Not `sys.stdin.buffer`: when a submit fails (its broker died) while
    the reader thread waits on a read, the interpreter closes `sys.stdin` at exit under that
    thread's buffer lock and aborts ("could not acquire lock for <stdin> at interpreter
    shutdown", exit 134)."""
    return open(os.dup(sys.stdin.fileno()), "rb")
