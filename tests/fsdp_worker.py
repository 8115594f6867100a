"""One process of ``test_fsdp.py``'s launches: trains the same two iterations under DDP and
under FSDP2 (``ACCELERATE_USE_FSDP``, genrl's own ``fully_shard`` on CPU) in one process group,
exports both, and writes this process's losses and gathered trainable weights to
``<out>/rank<r>.pt``.

Usage: ``torchrun --nproc_per_node 2 tests/fsdp_worker.py OUT MODEL LORA_RANK [resume]`` with
MODEL ``sd3`` (tests/diffusers_tiny.py) or ``qwen3`` (tests/test_causal_lm.py); ``resume``
checks a sharded checkpoint instead (``resume``), ``from_ddp`` a DDP checkpoint resumed by an
FSDP2 run, ``ddp_eval`` a DDP ``train()`` whose held-out chunks fall unevenly on the processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def config(out: Path, model: str, lora: int):
    if model == "sd3":
        from diffusers_tiny import tiny_sd3_run

        cfg = tiny_sd3_run(
            out / "models",
            f"policy.lora_rank={lora}",
            "algorithm.kl_beta=0.0",
            "train.prompts_per_iteration=2",
            "train.group_size=4",
            "train.minibatch_size=8",
            "sampler.num_steps=3",
            "sampler.eval_num_steps=3",
            "optim.lr=1e-3",
            "train.iterations=2",
            "eval.every=0",
        )
        cfg.optim.ema_decay = None  # refused with FSDP (genrl/run/build.py)
        return cfg
    from test_causal_lm import CountLetterA, lm_config

    from reward_models import REWARDS

    REWARDS["letter_a"] = CountLetterA
    # Each process writes its own copy of the prompt file (one shared file would race).
    own = out / f"prompts{os.environ['RANK']}"
    own.mkdir(exist_ok=True)
    cfg = lm_config(own, out / "models" / "lm")
    cfg.policy.lora_rank = lora
    cfg.optim.lr = 1e-3
    cfg.train.iterations = 2
    return cfg


def resume(out: Path, model: str, lora: int, rank: int) -> None:
    """Under FSDP2: two iterations at once, and one, a sharded checkpoint, a fresh Trainer
    resuming from it and the second; writes both runs' final weights and metrics."""
    from genrl.loop.trainer import Trainer
    from genrl.reporting.metrics import read_metrics

    os.environ["ACCELERATE_USE_FSDP"] = "true"
    result = {}
    whole = Trainer(config(out, model, lora), run_dir=out / "whole")
    whole.train()
    result["whole"] = whole.policy.trainable_state_dict()
    result["initial"] = Trainer(
        config(out, model, lora), run_dir=out / "x"
    ).policy.trainable_state_dict()
    split = Trainer(config(out, model, lora), run_dir=out / "split")
    split.train(stop_after=1)
    # What the sharded checkpoint of iteration 1 holds, whole: a 1-process run loads it into
    # unsharded tensors (test_fsdp.py) and must find exactly these.
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    result["after_one"] = split.policy.trainable_state_dict()
    whole_options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim = get_optimizer_state_dict(
        split.policy.network, split.optimizer.optimizer, options=whole_options
    )
    result["after_one_optim"] = optim.get("state", {})  # the main process only
    resumed = Trainer(config(out, model, lora), run_dir=out / "split", resume_from=out / "split")
    resumed.train()
    result["resumed"] = resumed.policy.trainable_state_dict()
    first = out / "split" / "checkpoints" / "iter_000001"
    result["shards"] = sorted(p.name for p in first.glob("*.distcp"))
    for name in ("whole", "split"):
        rows = read_metrics(out / name / "metrics.jsonl")
        result[f"{name}_losses"] = [r["loss/total"] for r in rows if "loss/total" in r]
    torch.save(result, out / f"resume{rank}.pt")


def from_ddp(out: Path, model: str, lora: int, rank: int) -> None:
    """Two DDP iterations at once, and one DDP iteration whose (unsharded) checkpoint an FSDP2
    Trainer resumes for the second; writes both runs' final weights and losses. The DDP side
    steps ``train_iteration`` by hand: ``train()``'s held-out evaluation of the tiny SD3 under
    DDP waits forever when the processes get unequal numbers of chunks (DDP syncs buffers in
    every forward), which this test is not about."""
    from genrl.loop.trainer import Trainer

    os.environ["ACCELERATE_USE_FSDP"] = "false"
    whole = Trainer(config(out, model, lora), run_dir=out / "ddp_whole")
    result: dict = {"whole_losses": [whole.train_iteration()["loss/total"] for _ in range(2)]}
    result["whole"] = whole.policy.trainable_state_dict()
    split = Trainer(config(out, model, lora), run_dir=out / "ddp_split")
    result["split_losses"] = [split.train_iteration()["loss/total"]]
    checkpoint = split.save_checkpoint()
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    resumed = Trainer(config(out, model, lora), run_dir=out / "ddp_split")
    resumed.load_checkpoint(checkpoint or ckpt_dir(out / "ddp_split", 1))
    result["sharded"] = resumed.policy.sharded
    result["split_losses"].append(resumed.train_iteration()["loss/total"])
    result["resumed"] = resumed.policy.trainable_state_dict()
    torch.save(result, out / f"from_ddp{rank}.pt")


def ddp_eval(out: Path, model: str, lora: int, rank: int) -> None:
    """Under DDP: ``train()`` with a held-out evaluation before, during and after training of
    one chunk, which process 0 makes alone (the first forward after a training one, and the
    very first, broadcasts the transformer's buffers: without ``without_ddp_wrapper`` process 0
    waited there forever for process 1); writes this process's held-out rewards."""
    from genrl.loop.trainer import Trainer

    os.environ["ACCELERATE_USE_FSDP"] = "false"
    cfg = config(out, model, lora)
    cfg.apply_overrides(["eval.every=1", "eval.samples_per_prompt=2", "eval.batch_size=64"])
    trainer = Trainer(cfg, run_dir=out / "ddp_eval_run")
    trainer.train()
    result = trainer.evaluate()  # every process gets the whole result
    torch.save(
        {"rewards": [result.reward, *result.per_prompt.values()]}, out / f"ddp_eval{rank}.pt"
    )


def ckpt_dir(run_dir: Path, iteration: int) -> Path:
    from genrl.checkpoints.checkpoint import checkpoint_dir

    return checkpoint_dir(run_dir, iteration)


def main() -> None:
    out, model, lora = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    from genrl.loop.trainer import Trainer

    rank = int(os.environ["RANK"])
    if sys.argv[4:] == ["resume"]:
        resume(out, model, lora, rank)
        return
    if sys.argv[4:] == ["from_ddp"]:
        from_ddp(out, model, lora, rank)
        return
    if sys.argv[4:] == ["ddp_eval"]:
        ddp_eval(out, model, lora, rank)
        return
    result = {}
    for mode in ("ddp", "fsdp"):
        os.environ["ACCELERATE_USE_FSDP"] = "true" if mode == "fsdp" else "false"
        trainer = Trainer(config(out, model, lora), run_dir=out / f"run_{mode}")
        initial = trainer.policy.trainable_state_dict()
        metrics = [trainer.train_iteration() for _ in range(2)]
        result[mode] = {
            "losses": [m["loss/total"] for m in metrics],
            "grad_norms": [m["grad_norm"] for m in metrics],
            "sharded": trainer.policy.sharded,
            "initial": initial,
            "weights": trainer.policy.trainable_state_dict(),
        }
        trainer.export(out / f"export_{mode}")
    torch.save(result, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
