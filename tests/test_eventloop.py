"""The daemon's event loop: uvloop when installed, asyncio's own otherwise."""

from __future__ import annotations

import sys

import pytest

from fabricctl.server import eventloop


async def _which() -> str:
    return eventloop.loop_name()


def test_run_uses_uvloop_when_installed() -> None:
    assert eventloop.run(_which()) == "uvloop"


def test_run_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # the import fails
    assert eventloop.run(_which()) == "asyncio"


def test_run_on_asyncio_when_asked() -> None:
    assert eventloop.run(_which(), prefer_uvloop=False) == "asyncio"
