"""`fabricctl up --api` end to end, the official `openai` SDK as the client, the sim engine.

Promises checked against a real `up --api 127.0.0.1:PORT` subprocess:
- files: create, retrieve, content byte for byte, list, delete; a bad upload (not JSONL,
  wrong purpose, duplicate custom_id) and a batch for an unknown endpoint are 400s in
  OpenAI's error shape (the SDK raises `BadRequestError`), and so is a batch whose endpoint
  its file's lines are not for; with `server.token` set (and the
  API in the config's `[server] api`) a wrong key is 401 and the right one works; a
  non-loopback `--api` without a token is refused at once (exit 2, naming server.token);
  a 48 MiB upload raises the daemon's peak RSS (VmHWM) by far less than the file.
- batches: create, then retrieve until done, the statuses seen in OpenAI's order; the output
  file has one line per custom_id in input order; list shows the batch; cancelling a large
  batch on slowed simulated GPUs goes cancelling then cancelled with request counts that add
  up and `batch_cancelled` lines in the error file; a batch past its completion window
  expires, results so far kept; a job the API created survives a restart of `up`, and one
  whose file was still being fed when `up` was SIGKILLed (or stopped by SIGINT) is fed again
  after the restart (`resume`): one result per request, in input order.
- `--api` on a port already taken ends `up` with one error line naming it (exit 2).
- `metadata={"priority": "7"}` with completion_window "24h" gives the batch's job priority 7
  and a deadline 24 h after its creation (the Batch keeps its metadata as given); a priority
  that is not a whole number 0..MAX_PRIORITY is a 400 with param `metadata.priority`, and no
  batch is created.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cli_helpers import START_TIMEOUT_S, Broker, clean_env, fabricctl
from ports import free_port

from fabricctl.wire.client import Client

CHAT = "/v1/chat/completions"
ORDER = ["validating", "in_progress", "finalizing", "completed"]
def request(cid: str, prompt: str = "hi", max_tokens: int = 4) -> dict:
    return {"custom_id": cid, "method": "POST", "url": CHAT,
            "body": {"model": "fabric-demo", "max_tokens": max_tokens,
                     "messages": [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": prompt}]}}


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


class ApiBroker(Broker):
    """`fabricctl up --engine sim` (or `engine`) serving the Batch API, its settings from
    fabric.toml (`toml` after its `[server]` section)."""

    def __init__(self, data_dir: Path, home: Path, toml: str = "", token: str = "",
                 env: dict[str, str] | None = None, engine: str = "sim",
                 consumers: int = 2) -> None:
        self.port = free_port()
        self.token = token
        server = f'[server]\napi = "127.0.0.1:{self.port}"\n'
        if token:
            server += f'token = "{token}"\n'
        (home / "fabric.toml").write_text(server + toml)
        super().__init__(data_dir, home, env, engine, consumers)
        self.wait_api()

    def wait_api(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                if httpx.get(f"{self.url}/files", headers=headers).status_code == 200:
                    return
            except httpx.TransportError:  # not listening yet
                pass
            time.sleep(0.05)
        raise AssertionError(f"the API did not answer: {self.logs()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key or self.token or "none",
                             max_retries=0, timeout=60)

    def peak_rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ApiBroker]:
    b = ApiBroker(tmp_path / "d", tmp_path)
    try:
        yield b
    finally:
        assert b.stop() == 0, b.logs()


def wait_ended(c: openai.OpenAI, batch_id: str, timeout: float = 120) -> list[str]:
    """Retrieve until the batch ended; the statuses seen, each once, in the order seen."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = c.batches.retrieve(batch_id)
        if not seen or seen[-1] != b.status:
            seen.append(b.status)
        if b.status in ("completed", "failed", "cancelled", "expired"):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"batch {batch_id} still {seen[-1:]} after {timeout} s")


# ---- files ------------------------------------------------------------------------------


def test_files_round_trip(broker: ApiBroker) -> None:
    c = broker.client()
    data = jsonl([request(f"r{i}") for i in range(100)])
    f = c.files.create(file=("mine.jsonl", data), purpose="batch")
    assert (f.object, f.purpose, f.bytes, f.filename) == ("file", "batch", len(data),
                                                          "mine.jsonl")
    assert c.files.retrieve(f.id).bytes == len(data)
    assert c.files.content(f.id).content == data
    assert [x.id for x in c.files.list().data] == [f.id]
    assert c.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError) as e:
        c.files.retrieve(f.id)
    assert e.value.status_code == 404


def test_bad_uploads_and_endpoints_are_400s_in_openai_shape(broker: ApiBroker) -> None:
    c = broker.client()
    bad = [
        (("a.txt", b"hello world\nthis is not json\n"), "batch", "line 1"),
        (("a.jsonl", jsonl([request("a")])), "fine-tune", "purpose"),
        (("a.jsonl", jsonl([request("a"), request("b"), request("a")])), "batch",
         "line 3: custom_id 'a' is a duplicate of line 1"),
    ]
    for file, purpose, words in bad:
        with pytest.raises(openai.BadRequestError) as e:
            c.files.create(file=file, purpose=purpose)  # type: ignore[arg-type]
        assert e.value.status_code == 400
        err = e.value.response.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error" and words in err["message"], err
    assert c.files.list().data == []
    f = c.files.create(file=("a.jsonl", jsonl([request("a")])), purpose="batch")
    for endpoint, code in (("/v1/moderations", "invalid_value"),  # no such endpoint here
                           ("/v1/embeddings", "mismatched_url")):  # the lines are chat
        with pytest.raises(openai.BadRequestError) as e:
            c.batches.create(input_file_id=f.id, endpoint=endpoint,  # type: ignore[arg-type]
                             completion_window="24h")
        assert e.value.status_code == 400
        err = e.value.response.json()["error"]
        assert (err["param"], err["code"]) == ("endpoint", code), err
    assert c.batches.list().data == []


def test_a_token_is_the_bearer_key(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path, token="sekrit")
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            b.client("wrong").files.list()
        assert e.value.status_code == 401
        assert e.value.response.json()["error"]["code"] == "invalid_api_key"
        assert b.client("sekrit").files.list().data == []
    finally:
        assert b.stop() == 0, b.logs()


def test_non_loopback_without_token_is_refused(tmp_path: Path) -> None:
    out = fabricctl("up", "--data-dir", str(tmp_path / "d"), "--engine", "sim", "--api",
                    f"0.0.0.0:{free_port()}", env=clean_env(tmp_path), cwd=tmp_path,
                    timeout=60)
    assert out.returncode == 2, out.stderr
    assert b"server.token" in out.stderr and b"Traceback" not in out.stderr
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_a_taken_port_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = fabricctl("up", "--data-dir", str(tmp_path / "d"), "--engine", "sim", "--api",
                        f"127.0.0.1:{port}", env=clean_env(tmp_path), cwd=tmp_path,
                        timeout=120)
    assert out.returncode == 2, out.stderr
    err = out.stderr.decode()
    assert f"--api 127.0.0.1:{port}: cannot listen there" in err and "Traceback" not in err


def test_a_large_upload_keeps_memory_flat(broker: ApiBroker, tmp_path: Path) -> None:
    row = request("x", "y" * 300)
    lines = []
    for i in range(150_000):
        row["custom_id"] = f"req-{i}"
        lines.append(json.dumps(row).encode())
    data = b"\n".join(lines) + b"\n"
    assert len(data) > 48 * 2**20
    before = broker.peak_rss_kib()
    f = broker.client().files.create(file=("big.jsonl", data), purpose="batch")
    grew = broker.peak_rss_kib() - before
    assert f.bytes == len(data)
    assert (broker.data_dir / "files" / f"{f.id}.jsonl").stat().st_size == len(data)
    assert grew < 16 * 1024, f"peak RSS grew {grew} KiB for a {len(data) >> 20} MiB upload"


# ---- batches ----------------------------------------------------------------------------


def test_a_batch_runs_to_completion(broker: ApiBroker) -> None:
    c = broker.client()
    ids = [f"q{i}" for i in range(300)]
    f = c.files.create(file=("in.jsonl", jsonl([request(i, f"question {i}") for i in ids])),
                       purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                         metadata={"owner": "test"})
    assert b.status in ORDER and b.input_file_id == f.id and b.metadata == {"owner": "test"}
    seen = wait_ended(c, b.id)
    assert seen[-1] == "completed"
    assert [ORDER.index(s) for s in seen] == sorted(ORDER.index(s) for s in seen), seen
    b = c.batches.retrieve(b.id)
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed,
            b.request_counts.failed) == (300, 300, 0)
    assert b.completed_at is not None and b.in_progress_at is not None
    assert b.created_at <= b.in_progress_at <= b.completed_at
    assert b.output_file_id and b.error_file_id is None
    out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ids
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert c.files.retrieve(b.output_file_id).purpose == "batch_output"
    assert b.id in [x.id for x in c.batches.list().data]


def test_metadata_priority_and_the_window_become_the_jobs_terms(broker: ApiBroker) -> None:
    c = broker.client()
    f = c.files.create(file=("in.jsonl", jsonl([request(f"p{i}") for i in range(20)])),
                       purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                         metadata={"priority": "7", "owner": "test"})
    assert b.metadata == {"priority": "7", "owner": "test"}
    assert b.expires_at == b.created_at + 86400

    async def job() -> dict:
        cl = await Client.connect(broker.data_dir, "observer", "terms-test")
        try:
            rec = (await cl.job(b.id)).job
            return {"priority": rec.priority, "deadline": rec.deadline, "created": rec.created}
        finally:
            await cl.close()

    rec = asyncio.run(job())
    assert rec["priority"] == 7
    assert rec["deadline"] == pytest.approx(rec["created"] + 86400)
    shown = broker.run("jobs", "show", b.id, "--json")
    assert json.loads(shown.stdout)["job"]["priority"] == 7
    assert wait_ended(c, b.id)[-1] == "completed"
    assert c.batches.retrieve(b.id).metadata == {"priority": "7", "owner": "test"}

    before = [x.id for x in c.batches.list().data]
    for bad in ("high", "-1", "1.5", "", "1000001"):
        with pytest.raises(openai.BadRequestError) as e:
            c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                             metadata={"priority": bad})
        err = e.value.body
        assert isinstance(err, dict), err
        assert (err["param"], err["code"]) == ("metadata.priority", "invalid_value"), err
        assert "priority must be a whole number from 0 to 1000000" in err["message"]
    assert [x.id for x in c.batches.list().data] == before  # no batch was created


def test_every_batch_is_listed_past_a_thousand(broker: ApiBroker) -> None:
    """The list pages through the store, not through the newest 1,000 jobs."""
    async def open_jobs() -> list[str]:
        c = await Client.connect(broker.data_dir, "producer", "list-test")
        ids = []
        for k in range(1100):
            if k % 20 == 0:  # a `submit` job between: never listed as a batch
                await c.open_job("submit", name=f"cli-{k}.jsonl", attach=False)
            reply = await c.open_job("api", name=f"file-{k}", endpoint=CHAT, attach=False)
            ids.append(reply.job.id)
        await c.close()
        return ids[::-1]

    newest_first = asyncio.run(open_jobs())
    c = broker.client()
    first = c.batches.list(limit=100)
    assert [b.id for b in first.data] == newest_first[:100] and first.has_more
    assert [b.id for b in c.batches.list(limit=100)] == newest_first  # the SDK pages on
    last = c.batches.list(limit=100, after=newest_first[-2])
    assert [b.id for b in last.data] == newest_first[-1:] and not last.has_more
    with pytest.raises(openai.BadRequestError, match="after"):
        c.batches.list(after="batch_nope")


def test_cancelling_a_large_batch(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path, toml="[sim]\ntime_scale = 0.05\n")
    try:
        c = b.client()
        n = 5000
        f = c.files.create(file=("in.jsonl", jsonl([request(f"k{i}", max_tokens=64)
                                                    for i in range(n)])), purpose="batch")
        batch = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        deadline = time.monotonic() + 60
        while c.batches.retrieve(batch.id).status == "validating":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        got = c.batches.cancel(batch.id)
        # in-flight requests finish first; with none in flight yet (a loaded box: the feeder
        # has not sent a line to an engine) the cancel ends the batch at once
        assert got.status in ("cancelling", "cancelled")
        seen = [got.status, *wait_ended(c, batch.id)]
        assert seen[-1] == "cancelled"
        done = c.batches.retrieve(batch.id)
        assert done.cancelling_at is not None and done.cancelled_at is not None
        counts = done.request_counts
        assert counts is not None and counts.total == n
        assert counts.completed + counts.failed == n and counts.failed > 0
        assert done.error_file_id
        err = [json.loads(x) for x in c.files.content(done.error_file_id).text.splitlines()]
        assert len(err) == counts.failed
        assert {e["error"]["code"] for e in err} <= {"batch_cancelled"}
        out = (c.files.content(done.output_file_id).text.splitlines()
               if done.output_file_id else [])
        assert len(out) == counts.completed
        assert {json.loads(x)["custom_id"] for x in out} | {e["custom_id"] for e in err} == {
            f"k{i}" for i in range(n)}
    finally:
        assert b.stop() == 0, b.logs()


def test_a_batch_past_its_window_expires(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path, toml="[sim]\ntime_scale = 1.0\n")
    try:
        c = b.client()
        n = 3000
        f = c.files.create(file=("in.jsonl", jsonl([request(f"e{i}", max_tokens=64)
                                                    for i in range(n)])), purpose="batch")
        batch = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="2s")
        assert batch.completion_window == "2s" and batch.expires_at is not None
        seen = wait_ended(c, batch.id)
        assert seen[-1] == "expired", seen
        done = c.batches.retrieve(batch.id)
        counts = done.request_counts
        assert counts is not None and counts.completed + counts.failed == n
        assert done.expired_at is not None and done.error_file_id
        err = [json.loads(x) for x in c.files.content(done.error_file_id).text.splitlines()]
        assert "batch_expired" in {e["error"]["code"] for e in err}
    finally:
        assert b.stop() == 0, b.logs()


def test_a_batch_survives_a_restart(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path)
    f = b.client().files.create(file=("in.jsonl", jsonl([request(f"s{i}") for i in
                                                          range(50)])), purpose="batch")
    batch = b.client().batches.create(input_file_id=f.id, endpoint=CHAT,
                                      completion_window="24h")
    wait_ended(b.client(), batch.id)
    assert b.stop() == 0, b.logs()
    b2 = ApiBroker(tmp_path / "d", tmp_path)
    try:
        c = b2.client()
        again = c.batches.retrieve(batch.id)
        assert again.status == "completed" and again.output_file_id
        assert c.files.retrieve(f.id).bytes > 0
        out = c.files.content(again.output_file_id).text.splitlines()
        assert [json.loads(x)["custom_id"] for x in out] == [f"s{i}" for i in range(50)]
    finally:
        assert b2.stop() == 0, b2.logs()


@pytest.mark.parametrize("how", ["sigkill", "sigint"])
def test_a_batch_being_fed_when_up_stops_is_fed_again(tmp_path: Path, how: str) -> None:
    slow = "[sim]\ntime_scale = 0.05\n"
    b = ApiBroker(tmp_path / "d", tmp_path, toml=slow)
    n = 20000
    c = b.client()
    f = c.files.create(file=("in.jsonl", jsonl([request(f"k{i}") for i in range(n)])),
                       purpose="batch")
    batch = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + 60
    while True:  # some of it is in, not all: the feed is under way
        got = c.batches.retrieve(batch.id)
        assert got.request_counts is not None and time.monotonic() < deadline
        if got.request_counts.total >= 1024:
            break
        time.sleep(0.01)
    assert got.status == "validating" and got.request_counts.total < n
    if how == "sigkill":
        b.proc.kill()
    else:  # a graceful stop: the feed is stopped, not failed
        b.proc.send_signal(signal.SIGINT)
    assert b.proc.wait(timeout=60) in (-signal.SIGKILL, 130)
    b.log.close()
    b2 = ApiBroker(tmp_path / "d", tmp_path, toml=slow)
    try:
        c2 = b2.client()
        assert wait_ended(c2, batch.id, 300)[-1] == "completed"
        done = c2.batches.retrieve(batch.id)
        assert done.request_counts is not None and done.errors is None
        assert (done.request_counts.total, done.request_counts.completed) == (n, n)
        assert done.output_file_id
        out = c2.files.content(done.output_file_id).text.splitlines()
        assert [json.loads(x)["custom_id"] for x in out] == [f"k{i}" for i in range(n)]
    finally:
        assert b2.stop() == 0, b2.logs()


def test_cancelling_while_validating_stops_the_feed(tmp_path: Path) -> None:
    b = ApiBroker(tmp_path / "d", tmp_path, toml="[sim]\ntime_scale = 0.05\n")
    try:
        c = b.client()
        n = 20000
        f = c.files.create(file=("in.jsonl", jsonl([request(f"v{i}") for i in range(n)])),
                           purpose="batch")
        batch = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        assert c.batches.cancel(batch.id).status in ("cancelling", "cancelled")
        assert wait_ended(c, batch.id)[-1] == "cancelled"
        done = c.batches.retrieve(batch.id)
        counts = done.request_counts
        assert counts is not None and counts.total < n  # the rest of the file never went in
        assert counts.completed + counts.failed == counts.total
        again = c.batches.retrieve(batch.id)  # nothing joins it later
        assert again.request_counts == counts and again.status == "cancelled"
    finally:
        assert b.stop() == 0, b.logs()
