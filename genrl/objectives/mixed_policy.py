"""ExGRPO's mixed-policy objective: the token policy gradient over groups that mix fresh
completions with replayed ones (``TokenRollout.replayed``, ``genrl/loop/replay.py``).

Zhan et al. 2025, "ExGRPO: Learning to Reason from Experience" (arXiv 2510.02245), as its
released code computes it (``ElliottYan/LUFFY``, ``ExGRPO/exgrpo/verl/verl/mix_src``:
``mix_core_alg.compute_token_on_off_policy_loss`` with the released script's
``off_policy_reshape=p_div_p_0.1``, ``loss_remove_clip=True``, ``loss_remove_token_mean=True``,
``grpo_use_std=False``, ``exp_is_correct=True``). Per completion token, with the group
advantage ``A_i`` (mean over fresh and replayed members alike, no std):

    fresh:     l = -A_i r_{i,t},                     r = pi_theta / pi_old
    replayed:  l = -A_i f(w_{i,t}),  f(w) = w / (w + gamma),   w = pi_theta / pi_behaviour

``pi_old`` is the policy that sampled the iteration (training's recomputation), ``pi_behaviour``
the earlier policy that sampled the replayed completion: its log-probs were stored with it
(``exp_is_correct`` replaces the recomputed old log-probs of replayed samples by the stored
ones). ``f`` is LUFFY's policy shaping (Yan et al. 2025, arXiv 2504.14945), ``gamma = 0.1``; it
is not clipped. The released trainer removes the fresh tokens' clip too once replay is on
(``loss_remove_clip`` only in its mixed phase; PPO's clip before), which
``algorithm.clip_when_mixing=false`` follows: an iteration with replayed samples is unclipped,
one without is GRPO's clipped surrogate. Terms are reduced with ``algorithm.aggregation``
(the released ``loss_remove_token_mean``: a token sum over the generation limit, genrl's
``constant``); the KL term is GRPO's.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import TokenRollout
from genrl.data.rng import RolloutNoise
from genrl.objectives.base import StepContext
from genrl.objectives.losses import (
    LOG_RATIO_CLAMP,
    Metrics,
    aggregate,
    masked_mean,
    surrogate_terms,
    token_kl,
)
from genrl.objectives.mismatch import sampler_mismatch
from genrl.objectives.tokens import TokenPolicyGradient
from genrl.policies.protocols import CausalTokenPolicy


def mixed_policy_terms(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    replayed: torch.Tensor,
    *,
    shaping_gamma: float,
    clip_range: tuple[float, float] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss terms ``[B, T]`` of ExGRPO's mixed-policy objective (module docstring),
    with the fresh tokens' ratios ``r`` and the replayed tokens' shaped ones ``f(w)`` (both
    ``[B, T]``, detached).

    Args:
        log_probs: ``[B, T]`` under the policy being trained (with gradients).
        old_log_probs: ``[B, T]`` under the iteration's sampling policy.
        behaviour_log_probs: ``[B, T]`` under the policy that sampled each replayed completion
            (read only on replayed rows).
        advantages: ``[B]`` or ``[B, T]``.
        replayed: ``[B]`` bool.
        shaping_gamma: ``gamma`` of ``f(w) = w / (w + gamma)``.
        clip_range: ``(low, high)`` PPO epsilons of the fresh tokens' surrogate; None: the
            unclipped ``-A r``.
    """
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    log_ratio = (log_probs - old_log_probs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if clip_range is None:
        ratio = log_ratio.exp()
        fresh = -advantages * ratio
    else:
        terms = surrogate_terms(log_ratio, advantages, clip_range[0], clip_range[1])
        ratio, fresh = terms.ratio, terms.loss
    w = (log_probs - behaviour_log_probs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    shaped = w / (w + shaping_gamma)
    off = -advantages * shaped
    rows = replayed[:, None]
    return torch.where(rows, off, fresh), ratio.detach(), shaped.detach()


class MixedPolicyTokenGradient(TokenPolicyGradient):
    """``TokenPolicyGradient`` whose loss treats replayed completions as ExGRPO does.

    Args: as ``TokenPolicyGradient``; ``config`` also has ``shaping_gamma``, ``behaviour`` and
    ``clip_when_mixing`` (``genrl/algorithms/exgrpo.py``).
    """

    def __init__(self, config: Any, rollout: Any, train_config: Any) -> None:
        super().__init__(config, rollout, train_config)
        self.mixing = False

    @torch.no_grad()
    def units(
        self, policy: CausalTokenPolicy, batch: TokenRollout, noise: RolloutNoise
    ) -> TokenRollout:
        """GRPO's units; also notes whether this iteration replays (the released trainer's
        mixed phase, where the fresh tokens lose their clip)."""
        self.mixing = batch.replayed is not None and bool(batch.replayed.any())
        return super().units(policy, batch, noise)

    def loss(
        self, policy: CausalTokenPolicy, minibatch: TokenRollout, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        c: Any = self.config  # an ExGRPOConfig: the token fields and the mixing ones
        mb = minibatch
        log_probs = self.log_probs(policy, mb)
        counted = mb.completion_mask
        replayed = mb.replayed if mb.replayed is not None else counted.new_zeros(len(mb))
        old = mb.old_log_probs if mb.old_log_probs.shape[-1] else log_probs.detach()
        recorded = mb.sampler_log_probs
        behaviour = recorded if c.behaviour == "recorded" and recorded is not None else old
        high = c.clip_range_high if c.clip_range_high is not None else c.clip_range
        clip = None if self.mixing and not c.clip_when_mixing else (c.clip_range, high)
        terms, ratio, shaped = mixed_policy_terms(
            log_probs,
            old,
            behaviour,
            mb.advantages,
            replayed,
            shaping_gamma=c.shaping_gamma,
            clip_range=clip,
        )
        tokens = step.tokens_per_minibatch if step is not None else None
        max_length = self.train_config.generation.max_new_tokens
        loss = aggregate(terms, counted, c.aggregation, max_length, tokens)
        fresh_tokens = counted & ~replayed[:, None]
        replay_tokens = counted & replayed[:, None]
        metrics: Metrics = {
            "policy_loss": loss.detach(),
            "ratio_mean": masked_mean(ratio, fresh_tokens),
            "replay_fraction": replayed.float().mean(),
            **self.extra_metrics(mb),
        }
        if bool(replay_tokens.any()):
            metrics["replay_shaped_ratio_mean"] = masked_mean(shaped, replay_tokens)
            metrics["replay_advantage_mean"] = mb.advantages[replayed].float().mean()
        if recorded is not None and bool(fresh_tokens.any()):
            trainer = mb.old_log_probs if mb.old_log_probs.shape[-1] else log_probs.detach()
            metrics.update(sampler_mismatch(trainer, recorded, fresh_tokens)[1])
        if c.kl_beta > 0:
            kl = token_kl(log_probs, mb.ref_log_probs, c.kl_estimator, counted)
            kl_loss = aggregate(kl, counted, c.aggregation, max_length, tokens)
            loss = loss + c.kl_beta * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
            metrics["kl"] = masked_mean(
                token_kl(log_probs, mb.ref_log_probs, "k3", counted), counted
            )
        return loss, {k: v.detach() for k, v in metrics.items()}


__all__ = ["MixedPolicyTokenGradient", "mixed_policy_terms"]
