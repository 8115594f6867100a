"""Every flow algorithm on the compositional task, with one sample budget (issue 16).

Each recipe starts from ``compositional_flow_grpo`` (``genrl/recipes/compositional.py``) and
keeps its policy (the 1.1M-parameter scene generator, fully fine-tuned), its rewards (the
``compositional`` score plus ``sample_diversity`` and ``compositional_artifact_probe`` at weight
0), its held-out protocol (25 held-out prompts x 8 fixed-seed 10-step ODE samples, every 25
iterations), its optimizer (AdamW 5e-5, wd 1e-4, grad-norm 1) and its budget: 200 iterations
of 16 prompts x 8 samples, 25,600 samples in all. Only the algorithm changes, with the settings
its embedded digits counterpart uses (``genrl/recipes/digits.py``, ``objectives.py`` and the
sampler-family table of ``docs/algorithms/flow_grpo.md``), which encode each method's
reference conventions. DGPO and AWM, which have no earlier compositional counterpart, take
their released GenEval configs as their digits recipes take the released configs (each
deviation in the recipe's docstring). ``benchmarks/compositional.py`` compares them;
``TUNING_KNOBS`` names each method's main setting for its tuning grid.

The sample budget of offline GDRO: its store is sampled once, by the reference model, before
training, and those samples are the only ones it ever draws. So that it draws as many as the
online methods, the store holds ``iterations x prompts_per_iteration`` groups of 8 (3,200
groups, 25,600 samples): one pass, each stored group trained on once, 16 groups per iteration
like online GDRO. The store's sampling time is training time (the benchmark puts it at the
start of the wall-clock axis).
"""

from __future__ import annotations

from dataclasses import dataclass

from genrl.algorithms.awm import AWMConfig
from genrl.algorithms.branch_grpo import BranchGRPOConfig
from genrl.algorithms.dgpo import DGPOConfig
from genrl.algorithms.diffusion_nft import DiffusionNFTConfig
from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.algorithms.gdro import GDROConfig
from genrl.algorithms.ram import RAMConfig
from genrl.recipes.compositional import compositional_flow_grpo
from genrl.run.config import SDESamplingConfig, TrainConfig


def _base(name: str) -> TrainConfig:
    """``compositional_flow_grpo`` renamed: the shared policy, rewards, eval, lr and budget."""
    config = compositional_flow_grpo()
    config.recipe = name
    return config


def _sampler(config: TrainConfig) -> SDESamplingConfig:
    assert isinstance(config.sampler, SDESamplingConfig)
    return config.sampler


def compositional_flow_grpo_fast() -> TrainConfig:
    """Flow-GRPO-Fast: CPS steps at noise 0.8 in a 3-step SDE window whose start is drawn each
    iteration from steps 0-2 (``sde_window_range`` [0, 5]), the ODE elsewhere; the group shares
    its initial noise, so the ODE prefix runs once per prompt and the group branches at the
    window. Every window step is trained (``timestep_fraction`` does not apply to a window).

    Inherited: the sampler settings of the digits table's Flow-GRPO-Fast row
    (``docs/algorithms/flow_grpo.md``, itself Flow-GRPO's ``pickscore_sd3_fast_nocfg``); clip
    range 2e-3, no KL and per-prompt std from ``compositional_flow_grpo``. Deviation from the
    reference: clip 2e-3, not its 1e-5 (its CPS log-prob is scaled differently, and our
    mean-reduced log-probs over 3072 pixels move more per update, as for every flow recipe
    here); the window stays in the first half, which is also where this task trains."""
    config = _base("compositional_flow_grpo_fast")
    s = _sampler(config)
    s.name, s.noise_level = "flow_cps", 0.8
    s.sde_window_size, s.sde_window_range, s.same_initial_noise = 3, [0, 5], True
    return config


def compositional_mix_grpo() -> TrainConfig:
    """MixGRPO: a 4-step window of Flow-GRPO SDE steps (noise 0.7) that slides progressively
    from step 0 by one step every 25 iterations and starts again at step 0 once it has passed
    the end (MixGRPO's ``iters_per_group`` 25 and ``--roll_back`` of its released scripts); the
    ODE elsewhere; every window step trained.

    Inherited: window size 4 and the progressive schedule from the digits table's MixGRPO row;
    the rest from ``compositional_flow_grpo``. Deviation: the digits run shifts every 10
    iterations (its window crosses the 10 steps once in 60 iterations); over 200 iterations the
    scripts' 25 crosses them once (starts 0-6 by iteration 175) and wraps for the last 25."""
    config = _base("compositional_mix_grpo")
    s = _sampler(config)
    s.sde_window_size, s.sde_window_schedule = 4, "progressive"
    s.sde_window_shift_every, s.sde_window_wrap = 25, True
    return config


def compositional_cps() -> TrainConfig:
    """Flow-GRPO with the coefficients-preserving sampler (CPS, Wang & Yu 2025) at noise 0.8 on
    every step (its last step is deterministic and never trained), the first half of the steps
    trained as in ``compositional_flow_grpo``.

    Inherited: ``sampler.name=flow_cps`` and noise 0.8 from the digits table's CPS row; the
    rest (clip 2e-3, ``timestep_fraction`` 0.5) from ``compositional_flow_grpo``."""
    config = _base("compositional_cps")
    s = _sampler(config)
    s.name, s.noise_level = "flow_cps", 0.8
    return config


def compositional_dance_grpo() -> TrainConfig:
    """DanceGRPO: its SDE (constant diffusion eta 0.3) on every step, a random 60% of the steps
    of each trajectory trained (DanceGRPO's ``timestep_fraction`` 0.6, drawn per trajectory),
    no KL.

    Inherited: sampler, noise level and timestep selection from the digits table's DanceGRPO
    row (the paper's values); clip 2e-3 and per-prompt std from ``compositional_flow_grpo``.
    Deviation from ``compositional_flow_grpo``: its first-half ``timestep_fraction`` 0.5 is
    replaced by DanceGRPO's random 0.6, the method's own convention."""
    config = _base("compositional_dance_grpo")
    s = _sampler(config)
    s.name, s.noise_level = "dance_sde", 0.3
    assert isinstance(config.algorithm, FlowGRPOConfig)
    config.algorithm.timestep_selection, config.algorithm.timestep_fraction = "random", 0.6
    return config


def compositional_branch_grpo() -> TrainConfig:
    """BranchGRPO: each prompt's 8 samples are the leaves of one tree that splits in two at
    steps 0, 3 and 6 of 10, split noise scaled 1.3x with the base drift kept, children scored
    under the base density, every edge trained.

    Inherited: the whole algorithm section of ``digits_branch_grpo`` (``genrl/recipes/
    digits.py``); the sampler (10 Flow-GRPO SDE steps at noise 0.7), clip 2e-3 and the rest
    from ``compositional_flow_grpo``. Deviation from ``compositional_flow_grpo``: every edge
    is trained (the paper's method), not only the first half of the steps."""
    config = _base("compositional_branch_grpo")
    config.set_algorithm(
        BranchGRPOConfig(
            clip_range=2e-3,
            kl_beta=0.0,
            split_steps=[0, 3, 6],
            branching=[2, 2, 2],
            split_noise_scale=1.3,
        )
    )
    return config


def compositional_ram() -> TrainConfig:
    """RAM: 10-step ODE endpoints sampled by the lagged copy of the policy (decay
    ``min(0.01 k, 0.9)``), 8 noisings each with ``p(t) = 2t``, per-prompt advantages scaled by
    the multiplier 100 (the released GenEval value), regressed onto; 1024 units per iteration,
    8 optimizer steps.

    Inherited: ``RAMConfig()``'s defaults as ``digits_ram`` uses them (``genrl/recipes/
    objectives.py``); policy, rewards, eval, lr and budget from ``compositional_flow_grpo``."""
    config = _base("compositional_ram")
    config.set_algorithm(RAMConfig())
    return config


def compositional_gdro() -> TrainConfig:
    """GDRO online: each iteration's 16 groups of 8 ODE samples from the current model, 8
    shared noisings per group, tau 0.05 and gamma 1 (the paper's GenEval values), beta 1;
    minibatches of 16 groups.

    Inherited: the algorithm section and ``minibatch_size`` 16 of ``digits_gdro``
    (``genrl/recipes/objectives.py``; beta 1 because a larger one saturated the group softmax
    there); the rest from ``compositional_flow_grpo``."""
    config = _base("compositional_gdro")
    config.set_algorithm(GDROConfig(beta=1.0, noisings_per_sample=8))
    config.train.minibatch_size = 16
    return config


def compositional_gdro_offline() -> TrainConfig:
    """GDRO offline: the reference model samples the whole budget once, 3,200 groups of 8 (200
    iterations x 16 groups: the samples the online methods draw, see the module docstring),
    into ``runs/compositional_gdro_store``; training reads 16 of them per iteration, one pass,
    with ``compositional_gdro``'s settings and beta 2.

    Inherited: beta 2 and the store mechanism from ``digits_gdro_offline``. Deviation: the
    digits store holds a sixth of that budget read in 6 passes; here the store holds the full
    budget so that the method draws exactly as many samples as the others.
    ``--set train.offline_store=DIR`` puts the store elsewhere (about 315 MB: float32 canvases);
    with ``train.iterations`` changed, set ``train.offline_groups`` to ``16 x iterations``."""
    config = compositional_gdro()
    config.recipe = "compositional_gdro_offline"
    assert isinstance(config.algorithm, GDROConfig)
    config.algorithm.beta = 2.0
    config.train.offline_store = "runs/compositional_gdro_store"
    config.train.offline_groups = config.train.iterations * config.train.prompts_per_iteration
    return config


def compositional_diffusion_nft() -> TrainConfig:
    """DiffusionNFT: the released code's defaults (beta 1, KL 1e-4, 9 of the sampler's noise
    levels per sample, old policy ``min(0.001 k, 0.5)``), CFG-free 10-step ODE data; 9
    optimizer steps per iteration.

    Inherited: ``DiffusionNFTConfig()`` as ``digits_diffusion_nft`` uses it; policy, rewards,
    eval, lr (5e-5) and budget from ``compositional_flow_grpo``. The lr 1e-4 trial of
    ``docs/compositional.md`` is not this recipe."""
    config = _base("compositional_diffusion_nft")
    config.set_algorithm(DiffusionNFTConfig())
    return config


def compositional_dgpo() -> TrainConfig:
    """DGPO: each iteration's 16 groups of 8 ODE samples from the lagged copy (decay
    ``min(0.001 k, 0.3)``), 4 noisings per group shared by its members on the sampler's 5
    noisiest levels of 10, the group's DPO margin weighted by ``sigmoid(s)`` against the frozen
    model, PPO-style clip 0.01 against the lagged copy, velocity KL 0.02 to the frozen model,
    per-prompt advantages over the group's std clipped to 5, beta 10; minibatches of 16 groups
    (64 units, 4 optimizer steps per iteration).

    From the released GenEval config (github.com/Luo-Yihong/DGPO ``config/dgpo.py:56-90``, as
    quoted in ``docs/algorithms/dgpo.md``): ``trunc_steps`` 4 (so the first 5 sampler levels,
    ``sampler_levels`` 5; ``digits_dgpo`` uses the OCR config's 6, so 7 levels), ``global_std``
    False (``std_mode`` group; the digits recipe's OCR config: global), clip 0.01, KL 0.02,
    4 training timesteps, shared noise. Deviations, each forced by this task or benchmark:
    beta 10, not the released 100, as ``digits_dgpo`` measured (100 saturates the group weights
    on a toy model's velocity errors; 100 is in the tuning grid); 8 samples per group, not 16,
    and lr 5e-5 with full fine-tuning, not LoRA at 3e-4, the benchmark's shared budget and
    policy; the lagged copy samples from the first iteration (released: after 500 steps) and
    each group draws its own levels, as in ``digits_dgpo``; our Euler ODE for their DPM-Solver;
    sampling without CFG (released: 4.5), as every recipe of this benchmark samples."""
    config = _base("compositional_dgpo")
    config.set_algorithm(DGPOConfig(beta=10.0, std_mode="group", sampler_levels=5))
    config.train.minibatch_size = 16
    return config


def compositional_awm() -> TrainConfig:
    """AWM: each iteration's 16 groups of 8 ODE samples from the current weights, 6 stratified
    noisings per sample on the sampler's levels 1-8 of 10, the generalised Huber weighting
    (power 0.25) of each unit's flow-matching error, KL 0.001 to the frozen model and 1 to the
    lagged copy (decay ``min(0.001 k, 0.3)``), advantages over the iteration's std clipped to 5
    and scaled to +-1; minibatches of 128 units (6 optimizer steps per iteration).

    Inherited: ``AWMConfig()``, the released GenEval config (github.com/scxue/
    advantage_weighted_matching ``config/dgx_awm.py:31-98``, as quoted in
    ``docs/algorithms/awm.md``), as ``digits_awm`` uses it. Deviations, each forced by this task
    or benchmark: 8 samples per group, not 24, and lr 5e-5 with full fine-tuning, not LoRA at
    3e-4 (the shared budget and policy); 6 optimizer steps per iteration, not one, as in
    ``digits_awm`` (there one step per iteration learned six times slower per iteration); the
    10-step Euler ODE for their stochastic 14-step SA-Solver (only the sampler's levels enter
    the loss)."""
    config = _base("compositional_awm")
    config.set_algorithm(AWMConfig())
    return config


@dataclass(frozen=True)
class Knob:
    """A method's main setting for the tuning grid of ``benchmarks/compositional.py --tune``:
    the config field (a dotted override path) and the values tried, the recipe's among them."""

    field: str
    """Dotted override path, e.g. ``algorithm.beta``."""
    values: tuple[float, ...]
    """Values tried (each with learning rate x 0.5, 1 and 2 of the recipe's)."""


LR_FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0)
"""The tuning grid's learning rates, as factors of the recipe's (equal for every method)."""

TUNING_KNOBS: dict[str, Knob] = {
    # Flow-GRPO's a in sigma_s = a sqrt(s / (1 - s)): how much the SDE explores (paper 0.7).
    "compositional_flow_grpo": Knob("sampler.noise_level", (0.5, 0.7, 0.9)),
    # CPS's a in std = s_next sin(a pi / 2) (the reference's 0.8; 1 is the largest allowed).
    "compositional_flow_grpo_fast": Knob("sampler.noise_level", (0.6, 0.8, 1.0)),
    # MixGRPO's window: fewer SDE steps are cheaper and explore less (paper 4).
    "compositional_mix_grpo": Knob("sampler.sde_window_size", (2, 4, 6)),
    "compositional_cps": Knob("sampler.noise_level", (0.6, 0.8, 1.0)),
    # DanceGRPO's constant eta, the suspect of its slow climb (issue 31 item 3; paper 0.3).
    "compositional_dance_grpo": Knob("sampler.noise_level", (0.15, 0.3, 0.6)),
    # How far a split moves the branches apart (reference 1.3; 1: no extra split noise).
    "compositional_branch_grpo": Knob("algorithm.split_noise_scale", (1.0, 1.3, 1.6)),
    # RAM's advantage multiplier (released GenEval 100, PickScore 1000).
    "compositional_ram": Knob("algorithm.reward_multiplier", (30.0, 100.0, 300.0)),
    # GDRO's softmax scale of the implicit rewards (digits 1 and 2; the paper's GenEval 6).
    "compositional_gdro": Knob("algorithm.beta", (1.0, 2.0, 6.0)),
    "compositional_gdro_offline": Knob("algorithm.beta", (1.0, 2.0, 6.0)),
    # DiffusionNFT's guidance strength between the positive and negative policies (released 1).
    "compositional_diffusion_nft": Knob("algorithm.beta", (0.5, 1.0, 2.0)),
    # DGPO's DPO scale (digits 10; released PickScore 10, GenEval/OCR 100).
    "compositional_dgpo": Knob("algorithm.beta", (10.0, 30.0, 100.0)),
    # AWM's generalised Huber power: 0.25 released, 1 is the paper's plain t-weighting.
    "compositional_awm": Knob("algorithm.ghuber_power", (0.25, 0.5, 1.0)),
}


COMPOSITIONAL_METHOD_RECIPES = {
    "compositional_flow_grpo_fast": compositional_flow_grpo_fast,
    "compositional_mix_grpo": compositional_mix_grpo,
    "compositional_cps": compositional_cps,
    "compositional_dance_grpo": compositional_dance_grpo,
    "compositional_branch_grpo": compositional_branch_grpo,
    "compositional_ram": compositional_ram,
    "compositional_gdro": compositional_gdro,
    "compositional_gdro_offline": compositional_gdro_offline,
    "compositional_diffusion_nft": compositional_diffusion_nft,
    "compositional_dgpo": compositional_dgpo,
    "compositional_awm": compositional_awm,
}
