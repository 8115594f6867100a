"""What the HTTP front (``asgi.py``) asks of the reward server, and the socket it listens on.

``RewardServer`` (``server.py``) builds the front; the front calls back only the ``ServerSide``
methods below, so it never imports the server module (which imports it).
"""

from __future__ import annotations

import socket
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from reward_models.serving.jobs import Job
    from reward_models.serving.requests import ScoreRequest


class ServerSide(Protocol):
    """The steps of ``POST /score`` and ``GET /health`` that the front takes, in order:
    ``authorised``, ``parse``, ``admit``, ``dispatch``, then ``outcome`` once scored."""

    max_request_bytes: int
    request_timeout_s: float
    header_timeout_s: float
    max_connections: int

    def describe(self) -> dict[str, Any]: ...

    def authorised(self, header: str | None) -> bool: ...

    def parse(self, body: bytes) -> ScoreRequest: ...

    def admit(self, request: ScoreRequest, request_id: str) -> Job: ...

    def dispatch(self, job: Job) -> None: ...

    def outcome(self, job: Job) -> tuple[HTTPStatus, dict[str, Any]]: ...


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound and listening on ``host:port`` (as http.server binds: an address only
    lingering in TIME_WAIT may be reused), so that ``address`` is known at construction."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock
