"""Reward models behind one interface; heavy imports are deferred until a model is built.

Importing the package imports no torch: ``REWARDS`` holds names and ``"module:Class"`` strings,
and the contract's names (``RewardModel``, ``CompositeReward``, ...) load on first access
(PEP 562), so that a config's reward names are checked before torch loads.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reward_models.base import CallableReward, RewardInputError, RewardModel, RewardOutput
    from reward_models.composite import CompositeReward, RewardError

# public name -> the module that defines it
_HOMES = {
    "CallableReward": "reward_models.base",
    "RewardInputError": "reward_models.base",
    "RewardModel": "reward_models.base",
    "RewardOutput": "reward_models.base",
    "CompositeReward": "reward_models.composite",
    "RewardError": "reward_models.composite",
}


def __getattr__(name: str) -> Any:
    """The contract's public names, imported on first access."""
    if name not in _HOMES:
        raise AttributeError(f"module 'reward_models' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


# name -> "module:Class" (imported on build) or the class itself, for rewards defined in user code.
REWARDS: dict[str, Any] = {
    "digit_classifier": "reward_models.digits:DigitClassifierReward",
    "moving_digit": "reward_models.moving_digits:MovingDigitReward",
    "compositional": "reward_models.compositional:CompositionalReward",
    "compositional_artifact_probe": "reward_models.compositional:CompositionalArtifactProbe",
    "sample_diversity": "reward_models.diversity:SampleDiversity",
    "target_color": "reward_models.color:TargetColorReward",
    "clipscore": "reward_models.clip:CLIPScoreReward",
    "pickscore": "reward_models.clip:PickScoreReward",
    "aesthetic": "reward_models.aesthetic:AestheticReward",
    "hps": "reward_models.hps:HPSReward",
    "image_reward": "reward_models.image_reward:ImageReward",
    "countdown": "reward_models.text:CountdownReward",
    "overlong_penalty": "reward_models.text:OverlongPenalty",
    "sudoku": "reward_models.text:SudokuReward",
    "math_boxed": "reward_models.math_answer:MathBoxedReward",
    "shapes_vqa": "reward_models.text:ShapesVQAReward",
    "remote": "reward_models.remote:RemoteReward",
    "dino_similarity": "reward_models.dino:DinoSimilarityReward",
    "dino_adversarial": "reward_models.dino:DinoAdversarialReward",
    "artifact_probe": "reward_models.artifact:ArtifactProbeReward",
    "artifact_judge": "reward_models.judge:ArtifactJudgeReward",
    "vqa_score": "reward_models.vqa_score:VQAScoreReward",
    "ocr": "reward_models.ocr:OCRReward",
    "corrected_score": "reward_models.corrected:CorrectedScore",
    "frame_reward": "reward_models.video:FrameReward",
    "video_judge": "reward_models.video:VideoJudgeReward",
    "subject_consistency": "reward_models.vbench:SubjectConsistency",
    "background_consistency": "reward_models.vbench:BackgroundConsistency",
    "motion_smoothness": "reward_models.vbench:MotionSmoothness",
    "rubric": "reward_models.rubric.reward:RubricReward",
    "rubric_pow3r": "reward_models.rubric.pow3r:Pow3rRubricReward",
}


def reward_class(name: str) -> Any:
    """The class (or factory) registered as ``name``, imported on first use."""
    if name not in REWARDS:
        close = difflib.get_close_matches(name, list(REWARDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown reward {name!r}.{hint} Known: {', '.join(REWARDS)}")
    entry = REWARDS[name]
    if isinstance(entry, str):
        module_name, cls_name = entry.split(":")
        entry = getattr(importlib.import_module(module_name), cls_name)
    return entry


def build_reward(name: str, /, **kwargs: Any) -> RewardModel:
    """Instantiate the reward registered as ``name``.

    A reward that wraps others (``corrected_score``) names the arguments that hold them in
    ``nested_rewards``; each such argument given as a spec, ``{"name": ..., "kwargs": {...}}``,
    is built here first, so the wrapper never reaches back into this registry. The wrapper's
    ``device`` goes to every inner reward that takes one and whose spec leaves it unset.
    """
    cls = reward_class(name)
    for argument in getattr(cls, "nested_rewards", ()):
        spec = kwargs.get(argument)
        if isinstance(spec, dict) and "name" not in spec:
            raise ValueError(f"{name}: {argument} must be a {{'name': ..., 'kwargs': ...}} spec")
        if isinstance(spec, dict):
            inner = dict(spec.get("kwargs", {}))
            takes_device = "device" in inspect.signature(reward_class(spec["name"])).parameters
            if "device" in kwargs and "device" not in inner and takes_device:
                inner["device"] = kwargs["device"]
            kwargs[argument] = build_reward(spec["name"], **inner)
    return cls(**kwargs)


__all__ = [
    "REWARDS",
    "CallableReward",
    "CompositeReward",
    "RewardError",
    "RewardInputError",
    "RewardModel",
    "RewardOutput",
    "build_reward",
    "reward_class",
]
