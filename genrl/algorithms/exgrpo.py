"""ExGRPO: GRPO on groups that mix fresh completions with replayed ones, and its mixed-policy
objective.

Zhan et al. 2025, "ExGRPO: Learning to Reason from Experience" (arXiv 2510.02245); released code
``ElliottYan/LUFFY`` (folder ``ExGRPO``). The replay store and its bucketed priorities are the
run's ``replay.*`` section (``genrl/loop/replay.py``, ``genrl/loop/replay_store.py``); this
algorithm is GRPO's rollout with the objective that treats replayed completions as ExGRPO does
(``genrl/objectives/mixed_policy.py``). Defaults are the released script's
(``exp_scripts/run_exgrpo.sh``): no std in the advantage (``grpo_use_std=False``), a token sum
over the generation limit (``loss_remove_token_mean``), no KL, policy shaping ``w / (w + 0.1)``
on replayed tokens, and no clip once replay is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genrl.algorithms.base import Algorithm, register_algorithm
from genrl.algorithms.grpo import GRPOConfig
from genrl.config.errors import ConfigError
from genrl.rollouts.configs import GenerationConfig

if TYPE_CHECKING:
    from genrl.objectives.mixed_policy import MixedPolicyTokenGradient
    from genrl.policies.protocols import Policy
    from genrl.rollouts.tokens import AutoregressiveRollout


@dataclass
class ExGRPOConfig(GRPOConfig):
    """GRPO's fields with ExGRPO's defaults, and the mixed-policy objective's own."""

    name: str = "exgrpo"
    """Registry name."""
    std_mode: Literal["group", "global", "none"] = "none"
    """ExGRPO: ``r - mean_group r`` (the released ``grpo_use_std=False``)."""
    aggregation: Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"] = (
        "constant"
    )
    """ExGRPO: a token sum over the generation limit (the released ``loss_remove_token_mean``
    divides the summed terms by the response length limit)."""
    shaping_gamma: float = 0.1
    """``gamma`` of the policy shaping ``f(w) = w / (w + gamma)`` of replayed tokens (LUFFY's,
    the released ``off_policy_reshape=p_div_p_0.1``)."""
    behaviour: Literal["recorded", "current"] = "recorded"
    """The denominator of a replayed token's ratio: ``recorded``, the sampling log-prob stored
    with it (the released ``exp_is_correct=True``); ``current``, the iteration's recomputed old
    log-prob (``exp_is_correct=False``)."""
    clip_when_mixing: bool = False
    """Keep PPO's clip on fresh tokens in iterations that replay (the released code drops it
    there, ``loss_remove_clip=True``; iterations without replayed samples are always clipped)."""

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if not self.shaping_gamma > 0:
            raise ConfigError(f"algorithm.shaping_gamma must be > 0, got {self.shaping_gamma}")
        if self.behaviour not in ("recorded", "current"):
            raise ConfigError(
                f"algorithm.behaviour must be recorded or current, got {self.behaviour!r}"
            )
        if self.advantage == "mssr" or self.ratio_level != "token":
            raise ConfigError(
                "algorithm.name=exgrpo: its mixed-policy loss is per token over group "
                "advantages (advantage group, rloo or median; ratio_level=token)"
            )
        if self.tis_cap is not None:
            raise ConfigError(
                "algorithm.tis_cap: exgrpo's loss does not apply truncated importance weights"
            )
        if train_config is not None and not train_config.replay.ratio > 0:
            raise ConfigError(
                "algorithm.name=exgrpo replays stored questions: set replay.ratio > 0 (the "
                "released script uses 0.5)"
            )


@register_algorithm("exgrpo")
class ExGRPO(Algorithm):
    Config = ExGRPOConfig
    sections: ClassVar[dict[str, type]] = {"generation": GenerationConfig}
    config: ExGRPOConfig

    def build(self, policy: Policy) -> tuple[AutoregressiveRollout, MixedPolicyTokenGradient]:
        # Imported here: tensor code, while the registry and this config load without torch.
        from genrl.objectives.mixed_policy import MixedPolicyTokenGradient
        from genrl.policies.protocols import CausalTokenPolicy, require
        from genrl.rollouts.tokens import AutoregressiveRollout

        require(policy, CausalTokenPolicy, "exgrpo")
        rollout = AutoregressiveRollout(self.train_config)
        return rollout, MixedPolicyTokenGradient(self.config, rollout, self.train_config)
