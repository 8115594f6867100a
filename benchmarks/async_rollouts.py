"""Asynchronous rollouts (``train.max_staleness``) against synchronous ones on Countdown.

Runs ``llm_countdown_grpo`` on the embedded Countdown LM for ``--iterations`` iterations with
``train.max_staleness`` 0, 1 and 2, in that order and then once more in reverse (so that a
change in the machine's load falls on both sides), and reports per setting the median seconds
per iteration (after the first, which has nothing to overlap), the seconds the trainer waited
for a rollout, the training reward of the last iterations, the mismatch KL between the sampler's
and the trainer's log-probs (the lag's footprint) and the held-out accuracy at the end. The
ratio ``sync_over_async_seconds_per_iteration`` is measured in the same run.

On a CPU the sampling thread and the update compete for the same cores, so the overlap can only
hide what one of them leaves idle; the case for it is an inference engine on its own device.

``python benchmarks/async_rollouts.py`` (about 5 minutes on 2 cores) or ``--quick``. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genrl import get_recipe
from genrl.loop.trainer import Trainer
from genrl.reporting.metrics import read_metrics


def run(staleness: int, iterations: int, directory: Path) -> dict[str, Any]:
    """One run's figures (``time/*`` and the last iterations' reward and mismatch)."""
    config = get_recipe("llm_countdown_grpo").apply_overrides(
        [
            f"train.iterations={iterations}",
            f"train.max_staleness={staleness}",
            "eval.every=0",
            "logging.progress_bar=false",
            "logging.log_every=1000",
            "logging.report_to=[]",
        ]
    )
    trainer = Trainer(config, run_dir=directory)
    summary = trainer.train()
    rows = [r for r in read_metrics(directory / "metrics.jsonl") if "train_units" in r]
    tail = rows[len(rows) // 2 :]
    return {
        "seconds_per_iteration": statistics.median(r["time/iteration_s"] for r in rows[1:]),
        "rollout_wait_s": statistics.median(r.get("time/rollout_wait_s", 0.0) for r in rows[1:]),
        "train_reward_last_half": statistics.mean(r["countdown/mean"] for r in tail),
        "mismatch_kl_last_half": statistics.mean(r["loss/mismatch_kl"] for r in tail),
        "heldout_accuracy_after": summary["heldout_scores_after"]["countdown/accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="6 iterations, one order")
    args = parser.parse_args()
    iterations = 6 if args.quick else args.iterations
    settings = [0, 1, 2]
    order = settings if args.quick else settings + settings[::-1]
    results: dict[int, list[dict[str, Any]]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for index, staleness in enumerate(order):
            figures = run(staleness, iterations, Path(tmp) / f"run{index}")
            results[staleness].append(figures)
            print(f"max_staleness={staleness}: " + json.dumps(figures), flush=True)

    def median(k: int, key: str) -> float:
        return statistics.median(float(r[key]) for r in results[k])

    out: dict[str, Any] = {"iterations": iterations, "settings": {}}
    for k in settings:
        keys = results[k][0].keys()
        out["settings"][str(k)] = {key: median(k, key) for key in keys}
    sync = out["settings"]["0"]["seconds_per_iteration"]
    out["sync_over_async_seconds_per_iteration"] = {
        str(k): sync / out["settings"][str(k)]["seconds_per_iteration"] for k in settings[1:]
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
