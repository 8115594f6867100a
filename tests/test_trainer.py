"""Trainer behaviour: parameters move, on-policy ratio is exactly 1, resume is exact, and the
2-process run computes the same advantages as the 1-process run."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.reporting.metrics import read_metrics
from reward_models import REWARDS, RewardModel, RewardOutput


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_two_steps_change_trainable_parameters(tmp_path: Path, lora_rank: int) -> None:
    config = tiny_config(tmp_path, f"policy.lora_rank={lora_rank}", "algorithm.kl_beta=0.01")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    before = _params(trainer)
    trainable = {n for n, p in trainer.policy.network.named_parameters() if p.requires_grad}
    summary = trainer.train()
    after = _params(trainer)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert trainable, "nothing is trainable"
    assert changed == trainable, "exactly the trainable parameters should move"
    if lora_rank:
        assert all("lora_" in n for n in trainable)
        # The reference (adapter disabled) is still the base model.
        x, sigma = torch.randn(3, 1, 8, 8), torch.full((3,), 0.5)
        condition = trainer.policy.encode_prompts(["digit 1", "digit 2", "digit 3"])
        base = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "base").policy
        with torch.no_grad(), trainer.policy.reference():
            reference = trainer.policy.velocity(x, sigma, condition)
        torch.testing.assert_close(reference, base.velocity(x, sigma, condition).detach())
    assert summary["optimizer_steps"] == trainer.optimizer_steps > 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert any("loss/kl_loss" in r for r in rows)


@pytest.mark.parametrize("guidance", ["1.0", "3.0"])
def test_first_update_of_an_iteration_has_ratio_exactly_one(tmp_path: Path, guidance: str) -> None:
    config = tiny_config(tmp_path, f"sampler.guidance_scale={guidance}")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    _, metrics = trainer.objective.loss(trainer.policy, units)
    assert metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0
    assert metrics["clip_fraction"] == 0.0
    # The same holds inside the loop for every iteration's first minibatch.
    trainer.train()
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train_units" in r]
    assert [r["loss/first_minibatch_ratio_deviation"] for r in rows] == [0.0, 0.0]


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_resume_is_exact(tmp_path: Path) -> None:
    overrides = ("train.iterations=4", "optim.ema_decay=0.5", "optim.lr_schedule=cosine")
    straight = Trainer(tiny_config(tmp_path, *overrides), run_dir=tmp_path / "a")
    straight.train()

    first = Trainer(tiny_config(tmp_path, *overrides), run_dir=tmp_path / "b")
    first.train(stop_after=2)
    assert first.iteration == 2
    resumed = Trainer(
        tiny_config(tmp_path, *overrides), run_dir=tmp_path / "b", resume_from=tmp_path / "b"
    )
    resumed.train()

    for name, value in _params(straight).items():
        assert torch.equal(value, _params(resumed)[name]), name
    assert torch.equal(
        torch.cat([t.flatten() for t in straight.ema.shadow.values()]),
        torch.cat([t.flatten() for t in resumed.ema.shadow.values()]),
    )
    rows_a = _comparable(read_metrics(tmp_path / "a" / "metrics.jsonl"))
    rows_b = _comparable(read_metrics(tmp_path / "b" / "metrics.jsonl"))
    assert rows_a == rows_b
    summary_a = json.loads((tmp_path / "a" / "summary.json").read_text())
    summary_b = json.loads((tmp_path / "b" / "summary.json").read_text())
    for key in ("heldout_reward_before", "heldout_reward_after", "optimizer_steps"):
        assert summary_a[key] == summary_b[key]


def _two_process_worker(directory: str, *overrides: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # The forked worker inherits the parent's single-process state singleton; start afresh.
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2
    config = tiny_config(Path(directory), "algorithm.timestep_selection=random", *overrides)
    trainer = Trainer(config, run_dir=Path(directory) / "ddp", accelerator=accelerator)
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    torch.save(
        {
            "advantages": batch.advantages,
            "local": batch.rollout.advantages,
            "rewards": batch.scores["reward"],
            "timesteps": units.timestep_index,
            "latents": batch.rollout.latents,
            "log_probs": batch.rollout.log_probs,
        },
        Path(directory) / f"rank{accelerator.process_index}.pt",
    )


def test_two_processes_compute_the_same_advantages(tmp_path: Path) -> None:
    from accelerate import debug_launcher

    trainer = Trainer(
        tiny_config(tmp_path, "algorithm.timestep_selection=random"), run_dir=tmp_path / "single"
    )
    single = trainer.collect()
    single_timesteps = trainer.objective.units(
        trainer.policy, single.rollout, single.noise
    ).timestep_index
    debug_launcher(_two_process_worker, args=(str(tmp_path),), num_processes=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for rank in ranks:
        torch.testing.assert_close(rank["rewards"], single.scores["reward"], rtol=0, atol=1e-6)
        # Rewards agree to 1e-6; dividing by a group's std scales that up (1.2e-5 measured on
        # an AVX-512 CPU), hence the relative bound.
        torch.testing.assert_close(rank["advantages"], single.advantages, rtol=1e-4, atol=1e-5)
    local = torch.cat([r["local"] for r in ranks])
    torch.testing.assert_close(local, single.advantages, rtol=1e-4, atol=1e-5)
    # Randomly chosen training timesteps follow the sample, not the process layout.
    assert torch.equal(torch.cat([r["timesteps"] for r in ranks]), single_timesteps)


def test_two_processes_share_a_straddling_group_prefix(tmp_path: Path) -> None:
    """Flow-GRPO-Fast on 2 processes: 3 groups of 4 over 2 x 6 samples, so group 1 is split;
    its shared ODE prefix and SDE window match the 1-process rollout."""
    from accelerate import debug_launcher

    fast = (
        "train.prompts_per_iteration=3",
        "train.group_size=4",
        "sampler.num_steps=5",
        "sampler.sde_window_size=2",
        "sampler.sde_window_range=[1, 4]",
        "sampler.same_initial_noise=true",
    )
    config = tiny_config(tmp_path, "algorithm.timestep_selection=random", *fast)
    single = Trainer(config, run_dir=tmp_path / "single").collect()
    debug_launcher(_two_process_worker, args=(str(tmp_path), *fast), num_processes=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    latents = torch.cat([r["latents"] for r in ranks])
    torch.testing.assert_close(latents, single.rollout.latents, rtol=0, atol=1e-5)
    log_probs = torch.cat([r["log_probs"] for r in ranks])
    torch.testing.assert_close(log_probs, single.rollout.log_probs, rtol=0, atol=1e-4)
    start = int(single.rollout.trainable_steps[0].float().argmax())
    split_group = latents[4:8, : start + 1]  # rows 4-5 on rank 0, 6-7 on rank 1
    torch.testing.assert_close(
        split_group, split_group[:1].expand_as(split_group), rtol=0, atol=1e-6
    )


def test_gradient_accumulation_matches_one_larger_minibatch(tmp_path: Path) -> None:
    # 16 samples x 3 trained steps = 48 units: two minibatches of 24 accumulated into one
    # optimizer step must equal one minibatch of 48 (same shuffled order, equal-size halves).
    accumulated = Trainer(
        tiny_config(tmp_path, "train.minibatch_size=24", "train.gradient_accumulation_steps=2"),
        run_dir=tmp_path / "acc",
    )
    single = Trainer(tiny_config(tmp_path, "train.minibatch_size=48"), run_dir=tmp_path / "one")
    norms = []
    for trainer in (accumulated, single):
        norms.append(trainer.train_iteration()["grad_norm"])
        assert trainer.optimizer_steps == 1
    # Adam is blind to the gradient's scale, so check the accumulated gradient itself too.
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
    for name, value in _params(accumulated).items():
        # Adam divides by sqrt(v): float noise in tiny gradients shows at ~1e-6 of a 1e-2 step.
        torch.testing.assert_close(value, _params(single)[name], rtol=1e-4, atol=2e-5)


def test_only_a_windows_last_backward_is_the_sync_boundary(tmp_path: Path) -> None:
    """DeepSpeed steps inside ``accelerator.backward`` when accelerate's ``sync_gradients`` is
    set (genrl/distributed/deepspeed.py): 48 units in minibatches of 16, accumulating 2, make the
    windows [0, 1] and [2], so the flag is False, True, True; the LR of the window's step is in
    place before its first backward (warm-up over 2 steps of lr 1e-2: 5e-3, then 1e-2)."""
    trainer = Trainer(
        tiny_config(
            tmp_path,
            "train.minibatch_size=16",
            "train.gradient_accumulation_steps=2",
            "optim.warmup_steps=2",
            "optim.lr_schedule=constant",
        ),
        run_dir=tmp_path / "run",
    )
    seen: list[tuple[bool, float]] = []
    real_backward = trainer.accelerator.backward

    def recording(loss: torch.Tensor, **kwargs: object) -> None:
        lr = trainer.optimizer.param_groups[0]["lr"]
        seen.append((trainer.accelerator.sync_gradients, lr))
        real_backward(loss, **kwargs)

    trainer.accelerator.backward = recording
    trainer.train_iteration()
    assert seen == [(False, 5e-3), (True, 5e-3), (True, 1e-2)]
    assert trainer.accelerator.sync_gradients and trainer.optimizer_steps == 2


def test_ctrl_c_mid_update_finishes_the_iteration_and_resumes_exactly(tmp_path: Path) -> None:
    overrides = ("train.iterations=4",)
    straight = Trainer(tiny_config(tmp_path, *overrides), run_dir=tmp_path / "a")
    straight.train()

    interrupted = Trainer(tiny_config(tmp_path, *overrides), run_dir=tmp_path / "b")
    real_update = interrupted.updater.update

    def ctrl_c_during_second_update(*args: object) -> dict[str, float]:
        if interrupted.iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C once, mid-update
        return real_update(*args)  # type: ignore[arg-type]

    interrupted.updater.update = ctrl_c_during_second_update  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    # The iteration in progress was completed, then checkpointed.
    assert [p.name for p in (tmp_path / "b" / "checkpoints").iterdir()] == ["iter_000002"]
    assert not (tmp_path / "b" / "summary.json").exists()

    resumed = Trainer(
        tiny_config(tmp_path, *overrides), run_dir=tmp_path / "b", resume_from=tmp_path / "b"
    )
    resumed.train()
    assert resumed.optimizer_steps == straight.optimizer_steps
    for name, value in _params(straight).items():
        assert torch.equal(value, _params(resumed)[name]), name
    assert _comparable(read_metrics(tmp_path / "a" / "metrics.jsonl")) == _comparable(
        read_metrics(tmp_path / "b" / "metrics.jsonl")
    )


def test_second_ctrl_c_aborts_without_saving(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, "train.iterations=3"), run_dir=tmp_path / "run")
    real_update = trainer.updater.update

    def ctrl_c_twice(*args: object) -> dict[str, float]:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        return real_update(*args)  # type: ignore[arg-type]

    trainer.updater.update = ctrl_c_twice  # type: ignore[method-assign]
    # Start from Python's default handler even where the test process inherited SIGINT as
    # ignored (a shell's background job).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        assert not (tmp_path / "run" / "checkpoints").exists()
        # The handler is removed again: SIGINT is back to Python's default.
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_resuming_an_older_checkpoint_sets_later_ones_aside(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "train.iterations=3", "logging.checkpoint_every=1",
                         "logging.keep_checkpoints=5")  # fmt: skip
    Trainer(config, run_dir=tmp_path / "run").train()
    older = tmp_path / "run" / "checkpoints" / "iter_000001"
    Trainer(config, run_dir=tmp_path / "run", resume_from=older).train(stop_after=2)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["abandoned", "iter_000001", "iter_000002"]
    abandoned = sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "abandoned").iterdir())
    assert abandoned == ["iter_000002", "iter_000003"]  # the old branch's 2 and 3


def test_lora_initialisation_follows_the_run_seed(tmp_path: Path) -> None:
    weights = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # whatever the caller did before must not matter
        trainer = Trainer(tiny_config(tmp_path, "policy.lora_rank=4"), run_dir=tmp_path / "r")
        weights.append(trainer.policy.trainable_state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.parametrize("selection", ["prefix", "random"])
def test_trained_timesteps(tmp_path: Path, selection: str) -> None:
    # 4 sampling steps x 0.99 -> 3 trained steps per trajectory.
    trainer = Trainer(
        tiny_config(tmp_path, f"algorithm.timestep_selection={selection}"), run_dir=tmp_path / "r"
    )
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    steps = units.timestep_index.reshape(len(batch.rollout), 3)
    if selection == "prefix":  # the Flow-GRPO reference: steps 0..k-1 in order
        assert (steps == torch.tensor([0, 1, 2])).all()
    else:
        assert len({tuple(row) for row in steps.sort(dim=1).values.tolist()}) > 1
        assert all(len(set(row)) == 3 for row in steps.tolist())
    # Each unit pairs the right states and log-prob of its trajectory.
    row = 5
    for j, step in enumerate(steps[row].tolist()):
        unit = row * 3 + j
        assert torch.equal(units.sample[unit], batch.rollout.latents[row, step])
        assert torch.equal(units.next_sample[unit], batch.rollout.latents[row, step + 1])
        assert units.old_log_probs[unit] == batch.rollout.log_probs[row, step]


def test_export_command_writes_the_checkpoint_weights(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from genrl.cli.main import main

    config = tiny_config(tmp_path, f"output_dir={tmp_path / 'run'}")
    trainer = Trainer(config)
    trainer.train()
    assert (tmp_path / "run" / "export" / "trainable.safetensors").is_file()  # end of a run
    flow, clf = (tmp_path / "flow.safetensors", tmp_path / "clf.safetensors")
    code = main(
        [
            "export",
            "--checkpoint",
            str(tmp_path / "run"),
            "--out",
            str(tmp_path / "out"),
            "--set",
            f"policy.pretrained={flow}",
            "--set",
            f'reward.0.kwargs={{"path": "{clf}"}}',
        ]
    )
    assert code == 0
    exported = load_file(str(tmp_path / "out" / "trainable.safetensors"))
    trained = trainer.policy.trainable_state_dict()
    assert exported.keys() == trained.keys()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)


class Brightness(RewardModel):
    name = "brightness"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        return RewardOutput({self.name: outputs.float().flatten(1).mean(1).cpu()})


def test_two_rewards_normalised_then_summed(tmp_path: Path, monkeypatch) -> None:
    """A composite of two rewards with GDPO's aggregation: per-reward metrics are logged and the
    advantages are the algorithm's estimator applied to the decoupled rewards."""
    from genrl.objectives.advantages import decoupled_group_rewards
    from genrl.run.config import RewardSpec

    monkeypatch.setitem(REWARDS, "brightness", Brightness)

    config = tiny_config(
        tmp_path, "reward_aggregation=normalize_then_sum", "algorithm.std_mode=none"
    )
    config.reward.append(RewardSpec(name="brightness", weight=0.5))
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    weights = {"digit_classifier": 1.0, "brightness": 0.5}
    decoupled = decoupled_group_rewards(batch.scores, weights, batch.group_ids)
    torch.testing.assert_close(batch.advantages, decoupled, atol=1e-5, rtol=0)  # groups centred
    metrics = trainer.train_iteration()
    for name in ("digit_classifier/mean", "brightness/mean", "reward/mean"):
        assert math.isfinite(metrics[name])


def _two_process_eval_worker(directory: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True)
    config = tiny_config(Path(directory), "eval.batch_size=6")
    trainer = Trainer(config, run_dir=Path(directory) / "ddp", accelerator=accelerator)
    result = trainer.evaluate()
    torch.save(
        {"reward": result.reward, "scores": result.scores, "outputs": result.outputs},
        Path(directory) / f"eval{accelerator.process_index}.pt",
    )


def test_evaluation_is_shared_out_over_processes(tmp_path: Path) -> None:
    """Two processes make and score alternate chunks and both return the one-process result."""
    from accelerate import debug_launcher

    config = tiny_config(tmp_path, "eval.batch_size=6")
    single = Trainer(config, run_dir=tmp_path / "single").evaluate()
    debug_launcher(_two_process_eval_worker, args=(str(tmp_path),), num_processes=2)
    for rank in range(2):
        result = torch.load(tmp_path / f"eval{rank}.pt")
        assert result["reward"] == pytest.approx(single.reward, abs=1e-6)
        assert result["scores"] == pytest.approx(single.scores, abs=1e-6)
        torch.testing.assert_close(result["outputs"], single.outputs, atol=1e-6, rtol=0)


def test_sharded_models_evaluate_every_chunk_on_every_process() -> None:
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from genrl.reporting.evaluation import _process_layout

    ddp = SimpleNamespace(
        num_processes=4, process_index=2, distributed_type=DistributedType.MULTI_GPU
    )
    fsdp = SimpleNamespace(num_processes=4, process_index=2, distributed_type=DistributedType.FSDP)
    assert _process_layout(ddp) == (2, 4)
    assert _process_layout(fsdp) == (0, 1)  # all processes run all chunks together
    assert _process_layout(None) == (0, 1)


def test_build_run_makes_every_component_in_order(tmp_path: Path) -> None:
    """genrl.run.build.build_run: the components a Trainer drives, built once; the optimizer holds
    exactly the trainable parameters, and the module the accelerator prepared is the policy's."""
    from genrl.run.build import build_run

    run = build_run(tiny_config(tmp_path, "policy.lora_rank=4"))
    params = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert params == {id(p) for p in run.policy.trainable_parameters()} and params
    assert run.local == slice(0, 16)  # 4 prompts x 4 samples, one process
    assert type(run.rollout).__name__ == "FlowSDERollout"
    assert type(run.objective).__name__ == "FlowPolicyGradient"
    # One keyword set for every adapter: the embedded model refuses what it cannot do.
    from genrl.config.errors import ConfigError
    from pipelines import build_policy

    with pytest.raises(ValueError, match="runs in float32"):
        build_policy("toy_digits", dtype="bfloat16", gradient_checkpointing=False)
    with pytest.raises(ConfigError, match=r"policy\.kwargs\.heigth.*takes no such keyword"):
        build_run(tiny_config(tmp_path, 'policy.kwargs={"heigth": 8}'))
