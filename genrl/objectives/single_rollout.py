"""MSSR's single-rollout advantages (Liu et al. 2025, "Stable and Efficient Single-Rollout RL
for Multimodal Reasoning"): a tracked per-prompt value baseline instead of a group, and an
entropy bonus per token. Pure tensor math like ``advantages.py``, whose group estimators these
replace when ``algorithm.advantage=mssr``.
"""

from __future__ import annotations

import torch


class BetaValueTracker:
    """MSSR's per-prompt value baseline (Liu et al. 2025, "Stable and Efficient Single-Rollout RL
    for Multimodal Reasoning", arXiv 2512.18215), kept across iterations, keyed by prompt text.

    With one rollout per prompt there is no group to compare against, so each prompt ``x``
    carries a Beta posterior over its success probability, ``V(x) ~ Beta(alpha(x), beta(x))``
    with estimate ``V(x) = alpha / (alpha + beta)`` ("eq. 5" in the released code's docstrings,
    ruiiu/MSSR ``verl/trainer/core_algos.py``, ``MVSRValueTracker``), updated after every rollout
    with a forgetting factor ``rho`` that discounts outcomes of older policies ("eq. 7"):

        alpha <- rho * alpha + o,   beta <- rho * beta + (1 - o),   o = 1[r > 0.5].

    An unseen prompt starts from ``alpha = v_init * N0``, ``beta = (1 - v_init) * N0``, the
    released code's fallback prior (``N0 = 1 / (1 - rho_min) = 8`` pseudo-outcomes). Its main
    path instead rolls the initial policy over the whole training set once before training
    ("Algorithm 2", ``mvsr_run_initialization``); genrl's trainer has no such pre-pass, so every
    prompt starts from the prior (genrl's choice, documented in ``docs/algorithms/grpo.md``).

    ``rho`` is fixed here. The released code adapts it to the mean KL between the rollout policy
    and the reference over the last 10 iterations and uses ``(rho_min + rho_max) / 2 = 0.9175``
    while it has no KL (always, when the run has no reference model); genrl keeps that value.

    Args:
        rho: forgetting factor in ``(0, 1]``.
        prior_count: ``N0``, pseudo-outcomes of the prior (> 0).
        v_init: prior success probability in ``[0, 1]``.
    """

    def __init__(self, rho: float = 0.9175, prior_count: float = 8.0, v_init: float = 0.5) -> None:
        if not 0 < rho <= 1:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        if prior_count <= 0:
            raise ValueError(f"prior_count must be > 0, got {prior_count}")
        if not 0 <= v_init <= 1:
            raise ValueError(f"v_init must be in [0, 1], got {v_init}")
        self.rho, self.prior_count, self.v_init = rho, prior_count, v_init
        # prompt -> [alpha, beta], Python floats (float64): the state of every process is the
        # same because every process updates it with the same gathered batch.
        self._counts: dict[str, list[float]] = {}

    def _state(self, prompt: str) -> list[float]:
        prior = [self.v_init * self.prior_count, (1.0 - self.v_init) * self.prior_count]
        return self._counts.get(prompt, prior)

    def values(self, prompts: list[str]) -> torch.Tensor:
        """``[N]`` float32 baselines ``alpha / (alpha + beta)`` of ``prompts`` (the prior's for
        unseen ones), without updating."""
        return torch.tensor(
            [a / (a + b) for a, b in (self._state(p) for p in prompts)], dtype=torch.float32
        )

    def update(self, prompts: list[str], rewards: torch.Tensor) -> None:
        """Fold ``rewards [N]`` into the prompts' posteriors, one outcome at a time (a prompt
        drawn twice in one batch is updated twice, as the released code does)."""
        outcomes = (rewards.float() > 0.5).tolist()
        if len(prompts) != len(outcomes):
            raise ValueError(f"{len(prompts)} prompts but {len(outcomes)} rewards")
        for prompt, success in zip(prompts, outcomes, strict=True):
            alpha, beta = self._state(prompt)
            self._counts[prompt] = [
                self.rho * alpha + float(success),
                self.rho * beta + float(not success),
            ]

    def state_dict(self) -> dict[str, object]:
        return {"counts": {p: list(c) for p, c in self._counts.items()}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        counts = state["counts"]
        assert isinstance(counts, dict)
        self._counts = {str(p): [float(c[0]), float(c[1])] for p, c in counts.items()}


def mssr_advantages(
    tracker: BetaValueTracker,
    prompts: list[str],
    rewards: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """MSSR's group-free sequence advantages: the reward minus the prompt's tracked baseline
    (read *before* this batch updates it), normalised over the whole batch,

        A_i = r_i - V(x_i),   A_i <- (A_i - mean A) / sqrt(max(var A, eps)),

    with the population variance, as the released code (``compute_mvsr_advantage``,
    ``normalize_globally``) computes it; a batch of one sample is left unnormalised. Then the
    tracker learns the batch's outcomes.

    Args:
        tracker: the run's ``BetaValueTracker`` (updated in place).
        prompts: ``N`` prompt texts of the gathered batch.
        rewards: ``[N]`` rewards (verifiable: 1 correct; ``> 0.5`` counts as a success).
        eps: floor of the variance (the released code's ``mvsr_eps``: 1e-6).

    Returns:
        ``[N]`` float32.
    """
    rewards = rewards.float()
    if rewards.ndim != 1 or len(prompts) != rewards.shape[0]:
        raise ValueError(f"{len(prompts)} prompts need rewards [N], got {tuple(rewards.shape)}")
    advantages = rewards - tracker.values(prompts).to(rewards.device)
    if advantages.numel() > 1:
        variance = advantages.var(unbiased=False)
        advantages = (advantages - advantages.mean()) * variance.clamp(min=eps).rsqrt()
    tracker.update(prompts, rewards.cpu())
    return advantages


def entropy_shaped_advantages(
    advantages: torch.Tensor,
    entropies: torch.Tensor,
    mask: torch.Tensor,
    alpha: float = 0.4,
    kappa: float = 2.0,
) -> torch.Tensor:
    """MSSR's entropy-based advantage shaping (the term of Cheng et al. 2025, "Reasoning with
    Exploration: An Entropy Perspective", which the released code's
    ``compute_entropy_advantage_shaping`` cites): every counted token ``t`` of sample ``i`` gets

        A_{i,t} = A_i + min(alpha * H_{i,t}, |A_i| / kappa),

    ``H`` detached (it shapes the signal and is never differentiated). The bonus is positive
    whatever the sign of ``A_i`` and at most ``|A_i| / kappa``: correct answers are pushed up to
    ``1 + 1 / kappa`` times harder at uncertain tokens, wrong answers pushed down less there
    (by at least ``1 - 1 / kappa`` of ``|A_i|``), which keeps the policy from collapsing its
    entropy.

    Args:
        advantages: ``[N]`` sequence advantages.
        entropies: ``[N, T]`` per-token entropies of the completions.
        mask: ``[N, T]`` bool, the tokens that enter the loss (0 elsewhere in the result).
        alpha: entropy scale (released config: 0.4).
        kappa: divisor of ``|A|`` that caps the bonus (released config: 2).

    Returns:
        ``[N, T]`` float32.
    """
    if entropies.shape != mask.shape or entropies.shape[0] != advantages.shape[0]:
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, entropies {tuple(entropies.shape)} and mask "
            f"{tuple(mask.shape)} must be [N], [N, T], [N, T]"
        )
    base = advantages.float()[:, None]
    bonus = torch.minimum(alpha * entropies.detach().float(), base.abs() / kappa)
    return (base + bonus) * mask


__all__ = ["BetaValueTracker", "entropy_shaped_advantages", "mssr_advantages"]
