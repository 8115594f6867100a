"""``genrl serve-reward``: its arguments, the replicas' reward arguments, the listen checks.

Kept apart from ``cli.py`` so that the command line stays readable; ``cli.main`` dispatches
here and turns ``ServeError`` (a ``ValueError``) into a one-line error with exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any


def add_serve_parser(sub: Any) -> None:
    """The ``serve-reward`` subcommand on ``sub`` (argparse's subparsers)."""
    serve = sub.add_parser("serve-reward", help="serve a reward model over HTTP (JSON)")

    serve.add_argument("reward", help="registered reward name (see `genrl list`)")
    serve.add_argument(
        "--kwargs", default="{}", help='reward arguments as JSON, e.g. \'{"device": "cuda"}\''
    )
    serve.add_argument("--host", default="127.0.0.1", help="other than loopback needs a token")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--token-env", default="GENRL_REWARD_TOKEN", help="environment variable with the token"
    )
    serve.add_argument("--max-batch-size", type=int, default=64, help="samples per reward call")
    serve.add_argument("--max-request-mb", type=float, default=64.0)
    serve.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    serve.add_argument(
        "--max-request-mpix", type=float, default=64.0, help="decoded pixels per request (2^20)"
    )
    serve.add_argument("--max-samples", type=int, default=512, help="outputs per request")
    serve.add_argument(
        "--max-prompt-kb", type=float, default=1024.0, help="UTF-8 KiB of a request's prompts"
    )
    serve.add_argument(
        "--pixel-budget-mpix",
        type=float,
        default=128.0,
        help="decoded pixels held by all requests together (2^20; 12 bytes each)",
    )
    serve.add_argument("--max-decodes", type=int, default=4, help="requests decoding at once")
    serve.add_argument(
        "--max-wait", type=float, default=10.0, help="seconds to wait for the budget, then 503"
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds for a request head to arrive, then 408 and close (slow clients)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="connections open at once; one more gets 503 and is closed",
    )
    serve.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="model instances behind the endpoint, each with its own scoring worker "
        "(default: one per --devices entry, else 1)",
    )
    serve.add_argument(
        "--devices",
        default=None,
        help="comma-separated devices of the replicas, e.g. cuda:0,cuda:1 (passed to the "
        "reward as its device argument; cycled when fewer than --replicas)",
    )


def cmd_serve_reward(args: argparse.Namespace) -> int:
    import json

    from reward_models import build_reward
    from reward_models.serving.server import MissingServerExtra, RewardServer, check_front

    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as err:
        raise ValueError(f"--kwargs must be a JSON object: {err}") from None
    if not isinstance(kwargs, dict):
        raise ValueError("--kwargs must be a JSON object")
    replica_kwargs = _replica_kwargs(kwargs, args.replicas, args.devices)
    try:  # before the (possibly slow) reward models load
        check_front()
    except MissingServerExtra as err:
        raise ServeError(str(err)) from None
    _check_listen(args.host, args.port)
    rewards = [build_reward(args.reward, **options) for options in replica_kwargs]
    try:
        server = RewardServer(
            rewards,
            host=args.host,
            port=args.port,
            token=os.environ.get(args.token_env) or None,
            max_request_bytes=int(args.max_request_mb * 2**20),
            max_pixels=int(args.max_request_mpix * 2**20),
            max_samples=args.max_samples,
            max_prompt_bytes=int(args.max_prompt_kb * 2**10),
            pixel_budget=int(args.pixel_budget_mpix * 2**20),
            max_decodes=args.max_decodes,
            max_wait_s=args.max_wait,
            max_batch_size=args.max_batch_size,
            request_timeout_s=args.timeout,
            header_timeout_s=args.header_timeout,
            max_connections=args.max_connections,
        )
    except OSError as err:  # taken since the check
        raise ServeAddressError(_listen_problem(err, args.host, args.port)) from None
    token = f"token from ${args.token_env}" if server.token else "no token (loopback only)"
    address = server.address
    where = ", ".join(str(o.get("device", "default device")) for o in replica_kwargs)
    print(
        f"serving reward {args.reward!r} at {address}: {token}, "
        f"{len(rewards)} replica(s) on {where}; Ctrl-C stops",
        flush=True,
    )
    # Shuts the server down however it ends. Ctrl-C is the way to stop it, a normal end:
    # uvicorn catches SIGINT and SIGTERM and returns (KeyboardInterrupt if it re-raises one).
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    print(f"genrl: stopped serving reward {args.reward!r} at {address}", file=sys.stderr)
    return 0


class ServeError(ValueError):
    """``serve-reward`` was asked for something it cannot do (a one-line error, exit 2)."""


class ServeAddressError(ServeError):
    """``serve-reward`` cannot listen where it was asked to (port taken, refused, invalid)."""


def _replica_kwargs(
    kwargs: dict[str, Any], replicas: int | None, devices: str | None
) -> list[dict[str, Any]]:
    """The reward arguments of each replica: ``--devices`` given to them in turn as
    ``device``."""
    names = [d.strip() for d in devices.split(",")] if devices else []
    if devices is not None and not all(names):
        raise ServeError(f"--devices must be comma-separated device names, got {devices!r}")
    if names and "device" in kwargs:
        raise ServeError("give the device in --devices or in --kwargs, not both")
    count = replicas if replicas is not None else max(1, len(names))
    if count < 1:
        raise ServeError(f"--replicas must be >= 1, got {count}")
    if names and count % len(names):
        raise ServeError(
            f"--replicas {count} cannot be spread evenly over the {len(names)} --devices "
            f"({', '.join(names)})"
        )
    return [
        {**kwargs, "device": names[i % len(names)]} if names else dict(kwargs) for i in range(count)
    ]


def _check_listen(host: str, port: int) -> None:
    """Raise ``ServeAddressError`` when ``host:port`` cannot be listened on."""
    import socket

    if not 0 <= port <= 65535:
        raise ServeAddressError(f"--port must lie in [0, 65535] (0: any free port), got {port}")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As the server binds: reusing a port that only lingers in TIME_WAIT is fine.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as err:
        raise ServeAddressError(_listen_problem(err, host, port)) from None
    finally:
        probe.close()


def _listen_problem(err: OSError, host: str, port: int) -> str:
    import errno
    import socket

    where = f"cannot listen on {host}:{port}"
    if isinstance(err, socket.gaierror):
        return f"{where}: unknown host {host!r} ({err.strerror})"
    reasons = {
        errno.EADDRINUSE: "the port is in use (another server?); pick another --port, or 0 "
        "for any free one",
        errno.EACCES: "permission denied (ports below 1024 need administrator rights); pick "
        "a --port of 1024 or more",
        errno.EADDRNOTAVAIL: "this machine has no such address; use --host 127.0.0.1 or 0.0.0.0",
    }
    reason = reasons.get(err.errno) if err.errno is not None else None
    return f"{where}: {reason or err.strerror or str(err)}"
