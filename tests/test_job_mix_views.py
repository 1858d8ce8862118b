"""A job's endpoint mix where it is shown (issue 26): the metrics family and the `status`
answer on a live broker, `jobs show`/`jobs` through the CLI against `fabricctl up --engine
sim` with a file that mixes native, chat, embeddings and rerank lines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cli_helpers import Broker
from server_helpers import MODEL, SIG_A, running_server, wait_until

from fabricctl.cli.common import settings
from fabricctl.cli.status import show_status
from fabricctl.core.records import Source
from fabricctl.core.types import Item
from fabricctl.wire.client import Client


def _items(n: int) -> list[Item]:
    """n items: three chat lines to one rerank line (stated endpoints, as the reader does)."""
    return [Item(f"r{k}", MODEL, SIG_A, 100, 8, f"p{k}".encode(), line=k + 1,
                 endpoint=int(Source.RERANK if k % 4 == 3 else Source.CHAT))
            for k in range(n)]


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    """(job_id, endpoint) -> value of each sample of a labelled family."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            kv = dict(part.split("=", 1) for part in labels.split(","))
            out[(kv["job_id"].strip('"'), kv["endpoint"].strip('"'))] = float(value)
    return out


async def _scrape(host: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    body = (await reader.read()).decode()
    writer.close()
    return body.split("\r\n\r\n", 1)[1]


async def test_metrics_and_status_name_each_live_jobs_mix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with running_server(tmp_path) as server:
        state = server.state
        c = await Client.connect(state.cfg.data_dir, "producer", "p")
        a = (await c.open_job("submit", name="a.jsonl")).job
        b = (await c.open_job("submit", name="b.jsonl")).job
        await c.submit(_items(40), job=a.number)  # no consumer: both stay live
        await c.submit([Item("e0", MODEL, SIG_A, 10, 1, b"e", line=1,
                             source=int(Source.EMBEDDINGS))], job=b.number)
        http = await state.metrics.serve("127.0.0.1", 0)
        port = http.sockets[0].getsockname()[1]
        try:
            samples = _samples(await _scrape("127.0.0.1", port), "fabricctl_job_items")
        finally:
            http.close()
            await http.wait_closed()
        assert samples == {(a.id, "chat"): 30.0, (a.id, "rerank"): 10.0,
                           (b.id, "embeddings"): 1.0}

        status = await c.status()
        assert status["mix"] == {"jobs": 2, "endpoints": {"chat": 30, "rerank": 10,
                                                          "embeddings": 1}}
        assert {j["id"]: j["endpoints"] for j in status["jobs"]} == {
            a.id: {"chat": 30, "rerank": 10}, b.id: {"embeddings": 1}}
        cfg = settings(state.cfg.data_dir, None)
        capsys.readouterr()
        await asyncio.to_thread(show_status, cfg, False)
        text = " ".join(capsys.readouterr().out.split())
        assert ("endpoints of the live jobs: chat 73.2% (30) · rerank 24.4% (10) · "
                "embeddings 2.4% (1) of 41 items in 2 live job(s)") in text

        # a job that ends leaves the family (its label sets are the live jobs')
        await c.cancel_job(b.id)

        async def ended() -> bool:
            return (await c.job(b.id)).job.ended
        await wait_until(ended)
        samples = _samples(state.metrics.render().decode(), "fabricctl_job_items")
        assert samples == {(a.id, "chat"): 30.0, (a.id, "rerank"): 10.0}
        assert (await c.job(b.id)).job.endpoints == {"embeddings": 1}  # the record keeps it
        await c.close()


def _mixed_file() -> bytes:
    lines = []
    for k in range(6):  # native completions
        lines.append({"id": f"n{k}", "model": "fabric-demo", "prefix": ["SYS"],
                      "prompt": f"q{k}", "max_tokens": 4})
    for k in range(3):  # OpenAI chat
        lines.append({"custom_id": f"c{k}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "fabric-demo", "max_tokens": 4,
                               "messages": [{"role": "user", "content": f"hi {k}"}]}})
    for k in range(2):  # OpenAI embeddings
        lines.append({"custom_id": f"e{k}", "method": "POST", "url": "/v1/embeddings",
                      "body": {"model": "fabric-demo", "input": f"text {k}"}})
    lines.append({"id": "r0", "model": "fabric-demo", "endpoint": "rerank",  # native rerank
                  "params": {"query": "q", "documents": ["a", "b"]}})
    return b"".join(json.dumps(o).encode() + b"\n" for o in lines)


def test_jobs_show_and_list_name_the_mix_of_a_mixed_file(tmp_path: Path) -> None:
    b = Broker(tmp_path / "broker", tmp_path)
    try:
        src = tmp_path / "mixed.jsonl"
        src.write_bytes(_mixed_file())
        out = b.run("submit", str(src), "--wait")
        assert len(out.stdout.splitlines()) == 12, out.stderr  # one result a line
        listed = b.run("jobs", "--json")
        [rec] = json.loads(listed.stdout)["jobs"]
        want = {"completions": 6, "chat": 3, "embeddings": 2, "rerank": 1}
        assert rec["endpoints"] == want and rec["total"] == 12
        doc = json.loads(b.run("jobs", "show", rec["id"], "--json").stdout)
        assert doc["job"]["endpoints"] == want
        assert doc["mix"] == [{"endpoint": "completions", "items": 6, "share": 0.5},
                              {"endpoint": "chat", "items": 3, "share": 0.25},
                              {"endpoint": "embeddings", "items": 2, "share": 2 / 12},
                              {"endpoint": "rerank", "items": 1, "share": 1 / 12}]
        text = " ".join(b.run("jobs", "show", rec["id"]).stdout.decode().split())
        assert ("endpoints completions 6 (50.0%), chat 3 (25.0%), embeddings 2 (16.7%), "
                "rerank 1 (8.3%)") in text
        tsv = b.run("jobs").stdout.decode().splitlines()  # piped: TSV
        head, row = tsv[0].split("\t"), tsv[1].split("\t")
        assert head[-1] == "endpoints"
        assert row[-1] == "completions=6,chat=3,embeddings=2,rerank=1"
    finally:
        assert b.stop() == 0
