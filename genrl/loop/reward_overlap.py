"""Rewards off the critical path (``train.overlap_rewards``): while the rollout samples chunk
``k + 1``, a background thread scores chunk ``k``.

Both orders score the batch in the rollout's chunks (``Rollout.chunks``: ``train.rollout_batch_size``
samples for the flow rollouts that stream, else the whole batch): the serial order with
``score_in_chunks`` after sampling, the overlapped one with ``sample_and_score``, which drives
``Rollout.stream`` (``genrl/rollouts/base.py``), decodes each chunk in the calling thread as the
serial order decodes it (``Rollout.outputs``, outside ``no_grad`` and autocast) and hands it to a
``RewardWorker``. The rewards see the same batches either way, so scores, advantages and
everything after them are the same bit for bit, whatever the reward. What stays in the calling
thread, as before: sampling, decoding, the errors of the NaN checks (raised there, naming the
sample's row in the whole batch), ``reward.update`` of stateful rewards, and the gathering over
processes (the collector's, after every chunk is scored).

The worker is one thread, so a local model scores chunks one after the other, in order; a
reward whose ``concurrent_calls`` is above 1 (a remote server's client) gets that many threads,
one request each, its results still assembled in row order. The threads live only inside
``sample_and_score``: an error or a Ctrl-C in either thread cancels the chunks not yet started
and waits for the running one before it propagates, so no thread outlives the call.

Threads and torch: a reward computed on the CPU shares torch's intra-op thread pool
(``torch.set_num_threads``) with the sampling thread, and pure-Python scoring holds the GIL, so
on a CPU-bound machine the overlap can slow sampling down by about what it hides; it pays when
the reward waits (a reward server, an API, a disk) or runs on another device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from genrl.prompts.sources import reward_metadata
from genrl.rollouts.base import Chunk, Rollout


@dataclass
class ScoredRollout:
    """What ``sample_and_score`` returns: the batch and its local scores.

    Attributes:
        batch: the rollout's batch (what ``Rollout.collect`` would return).
        outputs: every chunk's decoded outputs, joined (what ``Rollout.outputs`` returns).
        metadata: the rewards' per-sample columns, or None.
        scores: name -> ``[N]`` scores of this process's samples.
        sampling_s: seconds until the last chunk was handed over (sampling and decoding).
        waiting_s: seconds then spent waiting for the rewards still running.
    """

    batch: Any
    outputs: Any
    metadata: list[dict[str, Any]] | None
    scores: dict[str, torch.Tensor]
    sampling_s: float
    waiting_s: float


class RewardWorker:
    """Scores chunks in background threads and returns their scores in row order.

    Args:
        reward: the run's reward (``CompositeReward``); ``reward.concurrent_calls`` threads.
    """

    def __init__(self, reward: Any) -> None:
        self.reward = reward
        threads = max(1, int(getattr(reward, "concurrent_calls", 1)))
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="genrl-reward")
        self.parts: list[tuple[slice, Future[Any]]] = []

    def submit(
        self, rows: slice, outputs: Any, prompts: list[str], metadata: list[dict] | None
    ) -> None:
        """Queue the chunk at ``rows`` of the batch."""
        self.parts.append((rows, self.pool.submit(self.reward, outputs, prompts, metadata)))

    def raise_first_failure(self) -> None:
        """Raise the error of the first failed chunk if every chunk before it is scored (so
        a failure stops sampling early, and the error raised is the one the serial order
        would meet first)."""
        for rows, future in self.parts:
            if not future.done():
                return
            _result(rows, future)

    def scores(self) -> dict[str, torch.Tensor]:
        """Wait for every chunk; name -> ``[N]`` scores in row order."""
        parts = [(rows, _result(rows, future)) for rows, future in self.parts]
        return _joined_scores(self.reward, parts)

    def close(self) -> None:
        """Cancel the chunks not yet started and wait for the running ones."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def _result(rows: slice, future: Future[Any]) -> Any:
    """The chunk's ``RewardOutput``; a ``RewardError`` about one sample names its row in the
    whole batch."""
    error = future.exception()
    if error is None:
        return future.result()
    _raise_at(rows, error)


def _raise_at(rows: slice, error: BaseException) -> Any:
    shifted = getattr(error, "shifted", None)
    if callable(shifted) and rows.start:
        raise shifted(rows.start) from error.__cause__
    raise error


def _joined_scores(reward: Any, parts: list[tuple[slice, Any]]) -> dict[str, torch.Tensor]:
    """name -> ``[N]`` scores of the chunks' ``RewardOutput``s, in row order."""
    names = list(parts[0][1].scores)
    for rows, result in parts:
        if list(result.scores) != names:
            raise ValueError(
                f"reward {getattr(reward, 'name', 'reward')!r} returned the scores "
                f"{sorted(result.scores)} for rows {rows.start}-{rows.stop - 1} but "
                f"{sorted(names)} for rows 0-{parts[0][0].stop - 1}: rewards scored in chunks "
                "(train.rollout_batch_size) must name the same scores for every chunk"
            )
    return {name: torch.cat([r.scores[name] for _, r in parts]) for name in names}


def score_in_chunks(
    reward: Any,
    outputs: Any,
    prompts: list[str],
    metadata: list[dict[str, Any]] | None,
    chunks: list[slice],
) -> dict[str, torch.Tensor]:
    """The serial order: ``reward`` on each chunk of the decoded batch, one after the other;
    name -> ``[N]`` scores (a single chunk is one call on the whole batch)."""
    if len(chunks) == 1:
        return dict(reward(outputs, prompts, metadata).scores)
    parts = []
    for rows in chunks:
        try:
            result = reward(outputs[rows], prompts[rows], metadata[rows] if metadata else None)
        except Exception as error:  # re-raised, renumbered
            _raise_at(rows, error)
        parts.append((rows, result))
    return _joined_scores(reward, parts)


def sample_and_score(
    rollout: Rollout[Any, Any],
    policy: Any,
    prompts: list[str],
    group_ids: torch.Tensor,
    noise: Any,
    reward: Any,
    sampling_context: Callable[[], AbstractContextManager[Any]],
) -> ScoredRollout:
    """Sample with ``rollout.stream`` under ``sampling_context()`` (no gradients, autocast) and
    score each chunk in the background as soon as it is decoded."""
    start = time.perf_counter()
    expected = rollout.chunks(len(prompts))
    # Prompt columns anywhere in the batch give every chunk a metadata list, as the serial
    # order's slices of the whole batch's list.
    any_columns = reward_metadata(prompts) is not None
    stream = rollout.stream(policy, prompts, group_ids, noise)
    worker = RewardWorker(reward)
    outputs: list[Any] = []
    metadata: list[list[dict[str, Any]] | None] = []
    try:
        while True:
            with sampling_context():
                try:
                    chunk: Chunk[Any] = next(stream)
                except StopIteration as done:
                    batch = done.value
                    break
            _check_rows(rollout, expected, len(outputs), chunk.rows)
            outputs.append(rollout.outputs(policy, chunk.batch))
            chunk_prompts = prompts[chunk.rows]
            columns = reward_metadata(chunk_prompts, rollout.reward_metadata(chunk.batch))
            if columns is None and any_columns:
                columns = [{} for _ in chunk_prompts]
            metadata.append(columns)
            worker.submit(chunk.rows, outputs[-1], chunk_prompts, columns)
            worker.raise_first_failure()
        done_at = time.perf_counter()
        _check_rows(rollout, expected, len(outputs), None)
        scores = worker.scores()
    finally:
        stream.close()  # an interrupted stream leaves its contexts (a lagged copy's weights)
        worker.close()
    return ScoredRollout(
        batch=batch,
        outputs=_join(outputs),
        metadata=_join_metadata(metadata, [_length(o) for o in outputs]),
        scores=scores,
        sampling_s=done_at - start,
        waiting_s=time.perf_counter() - done_at,
    )


def _check_rows(rollout: Any, expected: list[slice], index: int, rows: slice | None) -> None:
    """The stream must yield the chunks ``rollout.chunks`` names, in order (``rows`` None: it
    has ended)."""
    want = expected[index] if index < len(expected) else None
    if rows != want:
        got = "ended before" if rows is None else f"yielded rows {rows} as"
        raise ValueError(
            f"{type(rollout).__name__}.stream {got} chunk {index}, but its chunks() are {expected}"
        )


def _length(outputs: Any) -> int:
    return outputs.shape[0] if isinstance(outputs, torch.Tensor) else len(outputs)


def _join(parts: list[Any]) -> Any:
    """The chunks' outputs as one batch: tensors concatenated, lists chained."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return [item for part in parts for item in part]


def _join_metadata(
    parts: list[list[dict[str, Any]] | None], sizes: list[int]
) -> list[dict[str, Any]] | None:
    """The chunks' reward columns as one list (None when no chunk has any), as
    ``reward_metadata`` builds them for the whole batch."""
    if all(part is None for part in parts):
        return None
    rows: list[dict[str, Any]] = []
    for part, size in zip(parts, sizes, strict=True):
        rows.extend(part if part is not None else [{} for _ in range(size)])
    return rows


__all__ = ["RewardWorker", "ScoredRollout", "sample_and_score", "score_in_chunks"]
