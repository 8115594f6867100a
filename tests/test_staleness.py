"""Asynchronous rollouts with bounded staleness (``train.max_staleness``, genrl/loop/staleness.py):
which weights each iteration samples from, that the sampling thread changes nothing else, exact
resume, the lag seen by the mismatch metrics, and the config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genrl import get_recipe
from genrl.config.errors import ConfigError
from genrl.loop.staleness import StaleSampler, sampling_copy, version_for
from genrl.loop.trainer import Trainer
from genrl.reporting.metrics import read_metrics
from genrl.run.config import TrainConfig
from pipelines import build_policy
from tests.resume_check import straight_and_resumed

# The embedded Countdown LM, a few small iterations (about 1 s each on a CPU).
SMALL = (
    "train.prompts_per_iteration=4",
    "train.group_size=4",
    "train.minibatch_size=16",
    "train.inner_epochs=1",
    "eval.every=0",
    "logging.progress_bar=false",
    "logging.log_every=100",
    "logging.report_to=[]",
)


def _config(*overrides: str) -> TrainConfig:
    return get_recipe("llm_countdown_grpo").apply_overrides([*SMALL, *overrides])


def _rows(run: Path) -> list[dict]:
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "train_units" in r]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "staleness/"))} for r in rows]


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}


def test_each_iteration_samples_from_the_version_k_behind() -> None:
    assert [version_for(i, 2) for i in range(5)] == [0, 0, 0, 1, 2]
    assert [version_for(i, 1) for i in range(4)] == [0, 0, 1, 2]


def test_the_sampling_copy_shares_frozen_tensors_and_owns_trained_ones() -> None:
    policy = build_policy("countdown_lm")
    policy.setup_training(4, 8.0, None)  # LoRA: the base weights are frozen
    clone = sampling_copy(policy)
    base = dict(policy.network.named_parameters())
    for name, param in clone.network.named_parameters():
        if base[name].requires_grad:
            assert param.data_ptr() != base[name].data_ptr(), name
        else:
            assert param is base[name], name


def test_versions_kept_are_the_ones_later_iterations_read() -> None:
    policy = build_policy("countdown_lm")
    policy.setup_training(0, 0.0, None)
    sampler = StaleSampler(policy, 2, lambda copy, iteration: iteration, lambda copy: None)
    for version in range(1, 5):
        sampler.record(version)
        # Iteration `version` may still have to sample (after a resume): K + 1 versions.
        assert sorted(sampler.versions) == list(range(max(0, version - 2), version + 1))
    sampler.close()


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_with_weights_that_do_not_move_k1_equals_the_synchronous_run(tmp_path: Path) -> None:
    """An update too small to change a float32 weight: every version is version 0, so the
    asynchronous run must sample, score and train exactly as the synchronous one does; any
    difference would come from the sampling thread itself (streams, modes, contexts)."""
    frozen = ("train.iterations=3", "optim.lr=1e-30", "algorithm.kl_beta=0")
    sync = Trainer(_config(*frozen), run_dir=tmp_path / "sync")
    sync.train()
    stale = Trainer(_config(*frozen, "train.max_staleness=1"), run_dir=tmp_path / "async")
    stale.train()
    assert _rows(tmp_path / "sync") == _rows(tmp_path / "async")
    for name, value in _weights(sync).items():
        assert torch.equal(value, _weights(stale)[name]), name


@pytest.mark.slow
def test_a_stale_rollout_is_off_policy_and_the_mismatch_shows_it(tmp_path: Path) -> None:
    """K=1: iteration 1 samples from the initial weights, so it samples exactly what the
    synchronous run samples at iteration 0's weights for iteration 1's prompts and streams,
    and the trainer's old log-probs (after one update) differ from the sampler's."""
    run = Trainer(_config("train.iterations=2", "train.max_staleness=1"), run_dir=tmp_path / "a")
    frozen = Trainer(_config("train.iterations=2", "optim.lr=1e-30"), run_dir=tmp_path / "b")
    run.train()
    frozen.train()
    lagged, on_policy = (
        read_metrics(p / "metrics.jsonl") for p in (tmp_path / "a", tmp_path / "b")
    )
    lagged = [r for r in lagged if "train_units" in r]
    on_policy = [r for r in on_policy if "train_units" in r]
    # The same completions (their rewards) at iteration 1, sampled from version 0 by both.
    assert lagged[1]["countdown/mean"] == on_policy[1]["countdown/mean"]
    assert lagged[1]["staleness/version_lag"] == 1.0
    assert lagged[1]["loss/mismatch_kl"] > 100 * max(on_policy[1]["loss/mismatch_kl"], 1e-9)


@pytest.mark.slow
def test_resume_is_exact_with_k2(tmp_path: Path) -> None:
    overrides = ("train.iterations=4", "train.max_staleness=2")
    straight_and_resumed(
        lambda: _config(*overrides), tmp_path, stop_after=2, ignore=("time/", "staleness/")
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("train.max_staleness=-1",), "train.max_staleness must be >= 0"),
        (
            ("train.max_staleness=1", "train.dynamic_sampling=true"),
            "cannot be combined with train.dynamic_sampling",
        ),
    ],
)
def test_bad_settings_are_one_line(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(*overrides).validate()


def test_more_than_one_process_is_refused() -> None:
    with pytest.raises(ConfigError, match="one process"):
        _config("train.max_staleness=1").validate(num_processes=2)


def test_a_rollout_without_sampler_log_probs_is_refused(tmp_path: Path) -> None:
    config = get_recipe("digits_flow_grpo").apply_overrides(["train.max_staleness=1"])
    with pytest.raises(ConfigError, match="does not record its sampler's log-probs"):
        Trainer(config, run_dir=tmp_path / "run")
