"""fabricctl's library for Python producers: items in, a job's results out.

Contract: everything a program needs to feed a broker, and nothing of the CLI, the TUI or the
server (importing it loads none of them; a test checks):
- `Producer.connect(address)` and `Producer.open_job(...)` -> `Job` (`producer.session`);
- `Job.run(lines, hooks=..., write=...)`: the one orchestration of a job (follow, submit, seal,
  await) `fabricctl submit`, `fabricctl run` and the Batch API's feeder run; its parts
  `Job.submit(lines)` / `submit_file(path)`, `seal()`, `cancel()`, `results()` / `follow()`;
- `Feed` (`producer.feed`): the one submit pipeline, its typed per-call `FeedHooks`, and its
  constants `CHUNK`, `IN_FLIGHT` and `QUEUED`;
- `JobFollower` (`producer.follow`): a job's results, once each, until it ends;
- `InputOrder` (`producer.ordered`): results back in input order, as `vllm run-batch` writes them;
- `ask_table(job, Table(path, fmt), TableSpec(...), out)` (`producer.table`): one question asked
  of every row of a CSV, Parquet or JSONL table, the answers joined back as columns.

The library reads no configuration: `connect` takes the broker's address, and
`fabricctl.config.load_config().data_dir` is the data dir every command uses (flag aside:
`FABRICCTL_DATA_DIR`, else the configuration's `data_dir`, else `~/.local/share/fabricctl`). A
producer of a hundred lines, fed to the broker `fabricctl up` started: README.md, "From Python:
`fabricctl.producer`".
"""

from __future__ import annotations

from fabricctl.producer.feed import CHUNK, IN_FLIGHT, QUEUED, Chunk, Feed, FeedHooks, Refusals
from fabricctl.producer.follow import JobFollower, results_stored
from fabricctl.producer.ordered import InputOrder
from fabricctl.producer.session import Job, Producer, file_digest, open_with_terms
from fabricctl.producer.table import Emitted, TableSpec, ask_table, emit_lines, join_answers
from fabricctl.producer.table_io import OutColumns, Table, TableFormat

__all__ = [
    "CHUNK",
    "IN_FLIGHT",
    "QUEUED",
    "Chunk",
    "Emitted",
    "Feed",
    "FeedHooks",
    "InputOrder",
    "Job",
    "JobFollower",
    "OutColumns",
    "Producer",
    "Refusals",
    "Table",
    "TableFormat",
    "TableSpec",
    "ask_table",
    "emit_lines",
    "file_digest",
    "join_answers",
    "open_with_terms",
    "results_stored",
]
