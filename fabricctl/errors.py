"""fabricctl's exception tree, its exit codes, and the one mapping between them.

Every error a user or a library caller can meet derives from `FabricError`, and every such
class lives here (this module imports nothing of fabricctl, so any layer may raise them but
core, which imports nothing outside itself). Each carries the exit status a command ends
with when it escapes (`exit_code`, a class attribute):

FabricError               (exit 1)  base; a runtime error
├── UsageError            (exit 2)  bad flags, bad config, a bad argument to a library call
│   └── WorkloadError               a workload line, a jobs file or an item's payload is not
│                                   what it must be
├── BackendMissing        (exit 3)  no broker to talk to, no engine, no NVML where required,
│                                   an optional package (tokenizers, Ray) not installed
├── FabricTimeout         (exit 4)  a wait ran out
├── EngineError           (exit 5)  an engine could not run a batch (down, aborted, timed
│                                   out, answered something else); consumers retry elsewhere
├── LaunchError           (exit 6)  an inference server could not be made ready (bad command,
│                                   start timeout, port taken, stopped)
├── BrokerError           (exit 1)  the broker refused a request (code + message)
│   └── ProtocolError               the peer spoke something that is not our protocol
├── JobRefused            (exit 1)  a job operation was refused: no such job, or it ended
├── StoreError            (exit 1)  the durable store refused
│   ├── StoreFullError              the map reached its ceiling or the disk is full
│   ├── StoreLockedError            another process owns the data dir
│   └── SegmentMissingError         dispatch found an entry whose segment is gone
├── NotFound              (exit 1)  no shape matches the argument (`shapes inspect`)
├── Ambiguous             (exit 1)  the argument names several shapes
├── FeedError             (exit 1)  a feeder process (a Batch API file fed into its job) failed
└── ApiError              (exit 1)  the Batch API refused a request (HTTP status + OpenAI's
                                    error fields; its HTTP handler answers it)

`exit_code_of(exc)` is the only mapping from an exception to an exit status; the CLI's
`fabricctl.cli.support.guarded` (and `report`, for bodies that return a status) apply it for
every command: a `FabricError` ends as one `fabricctl: error: ...` line on stderr and its
`exit_code`, Ctrl-C as 130. Anything else is a bug and keeps its traceback (exit 1).

Outside the tree on purpose:
- `fabricctl.core.broker.ShapeGuardError` is a `BaseException`: a batch that would feed an
  engine an item of another shape must stop the process, never be caught by an
  `except Exception` (or `except FabricError`) on the way and retried.
- core imports nothing outside itself (not this module): its own refusals are plain
  `ValueError`s and `KeyError`s (`core.settlement.UnknownBatchError`), which the layer
  above translates into a class of this tree where one can escape to a caller.
- Internal signals, caught by the code that reads what raised them and never escaping to a
  caller: `formats.common.Invalid` (a bad input line: `formats.reader` and `api.upload`
  turn it into the line's error), `wire.protocol.FrameTooLarge` (`wire.client` and
  `server.connection` drop the connection), and the private `_...` ones.
- A broken invariant (a state fabricctl never makes: "cannot happen") is an
  `AssertionError`: a bug, which keeps its traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Why: scripts branch on these; every command uses the same numbers."""

    OK = 0
    RUNTIME = 1
    USAGE = 2
    BACKEND_MISSING = 3
    TIMEOUT = 4
    ENGINE_FAILED = 5
    LAUNCH_FAILED = 6
    INTERRUPTED = 130


class FabricError(Exception):
    """Why: base of every error fabricctl raises on purpose; one `except` catches them all."""

    exit_code = ExitCode.RUNTIME


class UsageError(FabricError):
    """Why: bad flags, bad config or a bad argument: the caller must change what it asked."""

    exit_code = ExitCode.USAGE


class WorkloadError(UsageError):
    """Why: a workload line, a jobs file or an item's payload is malformed (exit 2): readers
    catch this kind alone to report a bad line and go on."""


class BackendMissing(FabricError):
    """Why: nothing to talk to (no broker, no engine, no NVML, a package not installed)."""

    exit_code = ExitCode.BACKEND_MISSING


class FabricTimeout(FabricError):
    """Why: a wait ran out; scripts retry this one, not the others."""

    exit_code = ExitCode.TIMEOUT


class EngineError(FabricError):
    """Why: the engine could not run a batch at all (down, aborted, timed out): retry
    elsewhere. A command it reaches (`calibrate`) ends with exit 5."""

    exit_code = ExitCode.ENGINE_FAILED

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        # the server did not answer at all (refused, reset, timed out): that says nothing
        # about the item, so it is never evidence that an item is poison
        self.unreachable = unreachable


class LaunchError(FabricError):
    """Why: a server could not be made ready (bad command, start timeout, port taken,
    stopped); `up` ends with exit 6 when vLLM did not start."""

    exit_code = ExitCode.LAUNCH_FAILED


class BrokerError(FabricError):
    """Why: the broker answered with an error frame; its code says which refusal."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ProtocolError(BrokerError):
    """Why: the other end does not speak fabricctl's protocol (or broke it)."""


class JobRefused(FabricError):
    """Why: a job operation on the store itself was refused (no such job, or it ended); the
    message is the store's reason, as a broker's `not_found` / `job_ended` error says it."""


class StoreError(FabricError):
    """Why: callers catch storage trouble in one place; every error the durable store raises on
    purpose derives from this (exit 1)."""


class StoreFullError(StoreError):
    """Why: a full map or disk refuses ingest, never loses what was acked; it says so."""


class StoreLockedError(StoreError):
    """Why: two brokers on one data dir would corrupt it; the second is refused with this."""


class SegmentMissingError(StoreError):
    """Why: dispatch found an entry whose segment is gone: the batch is refused before any
    change."""


class NotFound(FabricError):
    """Why: no live shape, no finished record and no event of one matches the argument
    (exit 1)."""


class Ambiguous(FabricError):
    """Why: the argument (a hex prefix, or a label) names several shapes (exit 1, as
    NotFound)."""


class FeedError(FabricError):
    """Why: a feeder process (a Batch API file fed into its job) failed; the message is its
    last line on stderr, which the job's error then carries."""


class ApiError(FabricError):
    """Why: every refusal of the Batch API carries OpenAI's status and error fields to one
    handler."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type)


def exit_code_of(exc: BaseException) -> int:
    """The exit status a command ends with when `exc` escapes its body.

    A `FabricError`'s own `exit_code`; Ctrl-C (`KeyboardInterrupt`) 130; anything else 1.
    """
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(exc, FabricError):
        return exc.exit_code
    return ExitCode.RUNTIME
