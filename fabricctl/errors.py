"""fabricctl's documented exception tree, its exit codes, and the one mapping between them.

Every error fabricctl raises on purpose derives from `FabricError` and carries the exit
status a command ends with when it escapes (`exit_code`, a class attribute):

FabricError               (exit 1)  base; a runtime error
├── UsageError            (exit 2)  bad flags, bad config
├── BackendMissing        (exit 3)  no broker to talk to, no engine, no NVML where required
├── FabricTimeout         (exit 4)  a wait ran out
├── BrokerError           (exit 1)  the broker refused a request (code + message)
│   └── ProtocolError               the peer spoke something that is not our protocol
├── StoreError            (exit 1)  fabricctl.store.errors: the durable store refused
│   ├── StoreFullError              the map reached its ceiling or the disk is full
│   ├── StoreLockedError            another process owns the data dir
│   └── SegmentMissingError         dispatch found an entry whose segment is gone
├── EngineError           (exit 3)  fabricctl.engines.base: an engine could not run a batch
│                                   (down, aborted, timed out); consumers retry elsewhere
├── LaunchError           (exit 3)  fabricctl.supervisor.launcher: an inference server could
│                                   not be made ready (as `up` reports it: BackendMissing)
└── NotFound              (exit 1)  fabricctl.cli.shapes: no shape matches the argument

Each class keeps its own module (and its name); only this tree and `ExitCode` live here.
`exit_code_of(exc)` is the only mapping from an exception to an exit status; the CLI's
`fabricctl.cli.support.guarded` (and `report`, for bodies that return a status) apply it for
every command: a `FabricError` ends as one `fabricctl: error: ...` line on stderr and its
`exit_code`, Ctrl-C as 130. Anything else is a bug and keeps its traceback (exit 1).

Outside the tree on purpose:
- `fabricctl.core.broker.ShapeGuardError` is a `BaseException`: a batch that would feed an
  engine an item of another shape must stop the process, never be caught by an
  `except Exception` (or `except FabricError`) on the way and retried.
- Internal signals that never leave the module that raises them (`formats.common.Invalid`,
  `wire.protocol.FrameTooLarge`, `engines.openai.Rejected`, `core.settlement.
  UnknownBatchError`, the private `_...` ones) are plain exceptions, not user-facing errors.
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
    INTERRUPTED = 130


class FabricError(Exception):
    """Base of every error fabricctl raises on purpose."""

    exit_code = ExitCode.RUNTIME


class UsageError(FabricError):
    exit_code = ExitCode.USAGE


class BackendMissing(FabricError):
    exit_code = ExitCode.BACKEND_MISSING


class FabricTimeout(FabricError):
    exit_code = ExitCode.TIMEOUT


class BrokerError(FabricError):
    """The broker answered with an error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ProtocolError(BrokerError):
    """The other end does not speak fabricctl's protocol (or broke it)."""


def exit_code_of(exc: BaseException) -> int:
    """The exit status a command ends with when `exc` escapes its body.

    A `FabricError`'s own `exit_code`; Ctrl-C (`KeyboardInterrupt`) 130; anything else 1.
    """
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(exc, FabricError):
        return exc.exit_code
    return ExitCode.RUNTIME
