"""The store's exception tree: one base, so callers can catch storage trouble in one place."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the durable store raises on purpose."""


class StoreFullError(StoreError):
    """Ingest is refused: the map reached its ceiling or the disk is full. Nothing acked is lost."""


class StoreLockedError(StoreError):
    """Another process already owns this data dir."""


class SegmentMissingError(StoreError):
    """Dispatch found an entry whose segment is gone: the batch is refused before any change."""
