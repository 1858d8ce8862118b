"""The store's exception tree: one base, so callers can catch storage trouble in one place."""

from __future__ import annotations

from fabricctl.errors import ExitCode, FabricError


class StoreError(FabricError):
    """Why: callers catch storage trouble in one place; every error the durable store raises on
    purpose derives from this (a `FabricError`, exit 1)."""

    exit_code = ExitCode.RUNTIME


class StoreFullError(StoreError):
    """Why: a full map or disk refuses ingest, never loses what was acked; it says so."""


class StoreLockedError(StoreError):
    """Why: two brokers on one data dir would corrupt it; the second is refused with this."""


class SegmentMissingError(StoreError):
    """Why: dispatch found an entry whose segment is gone: the batch is refused before any
    change."""
