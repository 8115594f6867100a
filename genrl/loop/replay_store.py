"""The replay store: per prompt, earlier correct completions with their scores, sampling
log-probs and entropy, and ExGRPO's bucketing and priorities over it.

ExGRPO (Zhan et al. 2025, "ExGRPO: Learning to Reason from Experience", arXiv 2510.02245) keeps
the correct rollouts of each question in a replay buffer, files each question in the bucket of
its latest number of correct rollouts ``k`` of ``G``, draws the questions to replay with a
weight per bucket, and replays each question's lowest-entropy stored trajectory. What follows
is read from its released code (``ElliottYan/LUFFY``, ``ExGRPO/exgrpo/verl/verl/mix_src``):

- collection (``experience/experience_trainer_ops.py``, ``collect_experience_entries``): a
  group with ``lbound < k <= rbound`` correct (released 0 and 7 of 8) moves its question to
  bucket ``k`` and stores each of its correct completions not already stored (by text);
  groups outside the range change nothing. A question whose whole group is correct is retired
  (``skip_uid_set``: its stored completions are deleted and it is never replayed again).
- bucket weights (``experience/weighted_bucket_sampler.py``): ``normal`` is the density of
  N(G/2, 1) at ``k``, ``1/sqrt(2 pi) exp(-(k - G/2)^2 / 2)``; ``linear`` k/G; ``sqrt``
  sqrt(k/G); ``linear_clip`` k/G, 0.5 above G/2. Non-empty buckets' weights are normalised to
  probabilities.
- question draw (``WeightedBucketSampler.sample``): ``n`` questions; the per-bucket counts are a
  multinomial draw with those probabilities; a bucket given more than it holds gives the excess
  back, and the excess is handed out one question at a time to the buckets with room left, each
  time with their renormalised probabilities; within a bucket the questions are drawn without
  replacement.
- trajectory choice (``experience/experience_helpers.py``, ``select_best_experiences``): per
  drawn question, the stored completion with the lowest mean token entropy (``argmin``).

Randomness comes from the named stream ``Streams.REPLAY`` of ``(seed, iteration)``, so a resumed
run draws what an uninterrupted one draws. The store's whole content is its ``state_dict``
(checkpointed by the trainer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from genrl.run.replay_config import ReplayConfig
from tasks.prompt import Prompt, prompt_columns, prompt_id


@dataclass
class StoredCompletion:
    """One stored completion of a prompt.

    Attributes:
        tokens: ``[L]`` long, the completion's generated tokens (what the model attended to).
        trained: how many leading tokens were trained (up to and including the end token, or a
            stop string's end).
        log_probs: ``[trained]`` float32 sampling log-probs of those tokens under the policy
            that sampled them (the rollout engine's, at the sampler's temperature).
        finished: the completion ended with an end token.
        scores: every reward score it got, name -> value.
        entropy: its mean negative sampled-token log-prob (``replay.entropy=recorded``).
        iteration: the iteration that sampled it.
    """

    tokens: torch.Tensor
    trained: int
    log_probs: torch.Tensor
    finished: bool
    scores: dict[str, float]
    entropy: float
    iteration: int

    def to_state(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens.clone(),
            "trained": self.trained,
            "log_probs": self.log_probs.clone(),
            "finished": self.finished,
            "scores": dict(self.scores),
            "entropy": self.entropy,
            "iteration": self.iteration,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> StoredCompletion:
        return cls(
            tokens=state["tokens"],
            trained=int(state["trained"]),
            log_probs=state["log_probs"],
            finished=bool(state["finished"]),
            scores={k: float(v) for k, v in state["scores"].items()},
            entropy=float(state["entropy"]),
            iteration=int(state["iteration"]),
        )


def bucket_weight(correct: int, group_size: int, method: str) -> float:
    """ExGRPO's sampling weight of the bucket of questions with ``correct`` of ``group_size``
    rollouts correct (``WeightedBucketSampler``'s four mappings)."""
    if method == "normal":
        return math.exp(-((correct - group_size / 2) ** 2) / 2) / math.sqrt(2 * math.pi)
    if method == "linear":
        return correct / group_size
    if method == "sqrt":
        return math.sqrt(correct / group_size)
    if method == "linear_clip":
        return 0.5 if correct > group_size / 2 else correct / group_size
    raise ValueError(f"unknown bucket weighting {method!r}")


def bucket_counts(
    sizes: dict[int, int], weights: dict[int, float], n: int, generator: torch.Generator
) -> dict[int, int]:
    """How many questions each bucket gives: a multinomial draw of ``n`` with the buckets'
    normalised weights, each count capped at the bucket's size and the excess handed out one at
    a time to the buckets with room, with their renormalised weights (ExGRPO's
    ``WeightedBucketSampler.sample``). ``sizes`` and ``weights`` are keyed by bucket; only
    buckets with questions and a positive weight take part."""
    keys = [k for k in sorted(sizes) if sizes[k] > 0 and weights[k] > 0]
    if not keys or n <= 0:
        return {}
    probs = torch.tensor([weights[k] for k in keys], dtype=torch.float64)
    drawn = torch.multinomial(probs / probs.sum(), n, replacement=True, generator=generator)
    counts = torch.bincount(drawn, minlength=len(keys)).tolist()
    excess = 0
    for i, k in enumerate(keys):
        if counts[i] > sizes[k]:
            excess += counts[i] - sizes[k]
            counts[i] = sizes[k]
    while excess > 0:
        room = [i for i, k in enumerate(keys) if counts[i] < sizes[k]]
        if not room:
            break  # every bucket is empty now: fewer questions than asked
        chosen = room[int(torch.multinomial(probs[room], 1, generator=generator))]
        counts[chosen] += 1
        excess -= 1
    return {k: c for k, c in zip(keys, counts, strict=True) if c > 0}


@dataclass
class ReplayStore:
    """Earlier correct completions per prompt, ExGRPO's buckets and retired prompts.

    Args:
        config: ``replay.*``.
        group_size: ``train.group_size`` (``G``).

    Attributes:
        completions: prompt id -> stored completions, oldest first.
        buckets: prompt id -> its latest count of correct completions (ExGRPO's bucket key).
        prompts: prompt id -> (text, columns, row), to rebuild the prompt a replay needs.
        retired: prompt ids whose whole group was once correct (never stored or replayed again).
        active: the delayed start is over (``replay.start_accuracy``).
    """

    config: ReplayConfig
    group_size: int
    completions: dict[str, list[StoredCompletion]] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)
    prompts: dict[str, tuple[str, dict[str, Any], int | None]] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)
    active: bool = False

    def __post_init__(self) -> None:
        self.active = self.config.start_accuracy is None

    # -- what may be replayed ----------------------------------------------------------------
    def replayable(self) -> list[str]:
        """Prompt ids with a bucket and a stored completion, in the order they were first
        stored (ExGRPO's ``valid_exp_uids``: stored and not retired)."""
        return [
            key
            for key, stored in self.completions.items()
            if stored and key in self.buckets and key not in self.retired
        ]

    def prompt(self, key: str) -> Prompt:
        text, columns, row = self.prompts[key]
        return Prompt(text, columns, row)

    def draw_questions(self, n: int, generator: torch.Generator) -> list[str]:
        """ExGRPO's question draw: ``n`` distinct replayable prompt ids by bucket weight (fewer
        when fewer are replayable), grouped by bucket in increasing ``k``."""
        candidates = self.replayable()
        by_bucket: dict[int, list[str]] = {}
        for key in candidates:
            by_bucket.setdefault(self.buckets[key], []).append(key)
        weights = {
            k: bucket_weight(k, self.group_size, self.config.bucket_weighting) for k in by_bucket
        }
        counts = bucket_counts({k: len(v) for k, v in by_bucket.items()}, weights, n, generator)
        chosen: list[str] = []
        for k, count in counts.items():
            members = by_bucket[k]
            order = torch.randperm(len(members), generator=generator)[:count].tolist()
            chosen += [members[i] for i in order]
        return chosen

    def choose(
        self, key: str, entropies: list[float] | None, generator: torch.Generator
    ) -> StoredCompletion:
        """The stored completion of ``key`` to replay: by ``replay.trajectory_choice`` over
        ``entropies`` (one per stored completion; the recorded ones when None)."""
        stored = self.completions[key]
        choice = self.config.trajectory_choice
        if choice == "random":
            return stored[int(torch.randint(len(stored), (1,), generator=generator))]
        values = entropies if entropies is not None else [c.entropy for c in stored]
        pick = min if choice == "lowest_entropy" else max
        # The first of equal values, as numpy's argmin / argmax.
        return stored[pick(range(len(values)), key=lambda i: values[i])]

    def correct_for_reuse(self, key: str, generator: torch.Generator) -> StoredCompletion | None:
        """AR3PO's reuse: a stored correct completion of ``key`` (``replay.reuse_choice``)."""
        stored = self.completions.get(key)
        if not stored or key in self.retired:
            return None
        if self.config.reuse_choice == "latest":
            return stored[-1]
        return stored[int(torch.randint(len(stored), (1,), generator=generator))]

    # -- what the store learns from a scored batch ----------------------------------------------
    def update(
        self, prompt: str, correct: list[bool], fresh: list[StoredCompletion | None]
    ) -> None:
        """One group's outcome: ``correct`` per member (replayed ones included, as in the
        released code, whose count ``k`` is over the whole group), and for each fresh correct
        member the completion to store (None for replayed or wrong members)."""
        key, k = prompt_id(prompt), sum(correct)
        if k == len(correct) and self.config.retire_solved:
            self.retired.add(key)
            self.completions.pop(key, None)
            self.buckets.pop(key, None)
            return
        if key in self.retired or not self.active:
            return
        if not self.config.min_correct <= k <= self.config.upper_correct(self.group_size):
            return
        self.buckets[key] = k
        self.prompts[key] = (str(prompt), prompt_columns(prompt), getattr(prompt, "row", None))
        stored = self.completions.setdefault(key, [])
        for candidate in fresh:
            if candidate is None:
                continue
            # The released code keeps one copy of each text; equal token ids mean equal text.
            if not any(torch.equal(candidate.tokens, c.tokens) for c in stored):
                stored.append(candidate)

    def stats(self) -> dict[str, float]:
        """Store metrics: questions, completions, retired questions and questions per bucket."""
        replayable = self.replayable()
        metrics = {
            "replay/questions": float(len(replayable)),
            "replay/completions": float(sum(len(self.completions[k]) for k in replayable)),
            "replay/retired": float(len(self.retired)),
            "replay/active": float(self.active),
        }
        for key in replayable:
            name = f"replay/bucket_{self.buckets[key]}"
            metrics[name] = metrics.get(name, 0.0) + 1.0
        return metrics

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "completions": {k: [c.to_state() for c in v] for k, v in self.completions.items()},
            "buckets": dict(self.buckets),
            "prompts": {k: list(v) for k, v in self.prompts.items()},
            "retired": sorted(self.retired),
            "active": self.active,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.completions = {
            k: [StoredCompletion.from_state(c) for c in v] for k, v in state["completions"].items()
        }
        self.buckets = {k: int(v) for k, v in state["buckets"].items()}
        self.prompts = {k: (v[0], dict(v[1]), v[2]) for k, v in state["prompts"].items()}
        self.retired = set(state["retired"])
        self.active = bool(state["active"])


__all__ = ["ReplayStore", "StoredCompletion", "bucket_counts", "bucket_weight"]
