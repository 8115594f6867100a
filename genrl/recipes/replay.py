"""Recipes with the replay store (``replay.*``) on the embedded Countdown LM: ExGRPO and GRPO
with AR3PO's response reuse. Their baseline is ``llm_countdown_grpo``; ``benchmarks/replay.py``
compares the three at an equal rollout budget (``docs/algorithms/replay.md``)."""

from __future__ import annotations

from genrl.algorithms.exgrpo import ExGRPOConfig
from genrl.recipes.text import llm_countdown_grpo
from genrl.run.config import TrainConfig
from genrl.run.replay_config import ReplayConfig


def llm_countdown_exgrpo() -> TrainConfig:
    """ExGRPO on the embedded Countdown LM: ``llm_countdown_grpo``'s model, prompts, groups of 8,
    iterations and optimiser, with ExGRPO's released settings for the rest: half of the
    iteration's prompts replay a stored question (buckets weighted by N(G/2, 1), the
    lowest-entropy stored completion, after the first iteration above 35% correct), the
    mixed-policy loss (shaping ``w / (w + 0.1)``, no clip once replaying, no std, a token sum
    over the limit) and no KL."""
    config = llm_countdown_grpo()
    config.recipe = "llm_countdown_exgrpo"
    config.set_algorithm(ExGRPOConfig())
    config.replay = ReplayConfig(ratio=0.5)
    return config


def llm_countdown_grpo_reuse() -> TrainConfig:
    """``llm_countdown_grpo`` with AR3PO's response reuse: a group whose 8 fresh completions are
    all wrong trains with one of the prompt's earlier correct completions in place of its last.
    Every correct completion is stored from the first iteration (AR3PO keeps the correct
    responses of any earlier round; ExGRPO's delayed start, bucket range and retirement are
    switched off)."""
    config = llm_countdown_grpo()
    config.recipe = "llm_countdown_grpo_reuse"
    size = config.train.group_size
    config.replay = ReplayConfig(
        reuse_correct=True, start_accuracy=None, max_correct=size, retire_solved=False
    )
    return config


REPLAY_RECIPES = {
    "llm_countdown_exgrpo": llm_countdown_exgrpo,
    "llm_countdown_grpo_reuse": llm_countdown_grpo_reuse,
}
