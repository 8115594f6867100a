"""The compositional task's reward, GenEval-like (``tasks.compositional`` describes the task).

The task's scorer (``tasks/compositional_scorer.py``: a tiny detector of grid-cell objects)
reads each canvas; the reward turns its detections into GenEval's per-prompt correctness: 1 when
every requirement of the prompt's spec is met, else 0.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.artifact import ArtifactProbeReward
from reward_models.base import RewardModel, RewardOutput
from tasks.compositional import (
    CANVAS,
    CATEGORIES,
    parse_prompt,
    requirements,
)
from tasks.compositional_scorer import CellScorer, load_scorer, read_scenes

EMBEDDED_ARTIFACT_PROBE = "compositional/artifact_probe.safetensors"


class CompositionalReward(RewardModel):
    """GenEval-style correctness of canvases ``[B, 3, 32, 32]`` for the compositional prompts.

    Scores:

    * ``compositional`` (primary): 1 when the scorer's reading of the canvas meets every
      requirement of the prompt's spec (``tasks.compositional.requirements``), else 0;
      with ``partial_credit`` the fraction of requirements met instead;
    * ``correct``: GenEval's all-or-nothing correctness, whatever the primary score is (so
      that a run trained on ``strict`` still logs the GenEval-rule score);
    * ``requirements``: the fraction of requirements met (logged either way);
    * ``exact``: correct and nothing else on the canvas (as many objects as the prompt asks
      for). GenEval does not count extra objects outside ``counting``, and neither does the
      primary score unless ``strict``; a policy that learns to fill every cell raises the
      primary score and lowers this one (and ``counting``), which is how that hack shows;
    * one score per category of ``CATEGORIES``: the correctness on that category's samples,
      NaN (and not ``applicable``) on the others, so that its mean over a batch or a held-out
      set is GenEval's per-category accuracy;
    * ``exact_<category>``: the same for ``exact``, the strict score's per-category accuracy;
    * ``objects``: how many objects the scorer found.

    Strict correctness is a mode of this reward rather than a reward of its own: both scores
    come from one reading of the canvas by the same detector, and one reward that logs both
    keeps a run trained on either score reporting the other on the same samples.

    Args:
        path: scorer safetensors; None uses the embedded one.
        device: where to run the scorer.
        partial_credit: train on the fraction of requirements met instead of all-or-nothing.
        strict: the primary score also requires no extra objects (``exact``).
    """

    name = "compositional"
    accepts = ("images",)
    image_channels = (3,)
    image_size = (CANVAS, CANVAS)  # the task's canvas, read by a detector of that size

    def __init__(
        self,
        path: str | None = None,
        device: str | torch.device = "cpu",
        partial_credit: bool = False,
        strict: bool = False,
    ) -> None:
        if partial_credit and strict:
            raise ValueError(f"{self.name}: choose partial_credit or strict, not both")
        self.path = path
        self.device = torch.device(device)
        self.partial_credit = partial_credit
        self.strict = strict
        self._model: CellScorer | None = None

    @property
    def model(self) -> CellScorer:
        if self._model is None:
            self._model = load_scorer(self.path).to(self.device)
        return self._model

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        if outputs.ndim != 4 or tuple(outputs.shape[1:]) != (3, CANVAS, CANVAS):
            raise ValueError(
                f"{self.name}: expected images [B, 3, {CANVAS}, {CANVAS}] in [0, 1], got "
                f"{tuple(outputs.shape)}"
            )
        specs = {p: parse_prompt(p) for p in dict.fromkeys(prompts)}  # groups repeat prompts
        scenes = read_scenes(self.model, outputs.float().to(self.device))
        met = [requirements(specs[p], scene) for p, scene in zip(prompts, scenes, strict=True)]
        correct = torch.tensor([float(all(m)) for m in met])
        fraction = torch.tensor([sum(m) / len(m) for m in met])
        asked = torch.tensor([float(sum(o.count for o in specs[p].objects)) for p in prompts])
        found = torch.tensor([float(len(s)) for s in scenes])
        exact = correct * (found == asked).float()
        primary = fraction if self.partial_credit else exact if self.strict else correct
        scores = {
            self.name: primary,
            "correct": correct,
            "requirements": fraction,
            "exact": exact,
            "objects": found,
        }
        applicable = {}
        for category in CATEGORIES:
            mask = torch.tensor([specs[p].category == category for p in prompts])
            missing = torch.full_like(correct, float("nan"))
            scores[category] = torch.where(mask, correct, missing)
            scores[f"exact_{category}"] = torch.where(mask, exact, missing)
            applicable[category] = applicable[f"exact_{category}"] = mask
        return RewardOutput(scores, applicable)


class CompositionalArtifactProbe(ArtifactProbeReward):
    """``artifact_probe`` (``1 - P(artifact)``) with the compositional task's embedded probe: a
    small head on the cell scorer's features, trained on rendered scenes (clean) against the
    same scenes with noise, blur, duplicated objects or grid lines (artifacts). A metric to log
    at weight 0: RL never sees it, so a policy that degrades its pictures while the reward
    rises shows here.

    Args:
        path: probe file; None uses the embedded one.
        device: where the scorer features and the head run.
    """

    def __init__(self, path: str | None = None, device: str | torch.device = "cpu") -> None:
        from loading.assets import embedded_asset_path

        super().__init__(path or str(embedded_asset_path(EMBEDDED_ARTIFACT_PROBE)), device)
