"""`fabricctl replay WORKLOAD.jsonl`: the command and its body.

Contract: the `replay` command (`command`) parses the flags and exits with `run_replay`'s
status. `run_replay(...)` reads a JSONL workload as `submit` reads it (bad lines reported on
stderr with their numbers and skipped), replays it through each requested policy on `gpus`
identical simulated GPUs and prints a Rich table (rows per policy on stdout, parameters on
stderr) or, with `json_out`, one JSON object keyed by policy (`PolicyResult` fields).
`policy`: one name, a comma-separated list (ablations included) or "all" (fabric, the three
baselines and the oracle). The GPU is the default profile (`engines/costs.py`) or the `costs`
TOML file (`SimCosts` fields, as `calibrate` writes); its KV pool is `kv_tokens`, else the
pool that gives cache `pressure`; `max_num_seqs` bounds running sequences; each consumer
registers the `[consumer]` contract. Arrivals: all at t = 0 (`rate` 0), else Poisson at
`rate` from `seed`. Jobs (`replay/jobs.py`): a line's `job` and `jobs_file` make it
multi-job: per-job arrival, "all" adds fabric-tokens, fabric-fair (no windows) and edf
(earliest deadline first, blind to shapes), and per policy the per-job completion against
standalone, slowdowns and deadlines met (more tables; JSON fields `jobs`, `deadlines`,
`deadlines_met`, `deadlines_missed`, `worst_slowdown`). Tokens are counted by
`formats.tokens.choose_counter` as `submit` counts them, named in `token_counter`.
Returns 0; bad arguments, a tokenizer that does not load or no readable item raise
`UsageError` (a bad jobs file: `WorkloadError`): exit 2 through `support.guarded`. Every
figure is simulated; the simulator and Rich are imported when a replay runs. What a replay
shows: README.md, "Commands" (`fabricctl replay`, "Several jobs in one replay").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fabricctl.cli.support import ConfigFile, guarded, load
from fabricctl.errors import ExitCode, UsageError, WorkloadError

if TYPE_CHECKING:
    from rich.table import Table

    from fabricctl.core.types import Item
    from fabricctl.engines.costs import SimCosts
    from fabricctl.formats.tokens import TokenCounter
    from fabricctl.replay.jobs import JobSpec
    from fabricctl.replay.report import PolicyResult


def command(
    workload: Path = typer.Argument(..., metavar="FILE",
                                    help="JSONL workload (native or OpenAI batch)."),
    gpus: int = typer.Option(2, "--gpus", "-g", min=1, help="Simulated GPUs."),
    policy: str = typer.Option("all", "--policy", "-p", help="fabric, round-robin, "
                               "prefix-affinity, pow2-buckets, all, or a comma list "
                               "(ablations: fabric-no-lanes, fabric-no-prewarm, "
                               "fabric-no-lifecycle, fabric-per-model; with jobs: "
                               "fabric-tokens, fabric-fair, edf)."),
    kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="KV capacity per GPU."),
    pressure: float | None = typer.Option(None, "--pressure", help="Size the KV capacity so "
                                          "distinct prefix tokens / free KV = this."),
    rate: float = typer.Option(0.0, "--rate", help="Poisson arrivals per simulated second "
                               "(0: all at once, an offline batch job)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the Poisson arrivals (--rate): the "
                             "same seed, the same arrivals."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="Running sequences "
                                            "per GPU (default: the --costs file's, else 64)."),
    costs: Path | None = typer.Option(None, "--costs", help="Simulated GPU costs (TOML, e.g. "
                                      "from `fabricctl calibrate`); default: an H100 with a "
                                      "7B model."),
    jobs: Path | None = typer.Option(None, "--jobs", help="Jobs file (JSON Lines: job, "
                                     "arrival, window_s, priority) for a workload whose lines "
                                     "name their job."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object keyed by policy."),
    config: Path | None = ConfigFile,
    model: str | None = typer.Option(None, "--model", "-m", help="The model (a directory "
                                     "with a tokenizer.json counts tokens with it)."),
) -> None:
    """Replay a workload through fabric and the schedulers users run instead (simulated).

    Token counts come from [producer] tokenizer, else the model directory's tokenizer.json
    (--model DIR), else an estimate of 4 bytes a token, as for submit and run.
    """
    cfg = load(config, model=model)
    c = cfg.consumer
    raise typer.Exit(guarded(lambda: run_replay(
        workload, gpus, policy, json_out, kv_tokens, pressure, rate, seed, max_num_seqs,
        tokenizer=cfg.producer.tokenizer, model=cfg.model, costs_file=costs,
        contract=(c.max_batch_size, c.max_batch_tokens, c.max_input_len), jobs_file=jobs)))


def policy_names(policy: str, jobs: bool = False) -> list[str]:
    """`policy` as a list of known names ("all" = fabric, the baselines and the oracle, and
    fabric-tokens, fabric-fair and edf for a multi-job workload)."""
    from fabricctl.replay.run import JOB_POLICIES, KNOWN, POLICIES

    if policy == "all":
        return list(JOB_POLICIES if jobs else POLICIES)
    names = [p.strip() for p in policy.split(",") if p.strip()]
    bad = [n for n in names if n not in KNOWN]
    if bad or not names:
        raise UsageError(f"unknown policy {', '.join(bad) or repr(policy)}; "
                         f"known: all, {', '.join(KNOWN)}")
    return names


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def read_workload(path: Path, counter: TokenCounter | None = None) -> list[Item]:
    """The workload's items, counted with `counter` (default: the estimate); bad lines are
    reported on stderr (the first 20)."""
    return [item for item, _ in read_job_workload(path, counter)]


def read_job_workload(path: Path, counter: TokenCounter | None = None
                      ) -> list[tuple[Item, str | None]]:
    """`read_workload`, each item with its line's job (None: none); a line whose job is not
    a non-empty string is a bad line."""
    from fabricctl.formats.reader import LineError, Parsed, parse_lines, read_lines
    from fabricctl.replay.jobs import line_job

    items: list[tuple[Item, str | None]] = []
    bad = 0

    def report(line: str) -> None:
        nonlocal bad
        bad += 1
        if bad <= 20:
            _say(f"{path}: {line}")

    with path.open("rb") as fp:
        lines = list(read_lines(fp))
    for got in parse_lines(lines, counter=counter):
        if isinstance(got, LineError):
            report(str(got))
        elif isinstance(got, Parsed):
            try:
                job = line_job(lines[got.line_no - 1].rstrip(b"\r\n"))
            except WorkloadError as e:
                report(f"line {got.line_no}: {e}")
                continue
            items.append((got.item, job))
    if bad > 20:
        _say(f"{path}: {bad - 20} more bad lines")
    return items


def read_jobs_file(path: Path) -> dict[str, JobSpec]:
    """A jobs file's jobs by name; one that does not read is a `UsageError`, one that does not
    parse a `WorkloadError`."""
    from fabricctl.replay.jobs import read_jobs

    try:
        return read_jobs(path.read_bytes().splitlines())
    except OSError as e:
        raise UsageError(f"jobs {path}: {e.strerror or e}") from None
    except WorkloadError as e:
        raise WorkloadError(f"jobs {path}: {e}") from None


def results_table(results: dict[str, PolicyResult], title: str) -> Table:
    """One row per policy; `vs best baseline` compares tokens/s with the best baseline run."""
    from rich.table import Table

    from fabricctl.fmt import pct
    from fabricctl.replay.run import BASELINES, ORACLE

    base = max((r.tokens_per_s for n, r in results.items() if n in BASELINES), default=0.0)
    oracle = results[ORACLE].tokens_per_s if ORACLE in results else 0.0
    t = Table(title=title)
    for col, justify in (("policy", "left"), ("tok/s", "right"), ("vs best baseline", "right"),
                         ("vs oracle", "right"),
                         ("KV hit", "right"), ("achievable", "right"),
                         ("switches/GPU", "right"), ("mid-stream", "right"),
                         ("padding", "right"), ("graph builds", "right"), ("thrash", "right"),
                         ("refills", "right"), ("p50 s", "right"), ("p99 s", "right")):
        t.add_column(col, justify=justify, no_wrap=col == "policy")  # type: ignore[arg-type]
    for name, r in results.items():
        t.add_row(
            name, f"{r.tokens_per_s:,.0f}",
            f"{r.tokens_per_s / base:.2f}x" if base else "-",
            f"{r.tokens_per_s / oracle:.2f}" if oracle else "-",
            pct(r.kv_hit_rate), pct(r.kv_hit_achievable), f"{r.switches_per_gpu:,.1f}",
            f"{r.midstream_switches:,}", pct(r.padding_waste), f"{r.graph_builds:,}",
            "-" if r.thrash_events is None else f"{r.thrash_events:,}", f"{r.prefix_refills:,}",
            f"{r.p50_latency_s:.2f}", f"{r.p99_latency_s:.2f}",
        )
    return t


def jobs_tables(results: dict[str, PolicyResult]) -> tuple[Table, Table]:
    """Per policy: makespan, deadlines met, the jobs that missed, the worst slowdown; and per
    policy and job: arrival, completion, standalone, slowdown, deadline."""
    from rich.table import Table

    summary = Table(title="jobs: per policy (simulated)")
    for col in ("policy", "makespan s", "deadlines met", "missed", "worst slowdown"):
        summary.add_column(col, justify="left" if col in ("policy", "missed") else "right")
    detail = Table(title="jobs: completion against standalone (simulated)")
    for col in ("policy", "job", "items", "priority", "arrival s", "window s", "completion s",
                "standalone s", "slowdown", "deadline"):
        detail.add_column(col, justify="left" if col in ("policy", "job", "deadline")
                          else "right")
    for name, r in results.items():
        summary.add_row(
            name, f"{r.makespan_s:.2f}",
            f"{r.deadlines_met}/{r.deadlines}" if r.deadlines else "-",
            ", ".join(r.deadlines_missed or []) or "-",
            "-" if r.worst_slowdown is None else f"{r.worst_slowdown:.2f}x")
        for j in r.jobs or []:
            detail.add_row(
                name, j.job, f"{j.items:,}", f"{j.priority}", f"{j.arrival_s:.2f}",
                "-" if j.window_s is None else f"{j.window_s:g}", f"{j.completion_s:.2f}",
                "-" if j.standalone_s is None else f"{j.standalone_s:.2f}",
                "-" if j.slowdown is None else f"{j.slowdown:.2f}x",
                "-" if j.deadline_met is None else "met" if j.deadline_met else "MISSED")
    return summary, detail


def counter_for(tokenizer: str, model: str) -> TokenCounter:
    """`choose_counter(tokenizer, model)`; a configured tokenizer that does not load is a
    `UsageError`."""
    from fabricctl.formats.tokens import choose_counter

    try:
        return choose_counter(tokenizer, model)
    except Exception as e:  # the configured tokenizer is missing or not a tokenizer.json
        raise UsageError(f"tokenizer {tokenizer}: {e}") from None


def load_costs_file(path: Path | None) -> SimCosts:
    """The default profile, or `path`'s costs; a file that does not load is a `UsageError`."""
    from fabricctl.engines.costs import SimCosts
    from fabricctl.replay.calibrate import load_costs

    if path is None:
        return SimCosts()
    try:
        return load_costs(path.read_text())
    except (OSError, UnicodeDecodeError, UsageError) as e:
        raise UsageError(f"costs {path}: {e}") from None


def run_replay(workload: Path, gpus: int, policy: str, json_out: bool, kv_tokens: int | None,
               pressure: float | None, rate: float, seed: int, max_num_seqs: int | None,
               tokenizer: str = "", model: str = "", costs_file: Path | None = None,
               contract: tuple[int, int, int] | None = None, jobs_file: Path | None = None
               ) -> int:
    """Replay `workload` through `policy` on `gpus` simulated GPUs; print; return exit code 0
    (bad input raises a `UsageError`). Tokens are counted by `choose_counter(tokenizer,
    model)`; `contract` is (max batch size, max batch tokens, max input length), default
    `BatchLimits()`; `jobs_file`: the jobs' terms (a multi-job workload)."""
    import msgspec
    from rich.console import Console

    from fabricctl.replay.report import JOB_FIELDS
    from fabricctl.replay.run import BatchLimits, costs_for, limits_for, pressure_of, replay
    from fabricctl.replay.workload import with_jobs

    policy_names(policy)  # checked before the workload is read; "all" depends on it
    if gpus < 1:
        raise UsageError("gpus must be at least 1")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise UsageError("max_num_seqs must be at least 1")
    if rate < 0:
        raise UsageError("rate must be >= 0")
    if kv_tokens is not None and pressure is not None:
        raise UsageError("give kv_tokens or pressure, not both")
    if not workload.is_file():
        raise UsageError(f"{workload}: no such file")
    specs = read_jobs_file(jobs_file) if jobs_file is not None else {}
    counter = counter_for(tokenizer, model)
    parsed = read_job_workload(workload, counter)
    if not parsed:
        raise UsageError(f"{workload}: no readable item")
    base = load_costs_file(costs_file)
    if max_num_seqs is None:
        max_num_seqs = base.max_num_seqs if costs_file is not None else 64
    try:
        items, jobs = with_jobs(parsed, specs, base.block_size, rate, seed)
    except WorkloadError as e:
        raise WorkloadError(f"jobs {jobs_file}: {e}") from None
    names = policy_names(policy, jobs=bool(jobs))
    costs = costs_for(items, kv_tokens=kv_tokens, pressure=pressure,
                      max_num_seqs=max_num_seqs, base=base)
    given = BatchLimits(*contract) if contract is not None else BatchLimits()
    limits = limits_for(items, costs, given)
    results = {n: msgspec.structs.replace(r, token_counter=counter.name)
               for n, r in replay(items, names, gpus, costs, limits, jobs=jobs).items()}
    if json_out:
        drop = () if jobs else JOB_FIELDS
        sys.stdout.write(msgspec.json.encode(
            {n: {k: v for k, v in msgspec.structs.asdict(r).items() if k not in drop}
             for n, r in results.items()}).decode() + "\n")
        return int(ExitCode.OK)
    arrivals = "all at t=0" if rate == 0 else f"Poisson {rate:g}/s (seed {seed})"
    _say(f"simulated: {len(items):,} items, {gpus} GPU(s), KV {costs.kv_tokens:,} tokens "
         f"(cache pressure {pressure_of(items, costs):.2f}), max_num_seqs {max_num_seqs}, "
         f"arrivals {arrivals}; token counts: {counter.name}; cost model: "
         f"{costs_file or 'fabricctl/engines/costs.py (an H100, a 7B model)'}; contract "
         f"{limits.max_batch_size} items / {limits.max_batch_tokens:,} tokens a batch"
         + (f"; {len(jobs)} jobs ({jobs_file or 'no jobs file'})" if jobs else ""))
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(results_table(results, f"fabricctl replay — {workload.name} (simulated)"))
    if jobs:
        for table in jobs_tables(results):
            console.print(table)
    return int(ExitCode.OK)
