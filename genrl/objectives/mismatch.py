"""The sampler/trainer mismatch of token rollouts, and truncated importance sampling.

The rollout engine's log-probs ``log mu`` (another kernel, another precision, another batch
shape: vLLM, or the loop's cached forward) differ from training's recomputation ``log pi_old``
of the same tokens under the same weights, so the samples are slightly off-policy for the
policy the surrogate's ratio starts from. Per counted token, with ``r = pi_old / mu``:

    mismatch_kl = mean_t (r_t - 1 - log r_t)          Schulman's k3 of KL(mu || pi_old)
    w_t = min(r_t, C)                                  truncated importance weight

Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training") multiplies each token's clipped-surrogate term by the detached
``w_t``; the cap ``C`` (``algorithm.tis_cap``; 2 in verl's rollout correction) bounds the
variance a token whose engine probability is far below the trainer's would bring.
"""

from __future__ import annotations

import torch

from genrl.objectives.losses import Metrics


def sampler_mismatch(
    trainer_log_probs: torch.Tensor,
    sampler_log_probs: torch.Tensor,
    mask: torch.Tensor,
    cap: float | None = None,
) -> tuple[torch.Tensor | None, Metrics]:
    """The truncated importance weights ``[B, T]`` (0 off the mask; None without ``cap``) and
    the mismatch metrics over the counted tokens of ``[B, T]`` log-probs: ``mismatch_kl`` (k3),
    ``mismatch_ratio_min``/``max``/``std`` of ``r = pi_old / mu``, ``mismatch_max_abs_diff``
    of the log-probs and, with a cap, ``tis_truncated_fraction`` (tokens with ``r > cap``)."""
    counted = mask.bool()
    if not bool(counted.any()):
        return (torch.zeros_like(trainer_log_probs) if cap is not None else None), {}
    diff = (trainer_log_probs.detach() - sampler_log_probs).float()
    chosen = diff[counted]
    ratio = chosen.exp()
    metrics: Metrics = {
        "mismatch_kl": (ratio - 1 - chosen).mean(),
        "mismatch_ratio_min": ratio.min(),
        "mismatch_ratio_max": ratio.max(),
        "mismatch_ratio_std": ratio.std(unbiased=False),
        "mismatch_max_abs_diff": chosen.abs().max(),
    }
    if cap is None:
        return None, metrics
    metrics["tis_truncated_fraction"] = (ratio > cap).float().mean()
    weights = diff.exp().clamp(max=cap) * counted
    return weights, metrics


__all__ = ["sampler_mismatch"]
