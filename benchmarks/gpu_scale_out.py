"""Every shipped accelerate config on GPUs, against DDP: a prepared script for a CUDA machine.

For each config of ``genrl/launch_configs/`` (ddp, fsdp2_full, fsdp2_lora, zero2, zero3) it runs
``accelerate launch --config_file <config> --num_processes N`` on ``genrl train sd35m_pickscore``
over the tiny random SD3 and CLIPScore of ``tests/diffusers_tiny.py`` (built into the output
directory; ``--pretrained`` puts a real SD3 checkpoint in its place) for ``--iterations``
iterations, then compares each run with the DDP run of the same fine-tuning mode (full, or
LoRA for fsdp2_lora, whose baseline ``ddp_lora`` is run too):

* ``max_rel_loss_diff``: the largest ``|loss - loss_ddp|`` over the iterations, divided by the
  largest ``|loss_ddp|`` (policy-gradient losses sit near 0, where a per-iteration ratio means
  nothing);
* ``max_rel_grad_norm_diff``: the largest ``|g - g_ddp| / g_ddp`` over the iterations;
* ``heldout_reward_diff``: ``heldout_reward_after - heldout_reward_after_ddp`` (summary.json);
* ``seconds`` (wall time of the launch) and ``peak_memory_gb`` per process
  (``torch.cuda.max_memory_allocated``, written by each process in ``--worker`` mode);
* ``planned_gb`` and ``planned_strategy``: ``genrl plan``'s total per GPU for the run's own
  setup (``summary.json``'s ``plan``, which every CUDA run writes, ``logging.plan``), and
  ``measured_over_planned`` of the main process.

``ok`` is: the launch exited 0 and ``max_rel_loss_diff <= --tolerance``. Sharding reorders
float32 reductions, so agreement is to rounding, not bit-exact.

Usage::

    python benchmarks/gpu_scale_out.py                      # every config, all visible GPUs
    python benchmarks/gpu_scale_out.py --configs ddp zero2 --num-processes 2
    python benchmarks/gpu_scale_out.py --dry-run            # print the commands (any machine)

Without CUDA (and without ``--dry-run``) it refuses in one line with exit status 2. zero2/zero3
need ``pip install deepspeed``. The last line of output is one JSON object (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("ddp", "fsdp2_full", "fsdp2_lora", "zero2", "zero3")
LORA_RANK = 4
# The small run of tests/fsdp_worker.py: 8 samples, 3 sampler steps, no KL, no EMA (FSDP
# refuses it), no held-out evaluation between iterations.
RUN_OVERRIDES = (
    "algorithm.kl_beta=0.0",
    "train.prompts_per_iteration=2",
    "train.group_size=4",
    "train.minibatch_size=8",
    "sampler.num_steps=3",
    "sampler.eval_num_steps=3",
    "optim.lr=1e-3",
    "optim.ema_decay=none",
    "eval.every=0",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument(
        "--num-processes", type=int, default=None, help="default: the visible CUDA devices"
    )
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--pretrained", help="a real SD3 diffusers directory instead of the tiny")
    parser.add_argument("--out", help="where runs and models go (default: a temporary directory)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="on max_rel_loss_diff")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one launched process (run_worker)
    args, rest = parser.parse_known_args(argv)
    if args.worker is None and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.cli_args = rest[1:] if rest[:1] == ["--"] else rest
    if args.num_processes is not None and args.num_processes < 1:
        parser.error(f"--num-processes must be at least 1, got {args.num_processes}")
    if args.iterations < 1:
        parser.error(f"--iterations must be at least 1, got {args.iterations}")
    return args


def runs_of(configs: list[str]) -> dict[str, tuple[str, int]]:
    """Run name -> (launch config, LoRA rank), baselines first: ``ddp`` for full fine-tuning,
    ``ddp_lora`` when fsdp2_lora is compared."""
    runs = {"ddp": ("ddp", 0)}
    if "fsdp2_lora" in configs:
        runs["ddp_lora"] = ("ddp", LORA_RANK)
    for name in configs:
        runs.setdefault(name, (name, LORA_RANK if name.endswith("lora") else 0))
    return runs


def baseline_of(run: str) -> str:
    return "ddp_lora" if run.endswith("lora") else "ddp"


def build_commands(args: argparse.Namespace, out: Path, models: list[str]) -> dict[str, list[str]]:
    """The ``accelerate launch`` command line of every run; ``models`` are the ``--set``
    overrides that point the recipe at the models."""
    commands = {}
    for run, (config, lora) in runs_of(args.configs).items():
        sets = [*models, *RUN_OVERRIDES, f"train.iterations={args.iterations}"]
        sets += [f"policy.lora_rank={lora}", *args.overrides]
        if args.pretrained:
            sets.append(f"policy.pretrained={args.pretrained}")
        commands[run] = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(ROOT / "genrl" / "launch_configs" / f"{config}.yaml"),
            "--num_processes", str(args.num_processes),
            str(Path(__file__).resolve()), "--worker", str(out / run), "--",
            "train", "sd35m_pickscore", "--output-dir", str(out / run),
            *[arg for value in sets for arg in ("--set", value)],
        ]  # fmt: skip
    return commands


def read_run(run_dir: Path) -> dict[str, Any]:
    """Losses, gradient norms and held-out reward of a finished run, and its processes' peaks."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss/total" in r]
    summary = json.loads((run_dir / "summary.json").read_text())
    peaks = sorted(run_dir.glob("peak_memory_rank*.json"))
    out = {
        "losses": [float(r["loss/total"]) for r in trained],
        "grad_norms": [float(r["grad_norm"]) for r in trained],
        "heldout_reward": float(summary["heldout_reward_after"]),
        "peak_memory_gb": [json.loads(p.read_text())["gb"] for p in peaks],
    }
    plan = summary.get("plan") or {}
    if plan.get("made"):
        out["planned_gb"] = plan["planned_bytes"]["total"] / 2**30
        out["planned_strategy"] = f"{plan['strategy']}, {plan['setup']}"
        out["measured_over_planned"] = plan.get("measured_over_planned")
    return out


def compare(run: dict[str, Any], ddp: dict[str, Any]) -> dict[str, float]:
    """The differences of ``run`` from its DDP baseline (module docstring)."""
    if len(run["losses"]) != len(ddp["losses"]):
        raise ValueError(
            f"the runs logged {len(run['losses'])} and {len(ddp['losses'])} iterations"
        )
    scale = max((abs(b) for b in ddp["losses"]), default=0.0) or 1e-12
    loss = max(abs(a - b) for a, b in zip(run["losses"], ddp["losses"], strict=True)) / scale
    norms = zip(run["grad_norms"], ddp["grad_norms"], strict=True)
    grad = max(abs(a - b) / max(abs(b), 1e-12) for a, b in norms)
    return {
        "max_rel_loss_diff": loss,
        "max_rel_grad_norm_diff": grad,
        "heldout_reward_diff": run["heldout_reward"] - ddp["heldout_reward"],
    }


def report(results: dict[str, dict[str, Any]], num_processes: int, tolerance: float) -> dict:
    """Print the table; return the JSON summary (one entry per run)."""
    print(f"{'run':<12}{'ok':>4}{'seconds':>9}{'peak GB/proc':>14}{'planned GB':>11}"
          f"{'rel loss':>10}{'rel gnorm':>11}{'reward diff':>13}")  # fmt: skip
    for name, row in results.items():
        peak = max(row.get("peak_memory_gb") or [float("nan")])
        planned = row.get("planned_gb", float("nan"))
        cells = [row.get(k, float("nan")) for k in ("max_rel_loss_diff", "max_rel_grad_norm_diff")]
        print(f"{name:<12}{'yes' if row['ok'] else 'NO':>4}{row['seconds']:>9.1f}{peak:>14.3f}"
              f"{planned:>11.3f}{cells[0]:>10.2e}{cells[1]:>11.2e}"
              f"{row.get('heldout_reward_diff', float('nan')):>13.2e}")  # fmt: skip
    return {
        "benchmark": "gpu_scale_out",
        "num_processes": num_processes,
        "tolerance": tolerance,
        "configs": results,
    }


def run_worker(args: argparse.Namespace) -> int:
    """One launched process: ``genrl train`` and then this process's peak GPU memory."""
    import torch

    from genrl.cli.main import main as genrl_main

    status = genrl_main(args.cli_args)
    rank = int(os.environ.get("RANK", "0"))
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    Path(args.worker).mkdir(parents=True, exist_ok=True)
    (Path(args.worker) / f"peak_memory_rank{rank}.json").write_text(json.dumps({"gb": peak}))
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return run_worker(args)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_scale_out: needs a CUDA GPU and none is visible (--dry-run prints the commands)")
        return 2
    args.num_processes = args.num_processes or max(1, torch.cuda.device_count())
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_scale_out-"))
    sys.path.insert(0, str(ROOT / "tests"))
    from diffusers_tiny import tiny_sd3_overrides

    models = tiny_sd3_overrides(out / "models", build=not args.dry_run)
    commands = build_commands(args, out, models)
    if args.dry_run:
        for command in commands.values():
            print(shlex.join(command))
        print(json.dumps({"benchmark": "gpu_scale_out", "dry_run": True, "runs": list(commands)}))
        return 0
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    results: dict[str, dict[str, Any]] = {}
    for name, command in commands.items():
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        row: dict[str, Any] = {"ok": done.returncode == 0, "seconds": time.perf_counter() - started}
        if done.returncode != 0:
            row["error"] = (done.stderr or done.stdout)[-2000:]
            results[name] = row
            continue
        measured = read_run(out / name)
        row["peak_memory_gb"] = measured["peak_memory_gb"]
        base = results.get(baseline_of(name))
        if name != baseline_of(name):
            if base is None or not base["ok"]:
                row.update(ok=False, error=f"its baseline {baseline_of(name)} failed")
            else:
                row.update(compare(measured, base["measured"]))
                row["ok"] = row["max_rel_loss_diff"] <= args.tolerance
        row["measured"] = measured
        results[name] = row
    summary = report(results, args.num_processes, args.tolerance)
    for row in results.values():
        row.pop("measured", None)
    print(json.dumps(summary))
    return 0 if all(row["ok"] for row in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
