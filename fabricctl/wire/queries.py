"""The observers' questions: one tagged request Struct per question, answered by `Answer`.

Contract: each request names its question by its type (the msgpack tag), never by a string
field, and carries only its own arguments; the server answers each with one handler
(`fabricctl.server.views.HANDLERS`, keyed by these types) and the client asks each through
one typed method (`fabricctl.wire.client.Client`: `shapes`, `shape`, `consumers`, `ledger`,
`events`, `results`, `results_by_key`, `result`, `jobs`, `job_views`, `job`, `job_results`,
`snapshot`, `status`), which decodes the answer into that question's result type.
`FollowResults` is not a question but a subscription: the server answers it with
`ResultsPush` frames carrying its rid, the results of one job (0: every job) stored after
sequence number `since` (-1: from the moment it is read), as they are stored; a push with
`ended` set is the last one (the job has every outcome and every result of it was pushed);
`StopFollow` with its rid ends a stream early.
"""

from __future__ import annotations

from fabricctl.core.jobs import JobRecord
from fabricctl.core.records import ResultRecord
from fabricctl.wire.message import Message


class ShapesQuery(Message):
    """Why: the live shapes; with `all`, then the finished shapes' records, newest first."""

    all: bool = False


class ShapeQuery(Message):
    """Why: the one shape `ref` names (hex signature, label or unique hex prefix)."""

    ref: str


class ConsumersQuery(Message):
    """Why: the registered consumers (`core.snapshot.ConsumerView`s)."""


class LedgerQuery(Message):
    """Why: the conservation ledger, its difference and the ledger as last persisted."""


class EventsQuery(Message):
    """Why: the broker's events after sequence number `since`, `limit` at most."""

    since: int = 0
    limit: int = 1000


class ResultsQuery(Message):
    """Why: stored results after sequence number `since`, in storage order, with their seq."""

    since: int = 0
    limit: int = 1000


class ResultsByKeyQuery(Message):
    """Why: stored results in entry-key (ingest) order after `after` (24 hex digits; "":
    from the first), with their key."""

    after: str = ""
    limit: int = 1000


class ResultQuery(Message):
    """Why: one stored result by its item id in job number `job` (0: none), or None."""

    id: str
    job: int = 0


class JobsQuery(Message):
    """Why: the newest `limit` job records numbered below `before` (0: any) of `kind`
    ("": any), newest first."""

    kind: str = ""
    before: int = 0
    limit: int = 1000


class JobViewsQuery(Message):
    """Why: each job with queued items, its place in the fleet (`core.forecast.JobView`)."""


class JobQuery(Message):
    """Why: one job (an id or unique prefix) as `jobs show` prints it (`JobView`)."""

    ref: str


class JobResultsQuery(Message):
    """Why: one job's results of lines after `after_line`, in input order, `limit` at most."""

    ref: str
    after_line: int = 0
    limit: int = 1000


class SnapshotQuery(Message):
    """Why: one snapshot, as the stats stream pushes them; `all_lanes`: every lane in it."""

    all_lanes: bool = False


class StatusQuery(Message):
    """Why: the broker's summary (`fabricctl status`)."""


Query = (
    ShapesQuery | ShapeQuery | ConsumersQuery | LedgerQuery | EventsQuery | ResultsQuery
    | ResultsByKeyQuery | ResultQuery | JobsQuery | JobViewsQuery | JobQuery | JobResultsQuery
    | SnapshotQuery | StatusQuery
)
QUERIES = (
    ShapesQuery, ShapeQuery, ConsumersQuery, LedgerQuery, EventsQuery, ResultsQuery,
    ResultsByKeyQuery, ResultQuery, JobsQuery, JobViewsQuery, JobQuery, JobResultsQuery,
    SnapshotQuery, StatusQuery,
)


class FollowResults(Message):
    """Why: a producer waits for its job's results as they are stored, pushed to it, and
    resumes after a lost connection from the last sequence number it saw."""

    job: int = 0  # a job's number; 0: the results of every job
    since: int = -1  # the sequence number to stream after; -1: from now


class StopFollow(Message):
    """Why: a follower that stops before its job ended (or a stream of every job) ends its
    stream, so the broker does not push to a connection that no longer reads them. Its rid
    is the FollowResults' rid; nothing answers it."""


class ResultsPush(Message):
    """Why: one step of a `FollowResults` stream: its results (with their sequence numbers,
    `seq` the last looked at), and, on the last push, the job's record once it ended."""

    seq: int
    rows: list[tuple[int, ResultRecord]] = []
    ended: JobRecord | None = None
