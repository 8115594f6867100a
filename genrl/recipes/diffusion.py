"""Recipes for classic diffusion checkpoints (Stable Diffusion 1.5, SDXL), sampled with DDIM
(need a GPU and the hub weights).

The DDPO recipes copy the released configs of github.com/kvablack/ddpo-pytorch
(``config/base.py`` and ``config/dgx.py`` ``aesthetic``, run by ``scripts/train.py``). Translated
to genrl's fields:

* Batch layout: ``aesthetic`` samples 8 GPUs x 8 images x 4 batches = 256 images per epoch and
  takes two optimizer steps of 8 x 4 images x 4 accumulation x 50 timesteps each. genrl draws
  the 256 as 32 prompts x 8 (DDPO draws each image's prompt on its own); with 8 processes, 4
  transitions per forward (``train.batch_size``) and ``gradient_accumulation_steps=200``, each
  optimizer step holds the same 800 transitions per process, two per iteration.
* LoRA: DDPO's ``LoRAAttnProcessor`` on every attention layer of the UNet, rank 4 (diffusers'
  default), scale 1: ``lora_rank=4, lora_alpha=4`` on ``to_q, to_k, to_v, to_out.0``.
* CFG in training: DDPO's ``train.cfg`` runs both branches in one forward and backpropagates
  through both: ``policy.kwargs.detach_uncond=false``.
* Precision: ``mixed_precision="fp16"``; the frozen weights in fp16, as DDPO's
  ``inference_dtype``.
* Prompts: DDPO's ``simple_animals`` list is not embedded; the recipes default to the bundled
  ``t2i_simple`` set (``--set prompts.dataset=my_prompts.txt``).

Remaining differences: DDPO uses CompVis/stable-diffusion-v1-4, these recipes its successor
``stable-diffusion-v1-5/stable-diffusion-v1-5`` (same architecture and scheduler); genrl
shuffles (sample, timestep) transitions over the whole rollout, DDPO the samples and then each
sample's timesteps; held-out evaluation samples deterministic DDIM, which DDPO does not run.
"""

from __future__ import annotations

from genrl.algorithms.ddim_grpo import DDIMGRPOConfig
from genrl.algorithms.ddpo import DDPOConfig
from genrl.run.config import (
    DDIMSamplingConfig,
    EvalConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)

SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
SDXL_BASE = "stabilityai/stable-diffusion-xl-base-1.0"
DDPO_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _ddpo_base(recipe: str, reward: RewardSpec) -> TrainConfig:
    """DDPO's ``aesthetic`` settings on SD 1.5 (module docstring): 512 px, LoRA r4 / alpha 4;
    50 DDIM steps at eta 1 with CFG 5 in rollouts and training (both branches trained); every
    step trained, in a random order; clip 1e-4; per-prompt buffers of 32 rewards, min count 16;
    advantages clipped at 5; AdamW 3e-4, betas (0.9, 0.999), wd 1e-4, eps 1e-8; grad-norm 1;
    fp16; 256 images per iteration, two optimizer steps; 200 iterations."""
    return TrainConfig(
        recipe=recipe,
        policy=PolicyConfig(
            name="sd",
            pretrained=SD15,
            lora_rank=4,
            lora_alpha=4,
            lora_target_modules=list(DDPO_LORA_TARGETS),
            dtype="float16",
            kwargs={"height": 512, "width": 512, "detach_uncond": False},
        ),
        sampler=DDIMSamplingConfig(
            num_steps=50, noise_level=1.0, guidance_scale=5.0, eval_num_steps=50
        ),
        reward=[reward],
        algorithm=DDPOConfig(
            clip_range=1e-4,
            advantage_clip=5.0,
            timestep_fraction=1.0,
            stat_buffer_size=32,
            stat_min_count=16,
        ),
        prompts=PromptConfig(dataset="t2i_simple"),
        train=TrainLoopConfig(
            iterations=200,
            prompts_per_iteration=32,
            group_size=8,
            minibatch_size=4,
            # 256 samples / 8 processes * 50 steps / 4 per minibatch / 2 optimizer steps.
            gradient_accumulation_steps=200,
            rollout_batch_size=8,
            mixed_precision="fp16",
        ),
        optim=OptimConfig(
            lr=3e-4, weight_decay=1e-4, betas=[0.9, 0.999], eps=1e-8, max_grad_norm=1.0
        ),
        eval=EvalConfig(every=20, samples_per_prompt=4, batch_size=16),
        logging=LoggingConfig(checkpoint_every=20, log_every=1),
    )


def sd15_aesthetic_ddpo() -> TrainConfig:
    """SD 1.5 + the LAION aesthetic predictor: DDPO's ``aesthetic`` config (``_ddpo_base``).

    Remaining differences: those of the module docstring."""
    return _ddpo_base("sd15_aesthetic_ddpo", RewardSpec(name="aesthetic"))


def sd15_pickscore_ddpo() -> TrainConfig:
    """SD 1.5 + PickScore with DDPO's ``aesthetic`` settings (DDPO has no PickScore config).

    Remaining differences: those of the module docstring."""
    return _ddpo_base("sd15_pickscore_ddpo", RewardSpec(name="pickscore"))


def sd15_imagereward_ddpo() -> TrainConfig:
    """SD 1.5 + ImageReward v1.0 with DDPO's ``aesthetic`` settings (DDPO has no ImageReward
    config).

    Remaining differences: those of the module docstring."""
    return _ddpo_base("sd15_imagereward_ddpo", RewardSpec(name="image_reward"))


def sd15_pickscore_grpo() -> TrainConfig:
    """SD 1.5 + PickScore with Flow-GRPO's objective on DDIM trajectories (``ddim_grpo``) and
    the settings of Flow-GRPO's ``pickscore_sd3`` where they carry over: groups of 24 over 48
    prompts, 10 stochastic steps (eta 1) with CFG 4.5, 9 of them trained in order, clip 1e-4,
    KL beta 0.01, global std, zero-advantage samples dropped; DDPO's LoRA and 512 px.

    Remaining differences: Flow-GRPO trains SD3 (a flow model) and has no SD 1.5 config; its
    SDE noise level 0.7 has no DDIM counterpart, eta 1 is DDPO's."""
    config = _ddpo_base("sd15_pickscore_grpo", RewardSpec(name="pickscore"))
    config.sampler = DDIMSamplingConfig(
        num_steps=10, noise_level=1.0, guidance_scale=4.5, eval_num_steps=50
    )
    config.set_algorithm(
        DDIMGRPOConfig(
            clip_range=1e-4,
            kl_beta=0.01,
            timestep_fraction=0.99,
            std_mode="global",
            advantage_clip=5.0,
        )
    )
    config.train.prompts_per_iteration, config.train.group_size = 48, 24
    # 1152 samples / 8 processes * 9 trained steps / 9 per minibatch / 2 optimizer steps.
    config.train.minibatch_size, config.train.gradient_accumulation_steps = 9, 72
    config.train.rollout_batch_size = 9
    config.train.iterations = 1000
    return config


def sdxl_pickscore_ddpo() -> TrainConfig:
    """SDXL base 1.0 at 1024 px + PickScore with DDPO's ``aesthetic`` settings (DDPO trains SD
    1.4 only): 50 DDIM steps at eta 1, CFG 5, LoRA r4 on the UNet's attention, fp16 (the VAE
    kept in float32, as the stock SDXL pipeline upcasts it to decode), 4 images per forward.

    Remaining differences: those of the module docstring; the size conditioning is the stock
    call's default (original = target = 1024 px, no crop)."""
    config = _ddpo_base("sdxl_pickscore_ddpo", RewardSpec(name="pickscore"))
    config.policy.name, config.policy.pretrained = "sdxl", SDXL_BASE
    config.policy.kwargs = {"height": 1024, "width": 1024, "detach_uncond": False}
    config.train.rollout_batch_size = 4
    return config


DIFFUSION_RECIPES = {
    "sd15_aesthetic_ddpo": sd15_aesthetic_ddpo,
    "sd15_pickscore_ddpo": sd15_pickscore_ddpo,
    "sd15_imagereward_ddpo": sd15_imagereward_ddpo,
    "sd15_pickscore_grpo": sd15_pickscore_grpo,
    "sdxl_pickscore_ddpo": sdxl_pickscore_ddpo,
}
