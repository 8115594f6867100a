"""User mistakes end in one clear message that names what is wrong, not a torch traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.checkpoints.checkpoint import CheckpointError
from genrl.cli.main import main
from reward_models import (
    REWARDS,
    CompositeReward,
    RewardError,
    RewardInputError,
    RewardModel,
    RewardOutput,
)


def _cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def test_unknown_config_key_suggests_the_right_one(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, "train", "--set", "optim.learning_rate=1e-3")
    assert "optim.learning_rate" in err and "Did you mean 'lr'" in err


def test_bad_values_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert "train.iterations must be >= 1" in _cli_error(
        capsys, "train", "--set", "train.iterations=0"
    )
    assert "expected a number" in _cli_error(capsys, "train", "--set", "optim.lr=fast")
    err = _cli_error(capsys, "train", "--set", "sampler.log_prob_reduction=avg")
    assert "sampler.log_prob_reduction" in err
    assert "unknown recipe 'digits_flow'" in _cli_error(capsys, "train", "digits_flow")
    assert "Did you mean 'flow_grpo'" in _cli_error(
        capsys, "train", "--set", "algorithm.name=flowgrpo"
    )


def test_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, "train", "--resume", str(tmp_path / "nowhere"))
    assert "does not exist" in err
    (tmp_path / "empty-run").mkdir()
    err = _cli_error(capsys, "train", "--resume", str(tmp_path / "empty-run"))
    assert "holds no checkpoint" in err
    with pytest.raises(CheckpointError, match="does not exist"):
        Trainer(tiny_config(tmp_path), run_dir=tmp_path / "r", resume_from=tmp_path / "missing")


def test_incomplete_checkpoint_is_reported(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "run")
    path = trainer.save_checkpoint()
    assert path is not None
    (path / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"incomplete: optimizer\.pt is missing"):
        Trainer(tiny_config(tmp_path), run_dir=tmp_path / "run2", resume_from=path).train()


class _NaNReward(RewardModel):
    name = "flaky"

    def score(self, outputs, prompts, metadata):
        values = torch.ones(len(prompts))
        values[3] = float("nan")
        return RewardOutput({self.name: values})


class _RaisingReward(RewardModel):
    name = "broken"

    def score(self, outputs, prompts, metadata):
        raise RuntimeError("server unreachable")


def test_nan_reward_names_the_reward_and_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(REWARDS, "flaky", _NaNReward)
    config = tiny_config(tmp_path, "reward.0.name=flaky", "reward.0.kwargs={}")
    with pytest.raises(RewardError, match=r"'flaky' returned nan for sample 3"):
        Trainer(config, run_dir=tmp_path / "run").train()


def test_raising_reward_is_named() -> None:
    composite = CompositeReward([(_RaisingReward(), 1.0)])
    with pytest.raises(RewardError, match=r"'broken' raised.*server unreachable"):
        composite(torch.zeros(2, 1, 8, 8), ["a 1", "a 2"])


def test_unparseable_prompt_and_wrong_image_shape() -> None:
    from reward_models.digits import DigitClassifierReward

    reward = DigitClassifierReward()
    # The caller's mistakes are RewardInputErrors (a ValueError): a reward server's 422.
    with pytest.raises(RewardInputError) as shape:
        reward(torch.zeros(2, 3, 8, 8), ["digit 1", "digit 2"])
    assert str(shape.value) == (
        "reward 'digit_classifier' scores 8x8 grayscale images ([B, 1, 8, 8]), got 3-channel 8x8"
    )
    with pytest.raises(RewardInputError, match="cannot score prompt 1: prompt 'a cat' names no"):
        reward(torch.zeros(2, 1, 8, 8), ["digit 1", "a cat"])
    with pytest.raises(RewardInputError, match="2 outputs but 1 prompts"):
        reward(torch.zeros(2, 1, 8, 8), ["digit 1"])


def test_settings_that_cannot_train_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, "train", "--set", "sampler.noise_level=0")
    assert "sampler.noise_level must be > 0 for flow_grpo" in err
    err = _cli_error(capsys, "train", "--set", "sampler.guidance_scale=3",
                     "--set", "algorithm.cfg_in_training=false")  # fmt: skip
    assert "off-policy" in err
    assert "logging.keep_checkpoints must be >= 1" in _cli_error(
        capsys, "train", "--set", "logging.keep_checkpoints=0"
    )
    assert "logging.log_every must be >= 1" in _cli_error(
        capsys, "train", "--set", "logging.log_every=0"
    )


def test_wrong_reward_kwargs_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, "train", "--set", 'reward.0.kwargs={"pth": "x"}')
    assert "unknown config key 'reward.0.kwargs.pth'. Did you mean 'path'?" in err
    assert "'digit_classifier' takes no such keyword" in err


class _BadShapeReward(RewardModel):
    name = "bad_shape"

    def score(self, outputs, prompts, metadata):
        return RewardOutput({self.name: torch.ones(len(prompts), 1)})


def test_reward_with_wrong_score_shape_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"'bad_shape': score 'bad_shape' must be a tensor of shape \[3\]"
    ):
        _BadShapeReward()(torch.zeros(3, 1, 8, 8), ["digit 1"] * 3)


def test_diverging_loss_names_its_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from genrl.loop.optimization import NonFiniteLossError

    trainer = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "run")
    real_loss = trainer.objective.loss

    def exploding_loss(policy, minibatch, step=None):
        loss, metrics = real_loss(policy, minibatch, step)
        return loss * float("inf"), metrics

    monkeypatch.setattr(trainer.objective, "loss", exploding_loss)
    with pytest.raises(NonFiniteLossError, match=r"the loss is inf .*clip_fraction="):
        trainer.train()


def test_a_policy_of_the_wrong_kind_is_named(tmp_path: Path) -> None:
    """The policy protocols (genrl/policies/protocols.py) are checked when an algorithm binds its
    rollout: an LM with a flow algorithm fails with a sentence, not an AttributeError."""
    from genrl.config.errors import ConfigError
    from genrl.policies.protocols import CausalTokenPolicy, FlowPolicy, MaskedTokenPolicy, Policy
    from pipelines import build_policy

    toy = build_policy("toy_digits")
    lm = build_policy("countdown_lm")
    dllm = build_policy("sudoku_dllm")
    assert isinstance(toy, FlowPolicy) and isinstance(toy, Policy)
    assert not isinstance(toy, CausalTokenPolicy) and not isinstance(lm, FlowPolicy)
    assert isinstance(lm, CausalTokenPolicy) and not isinstance(lm, MaskedTokenPolicy)
    assert isinstance(dllm, MaskedTokenPolicy) and not isinstance(dllm, CausalTokenPolicy)
    from genrl.run.config import PolicyConfig

    config = tiny_config(tmp_path)
    config.policy = PolicyConfig(name="countdown_lm")
    with pytest.raises(ConfigError, match="flow_grpo trains a flow-matching generator"):
        Trainer(config, run_dir=tmp_path / "run")
