"""Qwen-Image recipes with Flow-GRPO's and verl-omni's published settings (need a GPU and the
hub weights; the tests run them on tiny stand-ins).

Sources, read for these recipes:

* Flow-GRPO (github.com/yifan123/flow_grpo): ``config/grpo.py`` ``pickscore_qwenimage`` (and
  its ``_8gpu`` twin; the index's version at commit 31c71b9) over ``config/base.py`` (at
  54809b5). The index holds no
  ``scripts/train_qwenimage.py`` (only ``train_qwenimage_edit_plus.py`` for Qwen-Image-Edit-2509),
  so what that script decides is **not found**: LoRA rank, alpha, targets and init, the text
  encoder's ``max_sequence_length``, and whether CFG gradients flow through both branches.
  ``config/grpo.py`` has **no Qwen-Image OCR config** (its OCR configs are
  ``general_ocr_sd3*`` for SD3.5-medium, ``reward_fn={"ocr": 1.0}`` with KL 0.04, and
  ``general_ocr_wan2_1``).
* verl-omni (github.com/verl-project/verl-omni, snapshot a1139ba):
  ``examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh`` over the defaults of
  ``verl_omni/trainer/config/`` (``diffusion_trainer.yaml``, ``diffusion/actor/diffusion_actor.yaml``,
  ``diffusion/actor/dp_diffusion_actor.yaml``, ``optim/fsdp.yaml``,
  ``diffusion/model/diffusion_model.yaml``, ``diffusion/rollout/diffusion_rollout.yaml``), the
  OCR data script ``examples/flowgrpo_trainer/data_process/qwenimage_ocr.py`` and the reward
  ``verl_omni/utils/reward_score/genrm_ocr.py``.

Translation shared with ``genrl/recipes/images.py``: the global batch is
``prompts_per_iteration * group_size``; ``gradient_accumulation_steps`` is set for 8 processes
so that an iteration takes the reference's two optimizer steps; prompts default to a bundled set.
CFG is Qwen-Image's "true CFG" (``true_cfg_scale`` with the empty negative prompt, rescaled to
the conditional norm: ``pipelines/diffusers/qwenimage.py``), which is ``sampler.guidance_scale`` here.
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
    TrainConfig,
    TrainLoopConfig,
)

QWEN_IMAGE = "Qwen/Qwen-Image"

# run_qwen_image_ocr_lora.sh: actor_rollout_ref.model.target_modules.
VERL_OMNI_QWEN_LORA_TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
]


def qwenimage_pickscore() -> TrainConfig:
    """Qwen-Image + PickScore: Flow-GRPO's ``pickscore_qwenimage``, field by field:

    * ``pretrained.model = "Qwen/Qwen-Image"``; ``resolution = 512``; ``use_lora = True``;
      ``mixed_precision = "bf16"`` -> bf16 weights and autocast;
      ``activation_checkpointing = True`` -> ``gradient_checkpointing``;
    * ``sample.num_steps = 10``, ``eval_num_steps = 50``, ``guidance_scale = 4`` (true CFG,
      also in training: base ``train.cfg = True``);
    * ``sample.noise_level = 1.2``, ``sde_window_size = 2``, ``sde_window_range = (0,
      num_steps // 2)``: SDE (base's default sampler) on 2 consecutive steps starting in
      ``[0, 5)``, ODE elsewhere; only window steps are trained (base ``timestep_fraction``
      1.0 of them);
    * 32 GPUs x ``train_batch_size`` 4 x ``num_batches_per_epoch`` ``int(32 / (32 * 4 / 16))``
      = 4 -> 512 samples, ``num_image_per_prompt`` 16 -> 32 prompts x 16;
      ``train.batch_size = 4`` per forward; ``gradient_accumulation_steps =
      num_batches_per_epoch // 2`` -> two optimizer steps per iteration;
      ``num_inner_epochs = 1``;
    * ``train.beta = 0`` (no KL); ``sample.global_std = True``; ``train.ema = False``;
      ``per_prompt_stat_tracking = True``; base: ``clip_range`` 1e-4, ``adv_clip_max`` 5, AdamW
      ``lr`` 3e-4, betas (0.9, 0.999), ``weight_decay`` 1e-4, ``eps`` 1e-8, ``max_grad_norm``
      1.0;
    * ``save_freq = eval_freq = 30``; ``sample.test_batch_size = 4``;
      ``reward_fn = {"pickscore": 1.0}``; ``fsdp_optimizer_offload = True`` (launch with the
      shipped FSDP config to match).

    Not found (``scripts/train_qwenimage.py`` is not in the stored repository): LoRA rank,
    alpha, targets and init -> verl-omni's Qwen-Image values (r64 / alpha 128 on its 12
    targets, Gaussian init, ``qwenimage_ocr``); the prompt length -> the pipeline's default
    (512); CFG gradients -> genrl's default (unconditional branch detached).
    Remaining differences: prompts are the bundled ``t2i_simple`` set (the reference trains on
    ``dataset/pickscore``); the reference runs until stopped (1000 iterations here).
    """
    return TrainConfig(
        recipe="qwenimage_pickscore",
        policy=PolicyConfig(
            name="qwenimage",
            pretrained=QWEN_IMAGE,
            lora_rank=64,
            lora_alpha=128,
            lora_target_modules=list(VERL_OMNI_QWEN_LORA_TARGETS),
            dtype="bfloat16",
            gradient_checkpointing=True,
            kwargs={"height": 512, "width": 512, "lora_init": "gaussian"},
        ),
        sampler=SDESamplingConfig(
            num_steps=10,
            noise_level=1.2,
            guidance_scale=4.0,
            sde_window_size=2,
            sde_window_range=[0, 5],
            eval_num_steps=50,
        ),
        reward=[RewardSpec(name="pickscore")],
        algorithm=FlowGRPOConfig(
            clip_range=1e-4,
            kl_beta=0.0,
            timestep_fraction=1.0,
            std_mode="global",
            advantage_clip=5.0,
        ),
        prompts=PromptConfig(dataset="t2i_simple"),
        train=TrainLoopConfig(
            iterations=1000,
            prompts_per_iteration=32,
            group_size=16,
            minibatch_size=4,
            # 512 samples / 8 processes * 2 window steps / 4 per minibatch / 2 optimizer steps.
            gradient_accumulation_steps=16,
            rollout_batch_size=4,
            mixed_precision="bf16",
        ),
        optim=OptimConfig(
            lr=3e-4, weight_decay=1e-4, betas=[0.9, 0.999], eps=1e-8, max_grad_norm=1.0
        ),
        eval=EvalConfig(every=30, samples_per_prompt=4, batch_size=4),
        logging=LoggingConfig(checkpoint_every=30, log_every=1),
    )


def qwenimage_ocr() -> TrainConfig:
    """Qwen-Image + OCR: verl-omni's ``run_qwen_image_ocr_lora.sh`` (Flow-GRPO), field by field:

    * ``model.path=Qwen/Qwen-Image``; ``lora_rank=64``, ``lora_alpha=128``, its 12
      ``target_modules`` (attention and both streams' MLPs); model defaults
      ``lora_init_weights: gaussian``, ``enable_gradient_checkpointing: True``;
      ``fsdp_config.model_dtype=bfloat16`` (rollout ``dtype: bfloat16``);
    * ``data.train_batch_size=32`` prompts x ``rollout.n=16``; ``ppo_mini_batch_size=16``
      prompts (x n = 256 samples, as verl counts it) -> two optimizer steps per iteration;
      ``ppo_micro_batch_size_per_gpu=16`` per forward; ``ppo_epochs: 1``;
    * ``optim.lr=3e-4``, ``weight_decay=0.0001``; ``optim/fsdp.yaml``: AdamW, betas
      (0.9, 0.999), constant schedule; ``dp_diffusion_actor.yaml``: ``grad_clip: 1.0``;
    * ``diffusion_loss.clip_ratio=1e-5``; actor defaults ``adv_clip_max: 5.0``,
      ``ref_kl_coef: 0.0`` and ``use_kl_loss: false`` (no KL); ``algorithm.global_std: True``,
      ``norm_adv_by_std_in_grpo: True``, ``timestep_fraction: 1.0``;
    * rollout ``pipeline.true_cfg_scale=4.0``, ``max_sequence_length=256``
      (``data.max_prompt_length=256``); defaults ``height``/``width`` 512,
      ``num_inference_steps: 10``;
    * ``algo.noise_level=1.2``, ``sde_type="sde"`` (Flow-GRPO's SDE), ``sde_window_size=2``,
      ``sde_window_range="[0,5]"``;
    * ``val_kwargs``: ``num_inference_steps=50``, ``noise_level=0.0`` (ODE evaluation);
    * ``save_freq=30``, ``test_freq=30``, ``total_training_steps=300``;
    * reward ``genrm_ocr.compute_score_ocr``: ``1 - min(d, n) / n`` between the transcription
      and the prompt's quoted text (``qwenimage_ocr.py`` extracts the ground truth as
      ``text.split('"')[1]``), Flow-GRPO's OCR rule -> genrl's ``ocr`` reward.

    Remaining differences: verl-omni's reader is Qwen3-VL-8B-Instruct served by vLLM (sampled at
    temperature 0.7), Flow-GRPO's PaddleOCR; genrl's ``ocr`` reads with a transformers TrOCR
    model (``reward_models/ocr.py``; ``--set reward.0.kwargs.model=...`` for another). Prompts:
    the bundled ``ocr_simple`` set instead of Flow-GRPO's ``dataset/ocr``; verl-omni wraps them
    in Qwen-Image's own system prompt, which ``QwenImagePipeline.encode_prompt`` adds here too.
    """
    config = qwenimage_pickscore()
    config.recipe = "qwenimage_ocr"
    config.policy.kwargs = {
        "height": 512,
        "width": 512,
        "lora_init": "gaussian",
        "max_sequence_length": 256,
    }
    config.reward = [RewardSpec(name="ocr")]
    assert isinstance(config.algorithm, FlowGRPOConfig)
    config.algorithm.clip_range = 1e-5
    config.prompts = PromptConfig(dataset="ocr_simple")
    config.train.iterations = 300
    config.train.minibatch_size = 16
    # 512 samples / 8 processes * 2 window steps / 16 per minibatch / 2 optimizer steps.
    config.train.gradient_accumulation_steps = 4
    config.train.rollout_batch_size = 16
    config.optim.eps = 1e-8  # torch AdamW's default (optim/fsdp.yaml sets none)
    return config


QWENIMAGE_RECIPES = {"qwenimage_pickscore": qwenimage_pickscore, "qwenimage_ocr": qwenimage_ocr}
