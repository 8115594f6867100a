"""``genrl serve-rollout``: a vLLM engine on a checkpoint, over HTTP, for
``generation.engine=vllm_server`` (``genrl/rollouts/engines/rollout_server.py``).

It runs where vLLM is installed (the engine virtualenv, ``bash .ci/vllm_lane --install-only``);
the trainer that uses it needs only httpx. Loopback by default; any other address needs a token
(``--token-env``), as ``serve-reward`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_rollout_parser(sub: Any) -> None:
    """The ``serve-rollout`` subcommand on ``sub`` (argparse's subparsers)."""
    serve = sub.add_parser(
        "serve-rollout", help="serve a vLLM rollout engine over HTTP (engine=vllm_server)"
    )
    serve.add_argument("checkpoint", help="the policy's checkpoint directory (transformers)")
    serve.add_argument("--host", default="127.0.0.1", help="other than loopback needs a token")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument(
        "--token-env", default="GENRL_ROLLOUT_TOKEN", help="environment variable with the token"
    )
    serve.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--max-model-len", type=int, default=0, help="0: the config's limit")
    serve.add_argument("--kv-cache-mb", type=int, default=256)
    serve.add_argument("--compile", action="store_true", help="CUDA graphs / compilation")
    serve.add_argument("--max-request-mb", type=float, default=16.0, help="a /generate body")
    serve.add_argument("--max-samples", type=int, default=65536, help="samples per request")
    serve.add_argument("--trust-remote-code", action="store_true")


def weight_shapes(checkpoint: str, trust_remote_code: bool) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight the trainer pushes (the model's ``state_dict`` built on the
    meta device, tied weights under each name), so a push that does not fit is a 400."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def cmd_serve_rollout(args: argparse.Namespace) -> int:
    from genrl.cli.serving import ServeError, _check_listen
    from genrl.rollouts.engines.rollout_server import RolloutServer, ServerLimits, serve

    if importlib.util.find_spec("vllm") is None:
        raise ServeError(
            "serve-rollout needs vLLM, which is not installed here: build the engine "
            "virtualenv with `bash .ci/vllm_lane --install-only` and run it from there"
        )
    if not os.path.isdir(args.checkpoint):
        raise ServeError(f"{args.checkpoint} is not a checkpoint directory")
    token = os.environ.get(args.token_env, "")
    if args.host not in LOOPBACK and not token:
        raise ServeError(
            f"--host {args.host} listens beyond this machine: set a token in ${args.token_env}"
        )
    _check_listen(args.host, args.port)
    from genrl.rollouts.engines.vllm_engine import VLLMBackend

    backend = VLLMBackend(
        args.checkpoint,
        dtype=args.dtype,
        seed=args.seed,
        max_model_len=args.max_model_len,
        kv_cache_mb=args.kv_cache_mb,
        eager=not args.compile,
        trust_remote_code=args.trust_remote_code,
    )
    limits = ServerLimits(
        max_json_bytes=int(args.max_request_mb * 2**20), max_samples=args.max_samples
    )
    server = RolloutServer(
        backend, token, limits, weight_shapes(args.checkpoint, args.trust_remote_code)
    )
    told = f"token from ${args.token_env}" if token else "no token (loopback only)"
    print(
        f"serving rollouts of {args.checkpoint} at http://{args.host}:{args.port}: {told}; "
        "Ctrl-C stops",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        serve(server, args.host, args.port)
    print(f"genrl: stopped serving rollouts of {args.checkpoint}", file=sys.stderr)
    return 0


__all__ = ["add_serve_rollout_parser", "cmd_serve_rollout", "weight_shapes"]
