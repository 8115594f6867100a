"""Phases 1-4 of an iteration: prompts, rollout, rewards, advantages (docs/architecture.md, section 2).

``BatchCollector.collect(iteration)`` returns the training batch of this process with its
advantages, plus the gathered scores for logging. Everything random derives from named streams
of ``(seed, iteration, round)``, so a resumed run draws what an uninterrupted one draws, and so
does a run on N processes wherever the streams are global (``genrl/data/rng.py``). With ``train.dynamic_sampling`` it samples refill rounds
until enough groups have varied rewards (``genrl/allocation/dynamic_sampling.py``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from genrl.allocation.dynamic_sampling import collect_varied_groups
from genrl.allocation.registry import build_allocation
from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise
from genrl.distributed.processes import gather
from genrl.loop.allocated import collect_allocated
from genrl.loop.groups import expand_groups, gather_scores
from genrl.loop.replay import ReplayRound
from genrl.loop.reward_overlap import sample_and_score, score_in_chunks
from genrl.loop.rounds import CollectedBatch, SampledRound, sampling_context
from genrl.loop.staleness import StaleSampler, version_for
from genrl.objectives.advantages import decoupled_group_rewards
from genrl.objectives.base import Objective
from genrl.policies.protocols import Policy
from genrl.prompts.sources import reward_metadata
from genrl.rollouts.base import Rollout
from genrl.run.config import TrainConfig
from tasks.prompt import prompt_id


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
        self.stale: StaleSampler | None = None
        if config.train.max_staleness:
            if not rollout.supports_staleness:
                raise ConfigError(
                    f"train.max_staleness={config.train.max_staleness}: the "
                    f"{type(rollout).__name__} does not record its sampler's log-probs, so a "
                    "stale rollout could be neither measured nor corrected; the token rollouts "
                    "(the GRPO family) support it"
                )
            self.stale = StaleSampler(
                policy,
                config.train.max_staleness,
                lambda copy, iteration: self.sample_round(copy, iteration, 0),
                rollout.sync_weights,
            )
        # allocation.name other than uniform: a policy decides the prompts, sample counts and
        # groups (genrl/allocation/, genrl/loop/allocated.py).
        self.allocation = build_allocation(
            config.allocation,
            config.train.prompts_per_iteration,
            config.train.group_size,
            reward.name,
            config.seed,
            prompts.train,
        )
        self.offline = None
        if config.train.offline_store:
            from genrl.loop.offline import OfflineSource

            self.offline = OfflineSource(config, accelerator)
        # replay.*: earlier completions mixed into the groups (genrl/loop/replay.py).
        self.replay = ReplayRound(config) if config.replay.enabled else None

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
        if self.stale is not None:
            return self.collect_stale(iteration)
        if self.replay is not None:
            return self.replay.collect(self, iteration)
        if self.allocation is not None:
            return collect_allocated(self, iteration)
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

    def collect_stale(self, iteration: int) -> CollectedBatch:
        """``train.max_staleness``: the round sampled in the background from version
        ``max(0, iteration - K)``; the next iteration's starts sampling before this one's
        rewards and update run (``genrl/loop/staleness.py``)."""
        assert self.stale is not None
        t_wait = time.perf_counter()
        drawn = self.stale.take(iteration)
        waited = time.perf_counter() - t_wait
        # Read before the next round starts: that round's sync would overwrite it.
        synced, self.stale.last_sync_s = self.stale.last_sync_s, None
        if iteration + 1 < self.config.train.iterations:
            self.stale.start(iteration + 1)
        batch = self.score_round(drawn)
        batch.timings["rollout_wait_s"] = waited
        batch.extra_metrics["staleness/version_lag"] = float(
            iteration - version_for(iteration, self.config.train.max_staleness)
        )
        if synced is not None:  # the engine loaded this round's version
            batch.extra_metrics["time/weight_sync"] = synced
        return batch

    def collect_round(self, iteration: int, round_index: int) -> CollectedBatch:
        """One batch of ``prompts_per_iteration`` groups; refill rounds (``round_index > 0``)
        draw the iteration's next prompts and fresh noise, and number their groups after the
        earlier rounds' so that ids stay unique within the iteration."""
        if self.config.train.overlap_rewards:
            return self.score_round(self.sample_and_score_round(iteration, round_index))
        return self.score_round(self.sample_round(self.policy, iteration, round_index))

    def draw(self, iteration: int, round_index: int) -> SampledRound:
        """Phase 1: the same global prompt list on every process (each keeps a contiguous
        slice), its groups and the round's random streams; nothing sampled yet."""
        cfg = self.config
        per_round = cfg.train.prompts_per_iteration
        prompts = self.prompts.sample(
            per_round, cfg.seed, iteration, offset=round_index * per_round
        )
        global_prompts, global_group_ids = expand_groups(prompts, cfg.train.group_size)
        noise = RolloutNoise(
            cfg.seed, iteration, self.num_global, self.local, cfg.train.noise_layout, round_index
        )
        return SampledRound(round_index, global_prompts, global_group_ids, noise)

    def sample_round(self, policy: Policy, iteration: int, round_index: int) -> SampledRound:
        """Phases 1-2 with ``policy`` (the run's, or ``train.max_staleness``'s sampling copy in
        its thread, ``genrl/loop/staleness.py``): prompts and the rollout, no rewards yet."""
        t_start = time.perf_counter()
        drawn = self.draw(iteration, round_index)
        policy.module.eval()
        with sampling_context(self.accelerator):
            drawn.rollout = self.rollout.collect(
                policy, drawn.local_prompts(self.local), drawn.group_ids[self.local], drawn.noise
            )
        drawn.rollout_s = time.perf_counter() - t_start
        return drawn

    def sample_and_score_round(self, iteration: int, round_index: int) -> SampledRound:
        """Phases 1-3 with ``train.overlap_rewards``: a chunk is scored while the next one
        samples (``genrl/loop/reward_overlap.py``)."""
        t_start = time.perf_counter()
        drawn = self.draw(iteration, round_index)
        self.policy.module.eval()
        local_prompts = drawn.local_prompts(self.local)
        scored = sample_and_score(
            self.rollout,
            self.policy,
            local_prompts,
            drawn.group_ids[self.local],
            drawn.noise,
            self.reward,
            lambda: sampling_context(self.accelerator),
        )
        drawn.rollout = scored.batch
        drawn.scored = (scored.outputs, scored.metadata, scored.scores)
        drawn.rollout_s = time.perf_counter() - scored.waiting_s - t_start  # sampling's end
        drawn.reward_wait_s = scored.waiting_s
        return drawn

    def score_round(self, drawn: SampledRound) -> CollectedBatch:
        """Phases 3-4 of a sampled round: rewards gathered so that every group is whole, a
        stateful reward's update, and the advantages of the gathered batch."""
        acc, rollout = self.accelerator, drawn.rollout
        per_round = self.config.train.prompts_per_iteration
        t_start = time.perf_counter()
        scores, reward_metrics = self.reward_scores(drawn)
        t_reward = time.perf_counter()

        # 4. Advantages on the gathered batch; keep this process's slice.
        inputs = {k: gather(v, acc) for k, v in self.objective.advantage_inputs(rollout).items()}
        global_group_ids = drawn.group_ids
        advantages = self.advantages(rollout, scores, drawn.prompts, global_group_ids, inputs)
        if drawn.round_index:
            global_group_ids = global_group_ids + drawn.round_index * per_round
            rollout.group_ids = rollout.group_ids + drawn.round_index * per_round
        return CollectedBatch(
            rollout=rollout,
            noise=drawn.noise,
            scores=scores,
            group_ids=global_group_ids,
            advantages=advantages,
            timings={
                "rollout_s": drawn.rollout_s,
                "reward_s": drawn.reward_wait_s + t_reward - t_start,
            },
            extra_metrics={f"reward_update/{k}": v for k, v in reward_metrics.items()},
        )

    def reward_scores(
        self, drawn: SampledRound, local: slice | None = None
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """Phase 3 of a sampled round: every score, gathered so that every group is whole,
        and a stateful reward's update metrics; ``local`` is this process's slice of the
        round (default: the run's, for rounds of ``prompts_per_iteration`` groups)."""
        acc, rollout = self.accelerator, drawn.rollout
        local_prompts = drawn.local_prompts(self.local if local is None else local)
        if drawn.scored is not None:
            outputs, metadata, local_scores = drawn.scored
        else:
            outputs = self.rollout.outputs(self.policy, rollout)
            metadata = reward_metadata(local_prompts, self.rollout.reward_metadata(rollout))
            chunks = self.rollout.chunks(len(local_prompts))
            local_scores = score_in_chunks(self.reward, outputs, local_prompts, metadata, chunks)
        scores = gather_scores(local_scores, acc)
        # Stateful rewards (an adversarial head) learn from the samples they just scored.
        reward_metrics = self.reward.update(
            outputs, local_prompts, metadata, lambda t: gather(t, acc)
        )
        return scores, reward_metrics

    def advantages(
        self,
        rollout: Any,
        scores: dict[str, torch.Tensor],
        global_prompts: list[str],
        global_group_ids: torch.Tensor,
        inputs: dict[str, torch.Tensor] | None = None,
        local: slice | None = None,
    ) -> torch.Tensor:
        """Phase 4: the training reward (weighted sum, or GDPO's normalise-then-sum) and the
        objective's advantages of the gathered batch; this process's slice (``local``, default
        the run's) goes to ``rollout`` (with the samples the objective leaves out of training,
        if any)."""
        local = self.local if local is None else local
        rewards = scores[self.reward.name]
        if self.config.reward_aggregation == "normalize_then_sum":
            weights = {model.name: weight for model, weight in self.reward.rewards}
            rewards = decoupled_group_rewards(scores, weights, global_group_ids)
        # Per-prompt state (stat trackers, MSSR's baselines) is keyed by plain-string ids:
        # checkpoints hold it, and dataset rows may share a text.
        ids = [prompt_id(p) for p in global_prompts]
        inputs = dict(inputs or {})
        if self.objective.reward_names:  # per-reward advantages (MARBLE), columns in that order
            # Named as the config's reward entries; each score is under its model's own name.
            models = {
                s.name: m.name
                for s, (m, _) in zip(self.config.reward, self.reward.rewards, strict=True)
            }
            columns = [scores[models[name]].float() for name in self.objective.reward_names]
            inputs["reward_scores"] = torch.stack(columns, dim=1)
        advantages = self.objective.advantages(rewards, ids, global_group_ids, **inputs)
        rollout.advantages = advantages[local].to(self.policy.device, torch.float32)
        excluded = self.objective.excluded_samples(rewards, global_group_ids)
        if excluded is not None:
            rollout.excluded = excluded[local].to(self.policy.device)
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


__all__ = ["BatchCollector", "CollectedBatch", "SampledRound"]
