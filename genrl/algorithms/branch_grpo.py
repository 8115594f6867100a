"""BranchGRPO: Flow-GRPO on branching rollouts (Li et al. 2025, "BranchGRPO: Stable and
Efficient GRPO with Structured Branching in Diffusion Models").

Each prompt's group is the leaves of one tree (``genrl/rollouts/tree.py``): one initial noise,
split into ``branching[k]`` children at ``split_steps[k]``, so the group shares prefixes and
costs far fewer model forwards. Leaf rewards are fused up the tree and z-scored depth by depth
within each tree, following the reference code's conventions; every trained edge is a flow step
with the same clipped surrogate (and optional KL) as Flow-GRPO
(``genrl/objectives/tree_policy_gradient.py``).

The pairing: ``BranchingRollout`` and ``TreePolicyGradient``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.config.errors import ConfigError
from genrl.objectives.flow_configs import TreePolicyGradientConfig
from genrl.rollouts.configs import BranchingRolloutConfig, StochasticSamplingConfig

if TYPE_CHECKING:
    from genrl.objectives.tree_policy_gradient import TreePolicyGradient
    from genrl.policies.protocols import Policy
    from genrl.rollouts.tree import BranchingRollout


@dataclass
class BranchGRPOConfig(TreePolicyGradientConfig, BranchingRolloutConfig, AlgorithmConfig):
    """BranchGRPO's fields: the tree rollout's (``genrl/rollouts/configs.py``) and the objective's
    (``genrl/objectives/flow_configs.py``), with the reference's defaults."""

    name: str = "branch_grpo"
    """Registry name."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_loss(train_config)
        self.validate_rollout(train_config)
        num_steps = None if train_config is None else train_config.sampler.num_steps
        self.validate_objective(self.split_steps, num_steps)
        if self.ratio_norm:
            raise ConfigError("branch_grpo does not support algorithm.ratio_norm")
        if num_steps is not None and not self.trained_steps(
            num_steps, self.split_steps, self.ode_steps
        ):
            raise ConfigError(
                "branch_grpo: no step left to train (check train_steps and ode_steps)"
            )


@register_algorithm("branch_grpo")
class BranchGRPO(Algorithm):
    Config = BranchGRPOConfig
    sections: ClassVar[dict[str, type]] = {"sampler": StochasticSamplingConfig}
    fixed_group_shape: ClassVar[bool] = True  # a group is one tree's leaves
    config: BranchGRPOConfig

    def build(self, policy: Policy) -> tuple[BranchingRollout, TreePolicyGradient]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.tree_policy_gradient import TreePolicyGradient
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.tree import BranchingRollout

        t = self.train_config.train
        flow = require(policy, FlowPolicy, "branch_grpo")
        rollout = BranchingRollout(self.config, self.train_config, flow)
        return rollout, TreePolicyGradient(self.config, rollout, t.group_size, t.iterations)


__all__ = ["BranchGRPO", "BranchGRPOConfig"]
