"""The compositional task: Flow-GRPO on the tiny text-conditioned scene generator, scored like
GenEval.

32x32 RGB scenes of up to four coloured shapes on a 2x2 grid (``tasks/
compositional.py``), prompts of GenEval's six categories, rewarded by the ``compositional``
reward (``reward_models/compositional.py``: a per-cell detector, then all-or-nothing
correctness of the prompt's requirements). Training prompts and held-out prompts name disjoint
combinations, so the held-out score measures what RL teaches beyond the prompts it saw. Runs on
a 2-core CPU with the weights shipped in ``genrl/assets/compositional``.
"""

from __future__ import annotations

from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.run.config import (
    EvalConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    SDESamplingConfig,
    TrainConfig,
    TrainLoopConfig,
)


def compositional_flow_grpo() -> TrainConfig:
    """Flow-GRPO (SDE sampler, noise level 0.7, mean-reduced log-probs, per-prompt std, no KL),
    full fine-tuning of the 1.1M-parameter generator (text encoder included), 16 prompts x 8
    samples per iteration, 200 iterations. Held-out evaluation: the asset manifest's protocol
    (25 held-out prompts x 8 fixed-seed 10-step ODE samples); ``eval/compositional/<category>``
    is GenEval's per-category accuracy. As for the video model, which also predicts the clean
    sample, only the first half of the steps is trained (``timestep_fraction`` 0.5).
    ``sample_diversity`` and ``compositional_artifact_probe`` are logged at weight 0.

    Measured (2-core CPU shared with other jobs, one thread; held-out 0.365 before): seed 0
    0.735 (+0.370) in 190 s, 0.605 after 50 iterations, best 0.730 at 150; seed 1 0.710
    (+0.345) in 489 s (on a busier machine). Both gains come mostly from a hack that GenEval's
    rule allows: the policy fills all four cells (``objects`` 1.66 -> 3.88 / 3.97), so that
    "at least one" requirements hold more often, while ``exact`` (nothing extra) falls 0.35 ->
    0.04 and ``counting`` 0.75 -> 0.50. The artifact probe fell 0.67 -> 0.08 on seed 0 (noisy
    backgrounds) but rose to 0.94 on seed 1. ``compositional_flow_grpo_strict`` closes the
    loophole."""
    return TrainConfig(
        recipe="compositional_flow_grpo",
        seed=0,
        policy=PolicyConfig(name="toy_compositional"),
        prompts=PromptConfig(dataset="compositional"),
        sampler=SDESamplingConfig(
            num_steps=10, noise_level=0.7, log_prob_reduction="mean", eval_num_steps=10
        ),
        # Logged, never trained on (weight 0): within-prompt diversity shows collapse, the
        # artifact probe degraded pictures.
        reward=[
            RewardSpec(name="compositional"),
            RewardSpec(name="sample_diversity", weight=0.0),
            RewardSpec(name="compositional_artifact_probe", weight=0.0),
        ],
        algorithm=FlowGRPOConfig(
            clip_range=2e-3, kl_beta=0.0, std_mode="group", timestep_fraction=0.5
        ),
        train=TrainLoopConfig(
            iterations=200, prompts_per_iteration=16, group_size=8, minibatch_size=128
        ),
        optim=OptimConfig(lr=5e-5, weight_decay=1e-4, max_grad_norm=1.0),
        eval=EvalConfig(every=25, samples_per_prompt=8, seed=1234),
    )


def compositional_flow_grpo_strict() -> TrainConfig:
    """The same run with ``strict`` correctness as the reward (``exact``: every requirement met
    and nothing else on the canvas), which takes away the fill-every-cell hack.

    Measured (seed 0, 2-core CPU shared with other jobs): held-out ``exact`` 0.350 -> 0.500
    (+0.150) in 501 s on a busy machine (0.455 after 75 iterations, 0.365 after 100);
    GenEval-rule correctness 0.365 -> 0.515 without extra objects (``objects`` 1.66 -> 1.86;
    counting 0.75 -> 0.94, position 0.17 -> 0.27, colour binding 0.22 -> 0.28); the samples
    gain speckled backgrounds (artifact probe 0.67 -> 0.03)."""
    config = compositional_flow_grpo()
    config.recipe = "compositional_flow_grpo_strict"
    config.reward[0].kwargs = {"strict": True}
    return config


COMPOSITIONAL_RECIPES = {
    "compositional_flow_grpo": compositional_flow_grpo,
    "compositional_flow_grpo_strict": compositional_flow_grpo_strict,
}
