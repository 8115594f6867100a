"""One reward call on a batch of merged jobs (``replicas.py``), and what becomes of each job.

``score_batch`` scores the jobs' samples with one call and gives each job its rows. A
``RewardInputError`` is one request's fault, not the merge's: a merge of several jobs is then
scored again one job at a time, so that only the job whose input the reward refused gets a 422.
Any other exception is the replica's (or the reward's) fault: it is returned with the jobs left
unscored and their outputs kept, for the replica to fail them over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from reward_models.base import RewardInputError, RewardModel
from reward_models.serving.jobs import Job, one_line
from reward_models.wire import VERSION, encode_scores


def score_batch(
    reward: RewardModel, batch: list[Job], record: Callable[[int], None]
) -> Exception | None:
    """Score ``batch`` (merged jobs of one key) with one call of ``reward``; ``record`` is
    told the size of every call. Each job ends with a ``result`` or a ``refusal``, except, when
    a call raised another exception, the jobs not scored yet: that exception is returned and
    they keep their outputs (a retry elsewhere needs them)."""
    outputs, prompts, metadata = _merge(batch)
    if len(batch) > 1:
        for job in batch:  # the merged copy is the one to keep: halves the peak of a merge
            job.outputs = None
    try:
        record(len(prompts))
        result = reward(outputs, prompts, metadata)
        scores = {k: v.detach().float().cpu() for k, v in result.scores.items()}
        applicable = {
            k: result.applicable.get(k, torch.ones(len(prompts), dtype=torch.bool)).cpu()
            for k in result.applicable
        }
    except RewardInputError as err:
        if len(batch) == 1:
            batch[0].refusal = one_line(err, limit=1000)
            return None
        _restore(batch, outputs)
        del outputs
        for job in batch:  # one at a time: only the job the reward cannot score is refused
            failure = score_batch(reward, [job], record)
            if failure is not None:  # the others stay unscored, to go elsewhere
                return failure
        return None
    except Exception as err:  # the caller logs it and fails the jobs over
        _restore(batch, outputs)
        return err
    start = 0
    for job in batch:
        rows = slice(start, start + len(job))
        job.result = {
            "version": VERSION,
            "reward": reward.name,
            "scores": encode_scores({k: v[rows] for k, v in scores.items()}),
            "applicable": {k: v[rows].tolist() for k, v in applicable.items()},
        }
        start += len(job)
    return None


def _merge(batch: list[Job]) -> tuple[Any, list[str], list[dict[str, Any]] | None]:
    prompts = [p for job in batch for p in job.prompts]
    if len(batch) == 1:
        outputs: Any = batch[0].outputs  # a merge copies: not for one request
    elif isinstance(batch[0].outputs, torch.Tensor):
        outputs = torch.cat([job.outputs for job in batch])
    else:
        outputs = [t for job in batch for t in job.outputs]
    metadata = None
    if any(job.metadata for job in batch):
        metadata = [m for job in batch for m in (job.metadata or [{}] * len(job))]
    return outputs, prompts, metadata


def _restore(batch: list[Job], outputs: Any) -> None:
    """Give each job of a failed merge its own outputs back, copied out of the merged tensor
    (so that the merge, taken from the pixel budget until this call returns, can be freed)."""
    if len(batch) == 1:
        batch[0].outputs = outputs
        return
    start = 0
    for job in batch:
        rows = outputs[start : start + len(job)]
        job.outputs = rows.clone() if isinstance(rows, torch.Tensor) else rows
        start += len(job)


__all__ = ["score_batch"]
