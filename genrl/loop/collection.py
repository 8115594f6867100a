"""Phases 1-4 of an iteration: prompts, rollout, rewards, advantages (docs/architecture.md, section 2).

``BatchCollector.collect(iteration)`` returns the training batch of this process with its
advantages, plus the gathered scores for logging. Everything random derives from named streams
of ``(seed, iteration, round)``, so a resumed run draws what an uninterrupted one draws, and so
does a run on N processes wherever the streams are global (``genrl/data/rng.py``). With ``train.dynamic_sampling`` it samples refill rounds
until enough groups have varied rewards (``genrl/loop/allocation.py``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from genrl.data.rng import RolloutNoise
from genrl.distributed.processes import gather
from genrl.loop.allocation import collect_varied_groups
from genrl.loop.groups import expand_groups, gather_scores
from genrl.loop.reward_overlap import sample_and_score, score_in_chunks
from genrl.objectives.advantages import decoupled_group_rewards
from genrl.objectives.base import Objective
from genrl.policies.protocols import Policy
from genrl.prompts.sources import reward_metadata
from genrl.rollouts.base import Rollout
from genrl.run.config import TrainConfig
from tasks.prompt import prompt_id


@dataclass
class CollectedBatch:
    """Output of phases 1-4 for one iteration.

    Attributes:
        rollout: this process's rollout, advantages filled.
        noise: the iteration's random streams (also used for shuffling).
        scores: every reward score of the gathered batch, name -> ``[N]``.
        group_ids: ``[N]`` group ids of the gathered batch.
        advantages: ``[N]`` advantages of the gathered batch.
        timings: seconds spent per phase.
        extra_metrics: further iteration metrics (dynamic sampling's rounds, reward updates).

    With dynamic sampling, ``scores`` and ``group_ids`` cover every sample of every round and
    ``advantages`` the training batch.
    """

    rollout: Any
    noise: RolloutNoise
    scores: dict[str, torch.Tensor]
    group_ids: torch.Tensor
    advantages: torch.Tensor
    timings: dict[str, float]
    extra_metrics: dict[str, float] = field(default_factory=dict)


class BatchCollector:
    """Runs phases 1-4 for the trainer.

    Args:
        config: the run's configuration.
        accelerator: the run's ``accelerate.Accelerator``.
        policy, rollout, objective, reward: the run's components (the rollout samples in
            phase 2, the objective turns rewards into advantages in phase 4).
        prompts: the run's ``PromptSource``.
        local: this process's slice of the global batch.
    """

    def __init__(
        self,
        config: TrainConfig,
        accelerator: Any,
        policy: Policy,
        rollout: Rollout[Any, Any],
        objective: Objective[Any, Any, Any],
        reward: Any,
        prompts: Any,
        local: slice,
    ) -> None:
        self.config = config
        self.accelerator = accelerator
        self.policy = policy
        self.rollout = rollout
        self.objective = objective
        self.reward = reward
        self.prompts = prompts
        self.local = local
        self.num_global = config.train.prompts_per_iteration * config.train.group_size
        self.offline = None
        if config.train.offline_store:
            from genrl.loop.offline import OfflineSource

            self.offline = OfflineSource(config, accelerator)

    def fill_offline_store(self) -> int:
        """Sample and score the groups the offline store still lacks (none without a store)."""
        if self.offline is None:
            return 0
        return self.offline.fill(self.policy, self.rollout, self.reward, self.prompts, self.local)

    def collect(self, iteration: int) -> CollectedBatch:
        """The iteration's batch; with ``train.dynamic_sampling``, refill rounds until enough
        groups have varied rewards."""
        t = self.config.train
        if self.offline is not None:
            return self.read_offline(iteration)
        if not t.dynamic_sampling:
            return self.collect_round(iteration, 0)
        num_processes = self.accelerator.num_processes

        def min_over_processes(count: int) -> int:
            if num_processes == 1:
                return count
            counts = self.accelerator.gather(torch.tensor([count], device=self.policy.device))
            return int(counts.min())

        rollout: Any
        rollout, rounds = collect_varied_groups(
            lambda round_index: self.collect_round(iteration, round_index),
            target_groups=t.prompts_per_iteration // num_processes,
            group_size=t.group_size,
            max_rounds=t.dynamic_sampling_max_rounds,
            metric=t.dynamic_sampling_metric or self.reward.name,
            local=self.local,
            min_over_processes=min_over_processes,
        )
        # Metrics describe everything sampled this iteration (what the policy achieves), the
        # advantages the training batch.
        scores = {k: torch.cat([b.scores[k] for b in rounds]) for k in rounds[0].scores}
        generated = sum(len(b.group_ids) for b in rounds) // t.group_size
        return CollectedBatch(
            rollout=rollout,
            noise=rounds[0].noise,
            scores=scores,
            group_ids=torch.cat([b.group_ids for b in rounds]),
            advantages=gather(rollout.advantages, self.accelerator),
            timings={k: sum(b.timings[k] for b in rounds) for k in rounds[0].timings},
            extra_metrics={
                **rounds[-1].extra_metrics,
                "dynamic_sampling/rounds": float(len(rounds)),
                "dynamic_sampling/kept_group_fraction": t.prompts_per_iteration / generated,
            },
        )

    def collect_round(self, iteration: int, round_index: int) -> CollectedBatch:
        """One batch of ``prompts_per_iteration`` groups; refill rounds (``round_index > 0``)
        draw the iteration's next prompts and fresh noise, and number their groups after the
        earlier rounds' so that ids stay unique within the iteration."""
        cfg, acc = self.config, self.accelerator
        per_round = cfg.train.prompts_per_iteration
        t_start = time.perf_counter()

        # 1. Prompts: the same global list on every process; each keeps a contiguous slice.
        prompts = self.prompts.sample(
            per_round, cfg.seed, iteration, offset=round_index * per_round
        )
        global_prompts, global_group_ids = expand_groups(prompts, cfg.train.group_size)
        noise = RolloutNoise(
            cfg.seed, iteration, self.num_global, self.local, cfg.train.noise_layout, round_index
        )
        local_prompts = global_prompts[self.local]

        # 2. Rollout (no gradients) and 3. rewards, gathered so that every group is whole;
        # with train.overlap_rewards a chunk is scored while the next one samples.
        self.policy.module.eval()
        if cfg.train.overlap_rewards:
            scored = sample_and_score(
                self.rollout,
                self.policy,
                local_prompts,
                global_group_ids[self.local],
                noise,
                self.reward,
                lambda: _sampling_context(acc),
            )
            rollout, outputs, metadata = scored.batch, scored.outputs, scored.metadata
            local_scores = scored.scores
            t_rollout = time.perf_counter() - scored.waiting_s  # when sampling ended
        else:
            with _sampling_context(acc):
                rollout = self.rollout.collect(
                    self.policy, local_prompts, global_group_ids[self.local], noise
                )
            t_rollout = time.perf_counter()
            outputs = self.rollout.outputs(self.policy, rollout)
            metadata = reward_metadata(local_prompts, self.rollout.reward_metadata(rollout))
            chunks = self.rollout.chunks(len(local_prompts))
            local_scores = score_in_chunks(self.reward, outputs, local_prompts, metadata, chunks)
        scores = gather_scores(local_scores, acc)
        # Stateful rewards (an adversarial head) learn from the samples they just scored.
        reward_metrics = self.reward.update(
            outputs, local_prompts, metadata, lambda t: gather(t, acc)
        )
        t_reward = time.perf_counter()

        # 4. Advantages on the gathered batch; keep this process's slice.
        inputs = {k: gather(v, acc) for k, v in self.objective.advantage_inputs(rollout).items()}
        advantages = self.advantages(rollout, scores, global_prompts, global_group_ids, inputs)
        if round_index:
            global_group_ids = global_group_ids + round_index * per_round
            rollout.group_ids = rollout.group_ids + round_index * per_round
        return CollectedBatch(
            rollout=rollout,
            noise=noise,
            scores=scores,
            group_ids=global_group_ids,
            advantages=advantages,
            timings={"rollout_s": t_rollout - t_start, "reward_s": t_reward - t_rollout},
            extra_metrics={f"reward_update/{k}": v for k, v in reward_metrics.items()},
        )

    def advantages(
        self,
        rollout: Any,
        scores: dict[str, torch.Tensor],
        global_prompts: list[str],
        global_group_ids: torch.Tensor,
        inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Phase 4: the training reward (weighted sum, or GDPO's normalise-then-sum) and the
        objective's advantages of the gathered batch; this process's slice goes to ``rollout``
        (with the samples the objective leaves out of training, if any)."""
        rewards = scores[self.reward.name]
        if self.config.reward_aggregation == "normalize_then_sum":
            weights = {model.name: weight for model, weight in self.reward.rewards}
            rewards = decoupled_group_rewards(scores, weights, global_group_ids)
        # Per-prompt state (stat trackers, MSSR's baselines) is keyed by plain-string ids:
        # checkpoints hold it, and dataset rows may share a text.
        ids = [prompt_id(p) for p in global_prompts]
        advantages = self.objective.advantages(rewards, ids, global_group_ids, **(inputs or {}))
        rollout.advantages = advantages[self.local].to(self.policy.device, torch.float32)
        excluded = self.objective.excluded_samples(rewards, global_group_ids)
        if excluded is not None:
            rollout.excluded = excluded[self.local].to(self.policy.device)
        return advantages

    def read_offline(self, iteration: int) -> CollectedBatch:
        """Phases 1-4 from the offline store: its groups, samples and recorded scores."""
        assert self.offline is not None
        cfg = self.config
        t_start = time.perf_counter()
        local_prompts, samples, scores, global_prompts = self.offline.read(
            iteration, self.local, self.reward
        )
        _, global_group_ids = expand_groups(
            global_prompts[:: cfg.train.group_size], cfg.train.group_size
        )
        with torch.no_grad(), self.accelerator.autocast():
            rollout = self.rollout.from_stored(
                self.policy, local_prompts, global_group_ids[self.local], samples
            )
        t_read = time.perf_counter()
        advantages = self.advantages(rollout, scores, global_prompts, global_group_ids)
        noise = RolloutNoise(
            cfg.seed, iteration, self.num_global, self.local, cfg.train.noise_layout
        )
        return CollectedBatch(
            rollout=rollout,
            noise=noise,
            scores=scores,
            group_ids=global_group_ids,
            advantages=advantages,
            timings={"rollout_s": t_read - t_start, "reward_s": 0.0},
            extra_metrics={"offline/epoch": self.offline.epoch(iteration + 1)},
        )


def _sampling_context(accelerator: Any) -> contextlib.ExitStack:
    """What sampling runs under: no gradients, the accelerator's autocast."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(accelerator.autocast())
    return stack


__all__ = ["BatchCollector", "CollectedBatch"]
