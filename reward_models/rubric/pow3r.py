"""``rubric_pow3r``: the rubric reward with criterion weights adapted from rollout-level contrast
(POW3R: Tyagi et al. 2026, "Not Every Rubric Teaches Equally: Policy-Aware Rubric Rewards for
RLVR", https://arxiv.org/abs/2605.20164).

What the paper states (abstract and its Hugging Face page, https://huggingface.co/papers/2605.20164):
a criterion that all sampled rollouts pass, or all fail, gives no group-relative learning signal;
POW3R "preserves human weights and category balance as the rubric objective while adapting
criterion-level reward weights during training", using "rollout-level contrast to emphasize
criteria that currently separate the policy's outputs". Its update rule was not available to us
(no full text or code found), so the rule below is this project's, built from those sentences:

* contrast of criterion ``k`` in one iteration: ``c_k = mean over groups of std_g(s_k)``, the
  population standard deviation of its scores over the group's samples (groups of two or more
  samples where it applies; a pass/fail criterion with pass rate ``p`` has ``sqrt(p (1 - p))``);
* state: ``C_k <- (1 - ema) C_k + ema c_k`` (``C_k = c_k`` the first time; ``prior`` before);
* weights, per category (essential, important, optional, pitfall) of a sample's rubric, so that
  each category keeps its human total ``H`` ("category balance")::

      a_k = H * h_k (eps + C_k) / sum_j h_j (eps + C_j),   w_k = (1 - mix) h_k + mix a_k

  with ``h`` the human weights; ``eps`` keeps saturated criteria from vanishing entirely.

The reward trains on ``w``; ``human`` logs the same criterion scores under ``h`` (the objective).
The state is a table of ``buckets`` entries addressed by a hash of the criterion's id and text
(so every process holds the same table after ``gather``, and checkpoints hold it); criteria
that share a bucket share a contrast.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from reward_models.rubric.reward import RubricReward, group_index
from reward_models.rubric.spec import Criterion


def bucket_of(criterion: Criterion, buckets: int) -> int:
    """The state-table entry of a criterion: a stable hash of its id and text."""
    digest = hashlib.blake2b(criterion.key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


class Pow3rRubricReward(RubricReward):
    """Rubric reward with POW3R-style adaptive weights (module docstring).

    Args:
        ema: weight of the newest contrast in the running estimate.
        mix: how much of the adapted weight replaces the human one (1: all of it).
        eps: floor added to every contrast.
        prior: the contrast assumed for a criterion never seen (0.5: the largest std of a
            score in [0, 1], so new criteria start emphasised).
        buckets: size of the state table.
        **kwargs: ``RubricReward``'s arguments.
    """

    name = "rubric_pow3r"
    adaptive = True

    def __init__(
        self,
        ema: float = 0.5,
        mix: float = 1.0,
        eps: float = 0.05,
        prior: float = 0.5,
        buckets: int = 4096,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not (0 < ema <= 1 and 0 <= mix <= 1 and eps > 0 and buckets > 0):
            raise ValueError(f"{self.name}: need 0 < ema <= 1, 0 <= mix <= 1, eps > 0, buckets > 0")
        self.ema, self.mix, self.eps, self.prior, self.buckets = ema, mix, eps, prior, buckets
        self.contrast = torch.full((buckets,), float(prior), dtype=torch.float64)
        self.seen = torch.zeros(buckets, dtype=torch.bool)
        self.steps = 0

    def criterion_contrast(self, criterion: Criterion) -> float:
        """The running contrast ``C_k`` (``prior`` if never seen)."""
        return float(self.contrast[bucket_of(criterion, self.buckets)])

    def weights_for(self, rubric: list[Criterion]) -> list[float]:
        """``w = (1 - mix) h + mix a`` (module docstring), per category."""
        weights = [c.weight for c in rubric]
        for category in {c.category for c in rubric}:
            members = [k for k, c in enumerate(rubric) if c.category == category]
            human = sum(rubric[k].weight for k in members)
            raw = {
                k: rubric[k].weight * (self.eps + self.criterion_contrast(rubric[k]))
                for k in members
            }
            total = sum(raw.values())
            for k in members:
                adapted = human * raw[k] / total if total > 0 else rubric[k].weight
                weights[k] = (1 - self.mix) * rubric[k].weight + self.mix * adapted
        return weights

    def update(
        self,
        outputs: Any,
        prompts: list[str],
        metadata: Any = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Fold this iteration's per-criterion contrast into the running estimate (the scores
        of the last ``score`` call are reused when it scored these very outputs, as the trainer
        does, else recomputed)."""
        last = self._last
        if last is not None and last[0] is outputs and last[1] == list(prompts):
            _, _, rubrics, scores = last
        else:
            rubrics, scores, _ = self.criterion_scores(
                outputs, list(prompts), list(metadata or [{} for _ in prompts])
            )
        sums = torch.zeros(self.buckets, dtype=torch.float64)
        counts = torch.zeros(self.buckets, dtype=torch.float64)
        groups = group_index(list(prompts), rubrics)
        for g in dict.fromkeys(groups):
            rows = [i for i, h in enumerate(groups) if h == g]
            if len(rows) < 2:
                continue
            for k, crit in enumerate(rubrics[g]):
                values = scores[rows, k].double()
                if bool(torch.isfinite(values).all()):
                    b = bucket_of(crit, self.buckets)
                    sums[b] += values.std(unbiased=False)
                    counts[b] += 1
        table = torch.stack([sums, counts])[None]
        if gather is not None:
            table = gather(table)
        sums, counts = table.sum(dim=0)
        fresh = counts > 0
        batch = sums[fresh] / counts[fresh]
        old = self.contrast[fresh]
        blended = torch.where(self.seen[fresh], (1 - self.ema) * old + self.ema * batch, batch)
        self.contrast[fresh] = blended
        self.seen |= fresh
        self.steps += 1
        return {
            "criteria_updated": float(fresh.sum()),
            "contrast_mean": float(batch.mean()) if len(batch) else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"contrast": self.contrast.clone(), "seen": self.seen.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "contrast" not in state:
            return
        if state["contrast"].numel() != self.buckets:
            raise ValueError(
                f"{self.name}: checkpoint has {state['contrast'].numel()} buckets, "
                f"this reward {self.buckets}"
            )
        self.contrast = state["contrast"].clone().to(torch.float64)
        self.seen = state["seen"].clone().bool()
        self.steps = int(state.get("steps", 0))


__all__ = ["Pow3rRubricReward", "bucket_of"]
