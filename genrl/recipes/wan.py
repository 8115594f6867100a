"""Recipes for Wan 2.1 text-to-video (need a GPU and the hub weights).

Sources, read line by line (file and line numbers of those snapshots):

* Flow-GRPO's Wan code, upstream commit 11caf1b "wan2_1" (read in the fork zhtmike/flow_grpo at
  9745241, whose Wan files are that commit's; the newest official ``train_wan2_1.py``, 74db691,
  differs only in its prompt iterator): ``config/grpo.py`` ``general_ocr_wan2_1`` (L31-80) over
  ``config/base.py``, run by ``scripts/train_wan2_1.py`` with the sampler of
  ``flow_grpo/diffusers_patch/wan_pipeline_with_logprob.py``.
* DanceGRPO at 15cc71d: ``scripts/finetune/finetune_wan_2_1_grpo.sh`` and
  ``fastvideo/train_grpo_wan_2_1.py``.
* BranchGRPO at 19fbb9f has no video script (only ``train_branchgrpo_flux.py``), although its
  paper reports WanX-1.3B results; ``wan21_1_3b_branch_grpo`` therefore puts the tree of its FLUX
  script on Flow-GRPO's Wan video settings, and says so.

Rewards: Flow-GRPO's Wan config trains on OCR (PaddleOCR on every 4th frame, the mean over
frames that score above 0); PaddleOCR is outside genrl's stack, so the Flow-GRPO recipes score
the same frames with PickScore (``frame_reward``, mean over the frames) and the prompts are the
bundled ``t2v_simple`` set. DanceGRPO's Wan script treats Wan as an image model (one frame) with
HPSv2.1 on that frame, and so does its recipe.

Each runs on the tiny stand-ins of ``tests/`` with ``policy.pretrained`` (and the reward's
``model``) pointing at them; on a GPU with the hub ids they are the real thing.
"""

from __future__ import annotations

from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.run.config import (
    EvalConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    SDESamplingConfig,
    StochasticSamplingConfig,
    TrainConfig,
    TrainLoopConfig,
)

WAN21_1_3B = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
WAN21_14B = "Wan-AI/Wan2.1-T2V-14B-Diffusers"

# train_wan2_1.py L449-475: peft LoRA r32 / alpha 64, Gaussian init, on these names; the add_*
# and to_add_out projections exist only in image-to-video checkpoints, so on text-to-video the
# LoRA sits on attn1 (self) and attn2 (cross) to_q / to_k / to_v / to_out.0.
FLOW_GRPO_WAN_LORA_TARGETS = [
    "add_k_proj",
    "add_q_proj",
    "add_v_proj",
    "to_add_out",
    "to_k",
    "to_out.0",
    "to_q",
    "to_v",
]
FRAMES = 33  # general_ocr_wan2_1: height 240, width 416, 33 frames (L40-42)
# The reward's frames: every 4th of 33 (rewards.py video_ocr, frame_interval=4).
EVERY_FOURTH_FRAME = list(range(0, FRAMES, 4))


def _frame_reward(reward: str, frames: list[int], **kwargs: object) -> RewardSpec:
    """An image reward on the given frames of each video, averaged."""
    inner: dict[str, object] = {"name": reward}
    if kwargs:
        inner["kwargs"] = dict(kwargs)
    return RewardSpec(
        name="frame_reward",
        kwargs={"reward": inner, "frames": list(frames), "aggregate": "mean"},
    )


def wan21_1_3b_flow_grpo() -> TrainConfig:
    """Wan2.1-T2V-1.3B with Flow-GRPO's ``general_ocr_wan2_1``: 240 x 416, 33 frames; 20 SDE
    steps of the Wan sampler (``flow_sde_linear``: diffusion ``sigma_s ~ 0.98 s`` on UniPC's
    flow-shift-3 sigmas, every step stochastic) with CFG 4.5 and an empty negative prompt in
    rollouts, training (both branches trained) and evaluation (50 ODE steps); UMT5 at 512
    tokens; 19 of 20 steps trained in order; clip 1e-3, advantage clip 5; per-prompt advantages
    (std + 1e-4), zero-advantage samples dropped; KL 0.004 in the reference's form (divided by
    the transition variance); LoRA r32 / alpha 64, Gaussian init; AdamW 1e-4, wd 1e-4; grad
    norm 1; EMA 0.9 every 8 steps; bf16 (the reference's README: fp16 does not work for Wan);
    gradient checkpointing; 4 prompts x 4 videos per iteration (one GPU, two sampling batches
    of 8), 8 transitions per forward, two optimizer steps per iteration.

    Remaining differences: PickScore on every 4th frame instead of OCR (module docstring); the
    transformer gets ``1000 s`` as a float where UniPC rounds it down; frozen weights in one
    dtype (the reference: VAE float32); EMA as in ``genrl.recipes.images``; the reference skips
    the first two epochs at 11caf1b ("group size bug", dropped in 74db691); its author advises
    groups above 8 for stability (flow_grpo issue 86): ``--set train.group_size=12``.
    """
    return TrainConfig(
        recipe="wan21_1_3b_flow_grpo",
        policy=PolicyConfig(
            name="wan",
            pretrained=WAN21_1_3B,
            lora_rank=32,
            lora_alpha=64,
            lora_target_modules=list(FLOW_GRPO_WAN_LORA_TARGETS),
            dtype="bfloat16",
            gradient_checkpointing=True,
            kwargs={
                "height": 240,
                "width": 416,
                "num_frames": FRAMES,
                "max_sequence_length": 512,
                "negative_prompt": "",
                "lora_init": "gaussian",
                "detach_uncond": False,
            },
        ),
        sampler=SDESamplingConfig(
            name="flow_sde_linear",
            num_steps=20,
            noise_level=1.0,
            guidance_scale=4.5,
            eval_num_steps=50,
        ),
        reward=[_frame_reward("pickscore", EVERY_FOURTH_FRAME)],
        algorithm=FlowGRPOConfig(
            clip_range=1e-3,
            kl_beta=0.004,
            kl_form="flow_grpo",
            timestep_fraction=0.99,
            std_mode="group",
            advantage_clip=5.0,
        ),
        prompts=PromptConfig(dataset="t2v_simple"),
        train=TrainLoopConfig(
            iterations=1000,
            prompts_per_iteration=4,
            group_size=4,
            minibatch_size=8,
            # 16 videos x 19 trained steps / 8 per minibatch / 2 optimizer steps.
            gradient_accumulation_steps=19,
            rollout_batch_size=8,
            mixed_precision="bf16",
        ),
        optim=OptimConfig(
            lr=1e-4,
            weight_decay=1e-4,
            betas=[0.9, 0.999],
            eps=1e-8,
            max_grad_norm=1.0,
            ema_decay=0.9,
            ema_every=8,
        ),
        eval=EvalConfig(every=30, samples_per_prompt=1, batch_size=2),
        logging=LoggingConfig(checkpoint_every=60, log_every=1),
    )


def wan21_14b_flow_grpo() -> TrainConfig:
    """Wan2.1-T2V-14B with the settings of ``wan21_1_3b_flow_grpo`` (``general_ocr_wan2_1``
    names the 14B checkpoint as its alternative, L33-34, with no other change). At 14B the
    frozen bf16 weights alone take 28 GB: shard with an ``accelerate`` FSDP config."""
    config = wan21_1_3b_flow_grpo()
    config.recipe = "wan21_14b_flow_grpo"
    config.policy.pretrained = WAN21_14B
    return config


def wan21_1_3b_dance_grpo() -> TrainConfig:
    """Wan2.1-T2V-1.3B with DanceGRPO's Wan script, which treats Wan as an image model: one
    frame at 512 x 512 scored by HPSv2.1; 20 DanceGRPO SDE steps (eta 0.3) on shift-3 sigmas;
    CFG 5 in rollouts and training (one batched forward, both branches trained); every sample
    of a prompt starts from the same noise; group 12, 2 prompts per GPU on 8 GPUs; 60% of the
    steps trained, drawn at random; clip 1e-4, advantage clip 5, no KL; all weights trained
    (bf16); AdamW 1e-5, wd 1e-4, grad norm 1; one optimizer step per iteration; UMT5 at 226
    tokens (the embeddings it precomputes with ``encode_prompt``'s default); VAE tiling.

    Remaining differences: the reference always drops the last step and draws 11 of the other
    19 per sample (genrl: 12 of 20, per iteration); it decodes the last step's x0 prediction and
    scores the first frame after an mp4 round trip (genrl: the final sample, losslessly); it
    never synchronises its 8 GPUs' weights (no DDP/FSDP wrap in ``train_grpo_wan_2_1.py``),
    genrl trains one model over all processes; the reference stores and updates its weights in
    bf16, genrl keeps float32 trained weights over bf16 frozen ones."""
    config = wan21_1_3b_flow_grpo()
    config.recipe = "wan21_1_3b_dance_grpo"
    config.policy.lora_rank, config.policy.lora_alpha = 0, 0.0
    config.policy.lora_target_modules = None
    config.policy.kwargs = {
        "height": 512,
        "width": 512,
        "num_frames": 1,
        "max_sequence_length": 226,
        "negative_prompt": "",
        "detach_uncond": False,
        "vae_tiling": True,
    }
    config.sampler = SDESamplingConfig(
        name="dance_sde",
        num_steps=20,
        noise_level=0.3,
        shift=3.0,
        guidance_scale=5.0,
        eval_num_steps=20,
        same_initial_noise=True,
    )
    config.reward = [_frame_reward("hps", [0], version="v2.1")]
    config.algorithm = FlowGRPOConfig(
        clip_range=1e-4,
        kl_beta=0.0,
        timestep_fraction=0.6,
        timestep_selection="random",
        std_mode="group",
        std_eps=1e-8,
        advantage_clip=5.0,
        drop_zero_advantages=False,
    )
    config.train.prompts_per_iteration = 16
    config.train.group_size = 12
    config.train.minibatch_size = 1
    # One optimizer step per iteration on each of 8 processes: 24 samples x 12 steps each.
    config.train.gradient_accumulation_steps = 24 * 12
    config.train.rollout_batch_size = 4
    config.optim = OptimConfig(
        lr=1e-5, weight_decay=1e-4, betas=[0.9, 0.999], eps=1e-8, max_grad_norm=1.0
    )
    config.fit_sections()
    return config


def wan21_1_3b_branch_grpo() -> TrainConfig:
    """BranchGRPO on Wan2.1-T2V-1.3B video. The reference has no video script, so this puts the
    tree of its FLUX script (splits at steps 0, 3, 6, 9 into 2: 16 leaves per prompt; split
    noise scale 4; DanceGRPO steps at eta 0.3 on shift-3 sigmas; clip 1e-3; every edge
    trained) on ``wan21_1_3b_flow_grpo``'s video, model, LoRA, CFG and reward settings, with 2
    prompts (32 videos) per iteration. Not a reproduction of any released setting."""
    from genrl.algorithms.branch_grpo import BranchGRPOConfig

    config = wan21_1_3b_flow_grpo()
    config.recipe = "wan21_1_3b_branch_grpo"
    config.sampler = StochasticSamplingConfig(
        name="dance_sde", num_steps=20, noise_level=0.3, shift=3.0, guidance_scale=4.5,
        eval_num_steps=50,
    )  # fmt: skip
    config.algorithm = BranchGRPOConfig(
        split_steps=[0, 3, 6, 9],
        branching=[2, 2, 2, 2],
        split_noise_scale=4.0,
        clip_range=1e-3,
        advantage_clip=5.0,
        kl_beta=0.0,
        max_batch=8,
    )
    config.train.prompts_per_iteration = 2
    config.train.group_size = 16
    config.fit_sections()
    return config


WAN_RECIPES = {
    "wan21_1_3b_flow_grpo": wan21_1_3b_flow_grpo,
    "wan21_14b_flow_grpo": wan21_14b_flow_grpo,
    "wan21_1_3b_dance_grpo": wan21_1_3b_dance_grpo,
    "wan21_1_3b_branch_grpo": wan21_1_3b_branch_grpo,
}
