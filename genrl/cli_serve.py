"""``genrl serve-reward``: a registered reward model behind the JSON HTTP server, with the
listen address checked before the (possibly slow) model loads."""

from __future__ import annotations

import argparse
import os
import sys


def cmd_serve_reward(args: argparse.Namespace) -> int:
    import json

    from reward_models import build_reward
    from reward_models.server import RewardServer

    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as err:
        raise ValueError(f"--kwargs must be a JSON object: {err}") from None
    if not isinstance(kwargs, dict):
        raise ValueError("--kwargs must be a JSON object")
    _check_listen(args.host, args.port)  # before the (possibly slow) reward model loads
    reward = build_reward(args.reward, **kwargs)
    try:
        server = RewardServer(
            reward,
            host=args.host,
            port=args.port,
            token=os.environ.get(args.token_env) or None,
            max_request_bytes=int(args.max_request_mb * 2**20),
            max_pixels=int(args.max_request_mpix * 2**20),
            pixel_budget=int(args.pixel_budget_mpix * 2**20),
            max_decodes=args.max_decodes,
            max_wait_s=args.max_wait,
            max_batch_size=args.max_batch_size,
            request_timeout_s=args.timeout,
        )
    except OSError as err:  # taken since the check
        raise ServeAddressError(_listen_problem(err, args.host, args.port)) from None
    token = f"token from ${args.token_env}" if server.token else "no token (loopback only)"
    address = server.address
    print(f"serving reward {args.reward!r} at {address} ({token}); Ctrl-C stops", flush=True)
    try:
        server.serve_forever()  # shuts the server down however it ends
    except KeyboardInterrupt:  # the way to stop it: a normal end
        print(f"genrl: stopped serving reward {args.reward!r} at {address}", file=sys.stderr)
    return 0


class ServeAddressError(ValueError):
    """``serve-reward`` cannot listen where it was asked to (port taken, refused, invalid)."""


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
