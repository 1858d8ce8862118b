"""`fabricctl down` while a remote agent holds work: it finishes, or `down` says what went back.

A broker with no GPUs of its own (`up --gpus none --listen ... --token`) and one agent on
"another host" (`consume --broker ... --gpus 0 --engine sim`, slow simulated batches):
- the agent holds batches when `down` is run: the broker hands out nothing more, waits for
  the agent to answer what it holds (`[server] drain_s`), and only then closes; `down`
  exits 0; no item goes back to its lanes; the data dir, started again, holds a result for
  every item that was in flight at the `down` (each id once), and the ledger agrees;
- the agent is cut off (SIGSTOP) while it holds batches, and its heartbeat timeout is longer
  than the drain: the broker gives its work up once `drain_s` passed, and `down` (exit 0)
  names the consumer, the batches and items sent back to their lanes, and why (with how
  long before it had last been heard from), as the broker's log counted them.
Every wait is bounded polling or a waited-for log line.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from agent_helpers import (
    TOKEN,
    Child,
    agent_items,
    child_env,
    fabricctl_cmd,
    query,
    results,
    submit,
    wait_until,
)
from ports import free_port

from fabricctl.wire.client import Client

CONFIG = """\
model = "m"
[sim]
time_scale = 0.3
[consumer]
max_batch_size = 8
max_batch_tokens = 4096
max_input_len = 4096
[server]
heartbeat_s = 0.3
"""
ITEMS = 400


class Host:
    """Why: each test runs one broker and one agent as processes; this is their setup."""

    def __init__(self, tmp: Path, server: str) -> None:
        self.tmp, self.data = tmp, tmp / "data"
        self.config = tmp / "fabric-test.toml"
        self.config.write_text(CONFIG + server)
        self.address = f"127.0.0.1:{free_port()}"
        self.children: list[Child] = []
        self.lives = 0

    async def broker(self) -> Child:
        self.lives += 1
        argv = [*fabricctl_cmd(), "up", "--gpus", "none", "--listen", self.address,
                "--token", TOKEN, "--data-dir", str(self.data), "--config", str(self.config)]
        child = await self._child(argv, f"broker{self.lives}", child_env(self.tmp))
        await child.wait_line("broker listening on", 60)
        return child

    async def agent(self) -> Child:
        argv = [*fabricctl_cmd(), "consume", "--broker", self.address, "--engine", "sim",
                "--gpus", "0", "--name", "far", "--config", str(self.config)]
        return await self._child(argv, "agent", child_env(self.tmp, FABRICCTL_TOKEN=TOKEN))

    async def _child(self, argv: list[str], name: str, env: dict[str, str]) -> Child:
        child = Child(argv, env, self.tmp, self.tmp / f"{name}.log")
        self.children.append(child)
        return await child.start()

    async def down(self) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *fabricctl_cmd(), "down", "--data-dir", str(self.data), "--config",
            str(self.config), cwd=self.tmp, env=child_env(self.tmp),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        assert out == b"", out  # nothing on stdout
        assert proc.returncode is not None
        return proc.returncode, err.decode(errors="replace")

    async def cleanup(self) -> None:
        for c in self.children:
            c.signal(signal.SIGCONT)
            c.kill()
        for c in self.children:
            if c.proc is not None:
                await c.wait(30)


async def _in_flight(data: Path) -> dict[str, Any]:
    """The broker's ledger once the agent holds a batch it has not answered."""
    async def held() -> dict[str, Any] | None:
        cs = await query(data, Client.consumers)
        busy = sum(c.batches_inflight - c.batches_settling for c in cs)
        return (await query(data, Client.ledger))["ledger"] if busy else None
    got: dict[str, Any] = await wait_until(held, 60, "the agent holding a batch")
    return got


async def test_down_lets_a_remote_agent_finish_what_it_holds(tmp_path: Path) -> None:
    host = Host(tmp_path, "heartbeat_timeout_s = 2.0\n")
    try:
        broker = await host.broker()
        await host.agent()
        items = agent_items(ITEMS)
        await submit(host.data, items)
        ledger = await _in_flight(host.data)
        done_before, held = int(ledger["items_completed"]), int(ledger["items_inflight"])
        assert held > 0

        rc, err = await host.down()
        assert rc == 0, err
        assert await broker.wait(120) == 0, broker.tail()
        assert broker.count("back to their lanes") == 0, broker.tail()
        assert "sent back" not in err, err

        for c in host.children[1:]:  # the agent: nothing may finish after this
            c.kill()
            await c.wait(30)
        await host.broker()  # the same data dir, started again, with no consumer
        recs = await results(host.data)
        ids = Counter(r.id for r in recs)
        assert not [i for i, n in ids.items() if n > 1], "doubled"
        assert set(ids) <= {it.id for it in items}
        assert len(recs) >= done_before + held  # what the agent held at the `down` finished
        persisted = (await query(host.data, Client.ledger))["persisted"]
        assert int(persisted["items_completed"]) == len(recs)
    finally:
        await host.cleanup()


async def test_down_says_what_an_unreachable_agent_sent_back_and_why(tmp_path: Path) -> None:
    host = Host(tmp_path, "heartbeat_timeout_s = 120.0\ndrain_s = 3.0\n")
    try:
        broker = await host.broker()
        agent = await host.agent()
        await submit(host.data, agent_items(ITEMS))
        await _in_flight(host.data)
        agent.signal(signal.SIGSTOP)  # it holds its batches and answers nothing

        rc, err = await host.down()
        assert rc == 0, err
        assert await broker.wait(120) == 0, broker.tail()
        lost = [ln for ln in broker.lines if "back to their lanes" in ln]
        assert len(lost) == 1 and "within server.drain_s (3 s)" in lost[0], broker.tail()
        items = lost[0].split("): ")[1].split(" items")[0]
        note = [ln for ln in err.splitlines() if "sent back" in ln]
        assert len(note) == 1, err
        assert "far-gpu0" in note[0] and f"({items} items)" in note[0], note
        assert "within server.drain_s (3 s)" in note[0], note
        assert "last heard from" in note[0], note
    finally:
        await host.cleanup()
