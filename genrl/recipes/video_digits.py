"""The embedded video task: Flow-GRPO on the tiny moving-digits clip generator.

Clips of 6 frames of 16x16 (``pipelines/toy/video.py``) of a digit moving as the prompt says
("a 3 moving left"), rewarded by ``moving_digit`` (``reward_models/moving_digits.py``: the digit
classifier on each frame's ink-centred window, and the ink centroid's travel along the asked
direction). Runs on a 2-core CPU in minutes with the weights shipped in
``genrl/assets/video_digits``.
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


def video_digits_flow_grpo() -> TrainConfig:
    """Flow-GRPO (SDE sampler, noise level 1.0, mean-reduced log-probs over the clip's 1,536
    values, per-prompt std, KL 1.0 to the base on the step means), full fine-tuning of the
    1.4M-parameter clip generator, 320 iterations of 32 prompts x 8 clips at lr 5e-5. The
    reward ``moving_digit_judge`` is logged at weight 0: a second classifier that is never
    trained against, and the background speckle, so that a gain the training reward's own
    classifier alone sees would show. Held-out evaluation: the asset manifest's protocol (40
    prompts x 8 fixed-seed 10-step ODE samples).

    Only the first half of the steps (s = 1 .. 0.6, ``timestep_fraction`` 0.5 with the
    reference's prefix selection) are trained: the model predicts the clean clip and its
    velocity is ``(x - x0_hat) / s``, so the late steps' log-prob gradients are large and carry
    mostly pixel-level detail (with 9 of 10 steps, no KL and the old reward, the held-out
    reward fell 0.416 -> 0.320 in 60 iterations at lr 1e-4).

    The KL is what keeps the backgrounds black. Background pixels sit at the clamp (pixel 0 =
    -1 in the model's space), so untargeted drift of the weights shows only upwards, as grey
    speckle; the tidy factor of the reward alone does not hold it (measured with the new reward,
    noise 0.7, 240 iterations: judge speckle 0.019 -> 0.18 and tidy 0.91 -> 0.70 without KL,
    still rising at KL 0.04 and 0.3; flat at 0.02 with KL 1.0). Noise level 1.0 rather than
    0.7 explores more within a group: 0.551 after 160 iterations against 0.526 (both KL 1.0).
    Tried and left: lr 1e-4 (speckle 0.036 after 80 iterations), noise 0.3 (no gain after 120),
    ``timestep_fraction`` 0.8 (as clean, no faster), the reward's tidy factor to the 4th power
    (reward fell).

    Measured (a 2-core CPU shared with other jobs, one thread; held-out reward 0.431, judge
    0.188, speckle 0.019 before), reward / judge / speckle after, wall time:
    seed 0 0.614 (+0.183) / 0.447 / 0.021 in 311 s; seed 1 0.590 (+0.158) / 0.425 / 0.023 in
    250 s; seed 2 0.590 (+0.158) / 0.448 / 0.021 in 188 s. Those exploration numbers above
    were measured on a first build of the classifier (held-out 0.433 before)."""
    return TrainConfig(
        recipe="video_digits_flow_grpo",
        seed=0,
        policy=PolicyConfig(name="toy_video_digits"),
        prompts=PromptConfig(dataset="video_digits"),
        sampler=SDESamplingConfig(
            num_steps=10, noise_level=1.0, log_prob_reduction="mean", eval_num_steps=10
        ),
        reward=[
            RewardSpec(name="moving_digit"),
            RewardSpec(name="moving_digit_judge", weight=0.0),
        ],
        algorithm=FlowGRPOConfig(
            clip_range=2e-3, kl_beta=1.0, std_mode="group", timestep_fraction=0.5
        ),
        train=TrainLoopConfig(
            iterations=320, prompts_per_iteration=32, group_size=8, minibatch_size=256
        ),
        optim=OptimConfig(lr=5e-5, weight_decay=1e-4, max_grad_norm=1.0),
        eval=EvalConfig(every=40, samples_per_prompt=8, seed=1234),
    )


def video_digits_diffusion_nft() -> TrainConfig:
    """DiffusionNFT on the video task with the released code's defaults (as ``digits_diffusion_nft``)
    and the image task's budget: 60 iterations of 16 x 8 clips, lr 1e-4, full fine-tuning.

    Measured (seed 0, 2-core CPU shared with other jobs, one thread): held-out 0.431 -> 0.662
    (+0.231) in 56 s, judge 0.188 -> 0.490, speckle 0.019 -> 0.014 (0.416 -> 0.667 under the
    previous reward, the image task's classifier on an all-pixel centroid)."""
    from genrl.algorithms.diffusion_nft import DiffusionNFTConfig

    config = video_digits_flow_grpo()
    config.recipe = "video_digits_diffusion_nft"
    config.set_algorithm(DiffusionNFTConfig())
    config.train = TrainLoopConfig(
        iterations=60, prompts_per_iteration=16, group_size=8, minibatch_size=128
    )
    config.optim.lr = 1e-4
    config.eval.every = 10
    return config


VIDEO_RECIPES = {
    "video_digits_flow_grpo": video_digits_flow_grpo,
    "video_digits_diffusion_nft": video_digits_diffusion_nft,
}
