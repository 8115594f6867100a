"""MARBLE's fields (multi-reward gradient balancing on DiffusionNFT's loss), without torch; the
objective is ``genrl/objectives/marble.py``, the algorithm ``genrl/algorithms/marble.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from genrl.config.errors import ConfigError
from genrl.objectives.regression_configs import NFTObjectiveConfig


@dataclass
class BalancingConfig:
    """How the per-reward gradients are combined (each field an option where the paper leaves
    the choice open; ``docs/algorithms/marble.md``)."""

    balancing: Literal["min_norm", "weighted_sum"] = "min_norm"
    """``min_norm``: MARBLE, the update mixes the per-reward losses with the min-norm weights
    of their (normalised) gradients; ``weighted_sum``: the baseline, DiffusionNFT on the
    run's weighted-sum reward exactly as ``diffusion_nft`` trains, with the same per-reward
    gradient diagnostics (cosines with the update) logged."""
    balance_rewards: list[str] | None = None
    """The rewards balanced, by name, in this order (the per-reward advantages' columns);
    None: every reward of ``reward`` with a non-zero weight, in the config's order."""
    gradient_space: Literal["parameters", "velocity"] = "parameters"
    """Where the per-reward gradients and their Gram matrix live: ``parameters``, the
    trainable parameters' gradients (one backward per reward through the network, all from one
    shared forward); ``velocity``, the gradients with respect to the predicted velocities (the
    network's output, like MGDA-UB's gradients at a shared representation, Sener & Koltun
    2018), which cost no backward through the network. The cosines are logged in that space."""
    direction: Literal["normalized", "raw"] = "normalized"
    """``normalized``: the update is ``sum_k alpha_k g_k / |g_k|``, the min-norm point of the
    unit gradients (every reward's cosine with it is >= 0), carried by the loss mixed with
    weights ``w_k ~ alpha_k / |g_k|`` (renormalised to sum 1); ``raw``: ``w = alpha``."""
    balance_every: int = 1
    """Solve the program on every this-many-th minibatch and reuse the smoothed weights in
    between (the amortisation over steps; 1: every minibatch, as the diagnostics need)."""
    balance_ema: float = 0.9
    """``rho``: the mixing weights follow ``w <- rho w + (1 - rho) w*`` after each solve (the
    paper's EMA smoothing of the coefficients; its value here is ours); 0: no smoothing. The
    first solve sets ``w`` directly."""
    solver: Literal["frank_wolfe", "projected_gradient"] = "frank_wolfe"
    """Solver for three or more rewards (two have a closed form)."""
    solver_iters: int = 250
    """Iterations of that solver."""

    def validate_balancing(self, rewards: list[tuple[str, float]]) -> list[str]:
        """The balanced rewards' names, checked against the run's ``reward`` list of
        ``(name, weight)``."""
        if self.balance_every < 1:
            raise ConfigError(f"algorithm.balance_every must be >= 1, got {self.balance_every}")
        if not 0 <= self.balance_ema < 1:
            raise ConfigError(f"algorithm.balance_ema must lie in [0, 1), got {self.balance_ema}")
        if self.solver_iters < 1:
            raise ConfigError(f"algorithm.solver_iters must be >= 1, got {self.solver_iters}")
        reward_names = [name for name, _ in rewards]
        names = (
            list(self.balance_rewards)
            if self.balance_rewards is not None
            else [name for name, weight in rewards if weight != 0]
        )
        unknown = [n for n in names if n not in reward_names]
        if unknown:
            raise ConfigError(
                f"algorithm.balance_rewards: {unknown} not among the run's rewards {reward_names}"
            )
        if len(names) < 2 or len(set(names)) != len(names):
            raise ConfigError(
                "algorithm.balance_rewards needs two or more distinct rewards (set weights > 0 "
                f"on two rewards of reward, or name them), got {names}"
            )
        return names


@dataclass
class MarbleObjectiveConfig(BalancingConfig, NFTObjectiveConfig):
    """The MARBLE objective's fields: DiffusionNFT's loss and the balancing."""


__all__ = ["BalancingConfig", "MarbleObjectiveConfig"]
