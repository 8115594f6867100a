"""The diffusers UNet adapters (Stable Diffusion, SDXL) on tiny random pipelines loaded from
disk: DDIM rollouts against the stock call, DDPO and Flow-GRPO's objective training the LoRA,
and the LoRA export loaded back by ``pipe.load_lora_weights``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_tiny_unet import build_sd, build_sdxl

from genrl.algorithms.ddim_grpo import DDIMGRPOConfig
from genrl.algorithms.ddpo import DDPOConfig
from genrl.rollouts.configs import DDIMSamplingConfig
from genrl.rollouts.ddim import sample_ddim
from genrl.run.config import (
    EvalConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)
from pipelines import build_policy

PROMPTS = ["a red cat", "a blue dog"]
# family name -> (policy name, builder)
FAMILIES = {
    "sd": ("sd", build_sd),
    "sd_v": ("sd", lambda d: build_sd(d, "v_prediction")),
    "sdxl": ("sdxl", build_sdxl),
}


@pytest.fixture(scope="module")
def pipeline_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unet_pipelines")
    return {name: build(root / name) for name, (_, build) in FAMILIES.items()}


def _pipe_call(policy, noise: torch.Tensor, guidance: float, output_type: str, steps: int = 4):
    """The stock call with its DDIM scheduler, eta 0 and our initial latents."""
    return policy.pipe(
        PROMPTS,
        num_inference_steps=steps,
        guidance_scale=guidance,
        eta=0.0,
        latents=noise.clone(),
        height=policy.height,
        width=policy.width,
        output_type=output_type,
    ).images


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_ddim_rollout_reproduces_pipe_call(pipeline_dirs, family: str, guidance: float) -> None:
    name, _ = FAMILIES[family]
    policy = build_policy(name, pretrained=str(pipeline_dirs[family]))
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    ours = sample_ddim(policy, PROMPTS, noise, num_steps=4, guidance_scale=guidance)
    assert torch.equal(_pipe_call(policy, noise, guidance, "latent"), ours)
    images = _pipe_call(policy, noise, guidance, "pt")
    assert images.shape == (2, 3, 32, 32)
    assert (policy.decode(ours) - images).abs().max() < 1e-6
    if guidance != 1.0:  # the guidance really acts in the stock call
        plain = _pipe_call(policy, noise, 1.0, "latent")
        assert (plain - ours).abs().max() > 1e-3


def unet_config(tmp_path: Path, family: str, directory: Path, algorithm) -> TrainConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na blue dog\na green tree\n")
    return TrainConfig(
        recipe=f"tiny_{family}",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(name=FAMILIES[family][0], pretrained=str(directory), lora_rank=4),
        sampler=DDIMSamplingConfig(
            num_steps=3, noise_level=1.0, guidance_scale=3.0, eval_num_steps=3
        ),
        reward=[RewardSpec(name="target_color")],
        algorithm=algorithm,
        prompts=PromptConfig(dataset=str(prompts)),
        train=TrainLoopConfig(
            iterations=2, prompts_per_iteration=2, group_size=2, minibatch_size=6
        ),
        optim=OptimConfig(lr=1e-2),
        eval=EvalConfig(samples_per_prompt=1),
        logging=LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000),
    )


ALGORITHMS = {
    "ddpo": lambda: DDPOConfig(clip_range=1e-2, stat_buffer_size=4, stat_min_count=2),
    "ddim_grpo": lambda: DDIMGRPOConfig(clip_range=1e-2, kl_beta=0.01, std_mode="group"),
}


@pytest.mark.parametrize("family", ["sd", "sdxl"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_two_steps_train_the_lora(pipeline_dirs, tmp_path: Path, family: str, algorithm: str):
    from genrl.loop.trainer import Trainer

    config = unet_config(tmp_path, family, pipeline_dirs[family], ALGORITHMS[algorithm]())
    trainer = Trainer(config)
    policy = trainer.policy
    before = {
        n: p.detach().clone() for n, p in policy.network.named_parameters() if p.requires_grad
    }
    assert before and all("lora" in n for n in before)
    metrics = trainer.train_iteration()
    # On-policy first minibatch: the re-scored log-probs are the rollout's (float32 rounding
    # of the batched CFG forward at most).
    assert metrics["loss/first_minibatch_ratio_deviation"] < 1e-6
    trainer.train_iteration()
    after = dict(policy.network.named_parameters())
    # B starts at zero and moves only by gradient (A would move by weight decay alone).
    lora_b = [n for n in before if "lora_B" in n]
    changed = [n for n in lora_b if not torch.equal(before[n], after[n])]
    assert lora_b and len(changed) >= 0.9 * len(lora_b), sorted(set(lora_b) - set(changed))
    assert not any(p.requires_grad for n, p in after.items() if "lora" not in n)


@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_lora_export_loads_into_the_stock_pipeline(pipeline_dirs, tmp_path: Path, family: str):
    import diffusers

    from genrl.loop.trainer import Trainer

    config = unet_config(tmp_path, family, pipeline_dirs[family], ALGORITHMS["ddpo"]())
    trainer = Trainer(config)
    policy = trainer.policy
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    base = sample_ddim(policy, PROMPTS, noise, num_steps=3)
    trainer.train_iteration()
    tuned = sample_ddim(policy, PROMPTS, noise, num_steps=3)
    assert (tuned - base).abs().max() > 1e-4
    with policy.reference():  # adapter off: the base model again
        assert torch.equal(sample_ddim(policy, PROMPTS, noise, num_steps=3), base)

    exported = trainer.export(tmp_path / "export")
    stock = getattr(diffusers, policy.pipeline_class).from_pretrained(str(pipeline_dirs[family]))
    fresh = build_policy(FAMILIES[family][0], pipeline=stock)
    stock.load_lora_weights(str(exported))
    stock_tuned = _pipe_call(fresh, noise, 1.0, "latent", steps=3)
    assert (stock_tuned - base).abs().max() > 1e-4
    # The stock pipeline with our LoRA reproduces our fine-tuned samples.
    assert (stock_tuned - tuned).abs().max() < 1e-5


def test_a_flow_algorithm_refuses_a_diffusion_policy(pipeline_dirs) -> None:
    from genrl.algorithms.flow_grpo import FlowGRPO, FlowGRPOConfig
    from genrl.config.errors import ConfigError

    policy = build_policy("sd", pretrained=str(pipeline_dirs["sd"]))
    with pytest.raises(ConfigError, match="flow-matching generator"):
        FlowGRPO(FlowGRPOConfig(), None).build(policy)


def test_full_fine_tune_exports_the_unet(pipeline_dirs, tmp_path: Path) -> None:
    from diffusers import UNet2DConditionModel

    from genrl.loop.trainer import Trainer

    config = unet_config(tmp_path, "sd", pipeline_dirs["sd"], ALGORITHMS["ddpo"]())
    config.policy.lora_rank = 0
    config.optim.lr = 1e-3
    trainer = Trainer(config)
    start = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    trainer.train_iteration()
    exported = trainer.export(tmp_path / "export")
    unet = UNet2DConditionModel.from_pretrained(str(exported / "unet"))
    saved = dict(unet.named_parameters())
    trained = dict(trainer.policy.network.named_parameters())
    assert all(torch.equal(saved[n], p.detach()) for n, p in trained.items())
    assert any(not torch.equal(start[n], p.detach()) for n, p in trained.items())
