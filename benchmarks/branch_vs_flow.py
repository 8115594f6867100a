"""BranchGRPO vs Flow-GRPO: model forwards, rollout time and iteration time per iteration, with
the same number of leaves (samples) per prompt, in one run.

Methods (each a full trainer iteration on the same prompts):

* ``flow``: Flow-GRPO, ``group_size`` independent SDE trajectories per prompt;
* ``branch``: BranchGRPO as the ``digits_branch_grpo`` recipe trains it: one tree per prompt,
  every live node of a step in one forward, every edge trained (the paper's method; the
  reference's FLUX script prunes nothing);
* ``branch_pruned``: the same tree with the reference's pruning: child depths 8-10 left out
  (``--depth_pruning``, as its README's ``15,16,17`` of 20 steps) and width mode 1 (each
  last-split branch keeps its better half of the later transitions);
* ``branch_first_60``: the same tree, only the edges of the first 60% of the steps trained (an
  earlier genrl setting, kept for comparison);
* ``branch_one_node``: the recipe's tree, one node per forward (the reference code's way);
* ``branch_mix``: BranchGRPO-Mix, ODE on every step but the split steps (only split edges train).

Tasks: the embedded digits task (``digits_flow_grpo`` / ``digits_branch_grpo``) and the tiny
SD3 pipeline of the tests (random weights, 32 px, a tiny CLIPScore reward).

    python benchmarks/branch_vs_flow.py                   # both tasks, 5 timed iterations each
    python benchmarks/branch_vs_flow.py --curves docs/algorithms/branch_grpo_curves.png
        # also: held-out reward against wall-clock, 3 seeds per method, on the embedded task

The last line is one JSON object (benchmarks/README.md) with, for the embedded task,
``branch_over_flow_iter_time`` (the recipe's BranchGRPO, every edge trained),
``branch_pruned_over_flow_iter_time`` (the reference's depth and width pruning) beside it, and
``per_depth_batching_speedup`` (target >= 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tiny SD3 and CLIP builders

SPLITS = {"split_steps": [0, 3, 6], "branching": [2, 2, 2]}  # 8 leaves from 10 steps


def method_overrides(method: str) -> list[str]:
    if method == "flow":
        return []
    tree = [
        "algorithm.name=branch_grpo",
        f"algorithm.split_steps={SPLITS['split_steps']}",
        f"algorithm.branching={SPLITS['branching']}",
        "algorithm.clip_range=2e-3",
        "algorithm.kl_beta=0.0",
        "algorithm.split_noise_scale=1.3",  # as digits_branch_grpo
    ]
    if method == "branch_one_node":
        tree.append("algorithm.max_batch=1")
    if method == "branch_pruned":
        tree += ["algorithm.depth_pruning=[8, 9, 10]", "algorithm.width_pruning=last_split_top"]
    if method == "branch_first_60":
        tree.append("algorithm.train_steps=[0, 1, 2, 3, 4, 5]")
    if method == "branch_mix":
        ode = [t for t in range(10) if t not in SPLITS["split_steps"]]
        tree.append(f"algorithm.ode_steps={ode}")
    return tree


def task_config(task: str, method: str, root: Path, seed: int = 0) -> Any:
    from genrl import get_recipe

    common = [
        f"seed={seed}",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        "logging.log_every=100000",
        "train.group_size=8",
        "sampler.num_steps=10",
    ]
    if task == "digits":
        config = get_recipe("digits_flow_grpo")
        config.apply_overrides([*common, *method_overrides(method)])
        return config
    from diffusers_tiny import tiny_sd3_run

    config = tiny_sd3_run(
        root,
        *common,
        "train.prompts_per_iteration=4",
        "train.minibatch_size=32",
        "sampler.eval_num_steps=4",
        "algorithm.kl_beta=0.0",  # as the tree methods: no reference forward in either
        *method_overrides(method),
    )
    if method != "flow":
        config.apply_overrides(["algorithm.clip_range=1e-4", "algorithm.cfg_in_training=true"])
    return config


def measure(task: str, method: str, root: Path, iterations: int) -> dict[str, float]:
    """``measure_trainer`` on a trainer of ``method`` for ``task``."""
    from genrl import Trainer

    config = task_config(task, method, root)
    return measure_trainer(Trainer(config, run_dir=root / f"{task}-{method}"), iterations)


def measure_trainer(trainer: Any, iterations: int) -> dict[str, float]:
    """Median rollout and iteration seconds over ``iterations`` (after one warm-up) and the
    rows that went through the model per iteration (rollout and training)."""
    policy = trainer.policy
    counts = {"calls": 0, "rows": 0}
    velocity = policy.velocity

    def counted(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        counts["calls"] += 1
        counts["rows"] += int(x.shape[0])
        return velocity(x, *args, **kwargs)

    policy.velocity = counted  # type: ignore[method-assign]
    rollout, iteration, calls, rows = [], [], [], []
    for i in range(iterations + 1):
        counts.update(calls=0, rows=0)
        metrics = trainer.train_iteration()
        if i:  # the first iteration warms up
            rollout.append(metrics["time/rollout_s"])
            iteration.append(metrics["time/iteration_s"])
            calls.append(counts["calls"])
            rows.append(counts["rows"])
    return {
        "rollout_s": statistics.median(rollout),
        "iteration_s": statistics.median(iteration),
        "velocity_calls": statistics.median(calls),
        "velocity_rows": statistics.median(rows),
    }


def curves(path: Path, seeds: list[int], root: Path) -> dict[str, Any]:
    """Held-out reward against training wall-clock on the embedded task, for Flow-GRPO and
    BranchGRPO with the recipes' budget (60 iterations), ``seeds`` each; plotted to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from genrl import Trainer
    from genrl.reporting.metrics import read_metrics

    results: dict[str, Any] = {}
    figure, axis = plt.subplots(figsize=(6, 4))
    names = {
        "flow": "Flow-GRPO",
        "branch": "BranchGRPO (every edge trained)",
        "branch_pruned": "BranchGRPO (reference depth + width pruning)",
    }
    for method, colour in (
        ("flow", "tab:blue"),
        ("branch", "tab:orange"),
        ("branch_pruned", "tab:green"),
    ):
        finals = []
        for seed in seeds:
            config = task_config("digits", method, root, seed)
            config.apply_overrides(["eval.every=10"])
            run = root / f"curve-{method}-{seed}"
            summary = Trainer(config, run_dir=run).train()
            elapsed, xs, ys = 0.0, [], []
            for row in read_metrics(run / "metrics.jsonl"):
                elapsed += row.get("time/iteration_s", 0.0)
                if "eval/reward" in row:
                    xs.append(elapsed)
                    ys.append(row["eval/reward"])
            label = names[method] if seed == seeds[0] else None
            axis.plot(xs, ys, color=colour, alpha=0.8, label=label)
            finals.append(
                {"seed": seed, "after": summary["heldout_reward_after"], "seconds": xs[-1]}
            )
        results[method] = finals
    axis.set_xlabel("training seconds (2-core CPU)")
    axis.set_ylabel("held-out reward")
    axis.set_title("Embedded digits task, 8 samples per prompt")
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["digits", "tiny_sd3"])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--curves", type=Path, help="also plot reward vs wall-clock to this PNG")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    methods = (
        "flow",
        "branch",
        "branch_pruned",
        "branch_first_60",
        "branch_one_node",
        "branch_mix",
    )
    table: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(
            f"{'task':<9} {'method':<16} {'calls':>6} {'rows':>6} {'rollout s':>10} {'iteration s':>12}"
        )
        for task in args.tasks:
            for method in methods:
                started = time.perf_counter()
                row = measure(task, method, root, args.iterations)
                table.setdefault(task, {})[method] = row
                print(
                    f"{task:<9} {method:<16} {row['velocity_calls']:>6.0f} {row['velocity_rows']:>6.0f} "
                    f"{row['rollout_s']:>10.3f} {row['iteration_s']:>12.3f}   ({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
        result: dict[str, Any] = {"benchmark": "branch_vs_flow", "tasks": table}
        digits = table.get("digits")
        if digits:
            result["branch_over_flow_iter_time"] = round(
                digits["branch"]["iteration_s"] / digits["flow"]["iteration_s"], 3
            )
            result["branch_first_60_over_flow_iter_time"] = round(
                digits["branch_first_60"]["iteration_s"] / digits["flow"]["iteration_s"], 3
            )
            result["branch_pruned_over_flow_iter_time"] = round(
                digits["branch_pruned"]["iteration_s"] / digits["flow"]["iteration_s"], 3
            )
            result["branch_mix_over_flow_iter_time"] = round(
                digits["branch_mix"]["iteration_s"] / digits["flow"]["iteration_s"], 3
            )
            result["per_depth_batching_speedup"] = round(
                digits["branch_one_node"]["rollout_s"] / digits["branch"]["rollout_s"], 2
            )
        if args.curves:
            result["curves"] = curves(args.curves, args.seeds, root)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
