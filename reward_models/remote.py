"""A reward scored by a reward server (``genrl serve-reward``), used like a local one.

    reward = [{name = "remote", kwargs = {url = "http://gpu-box:8000", name = "pickscore"}}]

The batch goes out in requests of at most ``max_batch_size`` samples; each response must hold
exactly its request's rows, so no sample is lost or counted twice. Requests go through one pooled
``httpx.Client`` per ``RemoteReward`` (connections kept alive between iterations, no new TCP
handshake per request). Connection failures, timeouts and 502/503/504 are retried with
exponential back-off, waiting at least a 503's Retry-After (scoring is a pure function, so a
retry is safe); a wrong token or a refused request (400, 413, ...) fails at once, and a server
that stays down raises a ``RewardError`` naming the URL and the seconds waited before any
advantage is computed, so the iteration is not half applied and the run resumes from its last
checkpoint.

The defaults give up on a frozen server (one that accepts and never answers) within a minute:
each attempt may take ``timeout_s`` 15 s plus ``timeout_per_sample_s`` 0.05 s per sample of its
request (scoring, and the queue of merged requests ahead of it, grows with the samples), so
18.2 s for the default 64 samples; three attempts and back-offs of 1 and 2 s make 57.6 s at most
(``patience_s``). A server frozen for up to about 40 s is still waited out by the last attempt
(15.05 s each for one sample: 48.2 s). A reward slower than that (a large judge behind the
server) needs a larger ``timeout_s`` or ``timeout_per_sample_s``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from reward_models.base import RewardModel, RewardOutput
from reward_models.composite import RewardError
from reward_models.logs import clip
from reward_models.wire import VERSION, WireError, decode_scores, encode_outputs

if TYPE_CHECKING:
    import httpx

RETRIED_STATUS = (502, 503, 504)


class RemoteReward(RewardModel):
    """Client of a reward server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        name: this reward's name in the run (its primary score); the server's own primary score
            is renamed to it.
        token: shared secret; default: the ``token_env`` environment variable.
        token_env: where to read the token from when ``token`` is None.
        timeout_s: seconds an attempt may take, plus ``timeout_per_sample_s`` per sample.
        timeout_per_sample_s: added to ``timeout_s`` for each sample of the request.
        retries: further attempts after a failed one.
        backoff_s: wait before the first retry, doubled after each.
        max_batch_size: samples per request.
        concurrent_requests: chunks scored at once, one request each, when rewards overlap
            sampling (``train.overlap_rewards``; ``RewardModel.concurrent_calls``).
    """

    def __init__(
        self,
        url: str,
        name: str = "remote",
        token: str | None = None,
        token_env: str = "GENRL_REWARD_TOKEN",
        timeout_s: float = 15.0,
        retries: int = 2,
        backoff_s: float = 1.0,
        max_batch_size: int = 64,
        concurrent_requests: int = 4,
        timeout_per_sample_s: float = 0.05,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote reward url must start with http:// or https://, got {url!r}")
        if (
            retries < 0
            or max_batch_size < 1
            or timeout_s <= 0
            or timeout_per_sample_s < 0
            or concurrent_requests < 1
        ):
            raise ValueError(
                "retries must be >= 0, max_batch_size >= 1, timeout_s > 0, "
                "timeout_per_sample_s >= 0 and concurrent_requests >= 1"
            )
        self.url = url.rstrip("/")
        self.name = name
        self.token = token if token is not None else os.environ.get(token_env)
        self.timeout_s = timeout_s
        self.timeout_per_sample_s = timeout_per_sample_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_batch_size = max_batch_size
        self.concurrent_calls = concurrent_requests
        self._client: httpx.Client | None = None  # made on first use: one pool per reward
        self._client_lock = threading.Lock()

    def attempt_timeout_s(self, samples: int) -> float:
        """How long one attempt of a request of ``samples`` samples may take."""
        return self.timeout_s + self.timeout_per_sample_s * samples

    def patience_s(self, samples: int | None = None) -> float:
        """The longest a request of ``samples`` (default ``max_batch_size``) waits on a frozen
        server before ``RewardError``: every attempt timing out, plus the back-offs between."""
        attempts = self.retries + 1
        backoffs = sum(self.backoff_s * 2**i for i in range(self.retries))
        return attempts * self.attempt_timeout_s(samples or self.max_batch_size) + backoffs

    def client(self) -> httpx.Client:
        """This reward's pooled HTTP client (thread-safe; connections kept alive)."""
        with self._client_lock:
            if self._client is None:
                self._client = new_client()
            return self._client

    def close(self) -> None:
        """Close the pooled connections (a later call opens new ones)."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __getstate__(self) -> dict[str, Any]:
        # A copy (deepcopy, pickling for another process) gets its own pool and lock.
        state = dict(self.__dict__)
        state["_client"], state["_client_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        parts: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []
        for start in range(0, len(prompts), self.max_batch_size):
            rows = slice(start, start + self.max_batch_size)
            request = {
                "version": VERSION,
                "prompts": prompts[rows],
                "outputs": encode_outputs(outputs[rows]),
                "metadata": _jsonable(metadata[rows]) if metadata else None,
            }
            parts.append(self._score_request(request, len(prompts[rows])))
        scores = {k: torch.cat([p[0][k] for p in parts]) for k in parts[0][0]}
        applicable = {k: torch.cat([p[1][k] for p in parts]) for k in parts[0][1]}
        return RewardOutput(scores, applicable)

    def _score_request(
        self, request: dict[str, Any], size: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        response = self._post("/score", request, size)
        try:
            primary = response["reward"]
            scores = decode_scores(response["scores"], size)
            applicable = {
                k: torch.tensor([bool(x) for x in v]) for k, v in response["applicable"].items()
            }
        except (KeyError, TypeError, WireError) as err:
            raise RewardError(f"reward server {self.url} sent a malformed response: {err}") from err
        if primary not in scores:
            raise RewardError(f"reward server {self.url} sent no primary score {primary!r}")
        rename = {primary: self.name}
        scores = {rename.get(k, k): v for k, v in scores.items()}
        applicable = {rename.get(k, k): v for k, v in applicable.items() if len(v) == size}
        return scores, applicable

    def _post(self, path: str, body: dict[str, Any], samples: int) -> dict[str, Any]:
        return post_json(
            self.url + path,
            body,
            self.token,
            self.attempt_timeout_s(samples),
            self.retries,
            self.backoff_s,
            hint="is `genrl serve-reward` running there?",
            client=self.client(),
        )


KEEPALIVE_S = 30.0  # idle pooled connections are closed by the client after this


def new_client() -> httpx.Client:
    """A pooled client: keep-alive connections, no proxy from the environment (a reward server
    is reached directly), timeouts given per request. Idle connections expire after
    ``KEEPALIVE_S``, before the server closes them (uvicorn after 75 s, Python's http.server
    after 60 s), so the client never sends on a connection the server is closing at that moment."""
    import httpx

    limits = httpx.Limits(max_keepalive_connections=32, keepalive_expiry=KEEPALIVE_S)
    return httpx.Client(trust_env=False, limits=limits)


_shared: list[httpx.Client] = []  # post_json's client when none is given, made once
_shared_lock = threading.Lock()


def _shared_client() -> httpx.Client:
    with _shared_lock:
        if not _shared:
            _shared.append(new_client())
        return _shared[0]


def post_json(
    url: str,
    body: dict[str, Any],
    token: str | None,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    hint: str = "",
    token_hint: str = "set it with the reward's token or token_env",
    client: httpx.Client | None = None,
) -> dict[str, Any]:
    """POST ``body`` as JSON, return the JSON reply. Connection errors, timeouts (``timeout_s``
    per attempt) and 502-504 are retried with exponential back-off (waiting at least a 503's
    Retry-After, up to ``timeout_s``); 401 and other refusals raise a ``RewardError`` at once,
    as does a server that fails ``retries + 1`` times (in one line: the URL, the attempts, the
    seconds waited in all, the last error). ``client``: the pool to send through (default: one
    shared by every caller that gives none)."""
    import httpx

    client = client or _shared_client()
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    wait, retry_after, last_error = backoff_s, 0.0, ""
    started = time.monotonic()
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(max(wait, retry_after))
            wait *= 2
        try:
            reply = client.post(url, content=data, headers=headers, timeout=timeout_s)
        except httpx.TransportError as err:  # refused, reset, timed out, bad HTTP
            last_error, retry_after = repr(err), 0.0
            continue
        if reply.status_code == 401:
            raise RewardError(f"{url} rejected the token ({token_hint})")
        if reply.status_code in RETRIED_STATUS:
            last_error = f"HTTP {reply.status_code}: {_error_message(reply)}"
            retry_after = min(_seconds(reply.headers.get("Retry-After")), timeout_s)
            continue
        if reply.status_code >= 300:
            raise RewardError(
                f"{url} refused the request ({reply.status_code}): {_error_message(reply)}"
            )
        try:
            return json.loads(reply.content)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RewardError(
                f"{url} answered with something that is not JSON: {reply.content[:200]!r}"
            ) from None
    waited = time.monotonic() - started
    raise RewardError(
        f"{url} failed {retries + 1} times in {waited:.1f} s (each attempt allowed "
        f"{timeout_s:g} s; last: {clip(last_error, 500)}); {hint}".rstrip("; ")
    )


def _seconds(retry_after: str | None) -> float:
    """A Retry-After in seconds (the HTTP-date form, which our server never sends, counts 0)."""
    try:
        return max(0.0, float(retry_after or 0))
    except ValueError:
        return 0.0


def _error_message(reply: httpx.Response) -> str:
    """The server's error message, clipped: it lands in a ``RewardError`` and the run's log,
    and a server other than ours may send anything there."""
    try:
        return clip(json.loads(reply.content).get("error", ""), 1000)
    except Exception:  # not our server's JSON
        return reply.reason_phrase or f"HTTP {reply.status_code}"


def _jsonable(metadata: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metadata rows with tensors turned into numbers (e.g. ``completion_length``). Columns
    holding objects JSON cannot carry (a prompt's in-memory PIL images) stay home: the wire
    sends data, the server gets the outputs themselves."""
    rows = []
    for row in metadata:
        kept = {}
        for key, value in row.items():
            value = value.tolist() if isinstance(value, torch.Tensor) else value
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
            kept[key] = value
        rows.append(kept)
    return rows


__all__ = ["RemoteReward", "new_client", "post_json"]
