"""Names, one-sentence descriptions and needs of every recipe, importable without torch.

``genrl --help``, argument errors and the recipe check before a run starts read this table
instead of ``genrl.recipes`` (which imports torch and every algorithm), so that they answer in
a fraction of a second. ``tests/test_cli_speed.py`` checks that it names exactly the functions
of ``genrl.recipes.RECIPES`` and that its flags agree with the configs they build.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class RecipeEntry:
    """One recipe as ``genrl list`` shows it.

    Attributes:
        module: the module defining the recipe function (``genrl.recipes.<file>``).
        function: its name there.
        description: what it trains, in one sentence (the docstring has the details).
        needs_gpu: too large for a CPU in useful time.
        needs_download: its model weights (or data) come from the Hugging Face Hub.
    """

    module: str
    function: str
    description: str
    needs_gpu: bool = False
    needs_download: bool = False


def _embedded(module: str, function: str, description: str) -> RecipeEntry:
    return RecipeEntry(f"genrl.recipes.{module}", function, description)


def _hub(module: str, function: str, description: str) -> RecipeEntry:
    return RecipeEntry(f"genrl.recipes.{module}", function, description, True, True)


_ENTRIES: tuple[tuple[str, RecipeEntry], ...] = (
    # Embedded digits task (weights shipped in genrl/assets).
    ("digits_flow_grpo", _embedded("digits", "digits_flow_grpo",
        "Flow-GRPO, full fine-tuning of the 660k-parameter digits generator against the digit "
        "classifier (the default job).")),
    ("digits_flow_grpo_lora", _embedded("digits", "digits_flow_grpo_lora",
        "The default job through a peft LoRA adapter (reference = adapter disabled).")),
    ("digits_branch_grpo", _embedded("digits", "digits_branch_grpo",
        "BranchGRPO on the digits task: each prompt's 8 samples are the leaves of one tree "
        "split at steps 0, 3 and 6.")),
    # Real image models.
    ("sd35m_pickscore", _hub("images", "sd35m_pickscore",
        "SD3.5-medium + PickScore with Flow-GRPO's pickscore_sd3 settings.")),
    ("sd35m_pickscore_fast", _hub("images", "sd35m_pickscore_fast",
        "SD3.5-medium + PickScore with Flow-GRPO-Fast (CPS noise in a 3-step SDE window, no "
        "CFG).")),
    ("sd35m_imagereward", _hub("images", "sd35m_imagereward",
        "SD3.5-medium + ImageReward v1.0 with the sd35m_pickscore settings.")),
    ("sd35m_vqascore", _hub("images", "sd35m_vqascore",
        "SD3.5-medium rewarded by VQAScore with Qwen2.5-VL-7B-Instruct as the judge.")),
    ("flux_dev_pickscore", _hub("images", "flux_dev_pickscore",
        "FLUX.1-dev + PickScore with Flow-GRPO's pickscore_flux settings.")),
    ("flux_dev_hps", _hub("images", "flux_dev_hps",
        "FLUX.1-dev + HPSv2.1 with the flux_dev_pickscore settings.")),
    ("flux_dev_hps_branch", _hub("images", "flux_dev_hps_branch",
        "BranchGRPO on FLUX.1-dev + HPSv2.1, after the reference's FLUX script.")),
    ("sd35m_pickscore_branch", _hub("images", "sd35m_pickscore_branch",
        "BranchGRPO on SD3.5-medium + PickScore with the sd35m_pickscore settings.")),
    ("sana_clipscore", _hub("images", "sana_clipscore",
        "SANA-600M (512 px) + CLIPScore with Flow-GRPO's clipscore_sd3 settings.")),
    # Classic diffusion (epsilon / v prediction), sampled with DDIM.
    ("sd15_aesthetic_ddpo", _hub("diffusion", "sd15_aesthetic_ddpo",
        "SD 1.5 + LAION aesthetic score with DDPO's released aesthetic settings.")),
    ("sd15_pickscore_ddpo", _hub("diffusion", "sd15_pickscore_ddpo",
        "SD 1.5 + PickScore with DDPO (the aesthetic settings).")),
    ("sd15_imagereward_ddpo", _hub("diffusion", "sd15_imagereward_ddpo",
        "SD 1.5 + ImageReward v1.0 with DDPO (the aesthetic settings).")),
    ("sd15_pickscore_grpo", _hub("diffusion", "sd15_pickscore_grpo",
        "SD 1.5 + PickScore with Flow-GRPO's objective on DDIM trajectories (ddim_grpo).")),
    ("sdxl_pickscore_ddpo", _hub("diffusion", "sdxl_pickscore_ddpo",
        "SDXL base 1.0 (1024 px) + PickScore with DDPO.")),
    ("qwenimage_pickscore", _hub("qwenimage", "qwenimage_pickscore",
        "Qwen-Image + PickScore with Flow-GRPO's pickscore_qwenimage settings.")),
    ("qwenimage_ocr", _hub("qwenimage", "qwenimage_ocr",
        "Qwen-Image + OCR after verl-omni's Flow-GRPO script.")),
    # Real video models.
    ("wan21_1_3b_flow_grpo", _hub("wan", "wan21_1_3b_flow_grpo",
        "Wan2.1-T2V-1.3B video with Flow-GRPO's general_ocr_wan2_1 settings.")),
    ("wan21_14b_flow_grpo", _hub("wan", "wan21_14b_flow_grpo",
        "Wan2.1-T2V-14B with the wan21_1_3b_flow_grpo settings (shard it with FSDP).")),
    ("wan21_1_3b_dance_grpo", _hub("wan", "wan21_1_3b_dance_grpo",
        "Wan2.1-T2V-1.3B as an image model (one frame, HPSv2.1) after DanceGRPO's Wan script.")),
    ("wan21_1_3b_branch_grpo", _hub("wan", "wan21_1_3b_branch_grpo",
        "BranchGRPO's tree on Wan2.1-T2V-1.3B video with the wan21_1_3b_flow_grpo settings.")),
    ("ltx_video_flow_grpo", _hub("video_models", "ltx_video_flow_grpo",
        "LTX-Video (2B) with the wan21_1_3b_flow_grpo settings and LTX's own CFG and decoding.")),
    ("hunyuan_video15_flow_grpo", _hub("video_models", "hunyuan_video15_flow_grpo",
        "HunyuanVideo 1.5 (8.3B, 480p) with the wan21_1_3b_flow_grpo settings and CFG 6.")),
    ("wan22_a14b_flow_grpo", _hub("video_models", "wan22_a14b_flow_grpo",
        "Wan2.2-T2V-A14B, LoRA on both experts, with the wan21_1_3b_flow_grpo settings.")),
    # Other objectives on the digits task and real image models.
    ("digits_ram", _embedded("objectives", "digits_ram",
        "RAM on the digits task: ODE endpoints from a lagged copy, regressed with 8 noisings "
        "each.")),
    ("digits_gdro", _embedded("objectives", "digits_gdro",
        "GDRO online on the digits task (tau 0.05, gamma 1, beta 1).")),
    ("digits_gdro_offline", _embedded("objectives", "digits_gdro_offline",
        "GDRO offline: the reference model samples 160 groups once, training makes 6 passes.")),
    ("digits_diffusion_nft", _embedded("objectives", "digits_diffusion_nft",
        "DiffusionNFT on the digits task with the released code's defaults.")),
    ("digits_dgpo", _embedded("objectives", "digits_dgpo",
        "DGPO on the digits task: group-level DPO on ODE endpoints, released OCR settings.")),
    ("digits_awm", _embedded("objectives", "digits_awm",
        "AWM on the digits task: advantage-weighted flow matching on ODE endpoints, released "
        "GenEval settings.")),
    ("sd35m_pickscore_ram", _hub("objectives", "sd35m_pickscore_ram",
        "RAM on SD3.5-medium + PickScore with the released pickscore_sd3 settings.")),
    ("sd35m_pickscore_nft", _hub("objectives", "sd35m_pickscore_nft",
        "DiffusionNFT on SD3.5-medium + PickScore with the released sd3_pickscore settings.")),
    ("flux_dev_hps_gdro", _hub("objectives", "flux_dev_hps_gdro",
        "GDRO offline on FLUX.1-dev + HPSv2.1 from 2,048 stored groups of 6.")),
    # Text.
    ("llm_countdown_grpo", _embedded("text", "llm_countdown_grpo",
        "GRPO on the embedded 792k-parameter Countdown LM.")),
    ("llm_countdown_mc_grpo", _embedded("text", "llm_countdown_mc_grpo",
        "MC-GRPO on the embedded Countdown LM: groups of 3, the median completion left out.")),
    ("llm_countdown_mssr", _embedded("text", "llm_countdown_mssr",
        "MSSR on the embedded Countdown LM: one completion per prompt against a tracked "
        "baseline.")),
    ("qwen3_countdown_grpo", _hub("text", "qwen3_countdown_grpo",
        "Qwen3-0.6B with LoRA on Countdown through its chat template, TRL's GRPO defaults.")),
    ("llm_countdown_exgrpo", _embedded("replay", "llm_countdown_exgrpo",
        "ExGRPO on the embedded Countdown LM: half the prompts replay stored correct "
        "completions, with the mixed-policy loss.")),
    ("llm_countdown_grpo_reuse", _embedded("replay", "llm_countdown_grpo_reuse",
        "GRPO on the embedded Countdown LM with AR3PO's reuse of earlier correct completions.")),
    ("dllm_sudoku_maskgrpo", _embedded("dllm", "dllm_sudoku_maskgrpo",
        "MaskGRPO on the embedded 288k-parameter 4x4 Sudoku masked-diffusion LM.")),
    ("dllm_sudoku_d1", _embedded("dllm", "dllm_sudoku_d1",
        "diffu-GRPO (d1) on the embedded Sudoku masked-diffusion LM.")),
    ("llada8b_countdown_maskgrpo", _hub("dllm", "llada8b_countdown_maskgrpo",
        "MaskGRPO on LLaDA-8B-Instruct with LoRA, on Countdown.")),
    # Masked image-token generators.
    ("amused256_maskgrpo_hps", _hub("masked_images", "amused256_maskgrpo_hps",
        "MaskGRPO on aMUSEd-256 with LoRA against HPSv2.1: emerge-sampler rollouts, uniform "
        "re-masked views.")),
    ("compositional_discrete_maskgrpo", _embedded("masked_images", "compositional_discrete_maskgrpo",
        "MaskGRPO on the embedded 32x32 aMUSEd pipeline (VQ tokens + U-ViT) of the compositional "
        "task.")),
    ("compositional_discrete_d1", _embedded("masked_images", "compositional_discrete_d1",
        "diffu-GRPO (d1) on the embedded 32x32 aMUSEd pipeline of the compositional task.")),
    # Vision-language models.
    ("qwen25vl_3b_geo_grpo", _hub("qwen_vl", "qwen25vl_3b_geo_grpo",
        "Qwen2.5-VL-3B-Instruct on Geometry3K with EasyR1's GRPO recipe (2 processes).")),
    ("qwen25vl_7b_geo_grpo", _hub("qwen_vl", "qwen25vl_7b_geo_grpo",
        "Qwen2.5-VL-7B-Instruct on Geometry3K with the 3B recipe's settings (8 processes).")),
    ("qwen25vl_7b_geo_grpo_lora", _hub("qwen_vl", "qwen25vl_7b_geo_grpo_lora",
        "Qwen2.5-VL-7B-Instruct on Geometry3K with LoRA on one GPU.")),
    # Embedded video, compositional and VLM tasks.
    ("video_digits_flow_grpo", _embedded("video_digits", "video_digits_flow_grpo",
        "Flow-GRPO on the embedded 1.4M-parameter moving-digit clip generator.")),
    ("video_digits_diffusion_nft", _embedded("video_digits", "video_digits_diffusion_nft",
        "DiffusionNFT on the embedded moving-digit clip generator.")),
    ("compositional_flow_grpo", _embedded("compositional", "compositional_flow_grpo",
        "Flow-GRPO on the embedded 1.1M-parameter text-to-shapes generator, GenEval-style "
        "rewards.")),
    ("compositional_flow_grpo_strict", _embedded("compositional", "compositional_flow_grpo_strict",
        "The compositional run rewarded by strict correctness (nothing extra on the canvas).")),
    ("compositional_flow_grpo_fast", _embedded("compositional_methods", "compositional_flow_grpo_fast",
        "Flow-GRPO-Fast (CPS in a 3-step SDE window) on the compositional task, same budget.")),
    ("compositional_mix_grpo", _embedded("compositional_methods", "compositional_mix_grpo",
        "MixGRPO (a sliding SDE window, ODE elsewhere) on the compositional task, same budget.")),
    ("compositional_cps", _embedded("compositional_methods", "compositional_cps",
        "Flow-GRPO with the coefficients-preserving sampler on the compositional task, same budget.")),
    ("compositional_dance_grpo", _embedded("compositional_methods", "compositional_dance_grpo",
        "DanceGRPO (its constant-diffusion SDE) on the compositional task, same budget.")),
    ("compositional_branch_grpo", _embedded("compositional_methods", "compositional_branch_grpo",
        "BranchGRPO (each prompt's samples as one branching tree) on the compositional task, same budget.")),
    ("compositional_ram", _embedded("compositional_methods", "compositional_ram",
        "RAM (reward-weighted regression on ODE endpoints) on the compositional task, same budget.")),
    ("compositional_gdro", _embedded("compositional_methods", "compositional_gdro",
        "GDRO online (group ranking of implicit rewards) on the compositional task, same budget.")),
    ("compositional_gdro_offline", _embedded("compositional_methods", "compositional_gdro_offline",
        "GDRO offline: the reference model samples the whole budget once, then trains on it.")),
    ("compositional_diffusion_nft", _embedded("compositional_methods", "compositional_diffusion_nft",
        "DiffusionNFT (CFG-free positive/negative velocity regression) on the compositional task, same budget.")),
    ("compositional_dgpo", _embedded("compositional_methods", "compositional_dgpo",
        "DGPO (group DPO on the lagged copy's ODE samples) on the compositional task, same budget.")),
    ("compositional_awm", _embedded("compositional_methods", "compositional_awm",
        "AWM (advantage-weighted flow matching) on the compositional task, same budget.")),
    ("compositional_marble", _embedded("multi_reward", "compositional_marble",
        "MARBLE (per-reward advantages, min-norm balanced gradients) on the compositional score and the artifact probe.")),
    ("compositional_marble_weighted_sum", _embedded("multi_reward", "compositional_marble_weighted_sum",
        "DiffusionNFT on the weighted sum of the compositional score and the artifact probe (MARBLE's baseline).")),
    ("vlm_shapes_grpo", _embedded("vlm", "vlm_shapes_grpo",
        "GRPO on the embedded tiny Qwen2-VL over the shapes VQA task.")),
    ("vlm_shapes_rubric", _embedded("vlm", "vlm_shapes_rubric",
        "vlm_shapes_grpo rewarded by a rubric (answer correct, one word).")),
)  # fmt: skip

CATALOG: dict[str, RecipeEntry] = dict(_ENTRIES)
DEFAULT_RECIPE = "digits_flow_grpo"


def unknown_recipe_message(name: str) -> str | None:
    """None for a known recipe; else the error naming it, the closest name and the known ones."""
    if name in CATALOG:
        return None
    close = difflib.get_close_matches(name, list(CATALOG), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown recipe {name!r}.{hint} Known: {', '.join(CATALOG)}"


__all__ = ["CATALOG", "DEFAULT_RECIPE", "RecipeEntry", "unknown_recipe_message"]
