"""Recipes for real diffusers text-to-image checkpoints (need a GPU and the hub weights).

Hyper-parameters follow the Flow-GRPO reference configs (yifan123/flow_grpo, ``config/grpo.py``:
``pickscore_sd3``, ``pickscore_sd3_fast_nocfg``, ``clipscore_sd3``, ``pickscore_flux``), translated to genrl's fields:

* Reference: 48 prompts x 24 images per epoch on 32 GPUs, two optimizer steps per epoch. Here
  ``prompts_per_iteration * group_size`` is the same global batch; ``gradient_accumulation_steps``
  is set for 8 processes to keep two optimizer steps per iteration (scale it with the process
  count: ``units per process / (minibatch_size * 2)``).
* ``kl_beta``: the reference KL divides by ``sigma_s^2``, ours is the exact transition KL
  (divides by ``sigma_s^2 |dt|``), so the reference's beta is multiplied by ``1 / num_steps``.
* Prompts: the reference trains on the Pick-a-Pic prompt file; these recipes default to the
  bundled ``t2i_simple`` set (``--set prompts.dataset=my_prompts.txt`` to change).

Each runs on the tiny stand-ins of ``tests/`` with ``policy.pretrained`` (and the reward's
``model``) pointing at them; on a GPU with the hub ids they are the real thing.
"""

from __future__ import annotations

from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.config import (
    EvalConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    SamplerConfig,
    TrainConfig,
    TrainLoopConfig,
)

SD35_MEDIUM = "stabilityai/stable-diffusion-3.5-medium"
SANA_600M = "Efficient-Large-Model/Sana_600M_512px_diffusers"
FLUX_DEV = "black-forest-labs/FLUX.1-dev"


def _sd3_base(recipe: str, reward: RewardSpec, kl_beta: float) -> TrainConfig:
    """SD3.5-medium at 512 px, LoRA r32/alpha64, 10-step SDE rollouts with CFG 4.5."""
    return TrainConfig(
        recipe=recipe,
        policy=PolicyConfig(
            name="sd3",
            pretrained=SD35_MEDIUM,
            lora_rank=32,
            lora_alpha=64,
            dtype="bfloat16",
            kwargs={"height": 512, "width": 512},
        ),
        sampler=SamplerConfig(num_steps=10, noise_level=0.7, guidance_scale=4.5),
        reward=[reward],
        algorithm=FlowGRPOConfig(
            clip_range=1e-4, kl_beta=kl_beta, timestep_fraction=0.99, std_mode="global"
        ),
        prompts=PromptConfig(dataset="t2i_simple"),
        train=TrainLoopConfig(
            iterations=1000,
            prompts_per_iteration=48,
            group_size=24,
            minibatch_size=9,
            # 1152 samples / 8 processes * 9 trained steps / 9 per minibatch / 2 steps.
            gradient_accumulation_steps=72,
            rollout_batch_size=9,
            mixed_precision="bf16",
        ),
        optim=OptimConfig(
            lr=3e-4, weight_decay=1e-4, max_grad_norm=1.0, ema_decay=0.9, ema_every=8
        ),
        eval=EvalConfig(every=60, samples_per_prompt=4, num_steps=40, batch_size=16),
        logging=LoggingConfig(checkpoint_every=60, log_every=1),
    )


def sd35m_pickscore() -> TrainConfig:
    """SD3.5-medium + PickScore (Flow-GRPO ``pickscore_sd3``: beta 0.01, global std)."""
    return _sd3_base("sd35m_pickscore", RewardSpec(name="pickscore"), kl_beta=0.001)


def sd35m_imagereward() -> TrainConfig:
    """SD3.5-medium + ImageReward v1.0 (``THUDM/ImageReward``, on transformers' BLIP; no
    ``image-reward`` package at run time), with the ``sd35m_pickscore`` settings (Flow-GRPO
    has no ImageReward config): 10 SDE steps at noise 0.7, CFG 4.5, beta 0.001, global std."""
    return _sd3_base("sd35m_imagereward", RewardSpec(name="image_reward"), kl_beta=0.001)


def sd35m_pickscore_fast() -> TrainConfig:
    """SD3.5-medium + PickScore, Flow-GRPO-Fast without CFG (``pickscore_sd3_fast_nocfg``): CPS
    noise 0.8 in a 3-step SDE window within the first half of the steps, clip 1e-5 (the
    reference's log-prob is ``2 std^2`` times ours, 1.1-1.7 for windows there, so the range
    carries over roughly), no KL, 64 x 18. Like the reference, groups do not share initial
    noise; ``--set sampler.same_initial_noise=true`` computes the ODE prefix once per prompt."""
    config = _sd3_base("sd35m_pickscore_fast", RewardSpec(name="pickscore"), kl_beta=0.0)
    config.sampler = SamplerConfig(
        name="flow_cps",
        num_steps=10,
        noise_level=0.8,
        guidance_scale=1.0,
        sde_window_size=3,
        sde_window_range=[0, 5],
    )
    config.algorithm = FlowGRPOConfig(
        clip_range=1e-5,
        kl_beta=0.0,
        std_mode="global",
        cfg_in_training=False,
    )
    config.train.prompts_per_iteration, config.train.group_size = 64, 18
    # 1152 samples / 8 processes * 3 window steps / 9 per minibatch / 2 optimizer steps.
    config.train.gradient_accumulation_steps = 24
    return config


def flux_dev_pickscore() -> TrainConfig:
    """FLUX.1-dev + PickScore (Flow-GRPO ``pickscore_flux``): 6 SDE steps at noise 0.9, the
    guidance embedding at 3.5 and no true CFG, no KL, global std, 48 x 24."""
    config = _sd3_base("flux_dev_pickscore", RewardSpec(name="pickscore"), kl_beta=0.0)
    config.policy.name, config.policy.pretrained = "flux", FLUX_DEV
    config.policy.kwargs = {"height": 512, "width": 512, "embedded_guidance": 3.5}
    config.sampler = SamplerConfig(num_steps=6, noise_level=0.9, guidance_scale=1.0)
    config.algorithm.cfg_in_training = False
    config.eval.num_steps = 28
    # 1152 samples / 8 processes * 5 trained steps / 9 per minibatch / 2 optimizer steps.
    config.train.gradient_accumulation_steps = 40
    return config


def flux_dev_hps() -> TrainConfig:
    """FLUX.1-dev + HPSv2.1 (open_clip ViT-H-14, ``xswu/HPSv2``), DanceGRPO's FLUX reward, with
    the ``flux_dev_pickscore`` settings (Flow-GRPO has no HPS config for FLUX): 6 SDE steps at
    noise 0.9, guidance embedding 3.5, no KL, global std, 48 x 24. HPS scores are cosines
    (~0.25-0.35 for good images), so advantages, not raw rewards, set the step size."""
    config = flux_dev_pickscore()
    config.recipe = "flux_dev_hps"
    config.reward = [RewardSpec(name="hps", kwargs={"version": "v2.1"})]
    return config


def flux_dev_hps_branch() -> TrainConfig:
    """BranchGRPO on FLUX.1-dev + HPSv2.1, the reference's FLUX script
    (``scripts/finetune/finetune_flux_branchgrpo_8gpus.sh`` of github.com/Fredreic1849/BranchGRPO):
    720 px, 20 DanceGRPO SDE steps at eta 0.3 with shift 3, no CFG (guidance embedding 3.5),
    splits at steps 0, 3, 6, 9 into 2 (16 leaves = the group), split noise scale 4 (the drift
    stays at eta 0.3, children scored under the base density), mean fusion, every edge trained
    (the script passes ``--timestep_fraction 0.6`` but ``train_branchgrpo_flux.py`` parses it and
    never reads it; its depth pruning is empty and width pruning off), clip 1e-3, advantage clip
    5, lr 1e-5, weight decay 1e-4, grad-norm 1, one transition per backward with 12 accumulated
    per optimizer step, 16 prompts (2 per GPU on 8 GPUs), 300 iterations, all weights trained (the
    reference runs 8 GPUs with FSDP: launch with an ``accelerate`` FSDP config, or set
    ``policy.lora_rank`` for a single GPU).

    Remaining differences: the reference scales each transition's loss by ``1 / (12 x
    transitions per tree)`` (no effect on Adam's step direction); its ``--init_same_noise``
    starts every tree of a GPU's batch from one noise (here each tree has its own); it shuffles
    transitions with Python's ``random`` and evaluates one node per forward (here all nodes of
    a step at once, ``max_batch`` 16). Not run here (no GPU).
    """
    from genrl.algorithms.branch_grpo import BranchGRPOConfig

    config = flux_dev_hps()
    config.recipe = "flux_dev_hps_branch"
    config.policy.lora_rank, config.policy.lora_alpha = 0, 0.0
    config.policy.gradient_checkpointing = True
    config.policy.kwargs = {"height": 720, "width": 720, "embedded_guidance": 3.5}
    config.sampler = SamplerConfig(
        name="dance_sde", num_steps=20, noise_level=0.3, shift=3.0, guidance_scale=1.0
    )
    config.algorithm = BranchGRPOConfig(
        split_steps=[0, 3, 6, 9],
        branching=[2, 2, 2, 2],
        split_noise_scale=4.0,
        clip_range=1e-3,
        advantage_clip=5.0,
        kl_beta=0.0,
        cfg_in_training=False,
        max_batch=16,
    )
    config.train = TrainLoopConfig(
        iterations=300,
        prompts_per_iteration=16,
        group_size=16,
        minibatch_size=1,
        gradient_accumulation_steps=12,
        rollout_batch_size=16,
        mixed_precision="bf16",
    )
    config.optim = OptimConfig(lr=1e-5, weight_decay=1e-4, max_grad_norm=1.0)
    return config


def sd35m_pickscore_branch() -> TrainConfig:
    """BranchGRPO on SD3.5-medium + PickScore. The reference publishes only a FLUX script, so
    this keeps ``sd35m_pickscore``'s model, sampler (10 SDE steps at noise 0.7, CFG 4.5 in
    rollouts and training), clip range, LoRA and learning rate, and grows each prompt's 24
    leaves (Flow-GRPO's group) as a tree splitting at steps 0, 3 and 6 into 2, 3 and 4. Split
    noise is scaled 1.4x with the drift kept (the reference's split semantics; it scales its
    eta-0.3 noise 4x, but Flow-GRPO's SDE at 0.7 is already noisier), every edge is trained,
    and sibling-top width pruning keeps half of each sibling group (a genrl mode, for cost). No
    KL, as in the reference. Not run here (no GPU)."""
    from genrl.algorithms.branch_grpo import BranchGRPOConfig

    config = sd35m_pickscore()
    config.recipe = "sd35m_pickscore_branch"
    config.algorithm = BranchGRPOConfig(
        split_steps=[0, 3, 6],
        branching=[2, 3, 4],
        split_noise_scale=1.4,
        width_pruning="sibling_top",
        width_keep=0.5,
        clip_range=1e-4,
        advantage_clip=5.0,
        kl_beta=0.0,
        max_batch=48,
    )
    # 48 trees x 105 trained edges / 8 processes / 9 per minibatch / 2 optimizer steps.
    config.train.gradient_accumulation_steps = 35
    return config


def sana_clipscore() -> TrainConfig:
    """SANA-600M (512 px) + CLIPScore; settings of Flow-GRPO's ``clipscore_sd3`` (beta 0.02,
    same initial noise per group), which has no SANA config of its own."""
    config = _sd3_base("sana_clipscore", RewardSpec(name="clipscore"), kl_beta=0.002)
    config.policy.name, config.policy.pretrained = "sana", SANA_600M
    config.sampler.same_initial_noise = True
    return config


IMAGE_RECIPES = {
    "sd35m_pickscore": sd35m_pickscore,
    "sd35m_pickscore_fast": sd35m_pickscore_fast,
    "sd35m_imagereward": sd35m_imagereward,
    "flux_dev_pickscore": flux_dev_pickscore,
    "flux_dev_hps": flux_dev_hps,
    "flux_dev_hps_branch": flux_dev_hps_branch,
    "sd35m_pickscore_branch": sd35m_pickscore_branch,
    "sana_clipscore": sana_clipscore,
}
