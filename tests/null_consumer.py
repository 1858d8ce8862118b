"""A consumer process for the kill/stop tests: pulls one batch, says so, then waits.

    python tests/null_consumer.py --hold SOCKET NAME TEXT

It registers `server_helpers.CONTRACT`, heartbeats at the broker's interval, long-polls
until it gets a batch, prints one JSON line `{"event": "holding", "batch", "ids"}` and
then blocks on stdin. Each stdin line `complete` completes the held batch with TEXT and
prints `{"event": "completed", "stored": n}` or `{"event": "complete_failed", "error"}`;
end of stdin exits. The test kills (SIGKILL) or stops (SIGSTOP) it while it holds the batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

from server_helpers import CONTRACT

from fabricctl.core.types import ItemResult
from fabricctl.errors import FabricError
from fabricctl.wire.client import Client


def say(**kw: object) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


async def heartbeat(client: Client, every: float) -> None:
    with contextlib.suppress(FabricError, ConnectionError, OSError):
        while True:
            await client.heartbeat()
            await asyncio.sleep(every)


async def hold(socket: str, name: str, text: str) -> None:
    client = await Client.connect(socket, "consumer", name)
    reg = await client.register(name, CONTRACT)
    beat = asyncio.get_running_loop().create_task(heartbeat(client, reg.heartbeat_s))
    work = None
    while work is None:
        work = await client.pull(1.0)
    say(event="holding", batch=work.id, ids=[i.id for i in work.items])
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        if line.strip() == "complete":
            try:
                stored = await asyncio.wait_for(
                    client.complete(work.id, [ItemResult(i.id, text=text) for i in work.items]),
                    10.0)
                say(event="completed", stored=stored)
            except (FabricError, ConnectionError, OSError, TimeoutError) as e:
                say(event="complete_failed", error=f"{type(e).__name__}: {e}")
    beat.cancel()
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold", nargs=3, metavar=("SOCKET", "NAME", "TEXT"), required=True)
    args = ap.parse_args()
    asyncio.run(hold(*args.hold))


if __name__ == "__main__":
    main()
