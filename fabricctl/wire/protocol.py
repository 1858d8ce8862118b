"""The wire: u32 big-endian length + msgpack, every frame a tagged msgspec Struct.

Contract: a connection opens with `Hello` (protocol version, role, token when TCP) answered by
`Welcome` or `Error`. Requests carry a request id `rid` that their reply echoes; the server
pushes `PrewarmPush` and `StatsPush` with rid 0, and `ResultsPush` with the rid of the
`FollowResults` it answers. The observers' questions are one request type each
(`wire.queries`), answered by `Answer`. A frame that is malformed, of an unknown
type, or longer than `max_frame` gets an `Error` frame and the connection is closed. Nothing
on the wire is pickled: msgpack only, validated against these types on decode.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Literal

import msgspec

from fabricctl.core.forecast import JobView as JobPlace
from fabricctl.core.jobs import JobRecord
from fabricctl.core.types import Contract, Item, ItemResult, Prewarm, Work
from fabricctl.wire.message import Message
from fabricctl.wire.queries import (
    ConsumersQuery,
    EventsQuery,
    FollowResults,
    JobQuery,
    JobResultsQuery,
    JobsQuery,
    JobViewsQuery,
    LedgerQuery,
    ResultQuery,
    ResultsByKeyQuery,
    ResultsPush,
    ResultsQuery,
    ShapeQuery,
    ShapesQuery,
    SnapshotQuery,
    StatusQuery,
    StopFollow,
)

PROTOCOL_VERSION = 2  # 2: one request type per question (`wire.queries`), FollowResults
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
SOCKET_NAME = "broker.sock"  # a broker's Unix socket: <data dir>/SOCKET_NAME, the one spelling
HEADER = struct.Struct(">I")
Role = Literal["producer", "consumer", "observer"]


class Hello(msgspec.Struct, tag=True):
    """First frame of every connection: who is calling, and its token for TCP."""

    version: int
    role: Role
    name: str = ""
    token: str = ""


class Welcome(msgspec.Struct, tag=True):
    version: int
    server: str
    data_dir: str


class Error(msgspec.Struct, tag=True):
    """A refused request; `fatal` means the server closes the connection after it."""

    code: str
    message: str
    rid: int = 0
    fatal: bool = False


class Submit(Message):
    """Items for the store; with `job` (a job's number, from `OpenJob`) they join that job.

    `resume`: the job was attached to (a rerun): an id already stored in this job is counted
    in `Ack.skipped`, not refused as a duplicate."""

    items: list[Item]
    job: int = 0
    resume: bool = False


class Reject(msgspec.Struct, array_like=True, omit_defaults=True):
    """Why: a submit is answered per item; this is one item it did not take, by its index.

    `stored`: it is a duplicate of an item already stored in its job (a resumed submit
    counts those in `Ack.skipped` instead)."""

    index: int
    reason: str
    stored: bool = False


class Ack(Message):
    """Sent only after the durable commit of every accepted item of the chunk."""

    accepted: int
    rejects: list[Reject]
    skipped: int = 0  # already stored in the job (a resumed submit): not sent again


class OpenJob(Message):
    """Start a job, or attach to one: to `job` (an id or a unique prefix) when given, else,
    when `attach`, to the newest job of the same kind, name and `sha256` (a file submitted
    again). Answered by `JobReply` once the job record is durable."""

    kind: str  # "submit", "run" or "api"
    name: str = ""
    sha256: str = ""
    size: int = 0
    endpoint: str = ""
    metadata: dict[str, str] = {}
    window_s: float = 0.0  # completion window; 0: none
    attach: bool = True
    job: str = ""
    validating: bool = False  # an API batch: `validating` until `SealJob(start=True)`
    priority: int = 0  # higher goes first (0..core.terms.MAX_PRIORITY)
    output_expires_s: int = 0  # an API batch's `output_expires_after` seconds; 0: never


class SealJob(Message):
    """The job's input ended after `lines` lines, `errors` the messages of the refused ones
    (not yet counted); `failed`: refuse the whole job (an API batch's bad file)."""

    job: int
    lines: int
    errors: list[str] = []
    failed: bool = False
    sha256: str = ""
    refused: int = 0  # refused lines beyond those in `errors` (only the first few are sent)


class CancelJob(Message):
    job: str  # an id or a unique prefix


class SetPriority(Message):
    """Change a live job's priority (0..core.terms.MAX_PRIORITY); answered by `JobReply`, or
    an `Error`: `not_found`/`ambiguous` (the id), `bad_priority`, `job_ended`."""

    job: str  # an id or a unique prefix
    priority: int


class JobReply(Message):
    """A job as it stands after the request; `attached`: an existing job was joined."""

    job: JobRecord
    attached: bool = False


class JobShapeView(msgspec.Struct):
    """Why: `jobs show` names each shape a job touched as `shapes` does (hex signature)."""

    model: str
    signature: str  # 16 hex digits
    label: str = ""


class JobView(msgspec.Struct):
    """Why: what `jobs show` prints of one job: its record and what only the broker knows
    now (items an engine holds, the rate so far, the time to go)."""

    job: JobRecord
    in_flight: int = 0
    shapes: list[JobShapeView] = []
    items_per_s: float = 0.0  # outcomes per second since it started running
    eta_s: float | None = None  # seconds to its predicted finish (`core.forecast.finish_in`
    # of `place`, the one forecast); None while there is none
    place: JobPlace | None = None  # its place in the fleet (waits, share, predicted finish);
    # None while it has no queued item


class Register(Message):
    name: str
    contract: Contract
    gpu: int | None = None
    engine: str = ""
    simulated: bool = False


class Registered(Message):
    consumer: str
    heartbeat_s: float
    heartbeat_timeout_s: float


class Heartbeat(msgspec.Struct, tag=True):
    stats: dict[str, Any] = {}  # the engine's counters (EngineStats as a dict)


class Pull(Message):
    wait_s: float = 1.0


class WorkReply(Message):
    work: Work | None


class Complete(Message):
    batch: int
    results: list[ItemResult]
    cache: list[int] = []  # the engine's (queries, hits, achievable) tokens for this batch


class Fail(Message):
    batch: int
    reason: str


class Done(Message):
    """Reply to Complete/Fail/Shutdown: `stored` results, or -1 when the batch was not ours."""

    stored: int = 0


class PrewarmPush(msgspec.Struct, tag=True):
    signal: Prewarm


class Subscribe(Message):
    """Ask for the stats stream: a snapshot every `interval_s`, lanes for the named shapes."""

    interval_s: float = 1.0
    lanes: list[tuple[str, int]] = []
    all_lanes: bool = False


class StatsPush(msgspec.Struct, tag=True):
    snapshot: msgspec.Raw  # an encoded Snapshot (see fabricctl.server.views)


class Answer(Message):
    """Why: a question's answer (`wire.queries`), encoded as that question's result type."""

    data: msgspec.Raw


class Shutdown(Message):
    """Why: `fabricctl down` asks the broker to stop; it is answered at once."""


Frame = (
    Hello | Welcome | Error | Submit | Ack | Register | Registered | Heartbeat | Pull | WorkReply
    | Complete | Fail | Done | PrewarmPush | Subscribe | StatsPush | Answer | Shutdown
    | OpenJob | SealJob | CancelJob | SetPriority | JobReply | FollowResults | ResultsPush
    | StopFollow
    | ShapesQuery | ShapeQuery | ConsumersQuery | LedgerQuery | EventsQuery | ResultsQuery
    | ResultsByKeyQuery | ResultQuery | JobsQuery | JobViewsQuery | JobQuery | JobResultsQuery
    | SnapshotQuery | StatusQuery
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


class FrameTooLarge(Exception):
    """A peer announced a frame longer than the maximum."""


def encode(frame: Frame) -> bytes:
    body = _encoder.encode(frame)
    return HEADER.pack(len(body)) + body


def encode_raw(obj: object) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(obj))


def decode(body: bytes | memoryview) -> Frame:
    """Decode one frame body; raises msgspec.DecodeError / ValidationError on bad input."""
    return _decoder.decode(body)


async def read_frame(reader: Any, max_frame: int = DEFAULT_MAX_FRAME) -> Frame | None:
    """The next frame, or None at a clean end of stream."""
    import asyncio

    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    (length,) = HEADER.unpack(head)
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the maximum of {max_frame}")
    return decode(await reader.readexactly(length))


class FrameReader:
    """Why: frames are cut out of the byte stream as it arrives, by the protocol callback
    itself, so a frame costs no task and no extra event-loop turn before it is handled."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._parts: list[bytes] = []  # an incomplete frame's bytes so far
        self._have = 0
        self._need = HEADER.size  # bytes the incomplete frame needs before it can be cut

    def feed(self, data: bytes) -> Iterator[Frame]:
        """The frames `data` completes, in order; raises `FrameTooLarge` as soon as a header
        announces one, and msgspec.DecodeError / ValidationError at a bad frame (the frames
        before it have been yielded)."""
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            data = b"".join(self._parts)
            self._parts, self._have = [], 0
        view, pos, end = memoryview(data), 0, len(data)
        need = HEADER.size
        while end - pos >= HEADER.size:
            (length,) = HEADER.unpack_from(data, pos)
            if length > self.max_frame:
                raise FrameTooLarge(
                    f"frame of {length} bytes exceeds the maximum of {self.max_frame}")
            need = HEADER.size + length
            if end - pos < need:
                break
            yield decode(view[pos + HEADER.size:pos + need])
            pos += need
            need = HEADER.size
        if pos < end:
            self._parts, self._have, self._need = [data[pos:]], end - pos, need
