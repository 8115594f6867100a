"""Verifiable text rewards: the embedded Countdown task and DAPO's overlong penalty."""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput


class CountdownReward(RewardModel):
    """``countdown``: 1 for a correct equation using exactly the prompt's numbers, 0.1 for a
    well-formed wrong one, 0 otherwise (``tasks.countdown``); also logs ``accuracy``."""

    name = "countdown"
    headline = "accuracy"  # what the docs quote; the reward gives partial credit
    accepts = ("texts",)
    score_range = (0.0, 1.0)

    def __init__(self, answer_tags: bool = False) -> None:
        """Args: answer_tags: read the equation from the last ``<answer>...</answer>`` (chat
        models that reason first); a completion without tags scores 0."""
        self.answer_tags = answer_tags

    def score(
        self, outputs: list[str], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        from tasks.countdown import CORRECT_REWARD, answer_in_tags, countdown_reward

        del metadata
        if isinstance(outputs, torch.Tensor):
            raise ValueError(f"{self.name}: expected completion texts, got a tensor")
        if self.answer_tags:
            # No tags: an empty answer, which scores 0 (malformed).
            outputs = [answer_in_tags(text) or "" for text in outputs]
        values = torch.tensor(countdown_reward(prompts, outputs), dtype=torch.float32)
        return RewardOutput({self.name: values, "accuracy": (values == CORRECT_REWARD).float()})


class OverlongPenalty(RewardModel):
    """DAPO's soft overlong punishment (Yu et al. 2025, "Overlong Reward Shaping"), a reward
    to add to the task reward:

    ``0`` up to ``max_length - buffer`` tokens, then falling linearly to ``-factor`` at
    ``max_length`` (and ``-factor`` beyond). Reads ``completion_length`` from the reward
    metadata that token algorithms pass.

    Args:
        max_length: the generation limit (``generation.max_new_tokens``).
        buffer: the length of the soft zone ``L_cache`` (DAPO: 4096 of 20480).
        factor: penalty at the limit.
    """

    name = "overlong_penalty"

    def __init__(self, max_length: int, buffer: int, factor: float = 1.0) -> None:
        if not 0 < buffer <= max_length:
            raise ValueError(f"overlong_penalty: need 0 < buffer <= max_length, got {buffer}")
        self.max_length, self.buffer, self.factor = max_length, buffer, factor

    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del outputs
        if metadata is None or any("completion_length" not in m for m in metadata):
            # Held-out evaluation passes no lengths: the penalty does not apply there.
            zeros = torch.zeros(len(prompts))
            return RewardOutput({self.name: zeros})
        lengths = torch.tensor([float(m["completion_length"]) for m in metadata])
        excess = lengths - (self.max_length - self.buffer)
        penalty = (-excess / self.buffer * self.factor).clamp(min=-self.factor, max=0.0)
        return RewardOutput({self.name: penalty})


class SudokuReward(RewardModel):
    """``sudoku``: fraction of the puzzle's blank cells filled correctly
    (``tasks.sudoku``), plus ``solved_bonus`` when every blank is right; also logs
    ``solved`` (0/1).

    Args:
        solved_bonus: added for a fully solved grid, so that the last wrong cell is worth more
            than the others (0: the plain cell fraction).
    """

    name = "sudoku"
    headline = "solved"  # what the docs quote; the reward gives partial credit
    accepts = ("texts",)

    def __init__(self, solved_bonus: float = 0.0) -> None:
        self.solved_bonus = solved_bonus
        self.score_range = (0.0, 1.0 + solved_bonus) if solved_bonus >= 0 else None

    def score(
        self, outputs: list[str], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        from tasks.sudoku import sudoku_reward

        del metadata
        if isinstance(outputs, torch.Tensor):
            raise ValueError(f"{self.name}: expected completion texts, got a tensor")
        cells = torch.tensor(sudoku_reward(prompts, outputs), dtype=torch.float32)
        solved = (cells == 1.0).float()
        return RewardOutput({self.name: cells + self.solved_bonus * solved, "solved": solved})


class ShapesVQAReward(RewardModel):
    """``shapes_vqa``: 1 when the first word of the completion's first line (lower-cased,
    without surrounding punctuation) is the prompt's ``answer`` column, 0.1 when it is another
    answer the task can give (a digit, colour, shape, yes or no), 0 otherwise
    (``tasks.shapes``); also logs ``accuracy`` (0/1) and, where prompts carry
    the ``kind`` column, ``accuracy/<kind>`` (NaN on the other kinds' samples, so that its
    mean is that kind's accuracy) and ``exists/says_yes`` (1 for a "yes" to an ``exists``
    question): a policy that answers every existence question alike shows there, since its
    accuracy on them is then the held-out set's share of that answer, not what it sees."""

    name = "shapes_vqa"
    headline = "accuracy"  # what the docs quote; the reward gives partial credit
    accepts = ("texts",)
    score_range = (0.0, 1.0)

    def score(
        self, outputs: list[str], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        from tasks.shapes import CORRECT_REWARD, normalise, shapes_reward

        if isinstance(outputs, torch.Tensor):
            raise ValueError(f"{self.name}: expected completion texts, got a tensor")
        if metadata is None or any("answer" not in m for m in metadata):
            raise ValueError(
                f"{self.name}: every prompt needs an 'answer' column (prompts.dataset=shapes_vqa)"
            )
        del prompts
        values = torch.tensor(shapes_reward(outputs, [str(m["answer"]) for m in metadata]))
        correct = (values == CORRECT_REWARD).float()
        scores = {self.name: values, "accuracy": correct}
        applicable = {}
        kinds = [m.get("kind") for m in metadata]
        nan = torch.full_like(correct, float("nan"))
        for kind in dict.fromkeys(k for k in kinds if k is not None):
            mask = torch.tensor([k == kind for k in kinds])
            scores[f"accuracy/{kind}"] = torch.where(mask, correct, nan)
            applicable[f"accuracy/{kind}"] = mask
        if "exists" in kinds:
            mask = torch.tensor([k == "exists" for k in kinds])
            yes = torch.tensor([normalise(o) == "yes" for o in outputs]).float()
            scores["exists/says_yes"] = torch.where(mask, yes, nan)
            applicable["exists/says_yes"] = mask
        return RewardOutput(scores, applicable)
