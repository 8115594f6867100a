"""DiffusionNFT: online diffusion reinforcement on the forward process (Zheng et al. 2025,
arXiv 2509.16117; used by MARBLE).

Clean samples come from the "old" policy, a lagged copy of the current one, with a deterministic
sampler and no CFG. Each sample's advantage becomes an optimality probability
``r = clamp(A / (2 A_max) + 1/2, 0, 1)``; training noises the samples as in pretraining and fits
two implicit policies built from the current and old velocities, a positive one towards the
sample with weight ``r`` and a negative one with weight ``1 - r`` (eq. 8), each loss normalised by
its own detached ``x_0`` error (the released code's adaptive weighting), plus a small velocity
KL to the reference. See ``genrl.objectives.regression_losses.NFTLoss``.

Differences from the released code, on purpose: endpoints come from our Euler ODE (the code
uses a second-order DPM solver; nothing about the sampler enters the loss), and ``t`` is drawn
``noisings_per_sample`` times per sample from the sampler's noise levels rather than as a
permutation of them (``time_sampling=uniform`` is the paper's Algorithm 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.config.errors import ConfigError
from genrl.objectives.regression_configs import NFTObjectiveConfig
from genrl.rollouts.configs import FlowSamplingConfig, LaggedCopyConfig

if TYPE_CHECKING:
    from genrl.objectives.regression_objectives import NFTObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.endpoints import EndpointRollout


@dataclass
class DiffusionNFTConfig(NFTObjectiveConfig, LaggedCopyConfig, AlgorithmConfig):
    """DiffusionNFT's fields: the objective's (``genrl/objectives/regression_configs.py``)
    and the old policy's (``genrl/rollouts/configs.py``), with the released code's defaults."""

    name: str = "diffusion_nft"
    """Registry name."""
    noisings_per_sample: int = 9
    """Noise levels trained per sample (released code: 9 of its 10 sampler steps)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "sampler_steps"
    """Uniform over the sampler's noise levels, like the released code."""
    sampling_ema_decay: float = 0.5
    """Largest decay of the old policy (released code: ``min(0.001 * step, 0.5)``)."""
    sampling_ema_ramp: float = 0.001
    """Per-iteration growth of the old policy's decay (0.0075 with a 75-iteration delay and a
    0.999 cap for OCR)."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_objective()
        self.validate_lagged_copy()
        if train_config is not None and train_config.sampler.guidance_scale != 1:
            raise ConfigError(
                "diffusion_nft samples without CFG (the guidance is learned into the weights): "
                f"set sampler.guidance_scale=1 (got {train_config.sampler.guidance_scale})"
            )


@register_algorithm("diffusion_nft")
class DiffusionNFT(Algorithm):
    Config = DiffusionNFTConfig
    sections: ClassVar[dict[str, type]] = {"sampler": FlowSamplingConfig}
    config: DiffusionNFTConfig

    def build(self, policy: Policy) -> tuple[EndpointRollout, NFTObjective]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.regression_objectives import NFTObjective
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.endpoints import EndpointRollout

        flow = require(policy, FlowPolicy, "diffusion_nft")
        rollout = EndpointRollout(self.train_config, flow, lagged=self.config)
        return rollout, NFTObjective(self.config, rollout, self.train_config.train.group_size)
