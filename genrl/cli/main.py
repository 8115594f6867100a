"""Command line: ``genrl train | eval | sample | export | plan | serve-reward | train-reward | list``.

User mistakes (bad config, missing checkpoint, failing reward) end with a one-line error and
exit code 2; set ``GENRL_DEBUG=1`` to see the full traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from genrl.cli.commands_config import checked_config, run_dir_with_config, unknown_recipe
from genrl.cli.planning import add_plan_parser
from genrl.cli.serving import add_serve_parser


def _add_config_args(p: argparse.ArgumentParser, recipe_optional: bool = True) -> None:
    p.add_argument(
        "recipe",
        nargs="?" if recipe_optional else None,
        default=None,
        help="recipe name (see `genrl list`); default: the embedded digits_flow_grpo",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set optim.lr=1e-4 (repeatable)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a hint after the error when one is set (an unknown command)."""

    hint = ""

    def error(self, message: str) -> NoReturn:
        super().error(f"{message}; {self.hint}" if self.hint else message)


# Words people type for a listing, as commands of their own.
_LISTINGS = ("recipes", "recipe", "algorithms", "policies", "rewards", "samplers", "models")


def _command_hint(argv: list[str]) -> str:
    """The hint for an unknown command: ``genrl list`` for a registry's name, ``genrl train``
    for a recipe's, the command list otherwise; "" when the command is known."""
    from genrl.recipes.catalog import CATALOG

    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None or word in _COMMANDS:
        return ""
    if word in ("recipes", "recipe"):
        return "`genrl list --recipes` lists the recipes"
    if word in _LISTINGS:
        return f"`genrl list` lists the {word}"
    if word in CATALOG:
        return f"to train that recipe: genrl train {word}"
    return "`genrl --help` describes the commands; `genrl list --recipes` lists the recipes"


def build_parser() -> _Parser:
    parser = _Parser(prog="genrl", description="RL post-training of generative models.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a policy (default: the embedded digits task)")
    _add_config_args(train)
    train.add_argument(
        "--output-dir",
        help="run directory (default runs/<recipe>-<time>); a fresh run refuses one that holds "
        "a run (config.json, metrics.jsonl, summary.json or checkpoints/) unless --resume or "
        "--overwrite is given",
    )
    start = train.add_mutually_exclusive_group()
    start.add_argument(
        "--resume",
        metavar="DIR",
        help="continue a run: its directory (latest checkpoint) or a checkpoint directory",
    )
    start.add_argument(
        "--overwrite",
        action="store_true",
        help="start a fresh run in a directory that holds one: delete the files and folders a "
        "run writes there (config.json, metrics.jsonl, summary.json, checkpoints/, tensorboard/, "
        "export/, sample grids, reward curve) and keep every other file",
    )

    ev = sub.add_parser("eval", help="held-out reward of a recipe's policy or a checkpoint")
    _add_config_args(ev)
    ev.add_argument("--checkpoint", help="run or checkpoint directory to evaluate")

    sample = sub.add_parser("sample", help="write a grid of samples for prompts")
    _add_config_args(sample)
    sample.add_argument("--checkpoint", help="run or checkpoint directory to sample from")
    sample.add_argument("--prompt", action="append", default=[], help="prompt (repeatable)")
    sample.add_argument("-n", "--num-per-prompt", type=int, default=4)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--out", default="samples.png", help="output PNG")

    export = sub.add_parser(
        "export", help="save a checkpoint's weights in the model's own format (diffusers LoRA)"
    )
    _add_config_args(export)
    export.add_argument("--checkpoint", required=True, help="run or checkpoint directory")
    export.add_argument("--out", required=True, help="output directory")

    add_plan_parser(sub, _add_config_args)
    add_serve_parser(sub)

    learn = sub.add_parser("train-reward", help="train a reward model (artifact probe)")
    learn.add_argument("kind", choices=["artifact"], help="what to train")
    learn.add_argument(
        "--data",
        help="folder with clean/ and artifact/ images (default: embedded synthetic digits)",
    )
    learn.add_argument("--backbone", default="digits", help="digits, dino:<ckpt> or clip:<ckpt>")
    learn.add_argument("--hidden", type=int, default=32, help="MLP width (0: linear)")
    learn.add_argument("--epochs", type=int, default=300)
    learn.add_argument("--seed", type=int, default=0)
    learn.add_argument("--device", default="cpu")
    learn.add_argument("--out", default="artifact_probe.safetensors", help="probe file to write")

    listing = sub.add_parser("list", help="recipes, algorithms, policies, rewards and samplers")
    listing.add_argument(
        "--recipes", dest="recipes_only", action="store_true", help="only the recipes (fast)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    # --help and argument errors end in parse_args, before anything imports torch.
    parser = build_parser()
    parser.hint = _command_hint(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    unknown = unknown_recipe(getattr(args, "recipe", None))
    if unknown is not None:  # also before torch: a typo is answered at once
        print(f"genrl: error: {unknown}", file=sys.stderr)
        return 2
    try:
        if args.command in _CONFIGURED:
            # Built and checked before torch is imported, so that a config error (an unknown
            # key, a bad value, an unknown name) answers in a fraction of a second.
            args.config = checked_config(args)
        _configure_threads()
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:  # train and serve-reward say more themselves
        print("genrl: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get("GENRL_DEBUG") or not _is_user_error(err):
            raise
        print(f"genrl: error: {err}", file=sys.stderr)
        return 2


def _is_user_error(err: Exception) -> bool:
    from genrl.config.errors import ConfigError

    # Decided before the imports below, which import torch: a config error, a missing file or
    # checkpoint (CheckpointError is a FileNotFoundError) met before torch loads stays fast.
    # ValueError covers our own input checks (shapes, prompts, names); torch failures are
    # RuntimeErrors and keep their traceback.
    if isinstance(err, ConfigError | FileNotFoundError | ValueError):
        return True
    from genrl.allocation.base import AllocationError
    from genrl.data.fileio import DiskFullError
    from genrl.loop.optimization import NonFiniteLossError
    from loading.extras import MissingExtraError
    from loading.hub import ModelNotCachedError
    from reward_models import RewardError

    return isinstance(
        err,
        RewardError
        | NonFiniteLossError
        | AllocationError
        | DiskFullError
        | MissingExtraError
        | ModelNotCachedError,
    )


def _configure_threads() -> None:
    import torch

    # Tiny models on a shared 2-core CPU stall with several intra-op threads (measured:
    # ~0.7 s instead of ~0.02 s per forward); one thread is fastest for them.
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def cmd_train(args: argparse.Namespace) -> int:
    from genrl.checkpoints.run_dir import refuse_existing_run, resolve_run_dir
    from genrl.data.fileio import check_output_directory
    from genrl.loop.trainer import Trainer

    if args.output_dir:
        check_output_directory(args.output_dir, "--output-dir")
    resume = Path(args.resume) if args.resume else None
    config = args.config
    run_dir = resolve_run_dir(
        config, args.output_dir or (run_dir_with_config(resume) if resume else None)
    )
    if resume is None and not args.overwrite:
        refuse_existing_run(run_dir)  # before the models are built (the Trainer checks again)
    try:
        trainer = Trainer(config, run_dir=run_dir, resume_from=resume, overwrite=args.overwrite)
        trainer.train()
    except KeyboardInterrupt:
        print(f"genrl: {_interrupted_run(run_dir)}", file=sys.stderr)
        return 130
    _end_processes(trainer.accelerator)
    return 0


def _end_processes(accelerator: Any) -> None:
    """Leave the process group together before the interpreter exits. Left to the exit
    handlers, a gloo group's worker threads are sometimes torn down while still joinable, and
    one process aborts (``terminate called without an active exception``), failing a run that
    finished."""
    if accelerator.num_processes > 1:
        accelerator.wait_for_everyone()
        accelerator.end_training()


def _interrupted_run(run_dir: Path) -> str:
    """What an interrupted run left: its latest checkpoint, or that there is none."""
    from genrl.checkpoints.checkpoint import PREFIX, list_checkpoints
    from genrl.checkpoints.run_dir import run_markers

    found = list_checkpoints(run_dir)
    if not run_markers(run_dir):
        return f"interrupted before the run wrote anything to {run_dir}"
    if not found:
        return (
            f"interrupted; {run_dir} holds no checkpoint: start again (with --overwrite to "
            "reuse the directory)"
        )
    iteration = int(found[-1].name.removeprefix(PREFIX))
    return (
        f"interrupted; the latest checkpoint is {found[-1]} (iteration {iteration}): continue "
        f"with --resume {run_dir}"
    )


def _trainer_for(args: argparse.Namespace):
    from genrl.checkpoints.checkpoint import resolve_checkpoint
    from genrl.checkpoints.run_dir import WEIGHT_KEYS, refuse_other_run
    from genrl.loop.trainer import Trainer

    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    config = args.config
    config.logging.tensorboard = False
    # Verified before the model loads, so that a corrupt checkpoint fails fast; another
    # recipe may score it, but its policy must be the checkpoint's.
    verified = resolve_checkpoint(checkpoint) if checkpoint is not None else None
    if verified is not None:
        refuse_other_run(config, verified, WEIGHT_KEYS)
    trainer = Trainer(config, run_dir=Path(os.devnull))
    if verified is not None:
        trainer.load_checkpoint(verified, verified=True)
    return trainer


def cmd_eval(args: argparse.Namespace) -> int:
    from genrl.prompts.heldout import run_protocol

    trainer = _trainer_for(args)
    result = trainer.evaluate()
    for prompt, value in result.per_prompt.items():
        print(f"{prompt:<32} {value:.3f}")
    print(f"held-out {trainer.reward.name}: {result.reward:.4f} ({len(result.prompts)} samples)")
    print(run_protocol(trainer))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from genrl.reporting.pictures import save_sample_grid

    if args.num_per_prompt < 1:
        raise ValueError(f"-n/--num-per-prompt must be >= 1, got {args.num_per_prompt}")
    trainer = _trainer_for(args)
    if not hasattr(trainer.policy, "latent_shape"):
        raise ValueError(
            "genrl sample draws image grids; for text policies `genrl eval` scores the "
            "held-out completions (a training run writes them to samples_after.md)"
        )
    prompts = args.prompt or trainer.prompts.eval
    if not args.prompt:
        shown = ", ".join(repr(p) for p in prompts[:8]) + (", ..." if len(prompts) > 8 else "")
        print(f"no --prompt given: sampling the recipe's {len(prompts)} held-out prompts: {shown}")
    policy, per_prompt = trainer.policy, args.num_per_prompt
    # The held-out sampler of `genrl eval` (the rollout's), with this command's seed.
    outputs = trainer.rollout.evaluation_outputs(policy, prompts, per_prompt, args.seed)
    n = len(prompts) * per_prompt
    order = [prompts[i % len(prompts)] for i in range(n)]
    # Sample with the weights `genrl eval` scores: the EMA when the run keeps one.
    ema = trainer.ema.swapped_in() if trainer.ema is not None else contextlib.nullcontext()
    size, chunks = trainer.config.eval.batch_size, []
    policy.module.eval()
    with ema, torch.no_grad():
        for start in range(0, n, size):  # eval.batch_size samples at a time (memory)
            chunk = order[start : start + size]
            chunks.append(outputs(chunk, slice(start, start + len(chunk))))
    images = torch.cat(chunks)
    scores = trainer.reward(images, order).scores[trainer.reward.name]
    title = (
        f"{trainer.config.recipe}, seed {args.seed}: mean {trainer.reward.name} "
        f"{float(scores.mean()):.3f}"
    )
    save_sample_grid(
        images,
        order,
        Path(args.out),
        num_prompts=len(prompts),
        per_prompt=args.num_per_prompt,
        title=title,
    )
    print(f"wrote {args.out} ({n} samples, mean {trainer.reward.name} {float(scores.mean()):.3f})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    trainer = _trainer_for(args)
    out = trainer.export(Path(args.out))
    print(f"wrote {out}")
    return 0


def cmd_train_reward(args: argparse.Namespace) -> int:
    from genrl.cli.train_reward import train_artifact_probe

    path, metrics = train_artifact_probe(
        args.out, args.data, args.backbone, args.hidden, args.epochs, args.seed, args.device
    )
    by_kind = ", ".join(f"{k} {v:.3f}" for k, v in metrics["heldout_accuracy_by_kind"].items())
    print(f"held-out accuracy {metrics['heldout_accuracy']:.3f} ({by_kind})")
    print(
        f"wrote {path}; use it with --set reward.1.name=artifact_probe "
        f'--set \'reward.1.kwargs={{"path": "{path}"}}\''
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from genrl.cli.listing import cmd_list as run

    return run(args)


def cmd_plan(args: argparse.Namespace) -> int:
    from genrl.cli.planning import cmd_plan as run

    return run(args)


def cmd_serve_reward(args: argparse.Namespace) -> int:
    from genrl.cli.serving import cmd_serve_reward as run

    return run(args)


# The commands that build a run from a config (checked before torch loads).
_CONFIGURED = ("train", "eval", "sample", "export", "plan")

_COMMANDS = {
    "train": cmd_train,
    "eval": cmd_eval,
    "sample": cmd_sample,
    "export": cmd_export,
    "serve-reward": cmd_serve_reward,
    "train-reward": cmd_train_reward,
    "list": cmd_list,
    "plan": cmd_plan,
}

if __name__ == "__main__":
    sys.exit(main())
