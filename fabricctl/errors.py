"""fabricctl's exception tree, its exit codes, and the one mapping between them.

Every error a user or a library caller can meet derives from `FabricError` and lives here
(this module imports nothing of fabricctl, so every layer but core may raise them). Each
class carries the exit status a command ends with when it escapes (`exit_code`):
- 1 `FabricError` (a runtime error) and `BrokerError` (`ProtocolError`), `JobRefused`,
  `StoreError` (`StoreFullError`, `StoreLockedError`, `SegmentMissingError`), `NotFound`,
  `Ambiguous`, `FeedError`, `ApiError` (HTTP status + OpenAI's error fields);
- 2 `UsageError` (`WorkloadError`): bad flags, config, arguments or workload lines;
- 3 `BackendMissing`: no broker, engine, NVML or optional package where one is needed;
- 4 `FabricTimeout`; 5 `EngineError` (a batch could not run: consumers retry elsewhere);
- 6 `LaunchError`: an inference server could not be made ready.
`exit_code_of(exc)` is the only mapping from an exception to an exit status; the CLI's
`fabricctl.cli.support.guarded` (and `report`) apply it for every command: a `FabricError`
ends as one `fabricctl: error: ...` line and its `exit_code`, Ctrl-C as 130, anything else
is a bug and keeps its traceback. What stays outside the tree on purpose (the shape guard,
core's plain refusals, internal signals, broken invariants): ARCHITECTURE.md, "Errors".
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
