"""Session fixtures for the real-vLLM suite: the CPU build's venv, a tiny model, two servers.

The venv is `.venv-vllm` at the repo root (override: FABRICCTL_VLLM_VENV); `make test`
creates it with scripts/vllm_env.sh. Missing venv = test failure, unless
FABRICCTL_ALLOW_SKIP_VLLM=1, then a skip. Two servers stand in for two GPUs, one core each,
started once per run through fabricctl's own launcher. `embed_server` (also started once, by
the first test that needs it, in the background: `starting`) serves the tiny model as an
embedding model (`--runner pooling --convert embed`: `EMBED`), started by `serve_pooling`,
which other pooling servers use too. `lora_adapters` writes two random LoRA adapters for the
tiny model (`make_lora.py`); `lora_server` (started like `embed_server`) serves the tiny model
with both, the launcher's own LoRA flags (its `adapters`), which `lora_flags` spells out for
run-batch.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from ports import free_port_pair

from fabricctl.errors import LaunchError
from fabricctl.supervisor.launch_spec import LORA_SPARE_SLOTS, vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FABRICCTL_VLLM_VENV", ROOT / ".venv-vllm"))
MAKE_MODEL = Path(__file__).with_name("make_tiny_model.py")
MAKE_LORA = Path(__file__).with_name("make_lora.py")
BLOCK_SIZE = 32  # the CPU backend needs a multiple of 32
NUM_BLOCKS = 64  # small, so a few shapes evict each other
MAX_MODEL_LEN = 512
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
               "--max-num-seqs", "16", "--enforce-eager", "--enable-prefix-caching",
               "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(NUM_BLOCKS),
               "--enable-prompt-tokens-details")


EMBED = ("--runner", "pooling", "--convert", "embed")
ADAPTERS = ("ad-a", "ad-b")  # the LoRA adapters' names, seeds 1 and 2
LORA_RANK = ("--max-lora-rank", "8")

LORA_NAMES = ("tiny", *ADAPTERS)  # the LoRA batch's names: the base model's first
LORA_SYSTEMS = ["You are a helpful assistant. the broker routes the items.",
           "You are terse. the cache keeps its blocks and the engine counts the tokens.",
           "Question: the supervisor sends the results. Answer:"]
LORA_USERS = ["the shape warms a prefix.", "every consumer reads the queue.",
         "a lane packs the items.", "one prompt evicts its blocks."]


def lora_lines() -> list[dict[str, Any]]:
    """36 temperature-0 chat lines: every (name, system, user) once, the names interleaved."""
    lines = []
    for i in range(len(LORA_NAMES) * len(LORA_SYSTEMS) * len(LORA_USERS)):
        name = LORA_NAMES[i % len(LORA_NAMES)]
        system = LORA_SYSTEMS[i // len(LORA_NAMES) % len(LORA_SYSTEMS)]
        user = LORA_USERS[i // (len(LORA_NAMES) * len(LORA_SYSTEMS))]
        lines.append({"custom_id": f"{name}-{i}", "method": "POST",
                      "url": "/v1/chat/completions",
                      "body": {"model": name, "temperature": 0, "max_tokens": 8,
                               "messages": [{"role": "system", "content": system},
                                            {"role": "user", "content": user}]}})
    return lines


def lora_flags(adapters: dict[str, Path]) -> tuple[str, ...]:
    """The engine flags that serve the tiny model with `adapters` (name -> directory), as the
    launcher writes them for its `adapters` (`lora_server`), for run-batch: `--max-loras` keeps
    `LORA_SPARE_SLOTS` free (vLLM 0.32's CPU build answers a base request beside adapter
    requests with the last slot's adapter when every slot is taken)."""
    return ("--enable-lora", "--lora-modules",
            *(f"{name}={path}" for name, path in adapters.items()),
            "--max-loras", str(len(adapters) + LORA_SPARE_SLOTS), *LORA_RANK)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kills_session_server: kills a session server and "
                            "does not wait for its restart; runs after every other test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that leave a session server restarting run last, so no other test waits for it."""
    items.sort(key=lambda item: item.get_closest_marker("kills_session_server") is not None)




def _kill_leftovers(launcher: Launcher) -> None:
    for pid in launcher.pids().values():
        if pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        msg = f"{py} is missing: run scripts/vllm_env.sh (make test does)"
        if os.environ.get("FABRICCTL_ALLOW_SKIP_VLLM") == "1":
            pytest.skip(msg + " [skipped: FABRICCTL_ALLOW_SKIP_VLLM=1]")
        pytest.fail(msg + "; set FABRICCTL_ALLOW_SKIP_VLLM=1 to skip instead", pytrace=False)
    return py


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-model")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    subprocess.run([str(vllm_python), str(MAKE_MODEL), str(out)], check=True, env=env,
                   timeout=300, capture_output=True)
    return out


async def start_or_fail(launcher: Launcher) -> None:
    """Start the launcher's servers; a test failure with their log tails when they do not."""
    try:
        await launcher.start()
    except LaunchError as e:
        tails = "\n".join(f"--- {s.log_path}\n" + s.log_path.read_text()[-3000:]
                          for s in launcher.servers if s.log_path.exists())
        pytest.fail(f"{e}\n{tails}", pytrace=False)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_servers(tiny_model: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Launcher]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    spec = vllm_cpu_spec(VENV, str(tiny_model), "tiny", logs, port_base=free_port_pair(),
                         extra_args=SERVER_ARGS, ready_timeout_s=240.0, stop_timeout_s=20.0,
                         restart_backoff_s=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0),
                         env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    launcher = Launcher(spec, [0, 1])
    atexit.register(_kill_leftovers, launcher)  # if the session dies before teardown
    t0 = time.monotonic()
    await start_or_fail(launcher)
    print(f"\nvLLM: two servers ready in {time.monotonic() - t0:.1f} s")
    yield launcher
    await launcher.stop()


async def serve_pooling(model: Path, flags: tuple[str, ...], logs: Path,
                        adapters: dict[str, Path] | None = None) -> Launcher:
    """One server of `model` with the session's flags plus `flags` (a pooling runner) and the
    LoRA `adapters` (name -> directory), ready; its log tail in the failure when it does not
    start."""
    spec = vllm_cpu_spec(VENV, str(model), "tiny", logs, port_base=free_port_pair(),
                         extra_args=(*SERVER_ARGS, *flags), ready_timeout_s=240.0,
                         adapters={name: str(path) for name, path in (adapters or {}).items()},
                         stop_timeout_s=20.0, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    launcher = Launcher(spec, [0])
    await start_or_fail(launcher)
    return launcher


@contextlib.asynccontextmanager
async def starting(start: Awaitable[Launcher]) -> AsyncIterator[asyncio.Task[Launcher]]:
    """A server starting in the background: a test awaits it beside what it does meanwhile
    (run-batch, on the other core); stopped at the end if it started."""
    task = asyncio.ensure_future(start)
    try:
        yield task
    finally:
        launcher = None
        with contextlib.suppress(BaseException):
            launcher = await task
        if launcher is not None:
            await launcher.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def embed_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> AsyncIterator[asyncio.Task[Launcher]]:
    """The tiny Llama as an embedding model (`EMBED`), starting once for the tests that await
    it (an idle CPU vLLM server takes no CPU time, measured)."""
    async with starting(serve_pooling(tiny_model, EMBED,
                                      tmp_path_factory.mktemp("embed-logs"))) as task:
        yield task


@pytest.fixture(scope="session")
def lora_adapters(vllm_python: Path, tiny_model: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two random rank-8 LoRA adapters (peft layout) for the tiny model:
    {"ad-a": dir, "ad-b": dir}."""
    root = tmp_path_factory.mktemp("lora")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    adapters = {name: root / name for name in ADAPTERS}
    subprocess.run([str(vllm_python), str(MAKE_LORA), str(tiny_model),
                    *map(str, adapters.values())], check=True, env=env, timeout=300,
                   capture_output=True)
    return adapters


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lora_runbatch(tiny_model: Path, lora_adapters: dict[str, Path],
                        tmp_path_factory: pytest.TempPathFactory
                        ) -> AsyncIterator[asyncio.Task[dict[str, Any]]]:
    """`vllm run-batch` of `lora_lines()` with `lora_flags` (on core 1), started once in the
    background: its rows by custom_id, the reference of every LoRA test."""
    from runbatch import run_batch, write

    tmp = tmp_path_factory.mktemp("lora-runbatch")
    inp = write(tmp / "lora.jsonl", lora_lines())
    task = asyncio.ensure_future(run_batch(tiny_model, inp, tmp / "rb.jsonl", 1,
                                           *lora_flags(lora_adapters)))
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await task


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lora_server(tiny_model: Path, lora_adapters: dict[str, Path],
                      tmp_path_factory: pytest.TempPathFactory
                      ) -> AsyncIterator[asyncio.Task[Launcher]]:
    """The tiny Llama with both adapters (the launcher's `adapters`: its flags are
    `lora_flags`), starting once in the background for the tests that await it."""
    async with starting(serve_pooling(tiny_model, LORA_RANK, tmp_path_factory.mktemp("lora-logs"),
                                      adapters=lora_adapters)) as task:
        yield task
