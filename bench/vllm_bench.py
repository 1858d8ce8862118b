"""Grouping by shape against arrival order on real vLLM CPU servers: req/s and KV hits.

Contract. One run builds a random ~12M-parameter Llama (`bench/make_bench_model.py`, run
with `.venv-vllm`'s python; its BPE tokenizer is trained on prose from the docstrings of
a fixed list of Python stdlib modules, so nothing is downloaded), starts one vLLM 0.32 CPU
server through fabricctl's own launcher (`vllm_cpu_spec`, 127.0.0.1, pinned to core 0)
with prefix caching (once it runs, its scheduler joins the model worker on core 0, and its
front end and this process keep to the other cores: `keep_off_the_engine_core`),
`--block-size 32`, `--enforce-eager`, `--dtype float32`,
`--max-num-seqs 16`, `--enable-prompt-tokens-details`, `VLLM_SERVER_DEV_MODE=1`, and a KV
cache of `--num-gpu-blocks-override N` blocks: room for 16 in-flight requests' own blocks
plus TWO prefixes (policy_bench's "cache pressure" = shapes / 2), and stops it at the end,
also on an error, Ctrl-C or SIGTERM.

The workload (seeded, built before any clock starts): `--shapes` shapes, each a prefix of
exactly `PREFIX_TOKENS` tokens of real stdlib prose (a system line naming the shape, then a
passage; the pieces join at pre-token boundaries, checked), Zipf popularity (1/rank);
`--items` items (480 by default), each its shape's prefix + a unique suffix (" Item
<code>:" and a sentence, 8-40 tokens), `MAX_TOKENS` output tokens with `ignore_eos` and
temperature 0, so every ordering does identical work; items arrive shuffled. No two items
share a block past their prefix, and every request of a shape (item or bare-prefix
pre-warm) can hit exactly F = floor(PREFIX_TOKENS / 32) * 32 tokens.

Phases, on the same server, each after `POST /reset_prefix_cache` (and one unmeasured
warm-up before the first), with vLLM's `/metrics` scraped before and after:
  a. arrival:   the bench's httpx client, one `POST /v1/completions` per item, 16 in
                flight, in arrival (shuffled) order;
  b. grouped:   the same with the items stably sorted by shape;
  c. fabricctl: (a consumer window of two batches: the one the replay's prediction models)
                the items as native JSONL (`prefix` components, `prompt`, `max_tokens`,
                `params`) through `fabricctl.cli.run.run_job` (what `fabricctl run` does),
                engine "openai" against the same server, contract 16 items a batch,
                `[broker] prewarm = "on"`;
  d. no-prewarm: phase c with `[broker] prewarm = "off"` (what "auto", the default, does
                on a real engine: `fabricctl.core.config.prewarm_enabled`).
With `--servers 2` a second server (core 1, the same KV cache) starts beside the first, and
after phases a-d (on the first server alone):
  e. round-robin-2: the items in arrival order dealt out to the two servers in turn, 16 in
                flight on each;
  f. fabricctl-2: phase d with both servers (one consumer each, the default shape scope).
Their hit rates are set against the ONE-server achievable (each prefix computed once in
all), so splitting a shape over both servers shows as points below it.

With `--unpinned` nothing is pinned at all: the server gets `VLLM_CPU_OMP_THREADS_BIND=nobind`
(no OpenMP binding) and `OMP_NUM_THREADS=--engine-threads` (1 by default: the pinned
server's one core of compute), `keep_off_the_engine_core` is not called, and the kernel
places every thread (`cpu_affinities_at_start`/`_at_end`: the distinct affinities of this
process's and the servers' threads). No calibration, no prediction, and only:
  b. grouped:   as above;
  g. whole:     the same items as native JSONL through the whole command, a subprocess:
                `python -m fabricctl run FILE --config F --engine openai --model bench
                --output R --json`, F holding phase d's settings (`[vllm] endpoints`,
                `[consumer]` 16 items a batch, `[producer] tokenizer`, `[broker] prewarm =
                "off"`; no --data-dir: the temporary data dir a user gets), run from the temp
                dir with no user config, timed from before its process starts to its exit.
`--rounds N` runs b then g N times. Ratios: req/s of g over b (each round; with N > 1 also
the medians'), prompt tokens computed g over b, g's and b's hit rate minus the achievable;
per g its exit status, the first request in vLLM after its process started (start-up, to
the gauges' 50 ms), how long vLLM held no request before it exited (the tail and shutdown),
its seconds outside run_job's own clock (interpreter, imports, shutdown) and its CPU
seconds.

Per phase: wall seconds, req/s (items / wall), vLLM's hit rate (Δhits / Δqueries of
`vllm:prefix_cache_{hits,queries}_total`), prompt tokens computed (Δqueries - Δhits),
Δ`vllm:prompt_tokens_total`, requests vLLM finished (Δ`vllm:request_success_total`),
preemptions, and the achievable hit rate: F x (requests - shapes) / Δqueries, i.e. every
full prefix block of every request is a hit except one cold prefill of each prefix
(requests include fabricctl's pre-warms: extra requests whose tokens are bare prefixes).
Ratios: req/s of b and c over a, c over b, d over c and over b; c's and d's hit rate minus
their achievable, in points; prompt tokens computed by c and d over b, d over c; with two
servers f over e, f's and e's hit rate minus the one-server achievable. `occupancy` per phase
samples vLLM's running and waiting gauges every 50 ms (and when the first request
was in vLLM, `first_busy_s`, and how long none was at the end, `after_last_busy_s`).
`serve_s` ratios leave out `fabricctl run`'s start-up (job open to last result).

The rehearsal's prediction: before phase a the first server is calibrated as `fabricctl
calibrate` does (`fabricctl.replay.probe.measure`, fitted by
`fabricctl.replay.calibrate.fit_costs`); after the phases the same items, counted by the
same tokenizer, are replayed through round robin and fabric on one simulated GPU of those
costs (two with `--servers 2`), with the contract the fabricctl phases register.
`prediction.gpus1` holds the replay's fabric / round-robin speed-up, the measured phase d /
phase a one, their relative error, and both sets of seconds (`gpus2`: f over e; the replay's
GPUs are independent, so on a host with no core to spare beside two servers, where front
ends, schedulers and fabricctl share their cores, it does not hold). Exit status 0 when
every phase completed every item.

    .venv/bin/python bench/vllm_bench.py                    # a table (a few minutes)
    .venv/bin/python bench/vllm_bench.py --json             # exactly one JSON object
    .venv/bin/python bench/vllm_bench.py --items 96 --keep  # quicker; keep the temp dir
    .venv/bin/python bench/vllm_bench.py --servers 2        # also the two-server phases
    .venv/bin/python bench/vllm_bench.py --unpinned         # b and g, nothing pinned
    .venv/bin/python bench/vllm_bench.py --lora 2           # 4 prefixes x 3 names

With `--lora N` the server loads N random LoRA adapters (`--enable-lora`, a slot spare) and
each of `--shapes / (N + 1)` prefixes is asked under the base model and every adapter: the
same tokens make N + 1 shapes, since vLLM keys an adapter's cached blocks by its name, so
the achievable hit rate counts each (name, prefix) cold once. No prediction is made (the
replay's simulated workload knows one name per model).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import atexit
import contextlib
import dataclasses
import io
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from fabricctl.cli.replay import counter_for, read_workload
from fabricctl.cli.run import run_job
from fabricctl.cli.run_summary import RunSummary
from fabricctl.config import AppConfig, ConsumerSettings, ProducerSettings, VllmSettings
from fabricctl.core.config import CoreConfig
from fabricctl.engines.costs import SimCosts
from fabricctl.errors import LaunchError
from fabricctl.replay.calibrate import Probes, ServerShape, fit_costs
from fabricctl.replay.probe import measure
from fabricctl.replay.run import BatchLimits, costs_for, replay
from fabricctl.replay.workload import load
from fabricctl.supervisor.launch_spec import vllm_cpu_spec
from fabricctl.supervisor.launcher import Launcher

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("FABRICCTL_VLLM_VENV", ROOT / ".venv-vllm"))
MAKE_MODEL = Path(__file__).with_name("make_bench_model.py")
MAKE_LORA = ROOT / "tests" / "real" / "make_lora.py"
SERVED = "bench"
LORA_NAMES = ("ad-a", "ad-b", "ad-c", "ad-d")
BLOCK = 32  # the CPU backend needs a multiple of 32
IN_FLIGHT = 16  # = --max-num-seqs, and the bench client's concurrency
PREFIX_TOKENS = 300  # 9 full blocks + 12 tokens: the item's code lands in block 10
MAX_TOKENS = 4
SUFFIX_TOKENS = (8, 40)  # an item's own tokens after its prefix, min and max
MAX_MODEL_LEN = 512
KV_PREFIXES = 2  # prefixes the KV cache holds beside the in-flight requests' own blocks
PARAMS = {"ignore_eos": True, "temperature": 0}
COUNTERS = {
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:request_success_total": "requests",
    "vllm:num_preemptions_total": "preemptions",
}
# prose sources for the tokenizer and the prompts: stdlib modules' docstrings (fixed list)
STDLIB_MODULES = (
    "argparse", "textwrap", "difflib", "heapq", "bisect", "random", "statistics", "fractions",
    "_pydecimal", "logging/__init__", "pickle", "tarfile", "zipfile", "subprocess",
    "threading", "queue", "sched", "calendar", "csv", "shlex", "functools", "contextlib",
    "dataclasses", "enum", "inspect", "pathlib", "shutil", "tempfile", "typing",
    "unittest/case", "json/__init__", "email/message", "http/client", "urllib/parse",
    "collections/__init__", "string", "configparser", "optparse", "asyncio/events",
    "asyncio/tasks", "asyncio/streams", "socket", "selectors", "ssl", "codecs", "locale",
    "gettext", "imaplib", "smtplib", "ftplib", "mailbox", "pdb", "cmd", "doctest", "trace",
    "timeit", "profile", "pstats", "tokenize", "ast", "dis", "importlib/__init__", "pkgutil",
    "zipimport", "weakref", "copy", "pprint", "reprlib", "numbers", "operator", "base64",
    "hashlib", "hmac", "secrets", "uuid", "datetime", "glob", "fnmatch", "filecmp",
    "fileinput", "gzip", "bz2", "lzma", "mimetypes", "netrc", "plistlib", "quopri", "wave",
    "colorsys", "getopt", "getpass", "platform", "signal", "sysconfig", "traceback",
    "warnings", "abc", "types",
)


# -- corpus, tokenizer, workload ----------

def corpus_paragraphs() -> list[str]:
    """Prose paragraphs (ASCII, >= 8 words, no doctests) from the stdlib modules' docstrings,
    whitespace collapsed, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paras: list[str] = []
    for name in STDLIB_MODULES:
        path = root / f"{name}.py"
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes: list[ast.AST] = [tree]
        nodes += [n for n in ast.walk(tree)
                  if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        for node in nodes:
            doc = ast.get_docstring(node)  # type: ignore[arg-type]
            for para in re.split(r"\n\s*\n", doc or ""):
                words = para.split()
                if len(words) < 8 or ">>>" in para or "::" in para:
                    continue
                if not all(w.isascii() and w.isprintable() for w in words):
                    continue
                text = "".join(words)
                if sum(c.isalpha() for c in text) < 0.7 * len(text):
                    continue
                paras.append(" ".join(words))
    if len(paras) < 500:
        raise RuntimeError(f"only {len(paras)} prose paragraphs found under {root}")
    return paras


class Tok:
    """Why: the bench must know each prompt's exact token ids, as vLLM computes them."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def ids(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids  # vLLM adds no BOS here


@dataclass
class Shape:
    index: int
    components: list[str]
    ids: list[int]
    model: str = SERVED  # the name its items ask for (the base model, or a LoRA adapter)

    @property
    def prefix(self) -> str:
        return "".join(self.components)


@dataclass
class Item:
    id: str
    shape: int
    prompt: str  # the part after the prefix
    tokens: int  # prefix + prompt


@dataclass
class Workload:
    shapes: list[Shape]
    items: list[Item]  # in arrival order
    full_prefix_tokens: int  # F: what a warm cache gives every request of a shape

    @property
    def prompt_tokens(self) -> int:
        return sum(i.tokens for i in self.items)

    @property
    def shapes_used(self) -> int:
        return len({i.shape for i in self.items})

    @property
    def max_len(self) -> int:
        return max(i.tokens for i in self.items)


class WordStream:
    """Why: prefixes and suffixes are cut from the corpus word by word, each word tokenized
    on its own (" word"), so pieces join at pre-token boundaries."""

    def __init__(self, tok: Tok, words: list[str], start: int) -> None:
        self.tok = tok
        self.words = words
        self.pos = start

    def take(self, budget: int, filler: str) -> tuple[str, list[int]]:
        """Exactly `budget` tokens: words that fit, then one-token fillers."""
        text: list[str] = []
        ids: list[int] = []
        misses = 0
        while len(ids) < budget and misses < 200:
            piece = " " + self.words[self.pos % len(self.words)]
            self.pos += 1
            pid = self.tok.ids(piece)
            if len(ids) + len(pid) > budget:
                misses += 1
                continue
            text.append(piece)
            ids += pid
        while len(ids) < budget:
            text.append(filler)
            ids += self.tok.ids(filler)
        return "".join(text), ids


def one_token_filler(tok: Tok) -> str:
    for cand in (" the", " a", " of", " to", " is"):
        if len(tok.ids(cand)) == 1:
            return cand
    raise RuntimeError("the tokenizer has no one-token filler word")


def make_workload(tok: Tok, paras: list[str], shapes: int, items: int,
                  seed: int, names: tuple[str, ...] = (SERVED,)) -> Workload:
    """Shapes of exactly PREFIX_TOKENS tokens, Zipf-popular items with unique suffixes. With
    several `names` (the base model and LoRA adapters) each prefix is asked under every
    name: shape k is prefix k // len(names) under names[k % len(names)], so the same
    tokens make len(names) shapes, as vLLM caches them."""
    rng = random.Random(seed)
    words = " ".join(paras).split()
    filler = one_token_filler(tok)
    out_shapes = []
    stride = len(words) // (shapes + 1)
    for k in range(shapes):
        p = k // len(names)
        system = f"Shape {p}: you answer questions about the passage that follows."
        sys_ids = tok.ids(system)
        passage, pids = WordStream(tok, words, p * stride).take(
            PREFIX_TOKENS - len(sys_ids), filler)
        s = Shape(k, [system, passage], sys_ids + pids, names[k % len(names)])
        if tok.ids(s.prefix) != s.ids or len(s.ids) != PREFIX_TOKENS:
            raise RuntimeError(f"shape {k}: components do not join at token boundaries")
        out_shapes.append(s)
    tail = WordStream(tok, words, shapes * stride)  # suffix text, apart from every prefix
    weights = [1.0 / (k + 1) for k in range(shapes)]
    picks = rng.choices(range(shapes), weights=weights, k=items)
    codes = rng.sample(range(1000, 100000), items)
    lo, hi = SUFFIX_TOKENS
    out_items, private = [], set()
    for n, (k, code) in enumerate(zip(picks, codes, strict=True)):
        head = f" Item {code}:"
        body, _ = tail.take(rng.randint(lo, hi) - len(tok.ids(head)), filler)
        prompt = head + body
        s = out_shapes[k]
        ids = tok.ids(s.prefix + prompt)
        if ids[:PREFIX_TOKENS] != s.ids or ids[PREFIX_TOKENS:] != tok.ids(prompt):
            raise RuntimeError(f"item {n}: prompt does not join its prefix at a boundary")
        first_own = tuple(ids[:PREFIX_TOKENS // BLOCK * BLOCK + BLOCK])  # its first own block
        if first_own in private:
            raise RuntimeError(f"item {n} shares a block past its prefix with another item")
        private.add(first_own)
        out_items.append(Item(f"item-{n}", k, prompt, len(ids)))
    rng.shuffle(out_items)  # shapes arrive interleaved, as from a real producer
    return Workload(out_shapes, out_items, PREFIX_TOKENS // BLOCK * BLOCK)


def kv_blocks(wl: Workload) -> tuple[int, str]:
    """Blocks for IN_FLIGHT requests' own blocks plus KV_PREFIXES prefixes (+ the null block)."""
    prefix_blocks = PREFIX_TOKENS // BLOCK  # full, cacheable blocks
    own = math.ceil((wl.max_len + MAX_TOKENS) / BLOCK) - prefix_blocks
    n = 1 + IN_FLIGHT * own + KV_PREFIXES * prefix_blocks
    n = max(n, math.ceil(MAX_MODEL_LEN / BLOCK) + 1)  # vLLM needs one max-length request
    why = (f"1 null + {IN_FLIGHT} in flight x {own} own blocks + {KV_PREFIXES} prefixes x "
           f"{prefix_blocks} full blocks")
    return n, why


# -- the server ----------

def free_port(count: int = 1) -> int:
    """A port p with p .. p + count - 1 all free on 127.0.0.1 (one per server)."""
    rng = random.Random()
    for _ in range(200):
        p = rng.randrange(20000, 60000)
        socks = []
        try:
            for k in range(count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", p + k))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return p
    raise RuntimeError("no free port on 127.0.0.1")


def _kill_leftovers(launcher: Launcher) -> None:
    """atexit: SIGKILL a server's process group the normal stop did not reach."""
    for pid in launcher.pids().values():
        if pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


@dataclass
class Scrape:
    values: dict[str, float] = field(default_factory=dict)
    block_size: int = 0
    num_blocks: int = 0

    def minus(self, before: Scrape) -> dict[str, float]:
        return {k: v - before.values.get(k, 0.0) for k, v in self.values.items()}


async def scrape(client: httpx.AsyncClient) -> Scrape:
    resp = await client.get("/metrics")
    resp.raise_for_status()
    out = Scrape(dict.fromkeys(COUNTERS.values(), 0.0))
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            if s.name in COUNTERS:
                out.values[COUNTERS[s.name]] += s.value
            elif s.name == "vllm:cache_config_info":
                out.block_size = int(s.labels.get("block_size") or 0)
                out.num_blocks = int(s.labels.get("num_gpu_blocks") or 0)
    return out


SERVER_PIDS: list[int] = []  # the servers' process ids, set once they run


def keep_off_the_engine_core(pids: list[int], engine_cores: set[int]) -> list[int]:
    """Pin the engine's scheduler (`VLLM::EngineCore`) beside its model worker (whose threads
    the CPU backend binds to `engine_cores`), and this process and the servers' front ends
    to the other cores. Left to the kernel, the front end lands on the worker's core now and
    then and the scheduler on the front end's, which makes decode 2-8x slower at random (a
    16-request decode probe took 0.5 s or 4.5 s). Returns the cores the front ends and this
    process were pinned to ([] when there are none to spare)."""
    import psutil

    rest = sorted(set(os.sched_getaffinity(0)) - engine_cores)
    if not rest:
        return []
    procs = [psutil.Process(os.getpid())]
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            tids = [t.id for t in proc.threads()]
            if all(os.sched_getaffinity(t) <= engine_cores for t in tids):
                continue  # a model worker: its threads are bound to the engine's cores
            cores = engine_cores if "EngineCor" in proc.name() else rest
            for tid in tids:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(tid, cores)
    return rest


def affinities(pids: list[int]) -> list[str]:
    """The distinct CPU affinities of this process's and the servers' threads ("0-1" = both
    cores of a 2-core box), to show a phase ran unpinned."""
    import psutil

    procs = [psutil.Process(os.getpid())]
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
    seen: set[tuple[int, ...]] = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            for t in proc.threads():
                with contextlib.suppress(OSError):
                    seen.add(tuple(sorted(os.sched_getaffinity(t.id))))
    return sorted(",".join(map(str, cores)) for cores in seen)


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, the servers' process trees' CPU seconds)."""
    import psutil

    server = 0.0
    for pid in SERVER_PIDS:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    server += t.user + t.system
    return time.process_time(), server


class Occupancy:
    """Why: req/s below the grouped order's is either more work or an emptier engine; this
    samples vLLM's running and waiting gauges through a phase to tell which."""

    def __init__(self, clients: list[httpx.AsyncClient], every_s: float = 0.05) -> None:
        self.clients = clients
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []  # (running, waiting)
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = (0.0, 0.0)
        self._t0 = 0.0
        self.first_busy_s: float | None = None  # first sample with a request in vLLM
        self.last_busy_s: float | None = None  # the last such sample

    async def _loop(self) -> None:
        while True:
            running = waiting = 0.0
            for client in self.clients:
                resp = await client.get("/metrics")
                for family in text_string_to_metric_families(resp.text):
                    for s in family.samples:
                        if s.name == "vllm:num_requests_running":
                            running += s.value
                        elif s.name == "vllm:num_requests_waiting":
                            waiting += s.value
            self.samples.append((running, waiting))
            if running + waiting > 0:
                now = time.perf_counter() - self._t0
                if self.first_busy_s is None:
                    self.first_busy_s = now
                self.last_busy_s = now
            await asyncio.sleep(self.every_s)  # a sampling period, not synchronisation

    def start(self) -> None:
        self._cpu0 = cpu_seconds()
        self._t0 = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task
        n = len(self.samples) or 1
        full = IN_FLIGHT * len(self.clients)
        here, server = cpu_seconds()
        end = time.perf_counter() - self._t0
        return {
            # phase start to the first sample with a request in vLLM (start-up, +-every_s)
            "first_busy_s": None if self.first_busy_s is None else round(self.first_busy_s, 2),
            # the last sample with a request in vLLM to the phase's end (the tail, +-every_s)
            "after_last_busy_s": None if self.last_busy_s is None
            else round(end - self.last_busy_s, 2),
            "bench_process_cpu_s": round(here - self._cpu0[0], 2),  # client, or broker too
            "servers_cpu_s": round(server - self._cpu0[1], 2),
            "mean_running": round(sum(r for r, _ in self.samples) / n, 2),
            "mean_waiting": round(sum(w for _, w in self.samples) / n, 2),
            "share_underfilled": round(sum(1 for r, w in self.samples
                                           if r < full and w == 0) / n, 3),
            "share_idle": round(sum(1 for r, w in self.samples if r == 0 and w == 0) / n, 3),
            "samples": len(self.samples),
        }


async def start_or_raise(launcher: Launcher) -> None:
    """Start the servers; one that does not come up fails the bench with its log's tail."""
    try:
        await launcher.start()
    except LaunchError as e:
        tail = "\n".join(s.log_path.read_text(errors="replace")[-3000:]
                         for s in launcher.servers if s.log_path.exists())
        raise RuntimeError(f"{e}\n{tail}") from None


async def scrape_all(clients: list[httpx.AsyncClient]) -> Scrape:
    """Every server's counters, summed (the first server's cache config)."""
    parts = [await scrape(c) for c in clients]
    out = Scrape({k: sum(p.values.get(k, 0.0) for p in parts) for k in parts[0].values},
                 parts[0].block_size, parts[0].num_blocks)
    return out


async def reset_prefix_cache(client: httpx.AsyncClient) -> None:
    """POST /reset_prefix_cache until it succeeds (it fails while blocks are held)."""
    for _ in range(40):
        resp = await client.post("/reset_prefix_cache")
        resp.raise_for_status()
        if resp.json().get("success"):
            return
        await asyncio.sleep(0.25)
    raise RuntimeError("/reset_prefix_cache kept failing (blocks still held?)")


# -- the phases ----------

@dataclass
class Phase:
    name: str
    wall_s: float = 0.0
    items_done: int = 0
    deltas: dict[str, float] = field(default_factory=dict)
    client_cached_tokens: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


async def client_phase(clients: list[httpx.AsyncClient], name: str, wl: Workload,
                       order: list[Item]) -> Phase:
    """One request per item, IN_FLIGHT workers per server; with several servers the items
    are dealt out in turn (round robin), each server taking its share in `order`."""
    shapes = wl.shapes
    queues = [iter(order[k::len(clients)]) for k in range(len(clients))]
    phase = Phase(name)
    cached = 0
    bad: list[str] = []

    async def worker(client: httpx.AsyncClient, todo: Any) -> None:
        nonlocal cached
        for item in todo:  # shared iterator: bounded by the items
            shape = shapes[item.shape]
            body = {"model": shape.model, "prompt": shape.prefix + item.prompt,
                    "max_tokens": MAX_TOKENS, **PARAMS}
            resp = await client.post("/v1/completions", json=body)
            if resp.status_code != 200:
                bad.append(f"{item.id}: HTTP {resp.status_code} {resp.text[:200]}")
                continue
            data = resp.json()
            usage = data.get("usage") or {}
            choice = (data.get("choices") or [{}])[0]
            if (usage.get("prompt_tokens") != item.tokens
                    or usage.get("completion_tokens") != MAX_TOKENS
                    or choice.get("finish_reason") != "length"):
                bad.append(f"{item.id}: usage {usage} finish {choice.get('finish_reason')} "
                           f"(expected {item.tokens} prompt tokens)")
                continue
            cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            phase.items_done += 1

    before = await scrape_all(clients)
    occupancy = Occupancy(clients)
    occupancy.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c, q) for c, q in zip(clients, queues, strict=True)
                           for _ in range(IN_FLIGHT)))
    phase.wall_s = time.perf_counter() - t0
    phase.extra["occupancy"] = await occupancy.stop()
    phase.deltas = (await scrape_all(clients)).minus(before)
    phase.client_cached_tokens = cached
    if bad:
        phase.error = f"{len(bad)} bad responses, first: {bad[0]}"
    return phase


def native_lines(wl: Workload) -> str:
    return "".join(json.dumps({"id": i.id, "model": wl.shapes[i.shape].model,
                               "prefix": wl.shapes[i.shape].components, "prompt": i.prompt,
                               "max_tokens": MAX_TOKENS, "params": PARAMS}) + "\n"
                   for i in wl.items)


async def fabricctl_phase(clients: list[httpx.AsyncClient], wl: Workload,
                          base_urls: list[str], model_dir: Path, work: Path,
                          prewarm: str = "on", name: str = "fabricctl") -> Phase:
    """The items as native JSONL through `run_job`, engine "openai" on the same servers
    (one consumer each)."""
    phase = Phase(name)
    path = work / "items.jsonl"
    path.write_text(native_lines(wl))
    cfg = AppConfig(
        data_dir=work / f"fabric-data-{name}", engine="openai", model=SERVED,
        broker=CoreConfig(prewarm=prewarm),
        vllm=VllmSettings(endpoints=base_urls),
        # two batches in the server, the window the replay's prediction was validated
        # with (its fabric feeds about a step's admit ahead); phase g runs the default
        consumer=ConsumerSettings(max_batch_size=IN_FLIGHT,
                                  max_batch_tokens=IN_FLIGHT * wl.max_len,
                                  max_input_len=wl.max_len, window=2 * IN_FLIGHT),
        producer=ProducerSettings(tokenizer=str(model_dir / "tokenizer.json")),
    )
    phase.extra["consumer"] = dataclasses.asdict(cfg.consumer)
    summary, results = await measured_run(phase, clients, cfg, path)
    check_results(phase, wl, results,
                  None if summary is None else msgspec.structs.asdict(summary))
    return phase


async def measured_run(phase: Phase, clients: list[httpx.AsyncClient], cfg: AppConfig,
                       path: Path) -> tuple[RunSummary | None, bytes]:
    """`run_job` of `path` under `cfg` into `phase`: its wall time, the servers' occupancy and
    counter deltas, its input errors (the first 3) and any failure as the phase's error
    (the tree may be mid-change: it is this phase's, not the bench's); (its summary, or None
    when it failed, and its result lines)."""
    sink = io.BytesIO()
    errors: list[str] = []
    before = await scrape_all(clients)
    occupancy = Occupancy(clients)
    occupancy.start()
    t0 = time.perf_counter()
    summary: RunSummary | None = None
    try:
        summary = await asyncio.wait_for(
            run_job(cfg, path, sink, errors=errors.append, keep_data=True), 1800.0)
    except Exception as e:
        phase.error = f"run_job failed: {e!r}"
    phase.wall_s = time.perf_counter() - t0
    phase.extra["occupancy"] = await occupancy.stop()
    phase.deltas = (await scrape_all(clients)).minus(before)
    if errors:
        phase.extra["input_errors"] = errors[:3]
    return summary, sink.getvalue()


def check_results(phase: Phase, wl: Workload, results: bytes,
                  summary: dict[str, Any] | None) -> None:
    """Count the items whose result is as expected (each once, finish "length", MAX_TOKENS
    tokens out), keep the RunSummary's figures, and fail the phase on a missing item."""
    recs = [json.loads(line) for line in results.splitlines() if line.strip()]
    per_id = Counter(r.get("id") for r in recs)
    good = [r for r in recs if r.get("finish_reason") == "length"
            and (r.get("usage") or {}).get("completion_tokens") == MAX_TOKENS]
    phase.items_done = len(good) if set(per_id.values()) <= {1} else 0
    phase.extra["results"] = len(recs)
    phase.extra["finish_reasons"] = dict(Counter(r.get("finish_reason") for r in recs))
    if summary is not None:
        phase.extra.update(summary_kv_hit_rate=summary.get("kv_hit_rate"),
                           summary_kv_hit_achievable=summary.get("kv_hit_achievable"),
                           shape_switches=summary.get("shape_switches"),
                           midstream_switches=summary.get("midstream_switches"),
                           summary_wall_s=summary.get("wall_s"),
                           serve_s=summary.get("serve_s"))
    if phase.error is None and phase.items_done != len(wl.items):
        phase.error = (f"{phase.items_done} of {len(wl.items)} items completed as expected "
                       f"({len(recs)} results, finish reasons {phase.extra['finish_reasons']})")


def whole_toml(wl: Workload, base_url: str, model_dir: Path) -> str:
    """Phase d's AppConfig as the `--config` file of `fabricctl run` (engine and model go
    as flags): its endpoint, contract and tokenizer, pre-warm off."""
    return (f'[broker]\nprewarm = "off"\n\n'
            f"[vllm]\nendpoints = [{json.dumps(base_url)}]\n\n"
            f"[consumer]\nmax_batch_size = {IN_FLIGHT}\n"
            f"max_batch_tokens = {IN_FLIGHT * wl.max_len}\nmax_input_len = {wl.max_len}\n\n"
            f"[producer]\ntokenizer = {json.dumps(str(model_dir / 'tokenizer.json'))}\n")


async def whole_phase(clients: list[httpx.AsyncClient], wl: Workload, base_url: str,
                      model_dir: Path, work: Path, name: str = "whole") -> Phase:
    """Phase g: `fabricctl run` as a user types it, a subprocess of this interpreter, timed
    from before its process starts to its exit (interpreter and imports, the embedded
    broker's start, the job, the shutdown)."""
    import resource

    phase = Phase(name)
    items = work / "items.jsonl"
    items.write_text(native_lines(wl))
    cfg = work / f"{name}.toml"
    cfg.write_text(whole_toml(wl, base_url, model_dir))
    results = work / f"{name}-results.jsonl"
    argv = [sys.executable, "-m", "fabricctl", "run", str(items), "--config", str(cfg),
            "--engine", "openai", "--model", SERVED, "--output", str(results), "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICCTL_")}
    env["FABRICCTL_CONFIG"] = str(cfg)  # no user config file of this machine's
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    phase.extra["command"] = " ".join(["python", *argv[1:]])
    summary: dict[str, Any] | None = None
    before = await scrape_all(clients)
    occupancy = Occupancy(clients)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    occupancy.start()
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=work, env=env, stdin=subprocess.DEVNULL,  # cwd: no fabric.toml there
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 1800.0)
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        phase.error = "fabricctl run took over 1800 s"
    phase.wall_s = time.perf_counter() - t0
    phase.extra["occupancy"] = await occupancy.stop()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    phase.deltas = (await scrape_all(clients)).minus(before)
    phase.extra["fabricctl_cpu_s"] = round(
        children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime, 2)
    phase.extra["exit_status"] = proc.returncode
    with contextlib.suppress(ValueError, IndexError):
        summary = json.loads(stdout.decode().strip().splitlines()[-1])
    if phase.error is None and (proc.returncode != 0 or summary is None):
        phase.error = (f"fabricctl run exited {proc.returncode}: "
                       f"{stderr.decode(errors='replace')[-500:]}")
    check_results(phase, wl, results.read_bytes() if results.exists() else b"", summary)
    if summary is not None:
        # outside run_job's own clock: interpreter, imports, config; daemon stop, exit
        phase.extra["outside_run_job_s"] = round(phase.wall_s - summary["wall_s"], 2)
    return phase


async def warm_up(client: httpx.AsyncClient, tok: Tok, paras: list[str],
                  names: tuple[str, ...] = (SERVED,)) -> None:
    """Unmeasured: IN_FLIGHT prompts of the workload's length, none of its prefixes, under
    each of `names` in turn (an adapter's first request loads it)."""
    async def one(k: int) -> None:
        text = f"Warm-up {k}:"
        pos = 0
        while len(tok.ids(text)) < PREFIX_TOKENS and pos < len(paras):
            text += " " + paras[-1 - k * 37 - pos]
            pos += 1
        resp = await client.post("/v1/completions", json={
            "model": names[k % len(names)], "prompt": text, "max_tokens": MAX_TOKENS,
            "truncate_prompt_tokens": PREFIX_TOKENS, **PARAMS})
        resp.raise_for_status()

    await asyncio.gather(*(one(k) for k in range(IN_FLIGHT)))


# -- the rehearsal's prediction ----------

def predict(items_path: Path, tokenizer: Path, costs: SimCosts, max_len: int,
            gpus: int) -> dict[str, float]:
    """`fabricctl replay` of the bench's own items on `gpus` GPUs of the calibrated costs,
    with the contract the fabricctl phases register: simulated seconds per policy."""
    parsed = read_workload(items_path, counter_for(str(tokenizer), ""))
    items = load(parsed, costs.block_size)
    sim = costs_for(items, max_num_seqs=IN_FLIGHT, base=costs)
    limits = BatchLimits(IN_FLIGHT, IN_FLIGHT * max_len, max_len)
    res = replay(items, ["round-robin", "fabric"], gpus, sim, limits)
    return {name: r.makespan_s for name, r in res.items()}


def prediction(probes: Probes, costs: SimCosts, sims: dict[int, dict[str, float]],
               ph: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The replay's fabric/round-robin speed-up beside the measured default/arrival one
    (and with two servers fabricctl-2/round-robin-2), and each phase's simulated seconds."""
    out: dict[str, Any] = {"costs": dataclasses.asdict(costs),
                           "probes": dataclasses.asdict(probes)}
    pairs = {1: ("no-prewarm", "arrival"), 2: ("fabricctl-2", "round-robin-2")}
    for gpus, sim in sims.items():
        fab, base = pairs[gpus]
        if fab not in ph or base not in ph or "error" in ph[fab] or "error" in ph[base]:
            continue
        predicted = sim["round-robin"] / sim["fabric"]
        measured = ph[base]["wall_s"] / ph[fab]["wall_s"]
        out[f"gpus{gpus}"] = {
            "predicted_fabric_over_roundrobin": round(predicted, 3),
            "measured_fabricctl_over_arrival": round(measured, 3),
            "error": round(predicted / measured - 1, 3),
            "simulated_s": {k: round(v, 2) for k, v in sim.items()},
            "measured_s": {fab: ph[fab]["wall_s"], base: ph[base]["wall_s"]},
        }
    return out


# -- figures ----------

def figures(p: Phase, wl: Workload) -> dict[str, Any]:
    d = p.deltas
    queries, hits = d.get("queries", 0.0), d.get("hits", 0.0)
    requests = round(d.get("requests", 0.0))
    n = len(wl.items)
    extra_requests = requests - n
    extra_tokens = round(d.get("prompt_tokens", 0.0)) - wl.prompt_tokens
    achievable = wl.full_prefix_tokens * max(0, requests - wl.shapes_used)
    out: dict[str, Any] = {
        "wall_s": round(p.wall_s, 2),
        "req_per_s": round(n / p.wall_s, 2) if p.wall_s else 0.0,
        "items_done": p.items_done,
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "achievable_hit_rate": round(achievable / queries, 4) if queries else 0.0,
        "prompt_tokens_computed": round(queries - hits),
        "prefix_cache_queries": round(queries),
        "prefix_cache_hits": round(hits),
        "prompt_tokens": round(d.get("prompt_tokens", 0.0)),
        "requests": requests,
        "extra_requests": extra_requests,  # fabricctl: pre-warms (bare prefixes)
        "extra_requests_bare_prefixes": extra_tokens == extra_requests * PREFIX_TOKENS,
        "preemptions": round(d.get("preemptions", 0.0)),
    }
    if p.client_cached_tokens is not None:
        out["client_cached_tokens"] = p.client_cached_tokens
    out.update(p.extra)
    if p.error:
        out["error"] = p.error
    return out


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def points_below(p: dict[str, Any]) -> float:
    """A phase's hit rate minus its achievable one, in points."""
    return round((p["hit_rate"] - p["achievable_hit_rate"]) * 100, 2)


def against_client(p: dict[str, Any], arrival: dict[str, Any], grouped: dict[str, Any],
                   tag: str) -> dict[str, float | None]:
    """A fabricctl phase against the client's orders: req/s over arrival and grouped, its
    hit rate against achievable, prompt tokens computed over grouped."""
    return {
        f"rps_{tag}_over_arrival": ratio(p["req_per_s"], arrival["req_per_s"]),
        f"rps_{tag}_over_grouped": ratio(p["req_per_s"], grouped["req_per_s"]),
        f"{tag}_hit_minus_achievable_pts": points_below(p),
        f"computed_{tag}_over_grouped": ratio(p["prompt_tokens_computed"],
                                              grouped["prompt_tokens_computed"]),
    }


def ratios(ph: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    a, b, c, d = ph["arrival"], ph["grouped"], ph.get("fabricctl"), ph.get("no-prewarm")
    out: dict[str, float | None] = {
        "rps_grouped_over_arrival": ratio(b["req_per_s"], a["req_per_s"]),
        "rps_fabricctl_over_arrival": None, "rps_fabricctl_over_grouped": None,
        "fabricctl_hit_minus_achievable_pts": None,
        "computed_fabricctl_over_grouped": None,
        "computed_grouped_over_arrival": ratio(b["prompt_tokens_computed"],
                                               a["prompt_tokens_computed"]),
        "rps_noprewarm_over_fabricctl": None, "noprewarm_hit_minus_achievable_pts": None,
        "computed_noprewarm_over_fabricctl": None,
    }
    if c is not None and "error" not in c:
        out.update(against_client(c, a, b, "fabricctl"))
    if c is not None and d is not None and "error" not in c and "error" not in d:
        out.update(
            rps_noprewarm_over_fabricctl=ratio(d["req_per_s"], c["req_per_s"]),
            computed_noprewarm_over_fabricctl=ratio(d["prompt_tokens_computed"],
                                                    c["prompt_tokens_computed"]),
        )
    if d is not None and "error" not in d:  # the default (pre-warm "auto" = off on vLLM)
        out.update(against_client(d, a, b, "noprewarm"))
    rr, f2 = ph.get("round-robin-2"), ph.get("fabricctl-2")
    if rr is not None and f2 is not None and "error" not in rr and "error" not in f2:
        out.update(
            rps_fabricctl2_over_roundrobin2=ratio(f2["req_per_s"], rr["req_per_s"]),
            fabricctl2_hit_minus_one_server_achievable_pts=points_below(f2),
            roundrobin2_hit_minus_one_server_achievable_pts=points_below(rr),
            rps_fabricctl2_over_noprewarm=ratio(f2["req_per_s"], d["req_per_s"])
            if d is not None and "error" not in d else None,
        )
        if f2.get("serve_s"):
            out["rps_fabricctl2_serving_over_roundrobin2"] = ratio(
                f2["items_done"] / f2["serve_s"], rr["req_per_s"])
    for name, key in (("fabricctl", "rps_fabricctl_serving_over_grouped"),
                      ("fabricctl-2", "rps_fabricctl2_serving_over_grouped"),
                      ("no-prewarm", "rps_noprewarm_serving_over_grouped")):
        p = ph.get(name)
        if p is not None and "error" not in p and p.get("serve_s"):
            out[key] = ratio(p["items_done"] / p["serve_s"], b["req_per_s"])
    return out


def whole_ratios(ph: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Unpinned: each round's whole command (g) against the grouped client (b) of the same
    round: req/s, prompt tokens computed, hit rate against achievable; with several rounds,
    the median req/s of g over the median of b."""
    out: dict[str, float | None] = {}
    pairs = [(name, "grouped" + name[len("whole"):]) for name in ph if name.startswith("whole")]
    for g_name, b_name in pairs:
        g, b = ph[g_name], ph[b_name]
        tag = g_name[len("whole"):].replace("#", "_")
        if "error" in g or "error" in b:
            out[f"rps_whole_over_grouped{tag}"] = None
            continue
        out[f"rps_whole_over_grouped{tag}"] = ratio(g["req_per_s"], b["req_per_s"])
        out[f"computed_whole_over_grouped{tag}"] = ratio(g["prompt_tokens_computed"],
                                                         b["prompt_tokens_computed"])
        out[f"whole_hit_minus_achievable_pts{tag}"] = points_below(g)
        out[f"grouped_hit_minus_achievable_pts{tag}"] = points_below(b)
        if g.get("serve_s"):
            out[f"rps_whole_serving_over_grouped{tag}"] = ratio(
                g["items_done"] / g["serve_s"], b["req_per_s"])
    ok = [(ph[g], ph[b]) for g, b in pairs if "error" not in ph[g] and "error" not in ph[b]]
    if len(ok) > 1:
        out["rps_whole_over_grouped_median"] = ratio(
            statistics.median(g["req_per_s"] for g, _ in ok),
            statistics.median(b["req_per_s"] for _, b in ok))
    return out


def len_items(out: dict[str, Any]) -> int:
    """Items per phase (every phase runs the same workload)."""
    return int(next(iter(out["phases"].values())).get("items_done", 0) or 0)


def table(out: dict[str, Any]) -> str:
    cols = [("wall_s", "wall s", "{:.1f}"), ("req_per_s", "req/s", "{:.2f}"),
            ("hit_rate", "hit", "{:.1%}"), ("achievable_hit_rate", "achievable", "{:.1%}"),
            ("prompt_tokens_computed", "computed", "{:,}"),
            ("prompt_tokens", "prompt tok", "{:,}"), ("requests", "requests", "{:,}"),
            ("preemptions", "preempt", "{:,}"), ("items_done", "items ok", "{:,}")]
    head = f"{'phase':<10}" + "".join(f"{h:>12}" for _, h, _ in cols)
    lines = [head, "-" * len(head)]
    for name, ph in out["phases"].items():
        row = f"{name:<10}" + "".join(f"{fmt.format(ph.get(k, 0)):>12}" for k, _, fmt in cols)
        lines.append(row)
    lines.append("")
    whole = [n for n in out["phases"] if n.startswith("whole")]
    for fname in ("fabricctl", "no-prewarm", "fabricctl-2", *whole):
        fab = out["phases"].get(fname, {})
        if "summary_kv_hit_rate" not in fab:
            continue
        lines.append(f"{fname}: {fab['extra_requests']} extra requests (bare prefixes: "
                     f"{fab['extra_requests_bare_prefixes']}, i.e. pre-warms), "
                     f"{fab['shape_switches']} shape switches "
                     f"({fab['midstream_switches']} mid-stream); its RunSummary: "
                     f"kv_hit_rate {fab['summary_kv_hit_rate']}, kv_hit_achievable "
                     f"{fab['summary_kv_hit_achievable']}, wall {fab['summary_wall_s']} s, "
                     f"serving {fab['serve_s']} s (job open to last result: "
                     f"{len_items(out) / fab['serve_s']:.2f} req/s without start-up)"
                     if fab.get("serve_s") else "")
    for fname in whole:
        g = out["phases"][fname]
        occ = g.get("occupancy") or {}
        lines.append(f"{fname}: `fabricctl run` exit {g.get('exit_status')}; first request in "
                     f"vLLM {occ.get('first_busy_s')} s after process start, none in vLLM "
                     f"for its last {occ.get('after_last_busy_s')} s; outside run_job's "
                     f"clock (interpreter, imports, shutdown) {g.get('outside_run_job_s')} s;"
                     f" its CPU s {g.get('fabricctl_cpu_s')}")
    for name, ph in out["phases"].items():
        occ = ph.get("occupancy")
        if occ:
            lines.append(f"{name}: vLLM running {occ['mean_running']} on average (waiting "
                         f"{occ['mean_waiting']}); under {IN_FLIGHT} with none waiting "
                         f"{occ['share_underfilled']:.0%} of samples, idle "
                         f"{occ['share_idle']:.0%}; CPU s: bench process "
                         f"{occ['bench_process_cpu_s']}, servers {occ['servers_cpu_s']}; first "
                         f"request in vLLM at {occ['first_busy_s']} s, none for the last "
                         f"{occ['after_last_busy_s']} s")
    for name, ph in out["phases"].items():
        if "error" in ph:
            lines.append(f"{name}: ERROR {ph['error']}")
    for key, pr in out.get("prediction", {}).items():
        if key.startswith("gpus"):
            lines.append(f"replay ({key[4:]} GPU, calibrated costs): fabric "
                         f"{pr['predicted_fabric_over_roundrobin']}x round robin; measured "
                         f"{pr['measured_fabricctl_over_arrival']}x (error {pr['error']:+.1%});"
                         f" simulated s {pr['simulated_s']}, measured s {pr['measured_s']}")
    width = 40
    for k, v in out["ratios"].items():
        lines.append(f"{k:<{width}}{'n/a' if v is None else v:>14}")
    for k, v in out.items():
        if k not in ("phases", "ratios", "prediction"):
            lines.append(f"{k:<{width}}{v!s:>14}" if len(str(v)) <= 14 else f"{k}: {v}")
    return "\n".join(lines)


# -- driver ----------

def build_model(work: Path, paras: list[str]) -> tuple[Path, dict[str, Any]]:
    py = VENV / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"{py} is missing: run scripts/vllm_env.sh (make test does)")
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(paras) + "\n", encoding="utf-8")
    out = work / "model"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    done = subprocess.run([str(py), str(MAKE_MODEL), str(out), str(corpus)], check=True,
                          env=env, timeout=300, capture_output=True, text=True)
    return out, json.loads(done.stdout.strip().splitlines()[-1])


def build_adapters(work: Path, model_dir: Path, count: int) -> dict[str, Path]:
    """`count` random LoRA adapters of the bench model (peft layout, rank 8), by name, made
    by the real-vLLM suite's maker (tests/real/make_lora.py) in `.venv-vllm`."""
    adapters = {LORA_NAMES[k]: work / "adapters" / LORA_NAMES[k] for k in range(count)}
    if not adapters:
        return adapters
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    subprocess.run([str(VENV / "bin" / "python"), str(MAKE_LORA), str(model_dir),
                    *map(str, adapters.values())], check=True, env=env, timeout=300,
                   capture_output=True, text=True)
    return adapters


def lora_args(adapters: dict[str, Path]) -> tuple[str, ...]:
    """The server's LoRA flags: a slot spare beside the adapters (the CPU build applies the
    last slot's adapter to base requests of a step that fills every slot: the real-vLLM
    suite's finding, tests/real/README.md)."""
    if not adapters:
        return ()
    return ("--enable-lora", "--max-lora-rank", "8", "--max-loras", str(len(adapters) + 1),
            "--lora-modules", *(f"{n}={d}" for n, d in adapters.items()))


async def drive(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t_start = time.perf_counter()
    paras = corpus_paragraphs()
    model_dir, built = build_model(work, paras)
    adapters = build_adapters(work, model_dir, args.lora)
    names = (SERVED, *adapters)
    tok = Tok(model_dir / "tokenizer.json")
    wl = make_workload(tok, paras, args.shapes, args.items, args.seed, names)
    blocks, why = kv_blocks(wl)
    logs = work / "logs"
    extra_args = ("--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
                  "--max-num-seqs", str(IN_FLIGHT), "--enforce-eager",
                  "--enable-prefix-caching", "--block-size", str(BLOCK),
                  "--num-gpu-blocks-override", str(blocks), "--enable-prompt-tokens-details",
                  *lora_args(adapters))
    spec = vllm_cpu_spec(VENV, str(model_dir), SERVED, logs,
                         port_base=free_port(args.servers),
                         extra_args=extra_args, ready_timeout_s=300.0, stop_timeout_s=20.0,
                         env=server_env(args))
    launcher = Launcher(spec, list(range(args.servers)))  # one core each
    atexit.register(_kill_leftovers, launcher)
    server = launcher.servers[0]
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        await start_or_raise(launcher)
        started_s = time.perf_counter() - t0
        SERVER_PIDS[:] = [pid for pid in launcher.pids().values() if pid is not None]
        pinned = [] if args.unpinned else keep_off_the_engine_core(SERVER_PIDS,
                                                                   set(range(args.servers)))
        affinity = affinities(SERVER_PIDS)
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(
                httpx.AsyncClient(base_url=s.base_url, timeout=300.0))
                for s in launcher.servers]
            client = clients[0]
            for c in clients:
                cfg = await scrape(c)
                if cfg.block_size != BLOCK or cfg.num_blocks != blocks:
                    raise RuntimeError(f"server has {cfg.num_blocks} blocks of "
                                       f"{cfg.block_size}, asked for {blocks} of {BLOCK}")
                await warm_up(c, tok, paras, names)
            one = [client]
            phases: dict[str, Phase] = {}
            grouped = sorted(wl.items, key=lambda i: i.shape)  # stable: arrival within shape
            if args.unpinned:  # b and g only, alternating, nothing pinned
                for r in range(args.rounds):
                    tag = "" if r == 0 else f"#{r + 1}"
                    await reset_prefix_cache(client)
                    phases["grouped" + tag] = await client_phase(one, "grouped" + tag, wl,
                                                                 grouped)
                    await reset_prefix_cache(client)
                    phases["whole" + tag] = await whole_phase(one, wl, server.base_url,
                                                              model_dir, work, "whole" + tag)
                affinity_after = affinities(SERVER_PIDS)
                ph = {name: figures(p, wl) for name, p in phases.items()}
                out = {"phases": ph, "ratios": whole_ratios(ph), "prediction": {}}
            else:
                out = await pinned_phases(args, clients, wl, server.base_url, launcher,
                                          model_dir, work, blocks, grouped)
                affinity_after = affinities(SERVER_PIDS)
        out.update({
            "items": len(wl.items), "servers": args.servers, "shapes": args.shapes,
            "names": list(names),
            "shapes_used": wl.shapes_used,
            "seed": args.seed, "prefix_tokens": PREFIX_TOKENS,
            "full_prefix_tokens": wl.full_prefix_tokens,
            "item_tokens_min": min(i.tokens for i in wl.items), "item_tokens_max": wl.max_len,
            "items_per_shape": [sum(1 for i in wl.items if i.shape == k)
                                for k in range(args.shapes)],
            "max_tokens": MAX_TOKENS, "in_flight": IN_FLIGHT, "block_size": BLOCK,
            "kv_blocks": blocks, "kv_blocks_why": why,
            "cache_pressure": round(wl.shapes_used / KV_PREFIXES, 1),
            "model_params": built["params"], "vocab": built["vocab"],
            "model_build_s": built["seconds"], "server_start_s": round(started_s, 1),
            "server_cpu_bind": spec.env.get("VLLM_CPU_OMP_THREADS_BIND", "").replace(
                "{index}", "0"),
            "front_end_and_bench_cores": pinned,
            "unpinned": args.unpinned,
            "cpu_affinities_at_start": affinity,  # this process's and the servers' threads
            "cpu_affinities_at_end": affinity_after,
            "total_s": 0.0,
        })
        if args.unpinned:
            out["engine_threads"] = args.engine_threads
    finally:
        await launcher.stop()
        atexit.unregister(_kill_leftovers)
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    if args.keep:
        out["kept"] = str(work)
    return out


def server_env(args: argparse.Namespace) -> dict[str, str]:
    """The servers' environment beside vllm_cpu_spec's: unpinned, vLLM binds no OpenMP thread
    ("nobind" replaces the spec's one core each) and its worker runs `--engine-threads`."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if args.unpinned:
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(args.engine_threads))
    return env


async def pinned_phases(args: argparse.Namespace, clients: list[httpx.AsyncClient],
                        wl: Workload, base_url: str, launcher: Launcher, model_dir: Path,
                        work: Path, blocks: int, grouped: list[Item]) -> dict[str, Any]:
    """Calibration, phases a-d (e-f with two servers) and the replay's prediction."""
    client = clients[0]
    probes = await measure(client, SERVED, ServerShape(BLOCK, blocks, IN_FLIGHT, 2048),
                           MAX_MODEL_LEN)
    costs = fit_costs(probes, ServerShape(BLOCK, blocks, IN_FLIGHT, 2048))
    one = [client]
    phases: dict[str, Phase] = {}
    await reset_prefix_cache(client)
    phases["arrival"] = await client_phase(one, "arrival", wl, list(wl.items))
    await reset_prefix_cache(client)
    phases["grouped"] = await client_phase(one, "grouped", wl, grouped)
    if not args.no_prewarm_phase:
        await reset_prefix_cache(client)
        phases["fabricctl"] = await fabricctl_phase(one, wl, [base_url], model_dir, work,
                                                    prewarm="on")
    await reset_prefix_cache(client)
    phases["no-prewarm"] = await fabricctl_phase(one, wl, [base_url], model_dir, work,
                                                 prewarm="off", name="no-prewarm")
    if len(clients) > 1:
        urls = [srv.base_url for srv in launcher.servers]
        for c in clients:
            await reset_prefix_cache(c)
        phases["round-robin-2"] = await client_phase(clients, "round-robin-2", wl,
                                                     list(wl.items))
        for c in clients:
            await reset_prefix_cache(c)
        phases["fabricctl-2"] = await fabricctl_phase(clients, wl, urls, model_dir, work,
                                                      prewarm="off", name="fabricctl-2")
    ph = {name: figures(p, wl) for name, p in phases.items()}
    if args.lora:  # the replay's workload knows one name per model: no prediction to make
        return {"phases": ph, "ratios": ratios(ph), "prediction": {}}
    sims = {g: predict(work / "items.jsonl", model_dir / "tokenizer.json", costs,
                       wl.max_len, g) for g in range(1, args.servers + 1)}
    return {"phases": ph, "ratios": ratios(ph),
            "prediction": prediction(probes, costs, sims, ph)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--items", type=int, default=480)
    ap.add_argument("--shapes", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--servers", type=int, default=1, choices=(1, 2),
                    help="2: also run round robin and fabricctl over two servers (one core "
                         "each) against the one-server achievable hit rate")
    ap.add_argument("--no-prewarm-phase", action="store_true",
                    help="skip phase c (fabricctl with pre-warm on)")
    ap.add_argument("--unpinned", action="store_true",
                    help="no CPU pinning at all (vLLM's threads unbound, nothing moved off "
                         "the engine's core): only phase b (grouped client) and phase g "
                         "(the whole `fabricctl run` command as a subprocess)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --unpinned: run b then g this many times (ratios per round "
                         "and of the medians)")
    ap.add_argument("--engine-threads", type=int, default=1,
                    help="with --unpinned: the vLLM worker's OpenMP threads (OMP_NUM_THREADS;"
                         " pinned, it has one core)")
    ap.add_argument("--lora", type=int, default=0, choices=range(0, len(LORA_NAMES) + 1),
                    metavar="N",
                    help="N random LoRA adapters on the server: each prefix is asked under "
                         "the base model and every adapter (--shapes counts them all)")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir (model, server log, items, fabricctl data)")
    args = ap.parse_args(argv)
    if args.items < 1 or args.shapes < 1:
        ap.error("--items and --shapes must be >= 1")
    if args.rounds < 1 or args.engine_threads < 1:
        ap.error("--rounds and --engine-threads must be >= 1")
    if args.unpinned and args.servers != 1:
        ap.error("--unpinned runs one server")
    if args.shapes % (args.lora + 1):
        ap.error("--shapes must be a multiple of the names (--lora + 1)")

    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))

    async def runner() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await drive(args, work)

    try:
        out = asyncio.run(runner())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("vllm_bench: interrupted; the server was stopped", file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out) if args.json else table(out))
    return 0 if all("error" not in p for p in out["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
