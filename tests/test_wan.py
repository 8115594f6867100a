"""The Wan text-to-video adapter on a tiny random ``WanPipeline`` loaded from disk: our rollouts
against the stock pipeline, every flow algorithm on video latents, LoRA export into the stock
pipeline, and the loader's errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_tiny import build_wan

from genrl import Trainer
from genrl.algorithms.flow_grpo import FlowGRPOConfig
from genrl.recipes.wan import WAN_RECIPES
from genrl.rollouts.flow import sample_ode
from genrl.run.config import (
    EvalConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    SDESamplingConfig,
    TrainConfig,
    TrainLoopConfig,
)
from pipelines import build_policy
from reward_models import REWARDS, RewardModel, RewardOutput

PROMPTS = ["a red cat walking", "a blue dog running"]
VIDEO = {"height": 32, "width": 32, "num_frames": 5, "max_sequence_length": 16}


class RednessOverTime(RewardModel):
    """Red minus the other channels, averaged over pixels, growing with the frame index: a
    reward only a video has (tests only)."""

    name = "redness_over_time"
    accepts = ("videos",)

    def score(self, outputs, prompts, metadata) -> RewardOutput:
        red = outputs[:, :, 0] - outputs[:, :, 1:].mean(dim=2)  # [B, F, H, W]
        weights = torch.linspace(0.5, 1.5, outputs.shape[1])
        return RewardOutput({self.name: (red.mean(dim=(2, 3)) * weights).mean(dim=1)})


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wan(tmp_path_factory.mktemp("wan") / "wan")


@pytest.fixture(autouse=True)
def video_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REWARDS, "redness_over_time", RednessOverTime)


def pipe_call(policy, noise: torch.Tensor, guidance: float, output_type: str, steps: int = 4):
    """``WanPipeline.__call__`` with the adapter's settings."""
    return policy.pipe(
        prompt=PROMPTS,
        latents=noise.clone(),
        num_inference_steps=steps,
        guidance_scale=guidance,
        output_type=output_type,
        **VIDEO,
    ).frames


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_ode_rollout_reproduces_the_wan_pipeline(wan_dir: Path, guidance: float) -> None:
    policy = build_policy("flow_image", pretrained=str(wan_dir), **VIDEO)
    assert type(policy).__name__ == "WanPolicy"
    assert policy.latent_shape == (4, 2, 4, 4)  # 5 frames -> 1 + 4/4 latent frames
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=guidance)
    latents = pipe_call(policy, noise, guidance, "latent")
    assert (latents.float() - ours).abs().max() < 1e-4
    video = pipe_call(policy, noise, guidance, "pt")
    assert video.shape == (2, 5, 3, 32, 32)  # [B, F, C, H, W]
    assert (policy.decode(ours) - video).abs().max() < 1e-4


def test_unipc_checkpoints_are_stepped_on_their_own_sigma_grid(wan_dir: Path) -> None:
    """Released Wan checkpoints ship UniPC with flow sigmas; Flow-GRPO's Wan code takes its SDE
    steps on that grid, and so do our rollouts (with s = 1 exactly at the start)."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    stock = WanPipeline.from_pretrained(str(wan_dir))
    unipc = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    )
    pipe = WanPipeline(**{**stock.components, "scheduler": unipc})
    policy = build_policy("wan", pipeline=pipe, **VIDEO)
    sigmas = policy.sigma_schedule(20)
    unipc.set_timesteps(20)
    assert sigmas[0] == 1.0 and torch.equal(sigmas[1:], unipc.sigmas[1:].float())
    # The reference's sigma_max (its diffusion coefficient's slope) at 20 steps and shift 3.
    assert abs(float(sigmas[1]) - 0.9827765) < 1e-6 and float(sigmas[-1]) == 0.0
    noise = torch.randn(1, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    video = policy.decode(sample_ode(policy, PROMPTS[:1], noise, num_steps=4))
    assert video.shape == (1, 5, 3, 32, 32) and torch.isfinite(video).all()


def test_per_token_timesteps_reproduce_the_pipeline(wan_dir: Path) -> None:
    """Wan 2.2 TI2V-5B checkpoints set ``expand_timesteps``: one time input per latent token."""
    from diffusers import WanPipeline

    stock = WanPipeline.from_pretrained(str(wan_dir))
    expanded = WanPipeline(**stock.components, expand_timesteps=True)
    policy = build_policy("wan", pipeline=expanded, **VIDEO)
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(2))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=3, guidance_scale=3.0)
    latents = pipe_call(policy, noise, 3.0, "latent", steps=3)
    assert (latents.float() - ours).abs().max() < 1e-4


def video_config(tmp_path: Path, directory: Path, *overrides: str) -> TrainConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join([*PROMPTS, "a green tree swaying"]) + "\n")
    config = TrainConfig(
        recipe="tiny_wan",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(name="wan", pretrained=str(directory), lora_rank=4, kwargs=VIDEO),
        sampler=SDESamplingConfig(
            num_steps=3, noise_level=0.7, guidance_scale=3.0, eval_num_steps=3
        ),
        reward=[RewardSpec(name="redness_over_time")],
        algorithm=FlowGRPOConfig(clip_range=1e-2, kl_beta=0.01),
        prompts=PromptConfig(dataset=str(prompts)),
        train=TrainLoopConfig(
            iterations=2, prompts_per_iteration=2, group_size=4, minibatch_size=8
        ),
        optim=OptimConfig(lr=1e-2),
        eval=EvalConfig(samples_per_prompt=1),
        logging=LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000),
    )
    config.apply_overrides(list(overrides))
    return config


def _trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    named = trainer.policy.network.named_parameters()
    return {n: p.detach().clone() for n, p in named if p.requires_grad}


# Every flow algorithm and sampler family on video latents; none has a video-specific branch.
ALGORITHMS = {
    "flow_grpo": (),
    "flow_grpo_fast": (
        "sampler.sde_window_size=1",
        "sampler.sde_window_range=[0, 2]",
        "sampler.same_initial_noise=true",
    ),
    "mix_grpo": (
        "sampler.sde_window_size=2",
        "sampler.sde_window_schedule=progressive",
        "sampler.sde_window_shift_every=1",
    ),
    "dance_grpo": ("sampler.name=dance_sde", "sampler.noise_level=0.3"),
    "cps": ("sampler.name=flow_cps", "sampler.noise_level=0.5"),
    "branch_grpo": (
        "algorithm.name=branch_grpo",
        "algorithm.split_steps=[0, 1]",
        "algorithm.branching=[2, 2]",
    ),
    "ram": ("algorithm.name=ram", "algorithm.noisings_per_sample=2"),
    "gdro": ("algorithm.name=gdro", "algorithm.noisings_per_sample=2"),
    "diffusion_nft": (
        "algorithm.name=diffusion_nft",
        "algorithm.noisings_per_sample=2",
        "sampler.guidance_scale=1",  # CFG-free by construction
    ),
}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_two_steps_of_every_flow_algorithm_train_the_lora(
    wan_dir: Path, tmp_path: Path, name: str
) -> None:
    trainer = Trainer(video_config(tmp_path, wan_dir, *ALGORITHMS[name]))
    before = _trainable(trainer)
    assert before and all("lora" in n for n in before)
    first = trainer.train_iteration()
    if "loss/first_minibatch_ratio_deviation" in first:
        # On-policy first minibatch: re-scored log-probs equal the rollout's, ratio exactly 1.
        assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    metrics = trainer.train_iteration()
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))
    after = _trainable(trainer)
    changed = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.9 * len(before), sorted(set(before) - set(changed))


def test_offline_gdro_fills_and_trains_on_videos(wan_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    trainer = Trainer(
        video_config(
            tmp_path,
            wan_dir,
            *ALGORITHMS["gdro"],
            f"train.offline_store={store}",
            "train.offline_groups=4",
        )
    )
    assert trainer.collector.fill_offline_store() == 4
    before = _trainable(trainer)
    trainer.train_iteration()
    after = _trainable(trainer)
    assert any(not torch.equal(p, after[n]) for n, p in before.items())


def test_lora_export_loads_into_the_stock_wan_pipeline(wan_dir: Path, tmp_path: Path) -> None:
    from diffusers import WanPipeline

    trainer = Trainer(video_config(tmp_path, wan_dir))
    policy = trainer.policy
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    base = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=3.0)
    trainer.train_iteration()
    trainer.train_iteration()
    tuned = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=3.0)
    assert (tuned - base).abs().max() > 1e-4
    with policy.reference():  # the adapter disabled is the base model (the KL reference)
        assert torch.equal(sample_ode(policy, PROMPTS, noise, 4, guidance_scale=3.0), base)

    exported = trainer.export(tmp_path / "export")
    stock = WanPipeline.from_pretrained(str(wan_dir))
    fresh = build_policy("wan", pipeline=stock, **VIDEO)
    stock.load_lora_weights(str(exported))
    stock_tuned = pipe_call(fresh, noise, 3.0, "latent")
    assert (stock_tuned.float() - tuned).abs().max() < 1e-4


def test_run_directory_holds_before_and_after_videos(wan_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(video_config(tmp_path, wan_dir, "train.iterations=1"))
    trainer.train()
    run = Path(trainer.config.output_dir)
    for stem in ("samples_before", "samples_after"):
        assert (run / f"{stem}.gif").is_file() and (run / f"{stem}.png").is_file()
    assert (run / "samples_before_after.gif").is_file()


def test_gradient_checkpointing_gives_the_same_gradients(wan_dir: Path) -> None:
    grads = []
    for checkpointing in (False, True):
        policy = build_policy(
            "wan", pretrained=str(wan_dir), gradient_checkpointing=checkpointing, **VIDEO
        )
        torch.manual_seed(0)
        policy.setup_training(4, 8, None)
        for p in policy.trainable_parameters():  # LoRA B starts at 0: make the path non-trivial
            torch.nn.init.normal_(p, std=0.1)
        policy.module.train()
        condition = policy.encode_prompts(PROMPTS)
        x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
        v = policy.velocity(x, torch.tensor([0.7, 0.3]), condition, guidance_scale=2.0)
        v.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert grads[0].abs().sum() > 0


def test_wan_errors_name_the_problem(wan_dir: Path) -> None:
    from diffusers import WanPipeline

    with pytest.raises(ValueError, match=r"num_frames - 1 must be a multiple of 4 .*e\.g\. 5 or 9"):
        build_policy("wan", pretrained=str(wan_dir), **{**VIDEO, "num_frames": 7})
    with pytest.raises(ValueError, match="multiples of 16 for Wan, got 40x32"):
        build_policy("wan", pretrained=str(wan_dir), **{**VIDEO, "height": 40})
    stock = WanPipeline.from_pretrained(str(wan_dir))
    components = {**stock.components, "transformer_2": stock.transformer}
    no_boundary = WanPipeline(**components)  # two experts (Wan 2.2 A14B: tests/test_wan_experts.py)
    with pytest.raises(ValueError, match="no boundary_ratio"):
        build_policy("wan", pipeline=no_boundary, **VIDEO)
    with pytest.raises(ValueError, match="holds a WanPipeline"):
        build_policy("sd3", pretrained=str(wan_dir))


@pytest.mark.parametrize("name", sorted(WAN_RECIPES))
def test_wan_recipes_train_on_tiny_stand_ins(wan_dir: Path, tmp_path: Path, name: str) -> None:
    """Each recipe's adapter, sampler, algorithm and reward settings, one iteration on the tiny
    Wan with a tiny CLIP (PickScore) or HPS on a 32 px video of at most 5 frames."""
    import json
    import math

    from accelerate.state import AcceleratorState
    from diffusers_tiny import build_clip
    from vision_tiny import build_tiny_hps

    from genrl import get_recipe

    config = get_recipe(name)
    frames = min(config.policy.kwargs["num_frames"], 5)
    kwargs = {**config.policy.kwargs, "height": 32, "width": 32, "num_frames": frames}
    kwargs["max_sequence_length"] = 16
    inner = dict(config.reward[0].kwargs["reward"])
    if inner["name"] == "hps":
        inner["kwargs"] = {**inner.get("kwargs", {}), **build_tiny_hps(tmp_path / "hps")}
    else:
        inner["kwargs"] = {"model": str(build_clip(tmp_path / "clip"))}
    reward = {**config.reward[0].kwargs, "reward": inner, "frames": [0, frames - 1]}
    group = 3
    if config.algorithm.name == "branch_grpo":
        group = math.prod(config.algorithm.branching)
        config.apply_overrides(["sampler.num_steps=10", "algorithm.train_steps=[0, 1, 2, 3]"])
    else:
        config.apply_overrides(["sampler.num_steps=4"])
    config.apply_overrides(
        [
            f"policy.pretrained={wan_dir}",
            f"policy.kwargs={json.dumps(kwargs)}",
            f"reward.0.kwargs={json.dumps(reward)}",
            f"output_dir={tmp_path / 'run'}",
            "train.iterations=1",
            "train.prompts_per_iteration=2",
            f"train.group_size={group}",
            "train.gradient_accumulation_steps=1",
            "train.rollout_batch_size=4",
            "eval.samples_per_prompt=1",
            "eval.batch_size=4",
            "sampler.eval_num_steps=3",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        before = _trainable(trainer)
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    after = _trainable(trainer)
    assert any(not torch.equal(p, after[n]) for n, p in before.items())
    assert math.isfinite(metrics["loss/total"])
