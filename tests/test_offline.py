"""Offline training from a rollout store (GDRO's offline mode): the fill, its resumption after a
crash, and iterations that read the store without sampling or scoring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.data.rollout_store import RolloutStore

GDRO = ("algorithm.name=gdro", "algorithm.noisings_per_sample=2", "train.minibatch_size=4")


def _offline(tmp_path: Path, store: Path, *extra: str) -> Any:
    return tiny_config(
        tmp_path, *GDRO, f"train.offline_store={store}", "train.offline_groups=8", *extra
    )


class Crash(RuntimeError):
    pass


def test_offline_iterations_read_the_store_and_never_score(tmp_path: Path) -> None:
    store = tmp_path / "store"
    trainer = Trainer(_offline(tmp_path, store), run_dir=tmp_path / "run")
    assert trainer.collector.fill_offline_store() == 8
    assert trainer.collector.fill_offline_store() == 0  # full: nothing sampled again
    records = RolloutStore(store)
    assert len(records) == 8 and records.group_size(0) == 4

    # Stored rewards are the reward of the stored samples.
    group = records.group(3)
    images = trainer.policy.decode(group.samples)
    rescored = trainer.reward(images, [group.prompt] * 4).scores[trainer.reward.name]
    assert torch.allclose(rescored, group.rewards[trainer.reward.name], atol=1e-6)

    class NoScoring:
        name, rewards = trainer.reward.name, trainer.reward.rewards

        def __call__(self, *args: Any) -> None:
            raise AssertionError("an offline iteration scored samples")

    trainer.collector.reward = NoScoring()
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    first = trainer.train_iteration()
    second = trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert sum(not torch.equal(p, after[n]) for n, p in before.items()) >= 0.9 * len(before)
    assert first["offline/epoch"] == 0.5 and second["offline/epoch"] == 1.0
    # Two iterations of 4 groups are one shuffled pass over the 8 groups.
    ids = trainer.collector.offline.store_ids(0) + trainer.collector.offline.store_ids(1)
    assert sorted(ids) == list(range(8))


def test_an_interrupted_fill_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    whole = Trainer(_offline(tmp_path, tmp_path / "whole"), run_dir=tmp_path / "a")
    whole.collector.fill_offline_store()

    crashing = Trainer(_offline(tmp_path, tmp_path / "cut"), run_dir=tmp_path / "b")
    real = crashing.collector.reward

    class CrashOnSecondBatch:
        name, rewards, calls = real.name, real.rewards, 0

        def __call__(self, *args: Any) -> Any:
            self.calls += 1
            if self.calls == 2:
                raise Crash("killed while scoring the second batch")
            return real(*args)

    crashing.collector.reward = CrashOnSecondBatch()  # type: ignore[assignment]
    with pytest.raises(Crash):
        crashing.collector.fill_offline_store()
    assert len(RolloutStore(tmp_path / "cut")) == 4  # the first batch, whole

    resumed = Trainer(_offline(tmp_path, tmp_path / "cut"), run_dir=tmp_path / "c")
    assert resumed.collector.fill_offline_store() == 4
    a, b = RolloutStore(tmp_path / "whole"), RolloutStore(tmp_path / "cut")
    assert len(b) == 8
    for i in range(8):
        ga, gb = a.group(i), b.group(i)
        assert ga.prompt == gb.prompt and ga.seeds == gb.seeds
        assert torch.equal(ga.samples, gb.samples)
        assert torch.equal(ga.rewards[real.name], gb.rewards[real.name])


def test_the_fill_samples_the_reference_policy(tmp_path: Path) -> None:
    """Whatever the current weights are (e.g. after resuming a run), the store holds reference
    samples: a full fine-tune's frozen copy here."""
    trainer = Trainer(_offline(tmp_path, tmp_path / "store"), run_dir=tmp_path / "run")
    reference = Trainer(_offline(tmp_path, tmp_path / "ref"), run_dir=tmp_path / "run2")
    with torch.no_grad():
        for p in trainer.policy.trainable_parameters():
            p.add_(0.05)
    trainer.collector.fill_offline_store()
    reference.collector.fill_offline_store()
    a, b = RolloutStore(tmp_path / "store"), RolloutStore(tmp_path / "ref")
    assert torch.equal(a.group(0).samples, b.group(0).samples)


def test_a_store_of_another_group_size_is_refused(tmp_path: Path) -> None:
    Trainer(
        _offline(tmp_path, tmp_path / "store"), run_dir=tmp_path / "a"
    ).collector.fill_offline_store()
    other = Trainer(
        _offline(tmp_path, tmp_path / "store", "train.group_size=2", "train.offline_groups=12"),
        run_dir=tmp_path / "b",
    )
    with pytest.raises(ValueError, match=r"groups of 4, but train\.group_size is 2"):
        other.collector.fill_offline_store()


def test_offline_training_runs_end_to_end(tmp_path: Path) -> None:
    """``genrl train`` with a store: fill, train, evaluate, summary; a second run on the same
    store samples nothing."""
    store = tmp_path / "store"
    summary = Trainer(_offline(tmp_path, store), run_dir=tmp_path / "one").train()
    assert summary["algorithm"] == "gdro" and len(RolloutStore(store)) == 8
    assert (tmp_path / "one" / "export").is_dir()
    again = Trainer(_offline(tmp_path, store), run_dir=tmp_path / "two")
    assert again.collector.fill_offline_store() == 0


def _two_process_offline_worker(directory: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True)
    root = Path(directory)
    config = _offline(root, root / "ddp_store")
    trainer = Trainer(config, run_dir=root / "ddp", accelerator=accelerator)
    trainer.collector.fill_offline_store()
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    torch.save(
        {
            "samples": batch.rollout.samples,
            "advantages": batch.rollout.advantages,
            "noise": units.noise,
            "sigma": units.sigma,
        },
        root / f"offline_rank{accelerator.process_index}.pt",
    )


def test_two_processes_fill_and_read_the_store_as_one(tmp_path: Path) -> None:
    """Each process samples its half of a fill batch and the main process writes it; each then
    reads its own groups. The store, the samples and the training noise equal a 1-process run."""
    from accelerate import debug_launcher

    single = Trainer(_offline(tmp_path, tmp_path / "store"), run_dir=tmp_path / "single")
    single.collector.fill_offline_store()
    batch = single.collect()
    units = single.objective.units(single.policy, batch.rollout, batch.noise)
    debug_launcher(_two_process_offline_worker, args=(str(tmp_path),), num_processes=2)
    one, two = RolloutStore(tmp_path / "store"), RolloutStore(tmp_path / "ddp_store")
    assert len(two) == len(one) == 8
    for i in range(8):
        torch.testing.assert_close(two.group(i).samples, one.group(i).samples, rtol=0, atol=1e-5)
    ranks = [torch.load(tmp_path / f"offline_rank{r}.pt") for r in range(2)]
    samples = torch.cat([r["samples"] for r in ranks])
    torch.testing.assert_close(samples, batch.rollout.samples, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        torch.cat([r["advantages"] for r in ranks]), batch.rollout.advantages
    )
    torch.testing.assert_close(torch.cat([r["noise"] for r in ranks]), units.noise)
    torch.testing.assert_close(torch.cat([r["sigma"] for r in ranks]), units.sigma)


def test_a_store_of_other_rewards_is_refused(tmp_path: Path) -> None:
    Trainer(
        _offline(tmp_path, tmp_path / "store"), run_dir=tmp_path / "a"
    ).collector.fill_offline_store()
    reweighted = Trainer(
        _offline(tmp_path, tmp_path / "store", "reward.0.weight=2.0"), run_dir=tmp_path / "b"
    )
    with pytest.raises(ValueError, match="filled with rewards and weights"):
        reweighted.collect()
    with pytest.raises(ValueError, match="filled with rewards and weights"):
        reweighted.collector.fill_offline_store()
