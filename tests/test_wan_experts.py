"""Wan 2.2 A14B's two experts (``transformer`` above the boundary timestep, ``transformer_2``
below) on a tiny random two-expert ``WanPipeline``: our rollout against the stock pipeline, the
per-row expert switch in training, LoRA on both experts or one (``train_experts``) and its
export into the stock pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_tiny_video import build_wan_a14b

from genrl.algorithms.flow_grpo import FlowGRPOConfig
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
from pipelines.diffusers.wan import WanExperts

PROMPTS = ["a red cat walking", "a blue dog running"]
VIDEO = {"height": 32, "width": 32, "num_frames": 5, "max_sequence_length": 16}


@pytest.fixture(scope="module")
def a14b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wan_a14b(tmp_path_factory.mktemp("wan_a14b") / "wan")


def pipe_call(pipe, noise: torch.Tensor, guidance: float, output_type: str, steps: int = 4):
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        prompt=PROMPTS,
        latents=noise.clone(),
        num_inference_steps=steps,
        guidance_scale=guidance,
        output_type=output_type,
        **VIDEO,
    ).frames


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_ode_rollout_reproduces_the_two_expert_pipeline(a14b_dir: Path, guidance: float) -> None:
    from diffusers import WanPipeline

    policy = build_policy("flow_image", pretrained=str(a14b_dir), **VIDEO)
    assert isinstance(policy.network, WanExperts) and policy.network.boundary == 600.0
    times = policy.sigma_schedule(4)[:-1] * 1000
    assert (times >= 600).any() and (times < 600).any()  # both experts denoise
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=guidance)
    latents = pipe_call(policy.pipe, noise, guidance, "latent")
    assert (latents.float() - ours).abs().max() < 1e-4
    video = pipe_call(policy.pipe, noise, guidance, "pt")
    assert (policy.decode(ours) - video).abs().max() < 1e-4
    # The low-noise expert matters: the high-noise one alone samples something else.
    alone = WanPipeline(**{**policy.pipe.components, "transformer_2": None})
    assert (pipe_call(alone, noise, guidance, "latent") - latents).abs().max() > 1e-3


@pytest.mark.slow  # two stock calls; the fast lane keeps the one-scale equality
def test_guidance_scale_2_reproduces_the_pipeline(a14b_dir: Path) -> None:
    """The low-noise expert's own CFG scale (``guidance_scale_2``) as ``WanPipeline`` applies
    it, and it changes the samples; refused on a one-transformer checkpoint."""
    policy = build_policy("wan", pretrained=str(a14b_dir), guidance_scale_2=2.0, **VIDEO)
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=4.0)
    policy.pipe.set_progress_bar_config(disable=True)
    stock = policy.pipe(
        prompt=PROMPTS, latents=noise.clone(), num_inference_steps=4, guidance_scale=4.0,
        guidance_scale_2=2.0, output_type="latent", **VIDEO,
    ).frames  # fmt: skip
    assert (stock.float() - ours).abs().max() < 1e-4
    assert (pipe_call(policy.pipe, noise, 4.0, "latent") - stock).abs().max() > 1e-3
    # Under LoRA (the network is then peft's wrapper; a fresh adapter changes nothing) too.
    policy.setup_training(rank=4, alpha=4.0, target_modules=None)
    lora = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=4.0)
    assert (lora - ours).abs().max() < 1e-5
    from diffusers import WanPipeline

    one = WanPipeline(**{**policy.pipe.components, "transformer_2": None})
    with pytest.raises(ValueError, match="guidance_scale_2 needs a two-expert"):
        build_policy("wan", pipeline=one, guidance_scale_2=2.0, **VIDEO)


def test_each_row_goes_to_the_expert_of_its_timestep(a14b_dir: Path) -> None:
    policy = build_policy("wan", pretrained=str(a14b_dir), **VIDEO)
    condition = policy.encode_prompts(PROMPTS)
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.3, 0.9])  # row 0 below the boundary (0.6), row 1 above
    both = policy.forward_model(policy.network, x, sigma, condition)
    rows = [{k: v[i : i + 1] for k, v in condition.items()} for i in range(2)]
    low = policy.forward_model(policy.pipe.transformer_2, x[:1], sigma[:1], rows[0])
    high = policy.forward_model(policy.pipe.transformer, x[1:], sigma[1:], rows[1])
    assert torch.allclose(both, torch.cat([low, high]), atol=1e-6)
    assert (
        low - policy.forward_model(policy.pipe.transformer, x[:1], sigma[:1], rows[0])
    ).abs().max() > 1e-4


def video_config(tmp_path: Path, directory: Path, train_experts: str) -> TrainConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join([*PROMPTS, "a green tree swaying"]) + "\n")
    return TrainConfig(
        recipe="tiny_wan_a14b",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(
            name="wan",
            pretrained=str(directory),
            lora_rank=4,
            kwargs={**VIDEO, "train_experts": train_experts},
        ),
        # 5 steps on the shift-3 grid: sigmas 1, 0.9, 0.75, 0.5, 0.003; the SDE steps from 1 to
        # 0.75 go through the high-noise expert, the one from 0.5 through the low-noise one.
        sampler=SDESamplingConfig(
            num_steps=5, noise_level=0.7, guidance_scale=3.0, eval_num_steps=3
        ),
        reward=[
            RewardSpec(
                name="frame_reward", kwargs={"reward": {"name": "target_color"}, "frames": [0, 4]}
            )
        ],
        algorithm=FlowGRPOConfig(clip_range=1e-2, kl_beta=0.01, std_mode="group"),
        prompts=PromptConfig(dataset=str(prompts)),
        train=TrainLoopConfig(
            iterations=2, prompts_per_iteration=2, group_size=2, minibatch_size=4
        ),
        optim=OptimConfig(lr=1e-2),
        eval=EvalConfig(samples_per_prompt=1),
        logging=LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000),
    )


@pytest.mark.parametrize("train_experts", ["both", "low_noise"])
def test_flow_grpo_trains_the_chosen_experts_and_exports(
    a14b_dir: Path, tmp_path: Path, train_experts: str
) -> None:
    from diffusers import WanPipeline

    from genrl.loop.trainer import Trainer

    trainer = Trainer(video_config(tmp_path, a14b_dir, train_experts))
    policy = trainer.policy
    named = policy.network.named_parameters()
    before = {n: p.detach().clone() for n, p in named if p.requires_grad}
    experts = {n.split(".")[2] for n in before}  # base_model.model.<high|low>.blocks...
    assert experts == ({"high", "low"} if train_experts == "both" else {"low"})
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(2))
    base = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=3.0)
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] < 1e-6
    trainer.train_iteration()
    after = dict(policy.network.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.9 * len(before), sorted(set(before) - set(changed))
    assert {n.split(".")[2] for n in changed} == experts
    tuned = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=3.0)
    assert (tuned - base).abs().max() > 1e-4
    with policy.reference():
        assert torch.equal(sample_ode(policy, PROMPTS, noise, 4, guidance_scale=3.0), base)

    exported = trainer.export(tmp_path / "export")
    stock = WanPipeline.from_pretrained(str(a14b_dir))
    if "high" in experts:
        stock.load_lora_weights(str(exported))
    else:
        assert not (exported / "pytorch_lora_weights.safetensors").exists()
    stock.load_lora_weights(str(exported / "transformer_2"), load_into_transformer_2=True)
    assert (pipe_call(stock, noise, 3.0, "latent").float() - tuned).abs().max() < 1e-4


def test_full_fine_tuning_of_one_expert_exports_it_alone(a14b_dir: Path, tmp_path: Path) -> None:
    from diffusers import WanTransformer3DModel

    from genrl.loop.trainer import Trainer

    config = video_config(tmp_path, a14b_dir, "low_noise")
    config.policy.lora_rank = 0
    config.optim.lr = 1e-3
    trainer = Trainer(config)
    high_before = {
        n: p.detach().clone() for n, p in trainer.policy.pipe.transformer.named_parameters()
    }
    trainer.train_iteration()
    pipe = trainer.policy.pipe
    assert all(torch.equal(p, high_before[n]) for n, p in pipe.transformer.named_parameters())
    out = trainer.export(tmp_path / "export")
    assert not (out / "transformer").exists()
    loaded = WanTransformer3DModel.from_pretrained(str(out / "transformer_2")).state_dict()
    trained = pipe.transformer_2.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in loaded.items())
    original = WanTransformer3DModel.from_pretrained(str(a14b_dir / "transformer_2")).state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in original.items())


def test_train_experts_errors_name_the_problem(a14b_dir: Path) -> None:
    from diffusers_tiny import build_wan

    with pytest.raises(ValueError, match="train_experts must be"):
        build_policy("wan", pretrained=str(a14b_dir), train_experts="low", **VIDEO)
    with pytest.raises(ValueError, match="needs a two-expert checkpoint"):
        one = build_wan(a14b_dir.parent / "one")
        build_policy("wan", pretrained=str(one), train_experts="low_noise", **VIDEO)
