"""Phase 6's small pieces: an iteration's score metrics, the evaluation's metrics and record,
and the progress bar the trainer writes its console lines through."""

from __future__ import annotations

import math
from typing import Any

import torch

from genrl.loop.groups import group_stats
from genrl.objectives.advantages import zero_std_fraction
from genrl.reporting.evaluation import EvalResult


def score_metrics(
    scores: dict[str, torch.Tensor],
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
) -> dict[str, float]:
    """``<score>/mean|std|min|max`` of every score (NaN where it does not apply is left out)
    and the training reward's group statistics (the objective reports its advantages').

    Args:
        scores: name -> ``[N]`` every score of the iteration's samples.
        rewards: ``[N]`` the training reward.
        group_ids: ``[N]`` group ids.
    """
    metrics: dict[str, float] = {}
    for name, values in scores.items():
        # A score is NaN where it does not apply (a per-category score on the others).
        finite = values[~values.isnan()]
        metrics[f"{name}/mean"] = float(finite.mean()) if len(finite) else math.nan
        metrics[f"{name}/std"] = float(finite.std(unbiased=False)) if len(finite) else math.nan
        # The observed range bounds the plotted mean +- std band of an undeclared range.
        metrics[f"{name}/min"] = float(finite.min()) if len(finite) else math.nan
        metrics[f"{name}/max"] = float(finite.max()) if len(finite) else math.nan
    metrics["reward/zero_std_fraction"] = zero_std_fraction(rewards, group_ids)
    stats = group_stats(rewards, group_ids)
    metrics.update({f"reward/{k}": v for k, v in stats.items()})
    return metrics


def eval_metrics(result: EvalResult) -> dict[str, float]:
    """``eval/reward`` and every held-out score (e.g. ``eval/countdown/accuracy``)."""
    metrics = {"eval/reward": result.reward}
    metrics.update({f"eval/{name}": value for name, value in result.scores.items()})
    return metrics


def eval_record(result: EvalResult) -> dict[str, Any]:
    return {"reward": result.reward, "per_prompt": result.per_prompt, "scores": result.scores}


def progress(start: int, total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="training", unit="it", dynamic_ncols=True)


def echo(bar: Any, line: str) -> None:
    if bar is not None:
        bar.write(line)
    else:
        print(line, flush=True)


__all__ = ["echo", "eval_metrics", "eval_record", "progress", "score_metrics"]
