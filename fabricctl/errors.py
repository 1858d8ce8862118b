"""fabricctl's documented exception tree and its exit codes.

FabricError
├── UsageError            (exit 2)  bad flags, bad config
├── BackendMissing        (exit 3)  no broker to talk to, no engine, no NVML where required
├── FabricTimeout         (exit 4)  a wait ran out
└── BrokerError           (exit 1)  the broker refused a request (code + message)
    └── ProtocolError               the peer spoke something that is not our protocol
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
