"""Every documented example runs as written: the fenced code blocks of README.md and
examples/README.md and the EXAMPLES of the man pages (`man/*.1`, from `scripts/man_prose.py`),
as `gh`, `uv` and `cargo` test theirs.

Contract: each block is its own test (id: file and line). It runs in a fresh working
directory holding a copy of `examples/` and the few input files the examples name as the
reader's own (`FIXTURES`), with `HOME` in a temporary directory, `XDG_*` at their defaults
under it and no `FABRICCTL_*` variable but `FABRICCTL_ENGINE=sim` (a documented variable:
the simulator, even on a host with GPUs), so the defaults are a newcomer's: the data dir is
`~/.local/share/fabricctl` of that HOME. `python` and `fabricctl` are the test venv's.

- `sh` blocks (and man examples) run in `bash` with `set -eo pipefail`; a block that talks
  to a broker gets the shared one, `fabricctl up --engine sim --api 127.0.0.1:PORT` started
  once in the background on the default data dir (waited for by polling `fabricctl status`,
  then given `examples/openai_batch.jsonl` so it has jobs and shapes to show; stopped by
  `fabricctl down`); a
  block that starts its own broker (`fabricctl up ... &`) runs under a HOME of its own; a
  block that is one foreground `fabricctl up` is started, polled until `status` answers and
  stopped with `fabricctl down`; `fabricctl down --data-dir D` gets a broker at D to stop.
- `python` blocks run with the venv's python; `toml` blocks load through
  `fabricctl.config.load_config` (as `--config FILE`); `json` blocks parse as a sequence of
  JSON values, and the input lines among them (native `id`+`model`, or OpenAI `custom_id`)
  are read by fabricctl's own reader without a line error.
- A block that cannot run here is skipped with its reason: in the Markdown by an HTML comment
  `<!-- example: skip (REASON) -->` on the line before its fence, in the man pages by the
  first line of the command in `MAN_SKIPS`. Any other change to what runs is one of the
  `SUBSTITUTIONS`, each with its reason.
A block piping into a tool this host lacks (`PIPE_TOOLS`: jq, column) is skipped, saying so.
A failing block fails with its file, line, exit status and stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 90.0
START_TIMEOUT_S = 60.0
SKIP_MARK = re.compile(r"<!--\s*example:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")

# The first line of a man page example that cannot run here -> why.
MAN_SKIPS = {
    "fabricctl up --config examples/fabric.toml": "needs two GPUs and vLLM",
    "fabricctl consume --broker gpu-head:7070 --engine openai \\":
        "needs a remote broker host and a vLLM server",
    "fabricctl calibrate -e http://127.0.0.1:8001 --max-num-seqs 256 -o costs.toml":
        "needs a running vLLM server",
    "fabricctl jobs priority batch_1f 100": "names a job id of the reader's own broker",
    "fabricctl results --follow | jq -r .id": "runs until interrupted (Ctrl-C, exit 130)",
}


@dataclass(frozen=True)
class Substitution:
    """Why: the one sanctioned way an example runs other than as written, with its reason."""

    old: str
    new: str  # "{tmp}" and "{api}" are filled in by the test
    reason: str


SUBSTITUTIONS = [
    Substitution("/tmp/fabric-b", "{tmp}/fabric-b",
                 "a fixed path in /tmp is shared by everyone on the host"),
    Substitution("127.0.0.1:8000", "{api}",
                 "the shared broker's API listens on a free port, not a fixed one"),
]

# Input files an example names as the reader's own, made in its working directory.
_CHAT = [json.loads(ln) for ln in (ROOT / "examples" / "openai_batch.jsonl").read_text()
         .splitlines() if '"/v1/chat/completions"' in ln]
FIXTURES = {
    "batch.jsonl": "".join(json.dumps(x) + "\n" for x in _CHAT),
    "prompts.jsonl": "".join(
        json.dumps({"id": f"p{i}", "model": "fabric-demo", "prefix": ["Be brief."],
                    "prompt": f"Hello {i}", "max_tokens": 8, "label": "acme-support"}) + "\n"
        for i in range(20)),
    "urgent.jsonl": "".join(
        json.dumps({"id": f"u{i}", "model": "fabric-demo", "prompt": f"Now {i}",
                    "max_tokens": 4}) + "\n" for i in range(5)),
}


@dataclass(frozen=True)
class Block:
    """Why: one documented example, where it stands and what the test does with it."""

    source: str  # a path relative to the repository
    line: int  # of its first line of code
    lang: str  # sh, python, toml, json
    text: str
    skip: str  # why it cannot run here; "" when it runs

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def readme_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the skip marker of the line before it."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        indent, body, start = len(m["indent"]), [], i + 1
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        prev = next((ln for ln in reversed(lines[:start - 1]) if ln.strip()), "")
        mark = SKIP_MARK.search(prev)
        lang = {"bash": "sh", "shell": "sh", "jsonl": "json"}.get(m["lang"], m["lang"])
        out.append(Block(path.relative_to(ROOT).as_posix(), start + 1, lang,
                         "\n".join(body) + "\n", mark["reason"] if mark else ""))
        i += 1
    return out


def _unroff(line: str) -> str:
    return line.replace("\\&", "").replace("\\-", "-").replace("\\e", "\\")


def man_blocks(path: Path) -> list[Block]:
    """The commands of a man page's EXAMPLES section (each `.nf` ... `.fi`)."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        if lines[i].startswith(".SH "):
            section = lines[i][4:].strip('"')
        elif section == "EXAMPLES" and lines[i] == ".nf":
            start, body = i + 1, []
            i += 1
            while lines[i] != ".fi":
                body.append(_unroff(lines[i]))
                i += 1
            out.append(Block(path.relative_to(ROOT).as_posix(), start + 1, "sh",
                             "\n".join(body) + "\n", MAN_SKIPS.get(body[0], "")))
        i += 1
    return out


MARKDOWN = [ROOT / "README.md", ROOT / "examples" / "README.md"]
BLOCKS = [b for doc in MARKDOWN for b in readme_blocks(doc)] + [
    b for page in sorted((ROOT / "man").glob("*.1")) for b in man_blocks(page)]


# ---- the environment -----------------------------------------------------------------------------


def newcomer_env(home: Path) -> dict[str, str]:
    """A user's environment with nothing of this machine's fabricctl settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FABRICCTL_", "XDG_", "PYTHON", "VIRTUAL_ENV"))}
    env.pop("FORCE_COLOR", None)
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local" / "share"),
               XDG_CACHE_HOME=str(home / ".cache"), FABRICCTL_ENGINE="sim",
               PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               NO_COLOR="1", COLUMNS="120", TERM="dumb")
    return env



def fabricctl(env: dict[str, str], cwd: Path, *args: str,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "fabricctl"), *args], env=env, cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)


@dataclass
class Served:
    """Why: a `fabricctl up` in the background, with what it takes to wait for it and stop it."""

    proc: subprocess.Popen[bytes]
    env: dict[str, str]
    cwd: Path
    where: list[str]  # `--data-dir D` when it has one
    log: Path

    def wait_ready(self) -> None:
        """Bounded polling until `fabricctl status` answers (exit 0)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"fabricctl up exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text(errors='replace')}")
            if fabricctl(self.env, self.cwd, "status", *self.where).returncode == 0:
                return
            time.sleep(0.2)
        raise AssertionError(f"fabricctl status did not answer within {START_TIMEOUT_S} s:\n"
                             f"{self.log.read_text(errors='replace')}")

    def stop(self) -> int:
        """`fabricctl down` and the exit status of `up`."""
        try:
            if self.proc.poll() is None:
                fabricctl(self.env, self.cwd, "down", *self.where)
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def serve(argv: list[str], env: dict[str, str], cwd: Path) -> Served:
    """Start `argv` (a `fabricctl up`) in the background and wait until it answers."""
    where = []
    if "--data-dir" in argv:
        where = ["--data-dir", argv[argv.index("--data-dir") + 1]]
    log = cwd / f"up-{len(list(cwd.glob('up-*.log')))}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    served = Served(proc, env, cwd, where, log)
    try:
        served.wait_ready()
    except BaseException:
        served.stop()
        raise
    return served


def short_home() -> Path:
    """A HOME of its own directly under /tmp: the default data dir's socket path must stay
    within the 107 bytes a Unix socket allows, which pytest's (xdist) tmp paths exceed."""
    return Path(tempfile.mkdtemp(prefix="fx-home-", dir="/tmp"))


@pytest.fixture(scope="session")
def newcomer() -> Iterator[Path]:
    """The shared HOME, whose default data dir the shared broker uses."""
    home = short_home()
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def api_address() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="session")
def broker(newcomer: Path, api_address: str) -> Iterator[Served]:
    """`fabricctl up --engine sim` with the newcomer's defaults, for every block that needs it."""
    env = newcomer_env(newcomer)
    served = serve([str(VENV_BIN / "fabricctl"), "up", "--engine", "sim", "--api",
                    api_address], env, newcomer)
    # the reader's broker has done some work: shapes, labels (acme-support) and jobs to look at
    seeded = fabricctl(env, newcomer, "submit", str(ROOT / "examples" / "openai_batch.jsonl"),
                       "--wait")
    assert seeded.returncode == 0, seeded.stderr
    yield served
    assert served.stop() == 0, served.log.read_text(errors="replace")


# ---- running a block -----------------------------------------------------------------------------

PIPE_TOOLS = ("jq", "column")  # what the examples pipe into, not part of fabricctl
_BROKER_COMMANDS = re.compile(r"\bfabricctl (submit|results|jobs|shapes|status|top|doctor)\b"
                              r"|Producer\.connect|OpenAI\(")


def _substituted(text: str, tmp: Path, api: str) -> str:
    for s in SUBSTITUTIONS:
        text = text.replace(s.old, s.new.format(tmp=tmp, api=api))
    return text


def _workdir(tmp: Path) -> Path:
    cwd = tmp / "work"
    shutil.copytree(ROOT / "examples", cwd / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, content in FIXTURES.items():
        (cwd / name).write_text(content)
    return cwd


def _failure(block: Block, proc: subprocess.CompletedProcess[str]) -> str:
    return (f"{block.where}: the {block.lang} example exited {proc.returncode}\n"
            f"--- the block ---\n{block.text}--- stderr ---\n{proc.stderr}"
            f"--- stdout (tail) ---\n{proc.stdout[-2000:]}")


def _run_script(block: Block, text: str, env: dict[str, str], cwd: Path
                ) -> subprocess.CompletedProcess[str]:
    """The block in bash (or python) in its own process group, which is ended after it (a
    background `fabricctl up &` of a block that failed midway included)."""
    if block.lang == "python":
        (cwd / "example.py").write_text(text)
        argv = [str(VENV_BIN / "python"), "example.py"]
    else:
        (cwd / "example.sh").write_text("set -eo pipefail\n" + text)
        argv = ["bash", "example.sh"]
    out, err = cwd / "example.out", cwd / "example.err"  # files: a background child that
    with out.open("wb") as o, err.open("wb") as e:       # keeps them open cannot hang the test
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    note = ""
    try:
        proc.wait(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        note = f"\n(killed after {BLOCK_TIMEOUT_S} s)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # what it left running in the background
    return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(errors="replace"),
                                       err.read_text(errors="replace") + note)


def _is_input_line(value: object) -> bool:
    return isinstance(value, dict) and (
        ("custom_id" in value and "url" in value)
        or ("id" in value and "model" in value and not {"text", "error"} & value.keys()))


def check_json(block: Block) -> None:
    from fabricctl.formats.reader import LineError, parse_stream

    decoder, text, values, pos = json.JSONDecoder(), block.text, [], 0
    while (pos := len(text) - len(text[pos:].lstrip())) < len(text):
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            pytest.fail(f"{block.where}: not JSON at line {block.line + e.lineno - 1}: {e}")
        values.append(value)
    inputs = [v for v in values if _is_input_line(v)]
    if inputs:
        import io

        data = "".join(json.dumps(v) + "\n" for v in inputs).encode()
        errors = [r for r in parse_stream(io.BytesIO(data)) if isinstance(r, LineError)]
        assert not errors, f"{block.where}: fabricctl refuses the example's input: {errors}"


def check_toml(block: Block, tmp: Path) -> None:
    from fabricctl.config import load_config
    from fabricctl.errors import UsageError

    path = tmp / "example.toml"
    path.write_text(block.text)
    try:
        load_config(path, cwd=tmp, env={"HOME": str(tmp)})
    except UsageError as e:
        pytest.fail(f"{block.where}: fabricctl's config loader refuses the example: {e}")


def run_block(block: Block, request: pytest.FixtureRequest, tmp: Path) -> None:
    cwd = _workdir(tmp)
    if block.lang == "json":
        check_json(block)
        return
    if block.lang == "toml":
        check_toml(block, tmp)
        return
    assert block.lang in ("sh", "python"), f"{block.where}: no way to run a {block.lang!r} block"
    for tool in PIPE_TOOLS:
        if re.search(rf"\|\s*{tool}\b", block.text) and shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed here")
    api = ""
    text = block.text
    starts_own = block.lang == "sh" and re.search(r"^fabricctl up\b", text, re.M) is not None
    stops_one = re.fullmatch(r"fabricctl down --data-dir \S+\n", text)
    if starts_own or stops_one:
        home = short_home()  # its own broker: its own defaults
        request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
        env = newcomer_env(home)
    else:
        home = request.getfixturevalue("newcomer")
        env = newcomer_env(home)
        if _BROKER_COMMANDS.search(text):
            request.getfixturevalue("broker")
            api = request.getfixturevalue("api_address")
    text = _substituted(text, tmp, api)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) == 1 and lines[0].startswith("fabricctl up ") and "&" not in lines[0]:
        # one foreground server: it must come up and stop cleanly
        served = serve([str(VENV_BIN / "fabricctl"), *lines[0].split()[1:]], env, cwd)
        code = served.stop()
        assert code == 0, f"{block.where}: `up` exited {code}:\n{served.log.read_text()}"
        return
    served = None
    if stops_one:  # a broker for it to stop
        served = serve([str(VENV_BIN / "fabricctl"), "up", "--engine", "sim",
                        *lines[0].split()[2:]], env, cwd)
    try:
        proc = _run_script(block, text, env, cwd)
        assert proc.returncode == 0, _failure(block, proc)
        if served is not None:
            assert served.proc.wait(timeout=30) == 0, served.log.read_text()
    finally:
        if served is not None:
            served.stop()


@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.where,
                 marks=[pytest.mark.skip(reason=b.skip)] if b.skip else [])
    for b in BLOCKS])
def test_documented_example_runs(block: Block, request: pytest.FixtureRequest,
                                 tmp_path: Path) -> None:
    run_block(block, request, tmp_path)


def test_every_example_is_found_and_every_skip_has_a_reason() -> None:
    """The extraction itself: the README's blocks and the man pages' examples are all there,
    and a man skip names a command that still exists (a stale entry skips nothing)."""
    for doc in MARKDOWN:
        blocks = [b for b in BLOCKS if b.source == doc.relative_to(ROOT).as_posix()]
        fences = sum(1 for ln in doc.read_text().splitlines()
                     if (m := FENCE.match(ln)) and m["lang"])
        assert len(blocks) == fences > 0, doc
        assert {b.lang for b in blocks} <= {"sh", "python", "toml", "json"}
    firsts = {b.text.splitlines()[0] for b in BLOCKS if b.source.startswith("man/")}
    assert set(MAN_SKIPS) <= firsts, set(MAN_SKIPS) - firsts
    assert all(b.skip.strip() for b in BLOCKS if b.skip)
