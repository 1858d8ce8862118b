"""`fabricctl doctor`: is this host ready to run fabricctl, and is a broker running?

Contract: a fixed list of checks, each `Check(name, status, detail)` with status `ok`,
`warn` or `fail`, in this order: `config` (the files found and whether they parse),
`nvml` (GPUs through `supervisor.gpus.detect_gpus()`, or why not), `fleet` (the servers
of `AppConfig.fleet` against this host, `fleetspec.gpu_problems` and `adapter_problems`:
every group's GPUs found by NVML, every adapter directory present with its
adapter_config.json; the GPU checks say they were skipped without NVML, or with the
simulated engine or `vllm.device = cpu`, and nothing is checked for engine openai),
`vllm` (when the configuration launches vLLM, the named vLLM imported as its servers will
import it, with its version or the last lines of why not: `supervisor.vllm_install.probe`;
else whether its command is found), `data_dir` (exists, writable, free space), `broker`
(socket present and a broker answering a status query). A check fails only for what stops
the configured setup from working (e.g. no GPUs with `engine = "vllm"`, an unwritable data
dir, an invalid config); what merely degrades (no NVML with the simulated engine, no broker
running yet) is a warning. Exit 0 when no check failed, else 1. `--json`:
`{"ok": bool, "checks": [{"name", "status", "detail"}]}`. The `doctor` command (`command`)
runs `doctor` and exits with its status.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fabricctl.cli.optgroup import takes
from fabricctl.cli.support import (
    UNSET,
    ConfigFile,
    DataDir,
    EngineFlags,
    JsonOut,
    guarded,
)
from fabricctl.config import AppConfig, load_config, user_config_path
from fabricctl.config.fleetspec import ServerSpec, adapter_problems, gpu_problems
from fabricctl.errors import FabricError
from fabricctl.fmt import human_bytes
from fabricctl.wire.protocol import SOCKET_NAME

from .common import console, write_json

if TYPE_CHECKING:
    from fabricctl.supervisor.gpus import GpuReport

LOW_DISK = 1 << 30  # warn below 1 GiB free in the data dir's file system


DOCTOR_ENGINE = typer.Option(None, "--engine", "-e", metavar="auto|sim|vllm|openai",
                             help="Check for this engine instead of the configured one.",
                             show_default=False)


@takes(EngineFlags, omit=("model", "gpus"), engine=DOCTOR_ENGINE)
def command(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
            config: Path | None = ConfigFile, engines: EngineFlags = UNSET) -> None:
    """Check the host: config files, NVML and GPUs, vLLM, the data dir, a running broker.

    When the configuration launches vLLM (engine vllm, or auto with GPUs or vllm.device
    cpu), the vllm check imports it the way its servers will and reports its version.
    One line per check: ok, warn or fail. Exit status 0 when no check failed, else 1.
    """
    flags = {"data_dir": data_dir, **engines.config()}
    raise typer.Exit(guarded(lambda: doctor(config, flags, json_out)))


@dataclass(frozen=True)
class Check:
    """Why: one line of the report, and one element of --json."""

    name: str
    status: str  # ok | warn | fail
    detail: str


def check_config(config: Path | None, flags: dict[str, object]) -> tuple[Check, AppConfig]:
    found = [str(p) for p in (user_config_path(), Path.cwd() / "fabric.toml") if p.is_file()]
    if config is not None:
        found.append(str(config))
    try:
        cfg = load_config(config, flags)
    except FabricError as e:
        return Check("config", "fail", str(e)), AppConfig()
    files = ", ".join(found) if found else f"no files (defaults; user file {user_config_path()})"
    return Check("config", "ok", f"valid: {files}"), cfg


def gpu_report() -> GpuReport | None:
    """What NVML finds; None when the check itself failed (doctor never crashes)."""
    try:
        from fabricctl.supervisor.gpus import detect_gpus

        return detect_gpus()
    except Exception:  # the monitor never should raise, but doctor must not crash
        return None


def check_nvml(cfg: AppConfig, report: GpuReport | None = None) -> Check:
    if report is None:
        try:
            from fabricctl.supervisor.gpus import detect_gpus

            report = detect_gpus()
        except Exception as e:  # the monitor never should raise, but doctor must not crash
            return Check("nvml", "fail" if cfg.engine == "vllm" else "warn",
                         f"NVML check failed: {e}")
    if report.available and report.gpus:
        names = sorted({g.name or "?" for g in report.gpus})
        return Check("nvml", "ok", f"{len(report.gpus)} GPU(s) ({', '.join(names)}), driver "
                                   f"{report.driver_version or '?'}")
    reason = report.reason or "NVML found no GPUs"
    if cfg.vllm.device == "cpu":
        return Check("nvml", "ok", f"{reason}; not needed: vllm.device = cpu")
    if cfg.engine == "vllm":
        return Check("nvml", "fail", f"{reason}; engine 'vllm' needs GPUs")
    return Check("nvml", "warn", f"{reason}; `fabricctl up` will use simulated GPUs")


def _server_line(s: ServerSpec) -> str:
    groups = " ".join("[" + ",".join(map(str, g)) + "]" for g in s.gpus) or "every GPU"
    tp = {s.tp(g) for g in s.gpus}
    parts = [f"{s.served_name} on {groups}"]
    if tp - {1}:
        parts.append(f"tp {'/'.join(map(str, sorted(tp)))}")
    if s.adapters:
        parts.append(f"adapters {', '.join(s.adapters)}")
    return " ".join(parts)


def check_fleet(cfg: AppConfig, loaded: bool, report: GpuReport | None) -> Check:
    """The fleet against this host: GPU groups NVML has, adapter directories present."""
    if not loaded:
        return Check("fleet", "fail", "not checked: the configuration did not load")
    if cfg.engine == "openai":
        return Check("fleet", "ok", "engine openai: the servers are run by others "
                                    "(vllm.endpoints)")
    servers = cfg.fleet
    what = f"{len(servers)} server(s): " + "; ".join(_server_line(s) for s in servers)
    real = cfg.engine == "vllm" or (cfg.engine == "auto" and report is not None
                                    and report.available and bool(report.gpus))
    problems = adapter_problems(servers)
    skipped = ""
    if cfg.vllm.device == "cpu" and cfg.engine != "sim":
        skipped = "GPU groups not checked: vllm.device = cpu runs them on the CPU"
    elif not real:
        skipped = ("GPU groups not checked: " + (
            "engine sim simulates them" if cfg.engine == "sim"
            else f"no NVML ({(report.reason if report else None) or 'unavailable'})"))
    elif report is None or not report.available:
        skipped = ("GPU groups not checked: no NVML ("
                   f"{(report.reason if report else None) or 'unavailable'})")
    else:
        problems += gpu_problems(servers, [g.index for g in report.gpus])
    if problems:
        return Check("fleet", "fail" if real else "warn", "; ".join(problems))
    return Check("fleet", "ok", what + (f"; {skipped}" if skipped else ""))


def uses_vllm(cfg: AppConfig, report: GpuReport | None) -> bool:
    """Whether `up` and `run` would launch vLLM servers with this configuration."""
    gpus = report is not None and report.available and bool(report.gpus)
    return cfg.engine == "vllm" or (cfg.engine == "auto" and (gpus or cfg.vllm.device == "cpu"))


def check_vllm(cfg: AppConfig, report: GpuReport | None = None) -> Check:
    """The vLLM the servers would run: imported as they will import it (its version), when
    the configured setup launches vLLM; else only whether its command is found."""
    from fabricctl.supervisor.vllm_install import launch_command, missing, probe

    shown = " ".join(launch_command(cfg.vllm).command)
    if not uses_vllm(cfg, report):
        why = missing(cfg.vllm)
        return Check("vllm", "warn" if why else "ok",
                     f"not checked further: engine {cfg.engine} launches no vLLM here; "
                     + (why or f"{shown!r} found"))
    found = probe(cfg.vllm)
    if found.ok and found.version:
        return Check("vllm", "ok", f"vLLM {found.version} ({found.detail}); servers run "
                                   f"{shown!r} on {cfg.vllm.device}")
    return Check("vllm", "ok" if found.ok else "fail", found.detail)


def check_data_dir(cfg: AppConfig) -> Check:
    d = cfg.data_dir
    probe = d
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        what = "is not writable" if probe == d else f"does not exist and {probe} is not writable"
        return Check("data_dir", "fail", f"{d} {what}")
    free = shutil.disk_usage(probe).free
    where = f"{d}" if probe == d else f"{d} (does not exist yet; `fabricctl up` creates it)"
    status = "warn" if free < LOW_DISK else "ok"
    return Check("data_dir", status, f"{where}: writable, {human_bytes(free)} free")


def check_broker(cfg: AppConfig) -> Check:
    sock = cfg.data_dir / SOCKET_NAME
    if not sock.exists():
        return Check("broker", "warn", f"no socket at {sock}: no broker running "
                                       "(start one with `fabricctl up`)")

    async def ask() -> dict[str, object]:
        from fabricctl.wire.client import Client

        c = await Client.connect(cfg.data_dir, "observer", "fabricctl-doctor", timeout=3.0)
        try:
            return await asyncio.wait_for(c.status(), 5.0)
        finally:
            await c.close()

    try:
        st = asyncio.run(ask())
    except (FabricError, OSError, TimeoutError) as e:
        return Check("broker", "warn", f"socket {sock} present but no broker answers ({e})")
    extra = st.get("extra", {})
    engine = extra.get("engine", {}) if isinstance(extra, dict) else {}
    return Check("broker", "ok", f"broker {st.get('version')} answering at {sock}, "
                                 f"{st.get('consumers')} consumer(s), engine "
                                 f"{engine.get('kind', '?') if isinstance(engine, dict) else '?'}")


def run_checks(config: Path | None, flags: dict[str, object]) -> list[Check]:
    first, cfg = check_config(config, flags)
    report = gpu_report()
    return [first, check_nvml(cfg, report), check_fleet(cfg, first.status != "fail", report),
            check_vllm(cfg, report), check_data_dir(cfg), check_broker(cfg)]


def doctor(config: Path | None, flags: dict[str, object], as_json: bool) -> int:
    checks = run_checks(config, flags)
    ok = not any(c.status == "fail" for c in checks)
    if as_json:
        write_json({"ok": ok, "checks": [asdict(c) for c in checks]})
    else:
        from rich.markup import escape

        con = console()
        style = {"ok": "green", "warn": "yellow", "fail": "red bold"}
        for c in checks:
            con.print(f"[{style[c.status]}]{c.status:<4}[/] {c.name:<9} {escape(c.detail)}",
                      markup=True, soft_wrap=True)
    return 0 if ok else 1
