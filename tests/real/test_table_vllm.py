"""`fabricctl table` end to end on real vLLM: a small CSV in, the CSV out with its answers.

The command runs on the session's two CPU servers (`--engine openai` on their endpoints);
each row's answer at temperature 0 must be what the same server answers to that row's
prompt sent alone (`/v1/completions`, one request at a time, with httpx), whatever order
the rows and fields went in.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fabricctl.supervisor.launcher import Launcher

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session")]

FABRICCTL = [sys.executable, "-m", "fabricctl"]
TICKETS = """id,product,channel,priority,message
t1,router,email,high,The router drops the connection every evening.
t2,router,email,low,How do I change the wifi password?
t3,router,phone,high,No internet since the update this morning.
t4,modem,email,low,The modem lights blink orange.
t5,modem,chat,high,The modem reboots every ten minutes.
t6,router,chat,low,Can I use my own router?
t7,modem,email,high,Line is dead after the storm.
t8,router,email,high,Speed is a tenth of what I pay for.
t9,modem,phone,low,Where do I return the old modem?
t10,router,chat,high,Guest network does not show up.
"""
ASK = ["--key", "id", "-i", "Classify the support ticket as one of: outage, setup, billing.",
       "--question", "Category:", "--max-tokens", "6", "--params", '{"temperature": 0}']


def env_for(tmp: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("FABRICCTL_")},
            "XDG_CONFIG_HOME": str(tmp / "config"), "HF_HUB_OFFLINE": "1"}


@pytest.mark.timeout(900)  # the session's servers may start in this test (minutes on 2 cores)
async def test_a_table_answers_as_the_server_answers_each_prompt_alone(
        vllm_servers: Launcher, tmp_path: Path) -> None:
    endpoints = [s.base_url for s in vllm_servers.servers]
    (tmp_path / "tickets.csv").write_text(TICKETS)
    (tmp_path / "fabric.toml").write_text(
        f'engine = "openai"\nmodel = "tiny"\n[vllm]\nendpoints = {json.dumps(endpoints)}\n')

    def table(*extra: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*FABRICCTL, "table", "tickets.csv", *ASK, *extra],
                              capture_output=True, env=env_for(tmp_path), cwd=tmp_path,
                              timeout=400)

    ran = await asyncio.to_thread(table, "-o", "out.csv", "--explain")
    assert ran.returncode == 0, ran.stderr.decode()[-3000:]
    assert b"prefix share:" in ran.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out.csv").read_text())))
    source = list(csv.DictReader(io.StringIO(TICKETS)))
    assert [{k: r[k] for k in source[0]} for r in rows] == source  # input order, as given
    assert all(r["error"] == "" for r in rows), rows
    emitted = await asyncio.to_thread(table, "--emit")
    assert emitted.returncode == 0, emitted.stderr.decode()
    lines = {x["id"]: x for x in map(json.loads, emitted.stdout.splitlines())}
    async with httpx.AsyncClient(timeout=120) as client:
        for row in rows:  # one at a time: nothing else in the server's batch
            line = lines[row["id"]]
            body = {"model": "tiny", "prompt": "".join(line["prefix"]) + line["prompt"],
                    "max_tokens": 6, "temperature": 0}
            r = await client.post(f"{endpoints[0]}/v1/completions", json=body)
            r.raise_for_status()
            assert row["answer"] == r.json()["choices"][0]["text"], (row, body)
