"""Offline training: iterations read their groups from a ``RolloutStore`` instead of sampling.

With ``train.offline_store=DIR`` the trainer first makes sure the store holds
``train.offline_groups`` groups: missing ones are sampled by the *reference* policy with the
rollout's own sampler, scored by the run's rewards and appended, ``prompts_per_iteration``
groups per append (so an interrupted fill resumes where it stopped, losing nothing and writing
nothing twice). Each iteration then reads ``prompts_per_iteration`` groups in shuffled passes
over the store (an epoch is one pass), with the rewards recorded at fill time: no sampling, no
decoding and no reward model during training (GDRO's offline mode).
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.rng import RolloutNoise, Streams, stream_generator
from genrl.data.rollout_store import GroupRecord, RolloutStore
from genrl.distributed.processes import gather
from genrl.loop.groups import expand_groups
from genrl.policies.protocols import Policy
from genrl.prompts.sources import reward_metadata
from genrl.rollouts.base import Rollout


class OfflineSource:
    """The store of a run and the groups each iteration trains on.

    Args:
        config: the run's ``TrainConfig`` (``train.offline_store``, ``train.offline_groups``).
        accelerator: the run's accelerator (fills are shared out over processes).
    """

    def __init__(self, config: Any, accelerator: Any) -> None:
        self.config = config
        self.accelerator = accelerator
        # Only the main process writes (and repairs after a crash); the others read.
        self.store = RolloutStore(config.train.offline_store, accelerator.is_main_process)
        self._checked = False

    @property
    def target_groups(self) -> int:
        """Groups the store must hold: ``offline_groups`` rounded up to whole fill batches."""
        t = self.config.train
        per = t.prompts_per_iteration
        return -(-t.offline_groups // per) * per

    def fill(
        self, policy: Policy, rollout: Rollout[Any, Any], reward: Any, prompts: Any, local: slice
    ) -> int:
        """Sample, score and append the missing groups; returns how many were added."""
        cfg, acc = self.config, self.accelerator
        per, size = cfg.train.prompts_per_iteration, cfg.train.group_size
        have = self._agreed_length()
        if have % per:
            raise ValueError(
                f"the store {self.store.directory} holds {have} groups, not a multiple of "
                f"train.prompts_per_iteration ({per}): it was filled with other settings"
            )
        self._check_group_size()
        self._check_origin(reward)
        bar = _progress(have, self.target_groups, acc.is_main_process and cfg.logging.progress_bar)
        added = 0
        for start in range(have, self.target_groups, per):
            batch = start // per
            chunk = prompts.sample(per, cfg.seed, batch, purpose=Streams.OFFLINE_FILL)
            global_prompts, global_ids = expand_groups(chunk, size)
            noise = RolloutNoise(
                cfg.seed, batch, per * size, local, cfg.train.noise_layout,
                purpose=Streams.OFFLINE_FILL,
            )  # fmt: skip
            policy.module.eval()
            with torch.no_grad(), acc.autocast(), policy.reference():
                sampled = rollout.collect(policy, global_prompts[local], global_ids[local], noise)
            outputs = rollout.outputs(policy, sampled)
            local_prompts = global_prompts[local]
            metadata = reward_metadata(local_prompts, rollout.reward_metadata(sampled))
            scores = reward(outputs, local_prompts, metadata)
            samples = gather(sampled.final.float(), acc).cpu()
            gathered = {k: gather(v, acc).cpu() for k, v in scores.scores.items()}
            if acc.is_main_process:
                self.store.append(
                    [
                        GroupRecord(
                            prompt=prompt,
                            samples=samples[g * size : (g + 1) * size],
                            rewards={k: v[g * size : (g + 1) * size] for k, v in gathered.items()},
                            seeds=[cfg.seed, batch, g],  # of the offline_fill streams
                            sampler=_sampler_record(cfg, reward, rollout),
                        )
                        for g, prompt in enumerate(chunk)
                    ]
                )
            acc.wait_for_everyone()
            added += per
            if bar is not None:
                bar.update(per)
        if bar is not None:
            bar.close()
        if not acc.is_main_process:  # pick up what the main process wrote
            self.store = RolloutStore(self.store.directory, writable=False)
        self._agreed_length()
        return added

    def _agreed_length(self) -> int:
        """The store's length, checked to be the same on every process: a store on a disk that
        another process cannot see would otherwise make processes run different numbers of
        collective operations and hang."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return len(self.store)
        from accelerate.utils import gather_object

        lengths = gather_object([len(self.store)])
        if len(set(lengths)) > 1:
            raise ValueError(
                f"processes see different numbers of groups in {self.store.directory} "
                f"({lengths}); put train.offline_store on a file system every process shares"
            )
        return int(lengths[0])

    def _check_origin(self, reward: Any) -> None:
        """A store trains only runs of the policy and rewards that filled it."""
        if not len(self.store):
            return
        recorded = self.store.sampler_record(0)
        expected = _sampler_record(self.config, reward)
        for key, what in (("policy", "policy"), ("reward_weights", "rewards and weights")):
            if key in recorded and recorded[key] != expected[key]:
                raise ValueError(
                    f"the offline store {self.store.directory} was filled with {what} "
                    f"{recorded[key]}, this run has {expected[key]}: use another "
                    "train.offline_store"
                )

    def _check_group_size(self) -> None:
        size = self.config.train.group_size
        if len(self.store) and self.store.group_size(0) != size:
            raise ValueError(
                f"the store {self.store.directory} holds groups of {self.store.group_size(0)}, "
                f"but train.group_size is {size}"
            )

    def store_ids(self, iteration: int) -> list[int]:
        """The store groups of ``iteration``: positions ``iteration * P ..`` of the stream of
        shuffled passes over the store (seeded by the run's seed and the pass number)."""
        per, total = self.config.train.prompts_per_iteration, len(self.store)
        if total == 0:
            raise ValueError(
                f"the offline store {self.store.directory} is empty: set train.offline_groups"
            )
        ids, orders = [], {}
        for position in range(iteration * per, (iteration + 1) * per):
            epoch, index = divmod(position, total)
            if epoch not in orders:
                generator = stream_generator(
                    "genrl", Streams.OFFLINE_ORDER, self.config.seed, epoch
                )
                orders[epoch] = torch.randperm(total, generator=generator)
            ids.append(int(orders[epoch][index]))
        return ids

    def epoch(self, iteration: int) -> float:
        """Passes over the store completed before ``iteration``."""
        return iteration * self.config.train.prompts_per_iteration / max(1, len(self.store))

    def read(
        self, iteration: int, local: slice, reward: Any
    ) -> tuple[list[str], torch.Tensor, dict[str, torch.Tensor], list[str]]:
        """This process's prompts and clean samples, plus every stored score of the whole
        iteration (``[N]`` per name) and the iteration's global prompt list."""
        if iteration == 0 or not self._checked:
            self._check_group_size()
            self._check_origin(reward)
            self._checked = True
        reward_name = reward.name
        size = self.config.train.group_size
        ids = self.store_ids(iteration)
        prompts = [self.store.prompt(i) for i in ids]
        global_prompts, _ = expand_groups(prompts, size)
        rewards = [self.store.rewards(i) for i in ids]
        if reward_name not in rewards[0]:
            raise ValueError(
                f"the offline store was scored with {sorted(rewards[0])}, which lacks this "
                f"run's reward {reward_name!r}: fill a new store for it"
            )
        scores = {k: torch.cat([r[k] for r in rewards]) for k in rewards[0]}
        first, last = local.start // size, -(-local.stop // size)
        samples = torch.cat([self.store.group(i).samples for i in ids[first:last]])
        offset = local.start - first * size
        samples = samples[offset : offset + local.stop - local.start]
        return global_prompts[local], samples, scores, global_prompts


def _sampler_record(
    config: Any, reward: Any, rollout: Rollout[Any, Any] | None = None
) -> dict[str, Any]:
    """What a group was sampled and scored with (stored with it; later runs check the policy
    and the rewards): the rollout's own description (``Rollout.describe``), the policy, the
    algorithm and the reward weights."""
    return {
        **(rollout.describe() if rollout is not None else {}),
        "policy": config.policy.pretrained or config.policy.name,
        "algorithm": config.algorithm.name,
        "reward_weights": {model.name: float(weight) for model, weight in reward.rewards},
    }


def _progress(start: int, total: int, enabled: bool) -> Any:
    if not enabled or start >= total:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="filling offline store", unit="group")
