"""The legacy ``http.server`` front of the reward server (``server.py``, ``front="stdlib"``,
``genrl serve-reward --server stdlib``): one handler thread per connection, blocking on its
request until scored. Python's docs do not recommend http.server for production; the default
front is ``server_asgi.py``. This one stays as the baseline of ``benchmarks/reward_server.py``
and for installs without the server extra; both speak the same protocol.

Every reply is JSON, http.server's own refusals included (``send_error`` is overridden, so no
HTML error page goes out); every error reply carries the request's id, and anything unexpected
is logged under that id and answered with a generic 500. A client that goes away mid-request is
logged in one line instead of socketserver's traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from reward_models.serving.requests import RequestError, internal_error

if TYPE_CHECKING:
    from reward_models.serving.front import ServerSide

logger = logging.getLogger("reward_models.serving.server")


class StdlibFront:
    """``http.server`` listening on ``host:port`` from construction on, for ``server``."""

    def __init__(self, server: ServerSide, host: str, port: int) -> None:
        self._httpd = JSONHTTPServer((host, port), handler_for(server))
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self._thread = threading.current_thread()
        self._httpd.serve_forever()

    def shutdown(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()


class JSONHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()  # connections being served
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End every kept-alive connection: after ``shutdown`` its handler thread would serve
        the next request on it, with no scoring worker left to answer."""
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line for a client that went away; socketserver would print a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            logger.warning("client %s: connection lost (%r)", client_address[0], error)
        else:
            logger.exception("unexpected error serving client %s", client_address[0])


def handler_for(server: ServerSide) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as asyncio (uvicorn) sets it: headers and body go out in two writes, and
        # on a kept-alive connection Nagle's algorithm held the body until the client's delayed
        # ACK, 40 ms per reply (80 ms per request with one pooled client, measured; 33 ms since).
        disable_nagle_algorithm = True
        timeout = 60  # seconds a client may take to send its request (socket timeout)
        request_id = "-"

        def handle_one_request(self) -> None:
            # One id per request, in every error reply and in the server log for it.
            self.request_id = uuid.uuid4().hex[:12]
            super().handle_one_request()

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # quiet: a trainer calls many times a minute

        def log_error(self, format: str, *args: Any) -> None:
            # http.server reports a client that stalls mid-request here (socket timeout).
            logger.warning("request %s from %s: " + format, self.request_id, self._client, *args)

        @property
        def _client(self) -> str:
            return str(self.client_address[0])

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """http.server's own refusals (400 bad request line, 414, 431, 501, 505) in JSON,
            not its HTML error page."""
            del explain
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "error"
            self._reply(code, {"error": message or phrase})

        def _reply(
            self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
        ) -> None:
            if status >= 400:
                # The body of a refused request may be unread: it must not be taken for the
                # next request of a kept-alive connection.
                self.close_connection = True
                body = {**body, "request_id": self.request_id}
                level = logging.WARNING if status >= 500 else logging.INFO
                logger.log(level, "request %s: %d %s", self.request_id, status, body["error"])
            data = json.dumps(body).encode()
            # http.server answers requests it reads as HTTP/0.9 (a bad version, a two-word
            # request line) with a bare body; every reply here has a status and headers.
            if self.request_version == "HTTP/0.9":
                self.request_version = "HTTP/1.0"
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Request-Id", self.request_id)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            except (ConnectionError, TimeoutError) as err:
                logger.warning(
                    "request %s: client %s left before the reply (%r)",
                    self.request_id,
                    self._client,
                    err,
                )
                self.close_connection = True

        def _authorised(self) -> bool:
            return server.authorised(self.headers.get("Authorization"))

        def _guarded(self, serve: Callable[[], None]) -> None:
            """Refusals as their status; anything unexpected logged under the request id and
            answered with a generic 500 (no exception text leaves the server)."""
            try:
                serve()
            except RequestError as err:
                self._reply(err.status, {"error": err.message}, err.headers)
            except (ConnectionError, TimeoutError) as err:
                logger.warning(
                    "request %s: client %s lost (%r)", self.request_id, self._client, err
                )
                self.close_connection = True
            except Exception:
                logger.exception("request %s failed", self.request_id)
                message = internal_error(self.request_id)
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": message})

        def do_GET(self) -> None:
            self._guarded(self._health)

        def do_POST(self) -> None:
            self._guarded(self._score)

        def _health(self) -> None:
            if self.path != "/health":
                raise RequestError(HTTPStatus.NOT_FOUND, "GET /health or POST /score")
            if not self._authorised():
                raise RequestError(HTTPStatus.UNAUTHORIZED, "missing or wrong token")
            self._reply(HTTPStatus.OK, server.describe())

        def _score(self) -> None:
            if self.path != "/score":
                raise RequestError(HTTPStatus.NOT_FOUND, "POST /score")
            if not self._authorised():
                raise RequestError(HTTPStatus.UNAUTHORIZED, "missing or wrong token")
            body = self._body()
            if body is None:
                return
            request = server.parse(body)
            del body
            job = server.admit(request, self.request_id)  # its pixels are now taken
            del request  # the job holds the tensor alone: the scorer frees it when done
            server.dispatch(job)
            job.done.wait(server.request_timeout_s)
            self._reply(*server.outcome(job))

        def _body(self) -> bytes | None:
            """The request body, or None for a client that left mid-body (logged in one line)."""
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required") from None
            if length < 0:
                raise RequestError(HTTPStatus.BAD_REQUEST, "negative Content-Length")
            if length > server.max_request_bytes:
                raise RequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"request of {length} bytes exceeds {server.max_request_bytes}",
                )
            try:
                body = self.rfile.read(length)
            except (ConnectionError, TimeoutError) as err:  # reset, or stalled past `timeout`
                got, why = "part", repr(err)
            else:
                got, why = str(len(body)), "connection closed"
            if got != str(length):
                logger.warning(
                    "request %s: client %s left mid-body after %s of %d bytes (%s)",
                    self.request_id,
                    self._client,
                    got,
                    length,
                    why,
                )
                self.close_connection = True
                return None
            return body

    return Handler


__all__ = ["JSONHTTPServer", "StdlibFront", "handler_for"]
