"""``genrl serve-rollout``: a vLLM engine in its own process, over HTTP (Starlette on uvicorn).

The trainer's ``generation.engine=vllm_server`` (``vllm_server.py``) sends it the same requests
the colocated engine builds (``vllm_requests.py``) and pushes the trainer's weights to it after
each update, so the engine may live in another virtualenv (the CPU build of vLLM pins its own
torch), on another device or machine. Routes (JSON unless said):

- ``GET /health``: the checkpoint, its vocabulary size and length limit, the limits below, and
  ``weights_version`` (how many weight pushes it has taken).
- ``POST /generate``: ``{"requests": [{"token_ids", "n", "seed"}], "settings": {...}}`` (the
  fields of ``vllm_requests.sampling_settings``) -> ``{"samples": [[sample, ...], ...]}``.
- ``POST /weights``: a safetensors file as the body (``application/octet-stream``), the
  checkpoint's names -> ``{"tensors": n, "weights_version": v}``.

What a client gets wrong is a 4xx whose JSON body says what (``{"error": ...}``), checked
before any work: a missing or wrong token (401; required when listening beyond loopback), a
body over its limit (413, from ``Content-Length`` or while reading), malformed JSON or fields
(400), token ids outside the vocabulary, a prompt plus ``max_tokens`` over the model's length
limit or more samples than the limit (400); an unknown weight name or shape (400). 500 is for
the server's own faults. One request runs on the engine at a time (``vllm.LLM`` is not
thread-safe); the event loop stays free meanwhile.
"""

from __future__ import annotations

import hmac
import io
import json
import threading
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from genrl.rollouts.engines.vllm_requests import EngineRequest


@dataclass
class ServerLimits:
    """What one request may ask for."""

    max_json_bytes: int = 16 * 2**20
    """Body of a ``/generate`` request."""
    max_weights_bytes: int = 64 * 2**30
    """Body of a ``/weights`` push (a model's weights in float32)."""
    max_requests: int = 4096
    """Prompts per ``/generate`` request."""
    max_samples: int = 65536
    """Samples per ``/generate`` request (the sum of the ``n``)."""


class Backend(Protocol):
    """What the server drives (``vllm_engine.VLLMBackend``; a fake one in tests)."""

    def describe(self) -> dict[str, Any]: ...

    def generate(
        self, requests: list[EngineRequest], settings: dict[str, Any]
    ) -> list[list[dict[str, Any]]]: ...

    def load_weights(self, weights: Any) -> None: ...


class RequestError(ValueError):
    """A client's mistake: the HTTP status and the message of the reply."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _integer(value: Any, where: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{where} must be an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low} .. {high}"
        raise RequestError(400, f"{where} must be {bound}, got {value}")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{where} must be a number, got {type(value).__name__}")
    return float(value)


def parse_generate(
    data: Any, limits: ServerLimits, model: dict[str, Any]
) -> tuple[list[EngineRequest], dict[str, Any]]:
    """A ``/generate`` body as requests and settings, or ``RequestError`` saying what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise RequestError(400, 'the body must be a JSON object with a "requests" list')
    raw, settings = data["requests"], data.get("settings")
    if not isinstance(settings, dict):
        raise RequestError(400, 'the body needs a "settings" object')
    if not raw:
        raise RequestError(400, '"requests" is empty')
    if len(raw) > limits.max_requests:
        raise RequestError(400, f"{len(raw)} requests; at most {limits.max_requests}")
    vocab, longest = int(model["vocab_size"]), int(model["max_model_len"])
    max_tokens = _integer(settings.get("max_tokens"), "settings.max_tokens", 1, longest)
    parsed = {
        "temperature": _number(settings.get("temperature"), "settings.temperature"),
        "top_k": _integer(settings.get("top_k", 0), "settings.top_k", 0),
        "top_p": _number(settings.get("top_p", 1.0), "settings.top_p"),
        "max_tokens": max_tokens,
        "stop_token_ids": settings.get("stop_token_ids", []),
        "stop": settings.get("stop", []),
    }
    if parsed["temperature"] < 0 or not 0 < parsed["top_p"] <= 1:
        raise RequestError(400, "settings.temperature must be >= 0 and top_p in (0, 1]")
    if not isinstance(parsed["stop_token_ids"], list):
        raise RequestError(400, "settings.stop_token_ids must be a list of token ids")
    for i, t in enumerate(parsed["stop_token_ids"]):
        _integer(t, f"settings.stop_token_ids[{i}]", 0, vocab - 1)
    stop = parsed["stop"]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "settings.stop must be a list of non-empty strings")
    requests, samples = [], 0
    for i, r in enumerate(raw):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise RequestError(400, f"{where} must be an object with token_ids, n and seed")
        ids = r.get("token_ids")
        if not isinstance(ids, list) or not ids:
            raise RequestError(400, f"{where}.token_ids must be a non-empty list of token ids")
        for j, t in enumerate(ids):
            _integer(t, f"{where}.token_ids[{j}]", 0, vocab - 1)
        if len(ids) + max_tokens > longest:
            raise RequestError(
                400,
                f"{where}: {len(ids)} prompt tokens + max_tokens {max_tokens} exceed the "
                f"model's {longest}",
            )
        n = _integer(r.get("n"), f"{where}.n", 1)
        seed = _integer(r.get("seed"), f"{where}.seed", 0, 2**63 - 1)
        samples += n
        requests.append(EngineRequest(list(ids), n, seed))
    if samples > limits.max_samples:
        raise RequestError(400, f"{samples} samples requested; at most {limits.max_samples}")
    return requests, parsed


def parse_weights(body: bytes, expected: dict[str, tuple[int, ...]] | None) -> list[Any]:
    """A safetensors body as ``(name, tensor)`` pairs, or ``RequestError``; ``expected`` (name ->
    shape, when the backend knows it) refuses unknown names and wrong shapes."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(body)
    except (SafetensorError, ValueError, RuntimeError) as err:
        raise RequestError(400, f"the body is not a safetensors file: {err}") from None
    if not tensors:
        raise RequestError(400, "the safetensors file holds no tensors")
    if expected is not None:
        for name, tensor in tensors.items():
            if name not in expected:
                raise RequestError(400, f"unknown weight {name!r} for this checkpoint")
            if tuple(tensor.shape) != tuple(expected[name]):
                raise RequestError(
                    400,
                    f"weight {name!r} has shape {tuple(tensor.shape)}; the checkpoint's is "
                    f"{tuple(expected[name])}",
                )
    return list(tensors.items())


class RolloutServer:
    """The HTTP front of one ``Backend``.

    Args:
        backend: the engine (``VLLMBackend``).
        token: the bearer token clients must send (empty: none; loopback only).
        limits: what one request may ask for.
        weight_shapes: name -> shape of the checkpoint's weights, to refuse a push that does
            not fit before the engine sees it (None: the engine's own checks).
    """

    def __init__(
        self,
        backend: Backend,
        token: str = "",
        limits: ServerLimits | None = None,
        weight_shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.backend = backend
        self.token = token
        self.limits = limits or ServerLimits()
        self.weight_shapes = weight_shapes
        self.model = backend.describe()
        self.weights_version = 0
        self.lock = threading.Lock()

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/generate", self.generate, methods=["POST"]),
                Route("/weights", self.weights, methods=["POST"]),
            ],
            exception_handlers={404: _not_found, 405: _not_allowed},
        )

    async def health(self, request: Any) -> Any:
        return _reply(
            200,
            {
                "status": "ok",
                **self.model,
                "weights_version": self.weights_version,
                "limits": asdict(self.limits),
            },
        )

    async def generate(self, request: Any) -> Any:
        from starlette.concurrency import run_in_threadpool

        try:
            self._check_token(request)
            body = await _read_body(request, self.limits.max_json_bytes)
            try:
                data = json.loads(body)
            except (ValueError, RecursionError) as err:
                raise RequestError(400, f"the body is not valid JSON: {err}") from None
            requests, settings = parse_generate(data, self.limits, self.model)
        except RequestError as err:
            return _reply(err.status, {"error": str(err)})

        def run() -> list[list[dict[str, Any]]]:
            with self.lock:
                return self.backend.generate(requests, settings)

        try:
            samples = await run_in_threadpool(run)
        except Exception as err:  # the engine's own fault: the request was checked
            return _reply(500, {"error": f"the engine failed: {type(err).__name__}: {err}"})
        return _reply(200, {"samples": samples, "weights_version": self.weights_version})

    async def weights(self, request: Any) -> Any:
        from starlette.concurrency import run_in_threadpool

        try:
            self._check_token(request)
            body = await _read_body(request, self.limits.max_weights_bytes)
            pairs = parse_weights(body, self.weight_shapes)
        except RequestError as err:
            return _reply(err.status, {"error": str(err)})

        def run() -> None:
            with self.lock:
                self.backend.load_weights(pairs)
                self.weights_version += 1

        try:
            await run_in_threadpool(run)
        except Exception as err:
            return _reply(500, {"error": f"loading the weights failed: {err}"})
        return _reply(200, {"tensors": len(pairs), "weights_version": self.weights_version})

    def _check_token(self, request: Any) -> None:
        if not self.token:
            return
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
            raise RequestError(401, "missing or wrong token (Authorization: Bearer ...)")


async def _read_body(request: Any, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (declared or sent)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, "Content-Length is not a number")
        if int(declared) > limit:
            raise RequestError(413, f"the body is {int(declared)} bytes; at most {limit}")
    buffer = io.BytesIO()
    async for chunk in request.stream():
        buffer.write(chunk)
        if buffer.tell() > limit:
            raise RequestError(413, f"the body is over {limit} bytes")
    return buffer.getvalue()


def _reply(status: int, body: dict[str, Any]) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status)


async def _not_found(request: Any, exc: Any) -> Any:
    return _reply(
        404, {"error": f"no route {request.url.path}; routes: /health, /generate, /weights"}
    )


async def _not_allowed(request: Any, exc: Any) -> Any:
    return _reply(405, {"error": f"{request.method} is not allowed on {request.url.path}"})


def serve(server: RolloutServer, host: str, port: int) -> None:
    """Serve until Ctrl-C (uvicorn returns on SIGINT / SIGTERM)."""
    import uvicorn

    uvicorn.run(server.app(), host=host, port=port, log_level="warning")


__all__ = [
    "Backend",
    "RequestError",
    "RolloutServer",
    "ServerLimits",
    "parse_generate",
    "parse_weights",
    "serve",
]
