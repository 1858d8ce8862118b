"""`/v1/audio/transcriptions`, the endpoint added as one `core.endpoints` entry (issue 38).

Its lines are read as run-batch reads them (`file_url`, no `file`), shaped by `prompt`,
answered by the simulated engine with vLLM's `TranscriptionResponse` (deterministic), sent
by the OpenAI engine as multipart with the downloaded file, and written back as run-batch's
rows by `fabricctl run` in a subprocess.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from cli_helpers import clean_env, fabricctl

from fabricctl.core.endpoints import Source
from fabricctl.core.mix import ENDPOINT_NAMES
from fabricctl.core.payload import Payload, encode_payload
from fabricctl.core.types import Item, Work
from fabricctl.engines.openai import OpenAIEngine
from fabricctl.engines.request import fetch_file, form_fields, read_answer
from fabricctl.engines.simendpoints import TRANSCRIPT_WORDS
from fabricctl.engines.simrequest import sim_text
from fabricctl.formats.common import Invalid
from fabricctl.formats.native import parse_native
from fabricctl.formats.openai_batch import parse_openai

URL = "/v1/audio/transcriptions"


def line(cid: str, model: str = "m", **body: Any) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": URL, "body": {"model": model, **body}}


def test_a_line_is_shaped_by_its_prompt_and_sent_as_written() -> None:
    draft = parse_openai(line("a", file_url="file:///x.wav", prompt="Glossary: fabric.",
                              language="en"))
    assert draft.source is Source.TRANSCRIPTIONS
    assert (draft.path, draft.components, draft.prompt) == (URL, ["Glossary: fabric."], "")
    assert msgspec.json.decode(draft.body) == {"file_url": "file:///x.wav",
                                               "prompt": "Glossary: fabric.", "language": "en"}
    bare = parse_openai(line("b", file_url="https://h/a.wav"))
    assert (bare.components, bare.prompt, bare.max_tokens) == ([], "", 1)
    native = parse_native({"id": "n", "model": "m", "endpoint": "transcriptions",
                           "params": {"file_url": "data:audio/wav;base64,AA=="}})
    assert (native.path, native.components) == (URL, [])
    assert ENDPOINT_NAMES[Source.TRANSCRIPTIONS] == "transcriptions"


@pytest.mark.parametrize(("body", "why"), [
    ({}, "body.file_url is missing"),
    ({"file_url": ""}, "body.file_url must not be empty"),
    ({"file_url": "u", "file": "x"}, "body.file is not allowed in a batch: give body.file_url"),
])
def test_a_line_without_its_file_url_is_refused(body: dict[str, Any], why: str) -> None:
    with pytest.raises(Invalid) as err:
        parse_openai(line("a", **body))
    assert str(err.value) == why


def test_form_fields_are_text_and_fetch_reads_file_data_and_refuses_others(
        tmp_path: Path) -> None:
    assert form_fields({"file_url": "u", "model": "m", "temperature": 0.2, "language": None,
                        "timestamp_granularities[]": ["word", "segment"]}) == {
        "model": "m", "temperature": "0.2", "timestamp_granularities[]": ["word", "segment"]}
    audio = tmp_path / "a b.wav"
    audio.write_bytes(b"RIFF-audio")

    async def fetch(url: str) -> Any:
        async with httpx.AsyncClient() as client:
            return await fetch_file(url, client)

    assert asyncio.run(fetch(audio.as_uri())) == b"RIFF-audio"
    data = "data:audio/wav;base64," + base64.b64encode(b"RIFF").decode()
    assert asyncio.run(fetch(data)) == b"RIFF"
    refused = asyncio.run(fetch("ftp://h/a.wav"))
    assert (refused.status, refused.finish_reason) == (400, "error")
    assert refused.error == ("HTTP 400: Failed to process transcription: Unsupported URL "
                             "scheme: ftp. Supported schemes: http, https, data, file")
    missing = asyncio.run(fetch((tmp_path / "none.wav").as_uri()))
    assert missing.status == 400
    assert "FileNotFoundError" in missing.error


def test_an_answer_is_its_text_and_its_body() -> None:
    body = b'{"text":"hello there","usage":{"type":"duration","seconds":3}}'
    res = read_answer(200, body, True, URL)
    assert res is not None
    assert (res.text, res.body) == ("hello there", body)
    plain = read_answer(200, b"hello there\n", True, URL)
    assert plain is not None
    assert (plain.text, plain.body) == ("hello there\n", b'"hello there\\n"')


def test_fabricctl_run_on_the_sim_engine_writes_run_batch_rows(tmp_path: Path) -> None:
    demo = "fabric-demo"  # the simulated fleet's model
    lines = [line("t1", demo, file_url="https://example.invalid/one.wav", prompt="Names: Ada."),
             line("t2", demo, file_url="file:///audio/two.wav", language="en"),
             line("t3", demo, file_url="file:///audio/two.wav", response_format="srt")]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out_file = tmp_path / "out.jsonl"
    out = fabricctl("run", str(src), "-o", str(out_file), "--engine", "sim", "--json",
                    "--ordered", env=clean_env(tmp_path), cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["t1", "t2", "t3"]
    assert list(rows[0]) == ["id", "custom_id", "response", "error"]
    one, two, srt = (r["response"] for r in rows)
    assert (one["status_code"], rows[0]["error"]) == (200, None)
    assert list(one["body"]) == ["text", "usage"]
    assert one["body"]["text"] == sim_text("https://example.invalid/one.wav",
                                           TRANSCRIPT_WORDS)
    assert two["body"]["text"] == sim_text("file:///audio/two.wav", TRANSCRIPT_WORDS)
    assert two["body"]["usage"]["type"] == "duration"
    assert 1 <= two["body"]["usage"]["seconds"] <= 30
    assert srt["status_code"] == 400
    assert rows[2]["error"]["error"]["message"] == (
        "the simulated engine answers response_format json only")


def test_the_openai_engine_posts_multipart_with_the_downloaded_file(tmp_path: Path) -> None:
    audio = tmp_path / "clip.wav"
    audio.write_bytes(b"RIFF-clip")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)
        seen.append(request)
        return httpx.Response(200, json={"text": "hi", "usage": {"type": "duration",
                                                                  "seconds": 1}})

    def item(iid: str, url: str) -> Item:
        body = msgspec.json.encode({"file_url": url, "language": "en", "temperature": 0})
        payload = Payload([], "", [], 0, body=body, path=URL)
        return Item(iid, "m", 0, 1, 1, encode_payload(payload), source=int(Source.TRANSCRIPTIONS))

    eng = OpenAIEngine("http://srv", "m", max_batch_size=8, max_batch_tokens=1024,
                       max_input_len=100, transport=httpx.MockTransport(handler))
    work = Work(1, "m", 0, 0, 1, 16, 1, 100, [item("ok", audio.as_uri()),
                                               item("gone", (tmp_path / "no.wav").as_uri())])
    ok, gone = asyncio.run(eng.run(work))
    [sent] = seen
    assert sent.url.path == URL
    assert sent.headers["content-type"].startswith("multipart/form-data; boundary=")
    content = sent.read()
    assert b'name="file"; filename="audio.bin"' in content and b"RIFF-clip" in content
    for name, value in (("model", b"m"), ("language", b"en"), ("temperature", b"0")):
        assert f'name="{name}"'.encode() + b"\r\n\r\n" + value in content
    assert b"file_url" not in content
    assert (ok.id, ok.text, ok.error) == ("ok", "hi", None)
    assert (gone.id, gone.status, gone.finish_reason) == ("gone", 400, "error")
    assert gone.error is not None and "Failed to process transcription" in gone.error
