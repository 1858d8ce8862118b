"""fabricctl's library for Python producers: items in, a job's results out.

Contract: everything a program needs to feed a broker, and nothing of the CLI, the TUI or
the server (importing it loads none of them; a test checks):
- `Producer.connect(address)` and `Producer.open_job(...)` -> `Job` (`producer.session`);
- `Job.submit(lines)` / `submit_file(path)`, `seal()`, `cancel()`, `results()` / `follow()`;
- `Feed` (`producer.feed`): the one submit pipeline `fabricctl submit`, `fabricctl run` and
  the Batch API's feeder run, with its constants `CHUNK`, `IN_FLIGHT` and `QUEUED`;
- `JobFollower` (`producer.follow`): a job's results, once each, until it ends;
- `InputOrder` (`producer.ordered`): results back in input order, as `vllm run-batch`
  writes them.

A producer of ten lines::

    import asyncio
    from fabricctl.producer import Producer

    async def main() -> None:
        async with await Producer.connect(".fabricctl") as p:
            job = await p.open_job(name="greetings")
            await job.submit({"id": f"q{i}", "model": "fabric-demo", "prefix": ["Be brief."],
                              "prompt": f"Hello {i}", "max_tokens": 8} for i in range(100))
            await job.seal()
            async for result in job.results():
                print(result.id, result.text)

    asyncio.run(main())
"""

from __future__ import annotations

from fabricctl.producer.feed import CHUNK, IN_FLIGHT, QUEUED, Chunk, Feed, Refusals
from fabricctl.producer.follow import JobFollower, results_stored
from fabricctl.producer.ordered import InputOrder
from fabricctl.producer.session import Job, Producer, file_digest, open_with_terms

__all__ = [
    "CHUNK",
    "IN_FLIGHT",
    "QUEUED",
    "Chunk",
    "Feed",
    "InputOrder",
    "Job",
    "JobFollower",
    "Producer",
    "Refusals",
    "file_digest",
    "open_with_terms",
    "results_stored",
]
