"""Iteration time of the ``sd35m_pickscore`` recipe with T5 at 256 tokens (the pipeline's
default) against 128 (Flow-GRPO's ``max_sequence_length=128``), on the tiny SD3 pipeline.

Both runs are the recipe on ``tests/diffusers_tiny.tiny_sd3_run`` (tiny SD3 at 32 px, tiny
CLIPScore reward, float32 without autocast, LoRA r32 with the recipe's adapter settings), each
iteration 4 prompts x 4 samples, 10 SDE steps with CFG 4.5, 9 trained steps in minibatches of
16, one optimizer step per minibatch; they differ only in ``policy.kwargs.max_sequence_length``
(SD3's text sequence: 77 CLIP tokens + the T5 ones, 333 against 205). The two trainers alternate
iterations (order swapped every repeat) after one warm-up each; medians of ``time/iteration_s``.

Usage::

    python benchmarks/t5_length.py              # 5 repeats, about a minute on 2 CPU cores
    python benchmarks/t5_length.py --repeats 9 --threads 2

The last line is one JSON object; its headline ``iteration_time_ratio_256_over_128`` is the
median iteration time at 256 tokens over that at 128; ``paired_ratio_median``, the median of
the back-to-back per-repeat ratios, is less sensitive to load from other processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"  # tests/diffusers_tiny.py
LENGTHS = (256, 128)


def build(root: Path, length: int) -> Any:
    from accelerate.state import AcceleratorState
    from diffusers_tiny import tiny_sd3_run

    from genrl import Trainer, get_recipe

    kwargs = {**get_recipe("sd35m_pickscore").policy.kwargs, "height": 32, "width": 32}
    kwargs["max_sequence_length"] = length
    config = tiny_sd3_run(
        root,
        f"policy.kwargs={json.dumps(kwargs)}",
        "train.prompts_per_iteration=4",
        "train.group_size=4",
        "train.minibatch_size=16",
        "train.rollout_batch_size=0",
        "logging.log_every=100000",
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    return Trainer(config, run_dir=root / f"t5-{length}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed iterations per length")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(TESTS))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trainers = {length: build(root, length) for length in LENGTHS}
        tokens = {
            length: int(t.policy.encode_prompts(["a red cat"])["prompt_embeds"].shape[1])
            for length, t in trainers.items()
        }
        times: dict[int, list[float]] = {length: [] for length in LENGTHS}
        rollout: dict[int, list[float]] = {length: [] for length in LENGTHS}
        for r in range(args.repeats + 1):
            for length in LENGTHS if r % 2 == 0 else LENGTHS[::-1]:
                metrics = trainers[length].train_iteration()
                if r:  # the first round warms up
                    times[length].append(metrics["time/iteration_s"])
                    rollout[length].append(metrics["time/rollout_s"])
    median = {length: statistics.median(times[length]) for length in LENGTHS}
    rollout_median = {length: statistics.median(rollout[length]) for length in LENGTHS}
    ratio = median[256] / median[128]
    # Back-to-back pairs share the machine's load at that moment: less sensitive to other jobs.
    paired = statistics.median(a / b for a, b in zip(times[256], times[128], strict=True))
    print(f"{'T5 tokens':>10} {'text tokens':>12} {'iteration s':>12} {'rollout s':>10}  all")
    for length in LENGTHS:
        runs = " ".join(f"{t:.2f}" for t in times[length])
        print(
            f"{length:>10} {tokens[length]:>12} {median[length]:>12.3f} "
            f"{rollout_median[length]:>10.3f}  {runs}"
        )
    print(f"ratio 256 / 128: {ratio:.3f} (medians), {paired:.3f} (median of paired ratios)")
    result = {
        "benchmark": "t5_length",
        "text_tokens": {str(k): v for k, v in tokens.items()},
        "iteration_s_median": {str(k): round(v, 4) for k, v in median.items()},
        "rollout_s_median": {str(k): round(v, 4) for k, v in rollout_median.items()},
        "iteration_time_ratio_256_over_128": round(ratio, 3),
        "paired_ratio_median": round(paired, 3),
        "repeats": args.repeats,
        "threads": args.threads,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
