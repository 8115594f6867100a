"""The text-to-video adapters on the shared base (LTX-Video, HunyuanVideo 1.5) on tiny random
pipelines loaded from disk, each described once in ``family_table.VIDEO_FAMILIES``: our ODE
rollout against the stock call with and without CFG, decoding (LTX's decode timestep and
noise), two Flow-GRPO iterations and LoRA export into the stock pipeline. Wan has its own file
(tests/test_wan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_table import PROMPTS, VIDEO_FAMILIES, family_kwargs, pipe_call

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

FRAMES = VIDEO_FAMILIES["ltx"].size["num_frames"]


@pytest.fixture(scope="module")
def video_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("videos")
    return {name: family.build(root / name) for name, family in VIDEO_FAMILIES.items()}


def video_policy(family: str, pretrained: Path | None = None, **kwargs):
    """The adapter with the pipeline's own state set as the stock calls will have it."""
    kwargs = {**family_kwargs(family), **kwargs}
    policy = build_policy(
        family, pretrained=None if pretrained is None else str(pretrained), **kwargs
    )
    configure = VIDEO_FAMILIES[family].configure
    if configure is not None:
        configure(policy.pipe, 1.0)
    return policy


@pytest.mark.parametrize("family", list(VIDEO_FAMILIES))
def test_stock_call_applies_guidance(video_dirs, family: str) -> None:
    policy = video_policy(family, video_dirs[family])
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    plain = pipe_call(policy, family, noise, 1.0, "latent")
    guided = pipe_call(policy, family, noise, 4.5, "latent")
    assert (plain - guided).abs().max() > 1e-3


@pytest.mark.parametrize("family", list(VIDEO_FAMILIES))
@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_ode_rollout_reproduces_pipe_call(video_dirs, family: str, guidance: float) -> None:
    policy = video_policy(family, video_dirs[family])
    assert type(
        build_policy("flow_image", pretrained=str(video_dirs[family]), **family_kwargs(family))
    ) is type(policy)
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=guidance)
    latents = pipe_call(policy, family, noise, guidance, "latent")
    assert (latents.float() - ours).abs().max() < 1e-4
    # One video per stock call: HunyuanVideo 1.5's VAE decodes no batch of two (its adapter
    # decodes one video at a time).
    videos = torch.cat(
        [
            pipe_call(policy, family, noise[i : i + 1], guidance, "pt", prompts=PROMPTS[i : i + 1])
            for i in range(2)
        ]
    )
    assert videos.shape == (2, FRAMES, 3, 32, 32)
    decoded = torch.cat([policy.decode(ours[i : i + 1]) for i in range(2)])
    assert (decoded - videos).abs().max() < 1e-4


@pytest.mark.slow  # three stock calls; the fast lane keeps the plain-CFG equality
def test_ltx_guidance_rescale_reproduces_the_stock_call(video_dirs) -> None:
    """``guidance_rescale`` (Lin et al.'s CFG rescale) equals ``LTXPipeline``'s on the latents,
    and changes them: the rule is applied, not ignored on both sides."""
    policy = video_policy("ltx", video_dirs["ltx"], guidance_rescale=0.7)
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=4.5)
    stock = pipe_call(policy, "ltx", noise, 4.5, "latent", guidance_rescale=0.7)
    assert (stock.float() - ours).abs().max() < 1e-4
    plain = pipe_call(policy, "ltx", noise, 4.5, "latent")
    assert (plain.float() - ours).abs().max() > 1e-3
    with pytest.raises(ValueError, match="guidance_rescale"):
        video_policy("ltx", video_dirs["ltx"], guidance_rescale=1.5)


def test_ltx_decodes_with_the_vae_buffers_and_the_decode_noise(video_dirs) -> None:
    """LTX's latent statistics are VAE buffers over a scaling factor; its 0.9.1+ VAE decodes at
    a timestep with seeded noise blended in: both change the video, and the stock call with a
    generator of the adapter's seed decodes alike (test above)."""
    policy = video_policy("ltx", video_dirs["ltx"])
    assert policy.latent_shape == (32, 4) and policy.latent_grid == (2, 4, 4)
    vae = policy.pipe.vae
    grid = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(2))
    expected = grid * vae.latents_std.view(1, -1, 1, 1, 1) / 0.7 + vae.latents_mean.view(
        1, -1, 1, 1, 1
    )
    assert torch.allclose(policy.denormalize(grid), expected)
    latents = torch.randn(1, *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    video = policy.decode(latents)
    assert torch.equal(policy.decode(latents), video)  # the decode noise is seeded
    reseeded = video_policy("ltx", video_dirs["ltx"], decode_noise_seed=1)
    assert (reseeded.decode(latents) - video).abs().max() > 1e-4
    noiseless = video_policy("ltx", video_dirs["ltx"], decode_noise_scale=0.0)
    assert (noiseless.decode(latents) - video).abs().max() > 1e-4


def video_config(tmp_path: Path, family: str, directory: Path) -> TrainConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat walking\na blue dog running\na green tree swaying\n")
    return TrainConfig(
        recipe=f"tiny_{family}",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(
            name=family, pretrained=str(directory), lora_rank=4, kwargs=family_kwargs(family)
        ),
        sampler=SDESamplingConfig(
            num_steps=3, noise_level=0.7, guidance_scale=3.0, eval_num_steps=3
        ),
        reward=[
            RewardSpec(
                name="frame_reward",
                kwargs={"reward": {"name": "target_color"}, "frames": [0, FRAMES - 1]},
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


@pytest.mark.parametrize("family", list(VIDEO_FAMILIES))
def test_flow_grpo_trains_the_lora_and_exports_into_the_stock_pipeline(
    video_dirs, tmp_path: Path, family: str
) -> None:
    import diffusers

    from genrl.loop.trainer import Trainer

    trainer = Trainer(video_config(tmp_path, family, video_dirs[family]))
    policy = trainer.policy
    configure = VIDEO_FAMILIES[family].configure
    if configure is not None:
        configure(policy.pipe, 1.0)
    before = {
        n: p.detach().clone() for n, p in policy.network.named_parameters() if p.requires_grad
    }
    assert before and all("lora" in n for n in before)
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    base = sample_ode(policy, PROMPTS, noise, num_steps=3)
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] < 1e-6  # on-policy: ratio 1
    trainer.train_iteration()
    after = dict(policy.network.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.9 * len(before), sorted(set(before) - set(changed))
    tuned = sample_ode(policy, PROMPTS, noise, num_steps=4)
    with policy.reference():  # the adapter disabled is the base model (the KL reference)
        assert torch.equal(sample_ode(policy, PROMPTS, noise, num_steps=3), base)

    exported = trainer.export(tmp_path / "export")
    stock = getattr(diffusers, policy.pipeline_class).from_pretrained(str(video_dirs[family]))
    fresh = video_policy(family, pipeline=stock)
    stock_base = pipe_call(fresh, family, noise, 1.0, "latent")
    if hasattr(stock, "load_lora_weights"):
        stock.load_lora_weights(str(exported))
    else:  # HunyuanVideo15Pipeline has no LoRA loader: its transformer loads the file
        stock.transformer.load_lora_adapter(
            str(exported), prefix="transformer", weight_name="pytorch_lora_weights.safetensors"
        )
    stock_tuned = pipe_call(fresh, family, noise, 1.0, "latent")
    assert (stock_tuned.float() - stock_base.float()).abs().max() > 1e-4
    assert (stock_tuned.float() - tuned).abs().max() < 1e-4


def test_the_guide_s_worked_example_overrides_no_base_method() -> None:
    """docs/porting_a_diffusers_model.md, section 5: LTX-Video's adapter implements the two
    abstract hooks and sets class attributes; the base does the rest of the video part."""
    from pipelines.diffusers.flow_image import FlowImagePolicy
    from pipelines.diffusers.ltx import LTXPolicy

    methods = {name for name, value in vars(LTXPolicy).items() if callable(value)}
    assert methods == set(FlowImagePolicy.__abstractmethods__) == {"_encode", "_model_inputs"}
