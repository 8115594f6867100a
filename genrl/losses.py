"""Policy losses shared by every algorithm: the clipped surrogate and KL terms.

A loss is a small object whose ``__call__`` returns ``(loss, metrics)``; metrics are detached
Python floats ready for logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from samplers.base import reduce_event

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["sequence_mean", "token_mean", "constant"]
AGGREGATIONS: tuple[str, ...] = ("sequence_mean", "token_mean", "constant")


@dataclass
class ClippedSurrogate:
    """PPO's clipped surrogate objective (Schulman et al. 2017, eq. 7), negated as a loss.

    ``ratio = exp(log_probs - old_log_probs)``;
    ``L = mean(max(-A * ratio, -A * clip(ratio, 1 - clip_range_low, 1 + clip_range_high)))``.
    Separate low/high ranges are DAPO's "clip-higher" (Yu et al. 2025); by default both equal.

    Args:
        clip_range_low: ``epsilon_low``; Flow-GRPO uses 1e-4 with mean-reduced log-probs.
        clip_range_high: ``epsilon_high``; None means equal to ``clip_range_low``.
    """

    clip_range_low: float
    clip_range_high: float | None = None

    def __post_init__(self) -> None:
        if self.clip_range_high is None:
            self.clip_range_high = self.clip_range_low
        if self.clip_range_low <= 0 or self.clip_range_high <= 0:
            raise ValueError(
                f"clip ranges must be positive, got low={self.clip_range_low} "
                f"high={self.clip_range_high}"
            )

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss over ``[N]`` elements (samples, or sample-timestep pairs).

        Args:
            log_probs: ``[N]`` under the current parameters (with grad).
            old_log_probs: ``[N]`` recorded at rollout time.
            advantages: ``[N]``.

        Returns:
            scalar loss and metrics: ``clip_fraction`` (share of elements whose clipped term
            was active), ``ratio_mean/min/max``, ``approx_kl`` (``0.5 * mean((lp - lp_old)^2)``,
            the estimate Flow-GRPO logs).
        """
        if not (log_probs.shape == old_log_probs.shape == advantages.shape):
            raise ValueError(
                "log_probs, old_log_probs and advantages must share one shape, got "
                f"{tuple(log_probs.shape)}, {tuple(old_log_probs.shape)}, {tuple(advantages.shape)}"
            )
        assert self.clip_range_high is not None
        log_ratio = log_probs - old_log_probs.detach()
        ratio = torch.exp(log_ratio)
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1 - self.clip_range_low, 1 + self.clip_range_high)
        loss = torch.maximum(unclipped, clipped).mean()
        with torch.no_grad():
            metrics = {
                "clip_fraction": float((clipped > unclipped).float().mean()),
                "ratio_mean": float(ratio.mean()),
                "ratio_min": float(ratio.min()),
                "ratio_max": float(ratio.max()),
                "approx_kl": float(0.5 * log_ratio.square().mean()),
            }
        return loss, metrics


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation,
    max_length: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values ``[B, T]`` over the tokens where ``mask`` to a scalar.

    * ``sequence_mean``: mean over sequences of each sequence's token mean (GRPO, Shao et al.
      2024, eq. 3; long and short answers weigh the same, the "length bias" Dr.GRPO points out);
    * ``token_mean``: mean over every token of the batch (DAPO, Yu et al. 2025, eq. 8);
    * ``constant``: token sum divided by ``B * max_length`` (Dr.GRPO, Liu et al. 2025, eq. 3).

    Rows with no token contribute 0 (and count in ``B`` for ``sequence_mean``/``constant``).
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum(dim=-1)
    if aggregation == "sequence_mean":
        return (total / mask.sum(dim=-1).clamp(min=1)).mean()
    if aggregation == "token_mean":
        return total.sum() / mask.sum().clamp(min=1)
    if aggregation == "constant":
        if max_length is None or max_length < 1:
            raise ValueError("aggregation 'constant' needs max_length (the generation limit)")
        return total.sum() / (values.shape[0] * max_length)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


@dataclass
class TokenClippedSurrogate:
    """The clipped surrogate over tokens, at token or sequence level.

    ``level="token"`` (GRPO/DAPO): ``ratio_{i,t} = exp(lp_{i,t} - lp_old_{i,t})`` and the clipped
    term per token, reduced by ``aggregation``. ``level="sequence"`` (GSPO, Zheng et al. 2025,
    eq. 5-7): one ratio per sequence, ``exp(mean_t(lp - lp_old))``, clipped per sequence and
    averaged over sequences (``aggregation`` does not apply).

    Args:
        clip_range_low, clip_range_high: PPO epsilons (GRPO 0.2; DAPO high 0.28; GSPO 3e-4/4e-4).
        level: ``token`` or ``sequence``.
        aggregation: see ``aggregate``.
        max_length: generation limit, for the ``constant`` aggregation.
    """

    clip_range_low: float
    clip_range_high: float | None = None
    level: Literal["token", "sequence"] = "token"
    aggregation: Aggregation = "sequence_mean"
    max_length: int | None = None

    def __post_init__(self) -> None:
        self.sequence_loss = ClippedSurrogate(self.clip_range_low, self.clip_range_high)
        if self.level not in ("token", "sequence"):
            raise ValueError(f"level must be 'token' or 'sequence', got {self.level!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Args: ``log_probs``/``old_log_probs``/``mask`` ``[B, T]``, ``advantages`` ``[B]``.

        Returns the scalar loss and ``clip_fraction``, ``ratio_mean/min/max``, ``approx_kl``
        over the counted tokens (sequences for ``level="sequence"``).
        """
        if not (log_probs.shape == old_log_probs.shape == mask.shape) or log_probs.ndim != 2:
            raise ValueError(
                "log_probs, old_log_probs and mask must all be [B, T], got "
                f"{tuple(log_probs.shape)}, {tuple(old_log_probs.shape)}, {tuple(mask.shape)}"
            )
        if advantages.shape != log_probs.shape[:1]:
            raise ValueError(f"advantages must be [B], got {tuple(advantages.shape)}")
        maskf = mask.to(log_probs.dtype)
        log_ratio = (log_probs - old_log_probs.detach()) * maskf
        if self.level == "sequence":
            sequence_log_ratio = log_ratio.sum(-1) / maskf.sum(-1).clamp(min=1)
            return self.sequence_loss(
                sequence_log_ratio, torch.zeros_like(sequence_log_ratio), advantages
            )
        low, high = self.sequence_loss.clip_range_low, self.sequence_loss.clip_range_high
        assert high is not None
        ratio = torch.exp(log_ratio)
        unclipped = -advantages[:, None] * ratio
        clipped = -advantages[:, None] * ratio.clamp(1 - low, 1 + high)
        loss = aggregate(torch.maximum(unclipped, clipped), mask, self.aggregation, self.max_length)
        with torch.no_grad():
            counted = mask.bool()
            r = ratio[counted] if bool(counted.any()) else torch.ones(1, device=ratio.device)
            metrics = {
                "clip_fraction": float((clipped > unclipped)[counted].float().mean())
                if bool(counted.any())
                else 0.0,
                "ratio_mean": float(r.mean()),
                "ratio_min": float(r.min()),
                "ratio_max": float(r.max()),
                "approx_kl": float(0.5 * log_ratio[counted].square().mean())
                if bool(counted.any())
                else 0.0,
            }
        return loss, metrics


def gaussian_mean_kl(
    mean: torch.Tensor,
    ref_mean: torch.Tensor,
    std: torch.Tensor,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """KL between two Gaussian transitions that share their std: ``||mu - mu_ref||^2 / (2 std^2)``.

    This is the Flow-GRPO KL regulariser on the SDE step means (Liu et al. 2025, eq. 12). It is
    computed per element and reduced like the log-probs (``"mean"`` or ``"sum"`` over the event).
    Note: the Flow-GRPO reference code divides by the diffusion coefficient ``sigma_s^2`` instead of
    the transition variance ``sigma_s^2 * |dt|``; we use the exact KL, which is larger by
    ``1 / |dt|``, so its ``beta`` values are not directly transferable.

    Args:
        mean, ref_mean: ``[N, *event]``.
        std: ``[N]`` transition std (positive).

    Returns:
        ``[N]``.
    """
    var = std.reshape(-1, *([1] * (mean.ndim - 1))).square()
    return reduce_event((mean - ref_mean).square() / (2 * var), reduction)


def token_kl(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    estimator: KLEstimator = "k3",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-element KL(pi || pi_ref) estimates from samples of pi (Schulman, "Approximating KL").

    With ``d = ref_log_probs - log_probs``: ``k1 = -d``, ``k2 = d^2 / 2``,
    ``k3 = exp(d) - d - 1`` (unbiased and non-negative; GRPO's choice). ``mask`` zeroes ``d``
    outside the counted tokens before the exponential: a padding position's log-prob can be
    below -88, where ``exp`` overflows and ``inf * 0`` would turn the aggregate into NaN.
    """
    d = ref_log_probs - log_probs
    if mask is not None:
        d = torch.where(mask.bool(), d, torch.zeros_like(d))
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"KL estimator must be one of k1, k2, k3, got {estimator!r}")
