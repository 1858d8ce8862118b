"""`fabricctl calibrate --endpoint URL`: fit the replay's simulated costs to a live server.

Contract: the `calibrate` command (`command`) runs `fabricctl.replay.probe.calibrate`
against the server at `--endpoint` (its contract says what is timed and how it is fitted)
and prints the TOML table `fabricctl replay --costs FILE` reads, or writes it to
`--output`. A server that does not answer is a `BackendMissing` (exit 3); an answer that is
not a completion, or /metrics without `vllm:cache_config_info`, an `EngineError` (exit 5).
"""

from __future__ import annotations

from pathlib import Path

import typer

from fabricctl.cli.support import run_async
from fabricctl.replay.probe import calibrate


def command(
    endpoint: str = typer.Option(..., "--endpoint", "-e", help="The server's base URL, "
                                 "e.g. http://127.0.0.1:8000 (idle while it is probed)."),
    model: str | None = typer.Option(None, "--model", "-m", help="Served model name (default: "
                                     "the first of /v1/models)."),
    max_num_seqs: int = typer.Option(..., "--max-num-seqs", min=1,
                                     help="The server's --max-num-seqs."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=1,
                                               help="The server's --max-num-batched-tokens "
                                                    "(vLLM's CPU default: 2048)."),
    out: Path | None = typer.Option(None, "--output", "-o", help="Write the TOML here "
                                    "(default: stdout)."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY",
                                       help="Bearer token, for a server that asks for one."),
) -> None:
    """Time a few probes on a live server and print simulated costs for `replay --costs`."""
    text = run_async(calibrate(endpoint, model, max_num_seqs, max_num_batched_tokens,
                               api_key=api_key))
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"fabricctl: wrote {out}", err=True)
