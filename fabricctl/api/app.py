"""The OpenAI Batch API over HTTP: a Starlette app, served by uvicorn in the daemon's loop.

Contract:
- `build_app(api)` serves `/v1/files` (POST upload with purpose "batch", GET list, GET/DELETE
  `/v1/files/{id}`, GET `/v1/files/{id}/content`) and `/v1/batches` (POST create, GET list
  with `limit`/`after` newest first, GET `/{id}`, POST `/{id}/cancel`) with OpenAI's object
  shapes (`api.objects`). Every refusal is OpenAI's error shape: 400 bad request, 401 a wrong
  or missing bearer token (when a token is set), 404 unknown id or route, 405 wrong method,
  409 cancelling a batch that ended, 500 `server_error`. Cancelling a batch being fed stops
  its feed first.
- An upload streams (`api.upload`) into the files dir and is kept only when every line
  passed (its record in the `FileStore`). A batch names one endpoint (`objects.check_endpoint`)
  and every line must be for it (`objects.check_urls`); it is a job opened `validating` and
  answered at once, its file fed by a task of the `BatchApi` (`api.service`; a failed feed
  fails the job). Jobs left validating by a stopped daemon are fed again (`resume`).
- Output and error files are virtual (`file-<batch id>-output` / `-error`), streamed from
  the job's results; past `output_expires_after` (by `BatchApi.clock`) they are 404s while
  the Batch keeps their ids.
- `process_feeder(...)` feeds each batch from a child process (`api.feeder`), so parsing
  never holds the broker's GIL (a failed child is a `FeedError`).
- `ApiServer(api, host, port)` binds the socket itself (port 0 picks one), serves with
  `uvicorn.Server` as a task of the running loop without touching its signal handlers, and
  `stop()` ends it and the feeds. What clients see: README.md, "The OpenAI Batch API".
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fabricctl.api.batches import content
from fabricctl.api.objects import (
    Deleted,
    ErrorBody,
    ErrorInfo,
    FileObject,
    ListPage,
    batch_object,
    check_endpoint,
    check_urls,
    error_body,
    file_object,
    page,
    parse_output_expires,
    parse_priority,
    parse_window,
    virtual_file,
    virtual_file_object,
)
from fabricctl.api.service import BatchApi
from fabricctl.api.upload import receive_upload
from fabricctl.errors import ApiError, BrokerError, UsageError
from fabricctl.store.files import FileRecord

log = logging.getLogger("fabricctl.api")
_enc = msgspec.json.Encoder()
MAX_METADATA = 16


def _json(obj: object, status: int = 200) -> Response:
    return Response(_enc.encode(obj), status, media_type="application/json")


# ---- handlers -------------------------------------------------------------------------------


async def create_file(api: BatchApi, request: Request) -> Response:
    file_id = f"file-{secrets.token_hex(12)}"
    part = api.files.part_path(file_id)
    try:
        up = await receive_upload(request.stream(), request.headers.get("content-type", ""),
                                  part)
        purpose = up.fields.get("purpose")
        if purpose != "batch":
            raise ApiError(400, f"purpose must be 'batch' (this server runs batches only), "
                           f"not {purpose!r}", "purpose", "invalid_value")
        if up.checker.error is not None:
            raise ApiError(400, f"{up.filename}: {up.checker.error}", "file",
                           "invalid_file")
        if up.checker.requests == 0:
            raise ApiError(400, f"{up.filename}: the file has no requests", "file",
                           "invalid_file")
        rec = FileRecord(id=file_id, bytes=up.size, created_at=int(api.clock()),
                         filename=up.filename, purpose="batch", sha256=up.sha256,
                         lines=up.checker.lines, requests=up.checker.requests,
                         urls=up.checker.urls)
        api.files.add(rec)
    finally:
        part.unlink(missing_ok=True)
    log.info("file %s: %s, %d requests, %d bytes", rec.id, rec.filename, rec.requests,
             rec.bytes)
    return _json(file_object(rec))


async def list_files(api: BatchApi, request: Request) -> Response:
    q = request.query_params
    records = api.files.list()
    purpose = q.get("purpose")
    if purpose:
        records = [r for r in records if r.purpose == purpose]
    if q.get("order", "desc") == "desc":
        records.reverse()
    objs = [file_object(r) for r in records]
    return _json(page(objs, [o.id for o in objs], q.get("after"), _limit(q.get("limit"),
                                                                          10000)))


async def retrieve_file(api: BatchApi, request: Request) -> Response:
    file_id = request.path_params["file_id"]
    v = await api.virtual(file_id)
    if v is not None:
        job, which = v
        size = await api.virtual_size(file_id, job, which)
        return _json(virtual_file_object(job, which, size))
    return _json(file_object(api.upload(file_id)))


async def delete_file(api: BatchApi, request: Request) -> Response:
    file_id = request.path_params["file_id"]
    if virtual_file(file_id) is not None:
        raise ApiError(400, "a batch's output files are deleted with their batch", "id")
    if not api.files.delete(api.upload(file_id).id):
        raise ApiError(404, f"No such File object: {file_id}", "id", "not_found")
    return _json(Deleted(file_id))


async def file_content(api: BatchApi, request: Request) -> Response:
    file_id = request.path_params["file_id"]
    v = await api.virtual(file_id)
    if v is not None:
        job, which = v
        return StreamingResponse(content(api.backend, job, which),
                                 media_type="application/jsonl")
    rec = api.upload(file_id)
    return StreamingResponse(_read_file(api.files.blob_path(rec.id)),
                             media_type="application/jsonl")


def _read_file(path: Path, chunk: int = 1 << 16) -> Iterator[bytes]:
    with open(path, "rb") as fp:
        while data := fp.read(chunk):
            yield data


class _CreateBatch(msgspec.Struct, forbid_unknown_fields=False):
    """Why: the body of batches.create, type-checked on decode."""

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: Any = None  # checked by `parse_output_expires`


async def create_batch(api: BatchApi, request: Request) -> Response:
    try:
        body = msgspec.json.decode(await request.body(), type=_CreateBatch)
    except msgspec.ValidationError as e:
        raise ApiError(400, f"invalid batch: {e}", None, "invalid_request") from None
    except msgspec.DecodeError:
        raise ApiError(400, "the request body must be a JSON object", None,
                       "invalid_request") from None
    check_endpoint(body.endpoint)
    window_s = parse_window(body.completion_window)
    metadata = body.metadata or {}
    if len(metadata) > MAX_METADATA or any(
            len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise ApiError(400, "metadata takes at most 16 pairs, keys of at most 64 characters "
                       "and values of at most 512", "metadata", "invalid_value")
    priority = parse_priority(metadata)
    output_expires_s = parse_output_expires(body.output_expires_after)
    rec = api.files.get(body.input_file_id)
    if rec is None:
        raise ApiError(400, f"No such File object: {body.input_file_id}", "input_file_id",
                       "invalid_value")
    check_urls(body.endpoint, rec.urls)
    reply = await api.backend.open_job(
        "api", name=rec.id, sha256=rec.sha256, size=rec.bytes, endpoint=body.endpoint,
        metadata=metadata, window_s=window_s, attach=False, validating=True,
        priority=priority, output_expires_s=output_expires_s)
    job = reply.job
    api.start_feed(job, rec)
    log.info("batch %s: %s, %d requests for %s", job.id, rec.id, rec.requests, body.endpoint)
    return _json(batch_object(job))


async def retrieve_batch(api: BatchApi, request: Request) -> Response:
    return _json(batch_object(await api.batch(request.path_params["batch_id"])))


async def cancel_batch(api: BatchApi, request: Request) -> Response:
    job = await api.batch(request.path_params["batch_id"])
    if job.ended:
        raise ApiError(409, f"batch {job.id} is already {job.state.value}: it cannot be "
                       "cancelled", None, "batch_ended")
    await api.stop_feed(job.id)  # still validating: no more of its file goes in
    return _json(batch_object((await api.backend.cancel_job(job.id)).job))


async def list_batches(api: BatchApi, request: Request) -> Response:
    """Newest first, a page at a time from the store: `after` is the last batch of the
    page before (its job number is where this page starts), so every batch is reachable."""
    q = request.query_params
    limit = _limit(q.get("limit"), 100)
    before = 0
    after = q.get("after")
    if after:
        try:
            before = (await api.batch(after)).number
        except ApiError:
            raise ApiError(400, f"after: no batch with id {after!r}", "after") from None
    jobs = await api.backend.jobs(limit + 1, before, "api")
    objs = [batch_object(j) for j in jobs[:limit]]
    return _json(ListPage(data=objs, first_id=objs[0].id if objs else None,
                          last_id=objs[-1].id if objs else None, has_more=len(jobs) > limit))


def _limit(text: str | None, most: int) -> int:
    if text is None:
        return 20
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise ApiError(400, f"limit must be an integer from 1 to {most}", "limit",
                       "invalid_value")
    return n


# ---- the app --------------------------------------------------------------------------------


class _Auth:
    """Why: the bearer token guards every route before Starlette parses anything."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.token:
            given = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    given = value.removeprefix(b"Bearer ").strip()
            if not hmac.compare_digest(given, self.token):
                body = error_body(ApiError(401, "Incorrect API key provided: the bearer "
                                           "token must be this broker's server.token", None,
                                           "invalid_api_key"))
                await Response(body, 401, media_type="application/json")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _route(api: BatchApi, fn: Callable[[BatchApi, Request], Awaitable[Response]]) -> Any:
    async def endpoint(request: Request) -> Response:
        return await fn(api, request)
    return endpoint


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(error_body(exc), exc.status, media_type="application/json")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    body = ErrorBody(ErrorInfo(f"{request.method} {request.url.path}: {exc.detail}",
                               "invalid_request_error", None, None))
    return Response(_enc.encode(body), exc.status_code, media_type="application/json")


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    body = ErrorBody(ErrorInfo(f"the server failed: {type(exc).__name__}: {exc}",
                               "server_error", None, None))
    return Response(_enc.encode(body), 500, media_type="application/json")


async def _broker_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BrokerError)
    body = ErrorBody(ErrorInfo(f"the broker refused: {exc.message}", "server_error", None,
                               exc.code))
    return Response(_enc.encode(body), 500, media_type="application/json")


def build_app(api: BatchApi) -> ASGIApp:
    r = _route
    routes = [
        Route("/v1/files", r(api, create_file), methods=["POST"]),
        Route("/v1/files", r(api, list_files), methods=["GET"]),
        Route("/v1/files/{file_id}", r(api, retrieve_file), methods=["GET"]),
        Route("/v1/files/{file_id}", r(api, delete_file), methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", r(api, file_content), methods=["GET"]),
        Route("/v1/batches", r(api, create_batch), methods=["POST"]),
        Route("/v1/batches", r(api, list_batches), methods=["GET"]),
        Route("/v1/batches/{batch_id}", r(api, retrieve_batch), methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", r(api, cancel_batch), methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, BrokerError: _broker_error,
        Exception: _server_error})
    return _Auth(app, api.token)


class _QuietServer(uvicorn.Server):
    """Why: the daemon owns SIGINT/SIGTERM; uvicorn must not take them over."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiServer:
    """Why: uvicorn inside the daemon's own loop, started and stopped with it."""

    def __init__(self, api: BatchApi, host: str, port: int) -> None:
        self.api, self.host, self.port = api, host, port
        self._server: _QuietServer | None = None
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self._sock = socket.create_server((self.host, self.port))
        except OSError as e:
            raise UsageError(f"--api {self.host}:{self.port}: cannot listen there: "
                             f"{e.strerror or e}") from e
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(build_app(self.api), log_level="warning", lifespan="off",
                                access_log=False, timeout_graceful_shutdown=5)
        config.load()
        server = self._server = _QuietServer(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[self._sock])  # listening once this returns
        self._task = asyncio.get_running_loop().create_task(server.main_loop())
        try:
            await self.api.resume_feeds()
        except Exception as e:  # the API still serves; those batches stay validating
            log.warning("could not resume the batches left validating: %s", e)
        log.info("OpenAI Batch API on http://%s:%d/v1", self.host, self.port)

    async def stop(self) -> None:
        await self.api.stop()
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
            await server.shutdown(sockets=[self._sock] if self._sock else None)
        self._server = self._task = None


__all__ = ["ApiServer", "FileObject", "build_app"]
