"""Frames cut out of a byte stream as it arrives (`FrameReader`), and write pacing."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from fabricctl.wire.flow import WriteFlow
from fabricctl.wire.protocol import (
    HEADER,
    Done,
    FrameReader,
    FrameTooLarge,
    Pull,
    encode,
)


def test_whole_frames_in_one_read() -> None:
    data = encode(Pull(1, 0.5)) + encode(Done(2, 3))
    assert list(FrameReader().feed(data)) == [Pull(1, 0.5), Done(2, 3)]


def test_a_frame_split_anywhere_comes_out_once_complete() -> None:
    data = encode(Pull(7, 1.0)) + encode(Done(8, -1))
    for cut in range(1, len(data)):
        reader = FrameReader()
        got = list(reader.feed(data[:cut])) + list(reader.feed(data[cut:]))
        assert got == [Pull(7, 1.0), Done(8, -1)], cut


def test_byte_by_byte() -> None:
    reader = FrameReader()
    got = [f for b in encode(Done(5, 9)) for f in reader.feed(bytes([b]))]
    assert got == [Done(5, 9)]


def test_an_oversized_header_is_refused_before_its_body_arrives() -> None:
    reader = FrameReader(max_frame=100)
    with pytest.raises(FrameTooLarge, match="101 bytes exceeds the maximum of 100"):
        list(reader.feed(HEADER.pack(101)))


def test_frames_before_a_bad_one_are_delivered_first() -> None:
    bad = HEADER.pack(3) + b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    reader = FrameReader()
    got = []
    with pytest.raises(msgspec.DecodeError):
        for frame in reader.feed(encode(Done(1, 1)) + bad):
            got.append(frame)
    assert got == [Done(1, 1)]


async def test_drain_waits_while_writing_is_paused_and_not_otherwise() -> None:
    flow = WriteFlow()
    await flow.drain()  # never paused: at once
    flow.pause_writing()
    waiter = asyncio.ensure_future(flow.drain())
    await asyncio.sleep(0)
    assert not waiter.done()
    flow.resume_writing()
    await asyncio.wait_for(waiter, 1.0)
    flow.pause_writing()
    flow.pause_writing()  # paused twice: one resume still releases
    waiter = asyncio.ensure_future(flow.drain())
    flow.resume_writing()
    await asyncio.wait_for(waiter, 1.0)
