"""The embedded video task: Flow-GRPO on the tiny moving-digits clip generator.

Clips of 6 frames of 16x16 (``pipelines/toy/video.py``) of a digit moving as the prompt says
("a 3 moving left"), rewarded by ``moving_digit`` (``reward_models/moving_digits.py``: the digit
classifier on each frame's ink-centred window, and the ink centroid's travel along the asked
direction). Runs on a 2-core CPU in minutes with the weights shipped in
``genrl/assets/video_digits``.
"""

from __future__ import annotations

from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.config import (
    EvalConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    SDESamplingConfig,
    TrainConfig,
    TrainLoopConfig,
)


def video_digits_flow_grpo() -> TrainConfig:
    """Full fine-tuning of the 1.4M-parameter clip generator with Flow-GRPO (SDE sampler, noise
    level 0.7, mean-reduced log-probs over the clip's 1,536 values), the image task's settings
    otherwise. Held-out evaluation: the 40 prompts x 8 fixed-seed 10-step ODE samples of the
    asset's manifest."""
    return TrainConfig(
        recipe="video_digits_flow_grpo",
        seed=0,
        policy=PolicyConfig(name="toy_video_digits"),
        prompts=PromptConfig(dataset="video_digits"),
        sampler=SDESamplingConfig(
            num_steps=10, noise_level=0.7, log_prob_reduction="mean", eval_num_steps=10
        ),
        reward=[RewardSpec(name="moving_digit")],
        algorithm=FlowGRPOConfig(clip_range=2e-3, kl_beta=0.0, std_mode="group"),
        train=TrainLoopConfig(
            iterations=60, prompts_per_iteration=16, group_size=8, minibatch_size=128
        ),
        optim=OptimConfig(lr=1e-4, weight_decay=1e-4, max_grad_norm=1.0),
        eval=EvalConfig(every=10, samples_per_prompt=8, seed=1234),
    )


VIDEO_RECIPES = {"video_digits_flow_grpo": video_digits_flow_grpo}
