"""The reward server's HTTP/1.1 connections (``asgi.py``): uvicorn's h11 protocol, bounded.

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) and the size of a request
head (``h11_max_incomplete_event_size``), but not the time a head takes to arrive: it arms no
timer before the first request, and any byte cancels the keep-alive timer, so a client sending
one header line every few seconds, or bytes that never form a line, held its connection and file
descriptor forever. ``JSONH11Protocol`` adds, per connection:

* a **head timeout**: a complete request head must arrive within ``header_timeout_s`` of the
  connection opening, or of the first byte of a later request on a kept-alive connection; then
  the connection gets a 408 and is closed (an idle kept-alive connection stays uvicorn's);
* **garbage detection**: bytes of a request line that are not printable ASCII get a 400 and a
  close at once, instead of waiting for a line end that random bytes may never contain;
* a **connection cap**: a connection beyond ``max_connections`` open at once gets a 503 with
  ``Retry-After: 1`` and is closed on arrival. uvicorn's ``limit_concurrency`` answers 503 only
  once a request head has arrived, so a slow-header client over the limit would still hold its
  connection; refusing at connect frees the descriptor at once;
* every refusal in JSON with a request id, h11's own (400, 431) included, instead of uvicorn's
  plain text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import uuid
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from reward_models.logs import clip, install
from reward_models.serving.limits import HEADER_TIMEOUT_S, MAX_CONNECTIONS

logger = install(logging.getLogger("reward_models.serving.server"))

# What a request line may hold while it arrives: printable ASCII (a line end ends the check).
REQUEST_LINE_BYTES = re.compile(rb"[\x20-\x7e]*")


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


def error_response(
    status: int, message: str, request_id: str, headers: dict[str, str] | None = None
) -> bytes:
    """The bytes of a JSON error reply that closes the connection."""
    data = json.dumps({"error": message, "request_id": request_id}).encode()
    fields = {
        "content-type": "application/json",
        "content-length": str(len(data)),
        "x-request-id": request_id,
        "connection": "close",
        **(headers or {}),
    }
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return head.encode() + b"\r\n" + data


class JSONH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a head timeout, garbage detection and a connection cap
    (the module's docstring), answering every refusal in JSON."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    @classmethod
    def configured(cls, header_timeout_s: float, max_connections: int) -> type[JSONH11Protocol]:
        """This protocol with other limits (uvicorn builds the instances from the class)."""
        limits = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}
        return type(cls.__name__, (cls,), limits)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._request_line_open = True  # no line end seen yet in the awaited request head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            message = f"the server is at its limit of {self.max_connections} connections"
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, message, {"retry-after": "1"})
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        awaiting_head = self.conn.their_state is h11.IDLE
        if awaiting_head:
            if self._head_timer is None:  # the first bytes of a request on a kept-alive one
                self._arm_head_timer()
            if self._request_line_open and not self._plausible_request_line(data):
                self.send_400_response("the request line is not printable ASCII")
                return
        super().data_received(data)
        if awaiting_head and self.conn.their_state is not h11.IDLE:
            self._head_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next cycle on pipelined bytes
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm_head_timer()  # a pipelined head has started arriving

    def send_400_response(self, msg: str) -> None:
        """h11's refusal of a malformed head (its status: 431 for a head over the size limit,
        400 otherwise), or ours of garbage, in JSON."""
        error = sys.exc_info()[1]  # set when called from h11's RemoteProtocolError handler
        status = getattr(error, "error_status_hint", HTTPStatus.BAD_REQUEST)
        self._refuse(status, f"invalid HTTP request: {error or msg}")

    # -- the head timer ----------------------------------------------------------------------
    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._request_line_open = True
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_received(self) -> None:
        self._cancel_head_timer()
        self._request_line_open = True  # for the next request on this connection

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        message = f"request head not received within {self.header_timeout_s:g} s"
        self._refuse(HTTPStatus.REQUEST_TIMEOUT, message)

    def _plausible_request_line(self, data: bytes) -> bool:
        """Whether ``data``, the next bytes of a request line, could still be one (h11 checks
        the line's grammar once the whole head is in; this only catches garbage early)."""
        end = data.find(b"\n")
        line = data if end < 0 else data[:end]
        if line.endswith(b"\r"):  # before the line feed, or a line end split across reads
            line = line[:-1]
        if end >= 0:
            self._request_line_open = False
        return REQUEST_LINE_BYTES.fullmatch(line) is not None

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer ``status`` in JSON (logged at INFO, the message clipped: it may quote the
        client's bytes) and close the connection."""
        self._cancel_head_timer()
        request_id = new_request_id()
        message = clip(message)
        logger.info("request %s: %d %s", request_id, status, message)
        if not self.transport.is_closing():
            self.transport.write(error_response(status, message, request_id, headers))
            self.transport.close()


__all__ = ["JSONH11Protocol", "error_response", "new_request_id"]
