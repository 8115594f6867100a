"""Two conflicting rewards on the compositional task (issue 36): MARBLE against DiffusionNFT on
their weighted sum.

Both start from ``compositional_diffusion_nft`` (``genrl/recipes/compositional_methods.py``:
the 1.1M-parameter scene generator, fully fine-tuned; DiffusionNFT's released defaults; 200
iterations of 16 prompts x 8 samples) and train on the GenEval-rule ``compositional`` score
and the ``compositional_artifact_probe`` (the probability that a picture is free of the
artifacts RL introduces), weight 1 each; ``sample_diversity`` stays logged at weight 0. The two
conflict on this task: Flow-GRPO on the score alone drove the probe from 0.67 to 0.08 (seed 0,
``compositional_flow_grpo``'s docstring). Only the combination differs: ``weighted_sum`` sums the
two scores before the advantage; MARBLE keeps one advantage per reward and balances their
gradients. ``benchmarks/multi_reward.py`` compares them.
"""

from __future__ import annotations

from genrl.algorithms.marble import MarbleConfig
from genrl.recipes.compositional_methods import compositional_diffusion_nft
from genrl.run.config import RewardSpec, TrainConfig


def _two_rewards(name: str, balancing: str) -> TrainConfig:
    config = compositional_diffusion_nft()
    config.recipe = name
    config.reward = [
        RewardSpec(name="compositional"),
        RewardSpec(name="sample_diversity", weight=0.0),
        RewardSpec(name="compositional_artifact_probe", weight=1.0),
    ]
    config.set_algorithm(MarbleConfig(balancing=balancing))  # type: ignore[arg-type]
    return config


def compositional_marble() -> TrainConfig:
    """MARBLE on the score and the artifact probe: per-reward DiffusionNFT advantages, the
    min-norm weights of the normalised parameter gradients solved on every minibatch (9 per
    iteration), smoothed by an EMA of 0.9, the update one DiffusionNFT loss on the mixed
    optimality. Everything else as ``compositional_diffusion_nft``.

    Measured (seed 0, 50 iterations, 2-core CPU shared with other jobs): held-out composite
    1.039 -> 1.392 (score 0.365 -> 0.520, probe 0.674 -> 0.872) in 107 s; no minibatch had a
    negative worst cosine, whose mean was 0.72; weights 0.52 / 0.48."""
    return _two_rewards("compositional_marble", "min_norm")


def compositional_marble_weighted_sum() -> TrainConfig:
    """The baseline: DiffusionNFT on ``compositional + compositional_artifact_probe`` (the
    weighted sum, weights 1 and 1), trained exactly as ``diffusion_nft`` trains (the loss is
    the same, ``tests/test_marble.py``), with MARBLE's per-reward gradient cosines logged.

    Measured (seed 0, 50 iterations): held-out composite 1.039 -> 1.411 (score 0.540, probe
    0.871) in 126 s; no minibatch had a negative worst cosine, whose mean was 0.66 (score 0.85,
    probe 0.67)."""
    return _two_rewards("compositional_marble_weighted_sum", "weighted_sum")


MULTI_REWARD_RECIPES = {
    "compositional_marble": compositional_marble,
    "compositional_marble_weighted_sum": compositional_marble_weighted_sum,
}
