"""Recipes for the text-to-video families beyond Wan 2.1 (need a GPU and the hub weights):
LTX-Video, HunyuanVideo 1.5 and Wan 2.2 A14B (two experts).

No released RL script trains these models (Flow-GRPO's, DanceGRPO's and BranchGRPO's video code
is for Wan 2.1), so each recipe is ``genrl.recipes.wan.wan21_1_3b_flow_grpo`` (Flow-GRPO's
``general_ocr_wan2_1``: its sampler, objective, LoRA, optimizer and PickScore on every 4th of
33 frames over the ``t2v_simple`` prompts) on the family's checkpoint, with the family's own
sampling settings from its diffusers pipeline and model card: not a reproduction of any
released result. The hub ids are the ones diffusers' pipeline docstrings load.

Each runs on the tiny stand-ins of ``tests/`` with ``policy.pretrained`` (and the reward's
``model``) pointing at them (``tests/test_video_recipes.py``).
"""

from __future__ import annotations

from genrl.recipes.wan import wan21_1_3b_flow_grpo
from genrl.run.config import TrainConfig

LTX_VIDEO = "Lightricks/LTX-Video"
HUNYUAN_VIDEO15_480P = "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v"
FRAMES = 33  # as wan21_1_3b_flow_grpo: num_frames - 1 is a multiple of 8 (LTX) and 4 (Hunyuan)


def ltx_video_flow_grpo() -> TrainConfig:
    """LTX-Video (2B, 0.9.x) with the ``wan21_1_3b_flow_grpo`` settings at 256 x 416 (LTX needs
    multiples of 32), 33 frames; CFG 3 (``LTXPipeline``'s default) with the negative prompt of
    its docstring; T5 at the pipeline's 128 tokens; decode timestep 0.05 and noise 0.025 (the
    model card's values for the timestep-conditioned 0.9.1+ VAE; the 0.9.0 VAE ignores them);
    LoRA on the attention projections (``FlowImagePolicy``'s default targets)."""
    config = wan21_1_3b_flow_grpo()
    config.recipe = "ltx_video_flow_grpo"
    config.policy.name = "ltx"
    config.policy.pretrained = LTX_VIDEO
    config.policy.lora_target_modules = None
    config.policy.kwargs = {
        "height": 256,
        "width": 416,
        "num_frames": FRAMES,
        "max_sequence_length": 128,
        "negative_prompt": "worst quality, inconsistent motion, blurry, jittery, distorted",
        "decode_timestep": 0.05,
        "decode_noise_scale": 0.025,
        "lora_init": "gaussian",
        "detach_uncond": False,
    }
    config.apply_overrides(["sampler.guidance_scale=3.0"])
    return config


def hunyuan_video15_flow_grpo() -> TrainConfig:
    """HunyuanVideo 1.5 (8.3B, 480p text-to-video) with the ``wan21_1_3b_flow_grpo`` settings at
    240 x 416, 33 frames; CFG 6 (``guidance_scale`` in the ``model_index.json`` of Tencent's
    original-format release, tencent/HunyuanVideo-1.5 refs/pr/1) with the empty negative prompt; Qwen2.5-VL at the pipeline's
    1000 tokens; LoRA on the attention projections. At 8.3B the frozen bf16 weights take 17 GB
    besides the 7B text encoder: shard with an ``accelerate`` FSDP config on small GPUs."""
    config = wan21_1_3b_flow_grpo()
    config.recipe = "hunyuan_video15_flow_grpo"
    config.policy.name = "hunyuan_video15"
    config.policy.pretrained = HUNYUAN_VIDEO15_480P
    config.policy.lora_target_modules = None
    config.policy.kwargs = {
        "height": 240,
        "width": 416,
        "num_frames": FRAMES,
        "negative_prompt": "",
        "lora_init": "gaussian",
        "detach_uncond": False,
    }
    config.apply_overrides(["sampler.guidance_scale=6.0"])
    return config


WAN22_A14B = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def wan22_a14b_flow_grpo() -> TrainConfig:
    """Wan2.2-T2V-A14B (two 14B experts switched at the checkpoint's ``boundary_ratio``) with
    the ``wan21_1_3b_flow_grpo`` settings, LoRA on both experts (``train_experts="both"``;
    each trained step goes through the expert of its timestep). Both experts take the same CFG
    scale (4.5; the pipeline's separate ``guidance_scale_2`` is not reproduced). The frozen
    bf16 weights take 57 GB: shard with an ``accelerate`` FSDP config."""
    config = wan21_1_3b_flow_grpo()
    config.recipe = "wan22_a14b_flow_grpo"
    config.policy.pretrained = WAN22_A14B
    config.policy.kwargs = {**config.policy.kwargs, "train_experts": "both"}
    return config


VIDEO_MODEL_RECIPES = {
    "ltx_video_flow_grpo": ltx_video_flow_grpo,
    "hunyuan_video15_flow_grpo": hunyuan_video15_flow_grpo,
    "wan22_a14b_flow_grpo": wan22_a14b_flow_grpo,
}
