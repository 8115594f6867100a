"""DAPO dynamic sampling: which groups are kept, the refill rounds, the cap, and a real run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from genrl.allocation.dynamic_sampling import (
    DynamicSamplingError,
    collect_varied_groups,
    varied_groups,
)
from genrl.config.errors import ConfigError
from genrl.data.batches import Batch, MaskedSamples, TokenRollout
from reward_models import REWARDS, RewardModel, RewardOutput
from tests.test_causal_lm import lm_config, lm_dir  # noqa: F401  (fixture)


def test_varied_groups_by_hand() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.2, 7.0])
    group_ids = torch.tensor([3, 3, 9, 9, 4, 4, 0, 0, 5])  # any ids; a group of one never varies
    kept = varied_groups(rewards, group_ids)
    assert kept.tolist() == [False, False, True, True, False, False, True, True, False]


@dataclass
class Items(Batch):
    values: torch.Tensor
    group_ids: torch.Tensor


def fake_round(
    rewards_per_group: list[list[float]], first_value: int, local: slice = slice(None)
) -> SimpleNamespace:
    """A collected round: sample i has value first_value + i; this process holds ``local``."""
    size = len(rewards_per_group[0])
    n = len(rewards_per_group) * size
    group_ids = torch.arange(len(rewards_per_group)).repeat_interleave(size)
    return SimpleNamespace(
        rollout=Items(torch.arange(first_value, first_value + n), group_ids).select(local),
        scores={"r": torch.tensor([r for group in rewards_per_group for r in group])},
        group_ids=group_ids,
    )


def test_refill_keeps_the_first_varied_groups_in_order() -> None:
    rounds = [
        fake_round([[1, 1], [0, 1], [0, 0]], first_value=0),  # keeps samples 2, 3
        fake_round([[0.2, 0.3], [1, 0], [5, 5]], first_value=100),  # 100, 101 and 102, 103
    ]
    calls: list[int] = []

    def collect_round(index: int) -> SimpleNamespace:
        calls.append(index)
        return rounds[index]

    rollout, seen = collect_varied_groups(
        collect_round, target_groups=2, group_size=2, max_rounds=5, metric="r", local=slice(0, 6)
    )
    assert calls == [0, 1] and len(seen) == 2
    assert rollout.values.tolist() == [2, 3, 100, 101]  # the third varied group is not needed


def test_refill_uses_only_this_process_slice_and_waits_for_the_others() -> None:
    # Process 1 of 2 owns groups 1 and 2 of each round (samples 2..5).
    rounds = [
        fake_round([[0, 1], [0, 1], [1, 1], [0, 1]], first_value=0, local=slice(2, 6)),
        fake_round([[0, 1], [1, 1], [0, 1], [0, 1]], first_value=100, local=slice(2, 6)),
        fake_round([[0, 1], [0, 1], [0, 1], [0, 1]], first_value=200, local=slice(2, 6)),
    ]
    lagging = iter([0, 1, 2])  # the other process has 0, then 1, then 2 varied groups

    rollout, seen = collect_varied_groups(
        lambda i: rounds[i],
        target_groups=2,
        group_size=2,
        max_rounds=5,
        metric="r",
        local=slice(2, 6),
        min_over_processes=lambda n: min(n, next(lagging)),
    )
    assert len(seen) == 3  # this process had 2 after round 1 but waited for the other
    assert rollout.values.tolist() == [2, 3, 104, 105]


def test_refill_cap_raises_a_clear_error() -> None:
    calls: list[int] = []

    def collect_round(index: int) -> SimpleNamespace:
        calls.append(index)
        return fake_round([[1, 1], [0, 0]], first_value=0)

    with pytest.raises(DynamicSamplingError, match=r"after 3 rounds \(6 groups sampled\)"):
        collect_varied_groups(
            collect_round,
            target_groups=1,
            group_size=2,
            max_rounds=3,
            metric="r",
            local=slice(0, 4),
        )
    assert calls == [0, 1, 2]
    with pytest.raises(ConfigError, match="scores are: r"):
        collect_varied_groups(
            collect_round,
            target_groups=1,
            group_size=2,
            max_rounds=3,
            metric="acc",
            local=slice(0, 4),
        )


def test_token_rollouts_of_different_widths_concatenate() -> None:
    def rollout(prompt: list[int], completion: list[int], value: float) -> TokenRollout:
        p, t = len(prompt), len(completion)
        return TokenRollout(
            prompts=["p"],
            completions=["c"],
            group_ids=torch.tensor([0]),
            input_ids=torch.tensor([prompt + completion]),
            attention_mask=torch.ones(1, p + t, dtype=torch.long),
            completion_mask=torch.ones(1, t, dtype=torch.bool),
            old_log_probs=torch.full((1, t), value),
            ref_log_probs=torch.zeros(1, 0),
            finished=torch.tensor([True]),
            advantages=torch.tensor([value]),
        )

    both = TokenRollout.concatenate([rollout([5, 6], [7], -1.0), rollout([8], [9, 10, 11], -2.0)])
    assert both.input_ids.tolist() == [[5, 6, 7, 0, 0], [0, 8, 9, 10, 11]]
    assert both.attention_mask.tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert both.completion_start == 2
    assert both.completion_mask.tolist() == [[True, False, False], [True, True, True]]
    assert both.old_log_probs.tolist() == [[-1.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]
    assert both.ref_log_probs.shape == (2, 0) and both.advantages.tolist() == [-1.0, -2.0]


def test_masked_samples_with_different_prompt_widths_concatenate() -> None:
    def samples(prompt: list[int]) -> MaskedSamples:
        return MaskedSamples(
            prompts=["p"],
            completions=["c"],
            group_ids=torch.tensor([0]),
            prompt_ids=torch.tensor([prompt]),
            prompt_mask=torch.ones(1, len(prompt), dtype=torch.long),
            tokens=torch.tensor([[3, 4]]),
            valid=torch.ones(1, 2, dtype=torch.bool),
            reveal_step=torch.tensor([[1, 0]]),
        )

    both = MaskedSamples.concatenate([samples([7, 8, 9]), samples([6])])
    assert both.prompt_ids.tolist() == [[7, 8, 9], [0, 0, 6]]
    assert both.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert both.tokens.tolist() == [[3, 4], [3, 4]]
    assert both.reveal_step.tolist() == [[1, 0], [1, 0]]


class SayIsSolved(RewardModel):
    """1 for every completion of a "say" prompt (a group that never varies); otherwise a hash
    of the text in [0, 1) (differs between random completions)."""

    name = "say_solved"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        del metadata
        values = [
            1.0 if p.startswith("say") else sum(map(ord, t)) % 97 / 97
            for t, p in zip(outputs, prompts, strict=True)
        ]
        return RewardOutput({self.name: torch.tensor(values)})


def dynamic_config(tmp_path: Path, lm_dir: Path, prompts: str):  # type: ignore[no-untyped-def]  # noqa: F811
    config = lm_config(tmp_path, lm_dir)
    (tmp_path / "prompts.txt").write_text(prompts)
    config.reward[0].name = "say_solved"
    config.train.dynamic_sampling = True
    config.train.dynamic_sampling_max_rounds = 6
    return config


def test_trainer_trains_only_on_varied_groups(tmp_path: Path, lm_dir: Path, monkeypatch) -> None:  # noqa: F811
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "say_solved", SayIsSolved)
    trainer = Trainer(
        dynamic_config(tmp_path, lm_dir, "say a\nsay b\nsay c\nwrite 12\nwrite 3+4\n")
    )
    batch = trainer.collect()
    assert len(batch.rollout) == 2 * 4  # prompts_per_iteration x group_size, always
    assert all(p.startswith("write") for p in batch.rollout.prompts)
    assert len(batch.rollout.group_ids.unique()) == 2
    # Rounds continue the iteration's prompt stream until two "write" groups are in.
    expected_rounds, have = 0, 0
    while have < 2:
        drawn = trainer.prompts.sample(2, trainer.config.seed, 0, offset=2 * expected_rounds)
        have, expected_rounds = (
            have + sum(p.startswith("write") for p in drawn),
            expected_rounds + 1,
        )
    assert len(batch.group_ids) == expected_rounds * 8 and expected_rounds >= 2
    metrics = trainer.train_iteration()
    assert metrics["dynamic_sampling/rounds"] >= 1
    assert 0 < metrics["dynamic_sampling/kept_group_fraction"] <= 1
    assert abs(metrics["loss/first_minibatch_ratio_deviation"]) < 1e-5


def test_trainer_stops_at_the_cap_with_a_checkpoint(
    tmp_path: Path,
    lm_dir: Path,  # noqa: F811
    monkeypatch,
) -> None:
    from genrl.cli.main import _is_user_error
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "say_solved", SayIsSolved)
    trainer = Trainer(dynamic_config(tmp_path, lm_dir, "say a\nsay b\n"))
    with pytest.raises(DynamicSamplingError, match="resume with --resume") as err:
        trainer.train()
    assert _is_user_error(err.value)
    assert list((tmp_path / "run" / "checkpoints").iterdir())


def test_dynamic_sampling_needs_whole_groups_per_process(
    tmp_path: Path,
    lm_dir: Path,  # noqa: F811
    monkeypatch,
) -> None:
    monkeypatch.setitem(REWARDS, "say_solved", SayIsSolved)
    config = dynamic_config(tmp_path, lm_dir, "say a\n")
    config.train.prompts_per_iteration = 3
    with pytest.raises(ConfigError, match="divisible by the number of processes"):
        config.validate(num_processes=2)
    config.validate(num_processes=1)


def _two_process_worker(directory: str, lm: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from genrl.loop.trainer import Trainer

    AcceleratorState._reset_state(reset_partial_state=True)  # the fork inherits the parent's
    accelerator = Accelerator(cpu=True)
    REWARDS["say_solved"] = SayIsSolved
    rank_dir = Path(directory) / f"rank{accelerator.process_index}"
    rank_dir.mkdir()
    config = dynamic_config(rank_dir, Path(lm), "say a\nsay b\nsay c\nwrite 12\nwrite 3+4\n")
    config.train.prompts_per_iteration = 2  # one group per process and round
    trainer = Trainer(config, run_dir=rank_dir / "run", accelerator=accelerator)
    batch = trainer.collect()
    torch.save(
        {
            "prompts": batch.rollout.prompts,
            "rounds": batch.extra_metrics["dynamic_sampling/rounds"],
        },
        rank_dir / "batch.pt",
    )


@pytest.mark.slow
def test_two_processes_refill_the_same_number_of_rounds(tmp_path: Path, lm_dir: Path) -> None:  # noqa: F811
    from accelerate import debug_launcher

    debug_launcher(_two_process_worker, args=(str(tmp_path), str(lm_dir)), num_processes=2)
    ranks = [torch.load(tmp_path / f"rank{r}" / "batch.pt") for r in range(2)]
    assert ranks[0]["rounds"] == ranks[1]["rounds"] >= 2
    for rank in ranks:
        assert len(rank["prompts"]) == 4 and all(p.startswith("write") for p in rank["prompts"])


class HandwrittenIsSolved(RewardModel):
    """Images: 1 for "a handwritten digit ..." prompts (never varies), else the mean pixel."""

    name = "handwritten_solved"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        del metadata
        pixels = outputs.float().flatten(1).mean(1).cpu()
        solved = torch.tensor([p.startswith("a handwritten") for p in prompts])
        return RewardOutput({self.name: torch.where(solved, 1.0, pixels)})


def test_flow_trajectories_refill_and_train(tmp_path: Path, monkeypatch) -> None:
    from tiny import tiny_config

    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "handwritten_solved", HandwrittenIsSolved)
    config = tiny_config(
        tmp_path,
        "reward.0.name=handwritten_solved",
        "reward.0.kwargs={}",
        "train.dynamic_sampling=true",
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    assert len(batch.rollout) == 16 and batch.rollout.latents.shape[0] == 16
    assert not any(p.startswith("a handwritten") for p in batch.rollout.prompts)
    assert len(batch.group_ids) > 16  # the first round held a "handwritten" prompt
    metrics = trainer.train_iteration()
    assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0
