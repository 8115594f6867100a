"""Policy losses shared by every ratio-based algorithm: the clipped surrogate and KL terms.

A loss is a small object whose ``__call__`` returns ``(loss, metrics)``; metrics are detached
0-dim tensors (``Metrics``), reduced to floats once per iteration by the trainer, so logging
costs no device synchronisation per minibatch. Both surrogates (over flow transitions and over tokens) build
their per-element terms with ``surrogate_terms``, so clipping, dual-clip and the log-ratio
clamp behave the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from genrl.objectives.token_configs import AGGREGATIONS as AGGREGATIONS
from samplers.base import reduce_event

Metrics = dict[str, torch.Tensor]
"""Detached 0-dim tensors, by name."""
KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"]
LOG_RATIO_CLAMP = 20.0
"""verl clamps the log-ratio to +-20 before ``exp`` (``core_algos.compute_policy_loss_vanilla``):
``exp(20)`` is finite in float32, ``exp(100)`` is not, and an infinite unclipped term turns the
gradient of the clipped branch into ``0 * inf = NaN``."""


class SurrogateTerms(NamedTuple):
    """Per-element pieces of the clipped surrogate (all of the log-ratio's shape).

    Attributes:
        loss: the per-element loss (PPO's pessimistic max, then the dual clip where set).
        ratio: ``exp(clamped log-ratio)``.
        log_ratio: ``log_probs - old_log_probs`` after the clamp.
        clipped: True where the clipped term is the active one.
        dual_clipped: True where the dual-clip bound is the active one.
    """

    loss: torch.Tensor
    ratio: torch.Tensor
    log_ratio: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor


def surrogate_terms(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_range_low: float,
    clip_range_high: float,
    clip_ratio_c: float | None = None,
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP,
) -> SurrogateTerms:
    """PPO's clipped surrogate per element (Schulman et al. 2017, eq. 7), negated as a loss,
    with the dual clip of Ye et al. 2020 ("Mastering Complex Control in MOBA Games", eq. 5):

        l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
        l = min(l, -A c)   where A < 0 (dual clip, c > 1),      r = exp(clamp(log_ratio)).

    For a negative advantage the unclipped term grows without bound as ``r`` grows; the dual
    clip caps it at ``-A c`` (verl's ``clip_ratio_c``, default 3 there). ``log_ratio`` and
    ``advantages`` broadcast against each other.
    """
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_term = -advantages * ratio.clamp(1 - clip_range_low, 1 + clip_range_high)
    loss = torch.maximum(unclipped, clipped_term)
    clipped = clipped_term > unclipped
    dual_clipped = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_clipped, bound.expand_as(loss), loss)
    return SurrogateTerms(loss, ratio, log_ratio, clipped, dual_clipped)


def _check_ranges(low: float, high: float, clip_ratio_c: float | None) -> None:
    if not (low > 0 and high > 0):  # also rejects NaN
        raise ValueError(f"clip ranges must be positive, got low={low} high={high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")


def _ratio_metrics(terms: SurrogateTerms, counted: torch.Tensor | None) -> Metrics:
    """Clip fractions, ratio range and the KL estimates of the counted elements (the neutral
    values 0 and ratio 1 when none counts), computed without a device synchronisation."""
    with torch.no_grad():
        if counted is None:
            counted = torch.ones_like(terms.log_ratio, dtype=torch.bool)
        counted = counted.expand_as(terms.log_ratio)
        n = counted.sum().clamp(min=1)
        ratio, log_ratio = terms.ratio.expand_as(counted), terms.log_ratio
        any_counted = counted.any()

        def mean(x: torch.Tensor) -> torch.Tensor:
            return torch.where(counted, x.expand_as(counted).float(), 0.0).sum() / n

        one = torch.ones((), device=ratio.device)
        return {
            "clip_fraction": mean(terms.clipped),
            "dual_clip_fraction": mean(terms.dual_clipped),
            "ratio_mean": torch.where(any_counted, mean(ratio), one),
            "ratio_min": torch.where(
                any_counted, torch.where(counted, ratio, torch.inf).min(), one
            ),
            "ratio_max": torch.where(
                any_counted, torch.where(counted, ratio, -torch.inf).max(), one
            ),
            # Flow-GRPO logs 0.5 * mean(d^2) as "approx_kl" (train_sd3.py); verl logs the mean
            # of old minus new log-prob as "ppo_kl" (core_algos.compute_policy_loss_vanilla).
            "approx_kl": 0.5 * mean(log_ratio.square()),
            "ppo_kl": -mean(log_ratio),
        }


@dataclass
class ClippedSurrogate:
    """The clipped surrogate over independent elements (flow transitions), averaged.

    ``L = mean(surrogate_terms(log_probs - old_log_probs, A))``. Separate low/high ranges are
    DAPO's "clip-higher" (Yu et al. 2025); by default both equal.

    Args:
        clip_range_low: ``epsilon_low``; Flow-GRPO uses 1e-4 with mean-reduced log-probs.
        clip_range_high: ``epsilon_high``; None means equal to ``clip_range_low``.
        clip_ratio_c: dual-clip bound for negative advantages (> 1); None disables it.
        log_ratio_clamp: clamp of the log-ratio before ``exp`` (None disables it).
    """

    clip_range_low: float
    clip_range_high: float | None = None
    clip_ratio_c: float | None = None
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP

    def __post_init__(self) -> None:
        if self.clip_range_high is None:
            self.clip_range_high = self.clip_range_low
        _check_ranges(self.clip_range_low, self.clip_range_high, self.clip_ratio_c)

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        """Loss over ``[N]`` elements (samples, or sample-timestep pairs).

        Args:
            log_probs: ``[N]`` under the current parameters (with grad).
            old_log_probs: ``[N]`` recorded at rollout time.
            advantages: ``[N]``.
            weights: ``[N]`` multipliers of the elements' terms before the mean (None: 1).

        Returns:
            scalar loss and metrics: ``clip_fraction`` (share of elements whose clipped term
            was active), ``dual_clip_fraction``, ``ratio_mean/min/max``, ``approx_kl``
            (``0.5 * mean((lp - lp_old)^2)``, what Flow-GRPO logs) and ``ppo_kl``
            (``mean(lp_old - lp)``, what verl logs).
        """
        if not (log_probs.shape == old_log_probs.shape == advantages.shape):
            raise ValueError(
                "log_probs, old_log_probs and advantages must share one shape, got "
                f"{tuple(log_probs.shape)}, {tuple(old_log_probs.shape)}, {tuple(advantages.shape)}"
            )
        assert self.clip_range_high is not None
        terms = surrogate_terms(
            log_probs - old_log_probs.detach(),
            advantages,
            self.clip_range_low,
            self.clip_range_high,
            self.clip_ratio_c,
            self.log_ratio_clamp,
        )
        loss = terms.loss if weights is None else terms.loss * weights
        return loss.mean(), _ratio_metrics(terms, None)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation,
    max_length: int | None = None,
    tokens_per_minibatch: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values ``[B, T]`` over the tokens where ``mask`` to a scalar.

    * ``sequence_mean``: mean over sequences of each sequence's token mean (GRPO, Shao et al.
      2024, eq. 3; TRL ``loss_type="grpo"``, verl ``seq-mean-token-mean``). Long and short
      answers weigh the same, the "length bias" Dr.GRPO points out.
    * ``token_mean``: token sum divided by ``tokens_per_minibatch``, the mean number of counted
      tokens per minibatch over the optimizer step's accumulation window and all processes, so
      that the step's gradient is the mean over every token it sees (DAPO, Yu et al. 2025,
      eq. 8; TRL ``loss_type="dapo"``; verl ``token-mean`` with the global token count). Without
      it, this minibatch's own token count (``bnpo``).
    * ``bnpo``: token sum / this minibatch's token count (TRL ``loss_type="bnpo"``).
    * ``sequence_sum``: mean over sequences of each sequence's token sum (verl
      ``seq-mean-token-sum``).
    * ``constant``: token sum divided by ``B * max_length`` (Dr.GRPO, Liu et al. 2025, eq. 3;
      TRL ``loss_type="dr_grpo"``).

    Rows with no token contribute 0 (and count in ``B`` for the per-sequence forms).
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum(dim=-1)
    if aggregation == "sequence_mean":
        return (total / mask.sum(dim=-1).clamp(min=1)).mean()
    if aggregation == "token_mean" and tokens_per_minibatch is not None:
        return total.sum() / max(tokens_per_minibatch, 1.0)
    if aggregation in ("token_mean", "bnpo"):
        return total.sum() / mask.sum().clamp(min=1)
    if aggregation == "sequence_sum":
        return total.mean()
    if aggregation == "constant":
        if max_length is None or max_length < 1:
            raise ValueError("aggregation 'constant' needs max_length (the generation limit)")
        return total.sum() / (values.shape[0] * max_length)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


@dataclass
class TokenClippedSurrogate:
    """The clipped surrogate over tokens, with token or sequence importance ratios.

    ``level="token"`` (GRPO/DAPO): ``ratio_{i,t} = exp(lp_{i,t} - lp_old_{i,t})``.
    ``level="sequence"`` (GSPO, Zheng et al. 2025, eq. 5-7, in its "GSPO-token" form of eq. 13):
    every token of sequence ``i`` carries the ratio ``s_i = exp(mean_t(lp - lp_old))`` in value,
    with the gradient of ``s_i * lp_{i,t} / sg(lp_{i,t})``. Both levels build per-token terms and
    reduce them with ``aggregation``; with ``sequence_mean`` the sequence level is exactly
    GSPO's per-sequence objective (the aggregation verl's ``compute_policy_loss_gspo`` always
    uses), while the token-sum aggregations weigh each sequence by its length (TRL warns about
    that combination).

    Args:
        clip_range_low, clip_range_high: PPO epsilons (GRPO 0.2; DAPO high 0.28; GSPO 3e-4/4e-4).
        level: ``token`` or ``sequence``.
        aggregation: see ``aggregate``.
        max_length: generation limit, for the ``constant`` aggregation.
        clip_ratio_c: dual-clip bound for negative advantages (> 1); None disables it.
        log_ratio_clamp: clamp of the log-ratio before ``exp`` (None disables it).
    """

    clip_range_low: float
    clip_range_high: float | None = None
    level: Literal["token", "sequence"] = "token"
    aggregation: Aggregation = "sequence_mean"
    max_length: int | None = None
    clip_ratio_c: float | None = None
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP

    def __post_init__(self) -> None:
        if self.clip_range_high is None:
            self.clip_range_high = self.clip_range_low
        _check_ranges(self.clip_range_low, self.clip_range_high, self.clip_ratio_c)
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
        tokens_per_minibatch: float | None = None,
        token_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        """Args: ``log_probs``/``old_log_probs``/``mask`` ``[B, T]``; ``advantages`` ``[B]``
        (one per sequence) or ``[B, T]`` (per token, e.g. process rewards);
        ``tokens_per_minibatch`` the normaliser of the ``token_mean`` aggregation;
        ``token_weights`` ``[B, T]`` detached factors of each token's term (truncated
        importance weights, ``genrl/objectives/mismatch.py``), None for 1.

        Returns the scalar loss and ``clip_fraction``, ``dual_clip_fraction``,
        ``ratio_mean/min/max``, ``approx_kl`` and ``ppo_kl`` over the counted tokens.
        """
        if not (log_probs.shape == old_log_probs.shape == mask.shape) or log_probs.ndim != 2:
            raise ValueError(
                "log_probs, old_log_probs and mask must all be [B, T], got "
                f"{tuple(log_probs.shape)}, {tuple(old_log_probs.shape)}, {tuple(mask.shape)}"
            )
        if advantages.shape not in (log_probs.shape[:1], log_probs.shape):
            raise ValueError(
                f"advantages must be [B] or [B, T] = {tuple(log_probs.shape)}, got "
                f"{tuple(advantages.shape)}"
            )
        if advantages.ndim == 1:
            advantages = advantages[:, None]
        counted = mask.bool()
        maskf = mask.to(log_probs.dtype)
        log_ratio = (log_probs - old_log_probs.detach()) * maskf
        token_log_ratio = log_ratio.detach()
        if self.level == "sequence":
            sequence = log_ratio.sum(-1, keepdim=True) / maskf.sum(-1, keepdim=True).clamp(min=1)
            # Value s_i on every token; gradient s_i * d lp_t (GSPO-token, eq. 13).
            log_ratio = log_probs - log_probs.detach() + sequence.detach()
        assert self.clip_range_high is not None
        terms = surrogate_terms(
            log_ratio,
            advantages,
            self.clip_range_low,
            self.clip_range_high,
            self.clip_ratio_c,
            self.log_ratio_clamp,
        )
        per_token = terms.loss if token_weights is None else terms.loss * token_weights.detach()
        loss = aggregate(per_token, mask, self.aggregation, self.max_length, tokens_per_minibatch)
        if self.level == "sequence":
            # One ratio per sequence: report it once per sequence, not once per token.
            rows = counted.any(-1)
            first = counted.float().argmax(-1)
            pick = torch.zeros_like(counted)
            pick[rows, first[rows]] = True
            metrics = _ratio_metrics(terms, pick)
            # ppo_kl stays a token mean of old minus new log-prob, as verl's
            # compute_policy_loss_gspo logs it (masked_mean over the response tokens), not a
            # mean of the per-sequence ratios' logs.
            metrics["ppo_kl"] = -token_log_ratio.sum() / counted.sum().clamp(min=1)
            return loss, metrics
        return loss, _ratio_metrics(terms, counted)


def gaussian_mean_kl(
    mean: torch.Tensor,
    ref_mean: torch.Tensor,
    std: torch.Tensor,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """``||mu - mu_ref||^2 / (2 std^2)`` per element, reduced like the log-probs (``"mean"`` or
    ``"sum"`` over the event).

    With ``std`` the transition std this is the exact KL between two Gaussian transitions that
    share their std (Flow-GRPO, Liu et al. 2025, eq. 12). The Flow-GRPO reference code passes the
    diffusion coefficient ``sigma_s`` instead (``train_sd3.py``: ``/ (2 * std_dev_t ** 2)``, with
    ``std_dev_t`` from ``sde_step_with_logprob`` before the ``sqrt(-dt)`` factor): that value is
    smaller than the exact KL by the step's ``|dt|``, a factor that changes from step to step
    (``FlowGRPOConfig.kl_form`` picks one).

    Args:
        mean, ref_mean: ``[N, *event]``.
        std: ``[N]`` (positive).

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


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the ``mask`` elements (0 when none), detached, for logging."""
    counted = mask.bool()
    total = torch.where(counted, values.detach().float(), 0.0).sum()
    return total / counted.sum().clamp(min=1)


def token_policy_loss(
    surrogate: TokenClippedSurrogate,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    tokens_per_minibatch: float | None = None,
    extra: dict[str, torch.Tensor] | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """The token objective of the GRPO family: the clipped surrogate plus ``kl_beta`` times the
    per-token KL to the reference, both reduced by ``surrogate.aggregation``.

    Shapes: ``log_probs``, ``mask`` ``[B, T]``; ``old_log_probs`` ``[B, T]``, or ``[B, 0]``
    when the update is exactly on-policy (then the detached ``log_probs`` stand in for them);
    ``ref_log_probs`` ``[B, T]`` (ignored when ``kl_beta`` is 0); ``advantages`` ``[B]`` or
    ``[B, T]``.

    Metrics: the surrogate's, ``policy_loss``, and with a KL term ``kl_loss`` (the reduced term
    ``kl_beta`` multiplies) and ``kl`` (the mean per-token k3 over the counted tokens, what TRL
    logs as ``kl``); ``extra`` values are added, detached. ``token_weights`` scale the
    surrogate's terms (not the KL's), as the surrogate's ``__call__`` says.
    """
    if old_log_probs.shape[-1] == 0:
        old_log_probs = log_probs.detach()
    loss, metrics = surrogate(
        log_probs, old_log_probs, advantages, mask, tokens_per_minibatch, token_weights
    )
    metrics["policy_loss"] = loss.detach()
    if kl_beta > 0:
        kl = token_kl(log_probs, ref_log_probs, kl_estimator, mask)
        kl_loss = aggregate(
            kl, mask, surrogate.aggregation, surrogate.max_length, tokens_per_minibatch
        )
        loss = loss + kl_beta * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
        metrics["kl"] = masked_mean(token_kl(log_probs, ref_log_probs, "k3", mask), mask)
    for name, value in (extra or {}).items():
        metrics[name] = value.detach()
    return loss, metrics
