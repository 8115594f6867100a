"""The HTTP front of the reward server (``server.py``): Starlette on uvicorn.

One event loop serves every connection; a request waiting for its scores holds no thread (the
scoring worker resolves an asyncio future through ``Job.callbacks``), and only the blocking steps,
JSON parsing and PNG decoding within the server's limits, run in a worker thread. The protocol
(routes, wire format, status codes, token check, body-size limit, request ids) is
docs/rewards.md's "Reward servers". The connections themselves (a head timeout, a connection
cap, garbage closed at once, h11's refusals in JSON) are ``protocol.JSONH11Protocol``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from reward_models.logs import clip, install
from reward_models.serving.front import listening_socket
from reward_models.serving.jobs import Job, internal_error
from reward_models.serving.protocol import JSONH11Protocol, new_request_id
from reward_models.serving.requests import RequestError

if TYPE_CHECKING:
    from reward_models.serving.front import ServerSide

logger = install(logging.getLogger("reward_models.serving.server"))

BODY_TIMEOUT_S = 60.0  # seconds a client may take to send its body (then 408)
# Python's http.server limits (the server's first front used them, and clients may rely on
# them): the request target and each header line at most 65536 bytes (414 / 431), at most 100
# headers (431).
MAX_LINE = 65536
MAX_HEADERS = 100
MAX_HEAD_BYTES = 2 * MAX_LINE  # a head h11 is still waiting for the end of (431 beyond)


def json_reply(
    status: int, body: dict[str, Any], request_id: str, headers: dict[str, str] | None = None
) -> Response:
    """A JSON response; an error one carries the request id, is logged (4xx at INFO, 5xx at
    WARNING) and closes the connection. Its message is clipped (``logs.clip``): it may echo
    what the client sent, and neither the log nor the reply should grow with that."""
    extra = {"X-Request-Id": request_id, **(headers or {})}
    if status >= 400:
        body = {**body, "error": clip(body["error"]), "request_id": request_id}
        extra["Connection"] = "close"
        level = logging.WARNING if status >= 500 else logging.INFO
        logger.log(level, "request %s: %d %s", request_id, status, body["error"])
    return Response(json.dumps(body).encode(), status, extra, media_type="application/json")


def build_app(server: ServerSide) -> Starlette:
    """The Starlette app of ``server``: ``GET /health`` and ``POST /score``."""

    async def endpoint(request: Request) -> Response:
        request_id = new_request_id()
        try:
            return await _route(server, request, request_id)
        except RequestError as err:
            return json_reply(err.status, {"error": err.message}, request_id, err.headers)
        except Exception:
            logger.exception("request %s failed", request_id)
            message = internal_error(request_id)
            return json_reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": message}, request_id)

    async def every_request(scope: Scope, receive: Receive, send: Send) -> None:
        # Mounted at "/", so every method and path reaches ``_route``, which answers 404 for
        # other paths and 501 for other methods (HTTP's "not implemented", not Starlette's 405).
        response = await endpoint(Request(scope, receive))
        await response(scope, receive, send)

    return Starlette(routes=[Mount("/", app=every_request)])


def _check_head(scope: Scope) -> None:
    """http.server's limits on the request line and headers, and HTTP/1.x only."""
    target = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
    if target > MAX_LINE:
        raise RequestError(HTTPStatus.REQUEST_URI_TOO_LONG, f"request target over {MAX_LINE} bytes")
    headers = scope.get("headers", [])
    if len(headers) > MAX_HEADERS:
        raise RequestError(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_HEADERS} headers"
        )
    if any(len(name) + len(value) + 2 > MAX_LINE for name, value in headers):
        raise RequestError(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"a header line over {MAX_LINE} bytes"
        )
    version = scope.get("http_version", "1.1")
    if not version.startswith("1."):
        raise RequestError(
            HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"HTTP/{version} is not supported (HTTP/1.x)"
        )


async def _route(server: ServerSide, request: Request, request_id: str) -> Response:
    _check_head(request.scope)
    method, path = request.method, request.url.path
    if method == "GET":
        if path != "/health":
            raise RequestError(HTTPStatus.NOT_FOUND, "GET /health or POST /score")
        _check_token(server, request)
        return json_reply(HTTPStatus.OK, server.describe(), request_id)
    if method != "POST":
        raise RequestError(HTTPStatus.NOT_IMPLEMENTED, f"unsupported method ({method!r})")
    if path != "/score":
        raise RequestError(HTTPStatus.NOT_FOUND, "POST /score")
    _check_token(server, request)
    body = await _body(server, request, request_id)
    if body is None:  # the client left; nobody reads a reply
        return Response(status_code=HTTPStatus.BAD_REQUEST)
    return await _score(server, body, request_id)


def _check_token(server: ServerSide, request: Request) -> None:
    if not server.authorised(request.headers.get("authorization")):
        raise RequestError(HTTPStatus.UNAUTHORIZED, "missing or wrong token")


async def _score(server: ServerSide, body: bytes, request_id: str) -> Response:
    held = [body]
    del body

    def prepare() -> Job:  # one thread hop for both blocking steps
        request = server.parse(held.pop())  # the body is dropped before anything is decoded
        return server.admit(request, request_id)  # may wait for the pixel budget

    job = await run_in_threadpool(prepare)
    loop = asyncio.get_running_loop()
    scored: asyncio.Future[None] = loop.create_future()

    def resolve() -> None:
        if not scored.done():  # not once the wait timed out
            scored.set_result(None)

    def wake() -> None:  # called from the scoring worker
        # RuntimeError: the loop has closed (the server shut down) and nobody waits.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(resolve)

    job.callbacks.append(wake)
    server.dispatch(job)
    # On a timeout, outcome() answers 504 and marks the job abandoned.
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(scored, server.request_timeout_s)
    status, reply = server.outcome(job)
    return json_reply(status, reply, request_id)


async def _body(server: ServerSide, request: Request, request_id: str) -> bytes | None:
    """The request body within ``max_request_bytes`` (413 from Content-Length before reading,
    or as soon as a chunked body grows past it), or None for a client that left mid-body
    (logged in one line)."""
    declared = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if declared is None and not chunked:
        raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
    limit = server.max_request_bytes
    length = int(declared) if declared is not None else None  # h11 has checked it is a number
    if length is not None and length > limit:
        raise RequestError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request of {length} bytes exceeds {limit}"
        )
    chunks: list[bytes] = []
    received = 0

    async def read() -> None:
        nonlocal received
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise RequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds {limit} bytes"
                )
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except ClientDisconnect:
        logger.warning(
            "request %s: client %s left mid-body after %d of %s bytes (connection closed)",
            request_id,
            request.client.host if request.client else "-",
            received,
            length if length is not None else "chunked",
        )
        return None
    except asyncio.TimeoutError:
        raise RequestError(
            HTTPStatus.REQUEST_TIMEOUT, f"request body not received within {BODY_TIMEOUT_S:g} s"
        ) from None
    body = b"".join(chunks)
    chunks.clear()
    return body


class AsgiFront:
    """uvicorn serving ``build_app(server)`` on a socket bound at construction."""

    def __init__(self, server: ServerSide, host: str, port: int) -> None:
        self._socket = listening_socket(host, port)
        protocol = JSONH11Protocol.configured(server.header_timeout_s, server.max_connections)
        config = uvicorn.Config(
            build_app(server),
            http=protocol,
            lifespan="off",
            log_config=None,  # leave the host process's logging alone
            access_log=False,  # quiet: a trainer calls many times a minute
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            # No limit_concurrency: it answers 503 only once a head has arrived; the protocol
            # refuses a connection over server.max_connections on arrival instead.
            timeout_graceful_shutdown=1,
            # Idle connections kept longer than the client keeps them (remote.KEEPALIVE_S), so
            # that the client, not the server, closes them: no request races a server close.
            timeout_keep_alive=75,
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        """Serve until ``shutdown`` (or Ctrl-C, re-raised as KeyboardInterrupt)."""
        self._uvicorn.run(sockets=[self._socket])

    def shutdown(self) -> None:
        """Stop listening and close the socket; waits at most a few seconds for uvicorn."""
        self._uvicorn.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._socket.close()


__all__ = ["AsgiFront", "JSONH11Protocol", "build_app"]
