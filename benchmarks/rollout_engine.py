"""Rollout engines side by side: samples per second of the vLLM engine against the built-in loop
on the same model, in the same run, plus the weight-sync time and the engine/trainer mismatch.

The model is a random Qwen3 with the Countdown tokenizer (head_dim 32, which vLLM's CPU
attention needs), ``--hidden``/``--layers`` wide and deep, 512 positions; each configuration
samples ``--prompts`` prompts x ``group_size`` completions of at most ``max_new_tokens`` tokens
through ``AutoregressiveRollout.collect`` with ``generation.engine=loop`` and ``=vllm``, after
a warm-up of each, alternating which engine goes first, and reports medians. The mismatch is
measured on the engine's last batch: the largest ``|log mu - log pi|`` over the sampled tokens and
the k3 estimate of ``KL(mu || pi)`` (``genrl/objectives/mismatch.py``). The weight sync pushes
perturbed full weights (what follows an optimizer step) ``--repeats`` times.

Runs in the engine virtualenv (``bash .ci/vllm_lane --install-only``):
``.venv-vllm/bin/python benchmarks/rollout_engine.py`` (a few minutes on 2 CPU cores) or
``--quick``. The last line is JSON with ``engine_over_loop_samples_per_s`` per configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from genrl import get_recipe
from genrl.data.rng import RolloutNoise
from genrl.objectives.mismatch import sampler_mismatch
from genrl.rollouts.tokens import AutoregressiveRollout
from loading.assets import embedded_asset_path
from pipelines import build_policy

PROMPT = "3 5 7 = 15 :"


def save_model(directory: Path, hidden: int, layers: int) -> Path:
    """A random float32 Qwen3 of ``hidden`` width and ``layers`` depth, 32-wide heads, with the
    Countdown tokenizer, saved like a hub checkpoint."""
    from transformers import AutoConfig, AutoTokenizer, Qwen3ForCausalLM

    source = embedded_asset_path("countdown_lm")
    config = AutoConfig.from_pretrained(source)
    heads = max(1, hidden // 32)
    config.update(
        {
            "hidden_size": hidden,
            "intermediate_size": 3 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 4),
            "head_dim": 32,
            "max_position_embeddings": 512,
            "layer_types": ["full_attention"] * layers,
        }
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).float().save_pretrained(directory)
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    return directory


def rollout_for(checkpoint: Path, engine: str, group_size: int, length: int) -> Any:
    config = get_recipe("llm_countdown_grpo").apply_overrides(
        [
            "policy.name=causal_lm",
            f"policy.pretrained={checkpoint}",
            f"generation.engine={engine}",
            f"generation.max_new_tokens={length}",
            f"train.group_size={group_size}",
        ]
    )
    config.validate()
    return AutoregressiveRollout(config)


def timed_collect(
    rollout: Any, policy: Any, prompts: list[str], iteration: int
) -> tuple[float, Any]:
    noise = RolloutNoise(0, iteration, len(prompts), slice(0, len(prompts)))
    groups = torch.arange(len(prompts))
    start = time.perf_counter()
    with torch.no_grad():
        batch = rollout.collect(policy, prompts, groups, noise)
    return time.perf_counter() - start, batch


def mismatch(policy: Any, batch: Any, temperature: float) -> dict[str, float]:
    completion = batch.input_ids[:, batch.completion_start :]
    with torch.no_grad():
        trainer = policy.token_log_probs(
            batch.input_ids, batch.attention_mask, completion, temperature
        )
    _, metrics = sampler_mismatch(trainer, batch.sampler_log_probs, batch.completion_mask)
    return {k: float(v) for k, v in metrics.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one small configuration")
    args = parser.parse_args()
    if args.quick:
        args.group_sizes, args.lengths, args.repeats = [8], [32], 2
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = save_model(Path(tmp) / "model", args.hidden, args.layers)
        policy = build_policy("causal_lm", pretrained=str(checkpoint))
        policy.setup_training(0, 0.0, None)
        policy.module.eval()
        # One vLLM engine for every configuration (its sampling settings travel per request);
        # the rollout objects around it only differ in their config's lengths and groups.
        engine = rollout_for(checkpoint, "vllm", 8, 32).engine
        rows, last_batch = [], None
        for group_size in args.group_sizes:
            for length in args.lengths:
                prompts = [PROMPT] * (args.prompts * group_size)
                loop = rollout_for(checkpoint, "loop", group_size, length)
                vllm = rollout_for(checkpoint, "vllm", group_size, length)
                vllm.engine = engine
                timed_collect(loop, policy, prompts, 0)  # warm-ups
                timed_collect(vllm, policy, prompts, 0)
                seconds: dict[str, list[float]] = {"loop": [], "vllm": []}
                tokens: dict[str, list[float]] = {"loop": [], "vllm": []}
                for repeat in range(args.repeats):
                    order = [("loop", loop), ("vllm", vllm)]
                    for name, rollout in order if repeat % 2 == 0 else order[::-1]:
                        took, batch = timed_collect(rollout, policy, prompts, repeat + 1)
                        seconds[name].append(took)
                        tokens[name].append(float(batch.completion_mask.sum(1).float().mean()))
                        if name == "vllm":
                            last_batch = batch
                rate = {k: len(prompts) / statistics.median(v) for k, v in seconds.items()}
                # A random model ends its answers at random: tokens per second as well, since
                # the two engines' samples differ in length.
                token_rate = {
                    k: len(prompts) * statistics.mean(tokens[k]) / statistics.median(v)
                    for k, v in seconds.items()
                }
                row = {
                    "group_size": group_size,
                    "max_new_tokens": length,
                    "samples": len(prompts),
                    "loop_samples_per_s": round(rate["loop"], 2),
                    "engine_samples_per_s": round(rate["vllm"], 2),
                    "engine_over_loop_samples_per_s": round(rate["vllm"] / rate["loop"], 3),
                    "engine_over_loop_tokens_per_s": round(
                        token_rate["vllm"] / token_rate["loop"], 3
                    ),
                    "mean_completion_tokens": {
                        k: round(statistics.mean(v), 1) for k, v in tokens.items()
                    },
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
        assert last_batch is not None
        measured = mismatch(policy, last_batch, 1.0)
        syncs = []
        for _ in range(args.repeats):
            with torch.no_grad():
                for parameter in policy.trainable_parameters():
                    parameter.add_(1e-3 * torch.randn_like(parameter))
            took = engine.sync_weights(policy)
            assert took is not None
            syncs.append(took)
    parameters = sum(p.numel() for p in policy.network.parameters())
    print(
        json.dumps(
            {
                "benchmark": "rollout_engine",
                "parameters": parameters,
                "threads": torch.get_num_threads(),
                "configurations": rows,
                "weight_sync_s": round(statistics.median(syncs), 4),
                "mismatch_max_abs_log_prob_diff": measured["mismatch_max_abs_diff"],
                "mismatch_kl": measured["mismatch_kl"],
            }
        )
    )


if __name__ == "__main__":
    main()
