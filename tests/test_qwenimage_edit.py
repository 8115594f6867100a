"""Qwen-Image-Edit (a reference image per prompt) on a tiny random QwenImageEditPipeline: our
rollouts against the stock pipeline with and without CFG, two Flow-GRPO iterations reading the
reference images from a JSONL dataset, and the LoRA export loaded into the stock pipeline.

The stock pipeline is called once per prompt with a single PIL image, its documented use: given a
list of images it leaves the text encoder's copies unresized (``VaeImageProcessor.resize``
returns a list unchanged), which our adapter does not reproduce.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers_tiny_families import build_qwenimage_edit
from PIL import Image

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
from tasks.prompt import Prompt

SIZE = {"height": 32, "width": 32}
TEXTS = ["make it red", "make the dog blue"]


def reference(seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


PROMPTS = [Prompt(text, {"images": [reference(i)]}) for i, text in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwenimage_edit(tmp_path_factory.mktemp("edit") / "qwenimage_edit")


def stock_call(pipe, noise: torch.Tensor, guidance: float, steps: int = 3) -> torch.Tensor:
    """``QwenImageEditPipeline.__call__`` per prompt; CFG is ``true_cfg_scale`` with a negative
    prompt (``guidance_scale`` feeds a guidance embedding the model does not have)."""
    pipe.set_progress_bar_config(disable=True)
    cfg = {"true_cfg_scale": guidance, "negative_prompt": ""} if guidance > 1 else {}
    return torch.cat(
        [
            pipe(
                image=prompt.columns["images"][0],
                prompt=str(prompt),
                latents=noise[i : i + 1].clone(),
                num_inference_steps=steps,
                output_type="latent",
                **SIZE,
                **cfg,
            ).images
            for i, prompt in enumerate(PROMPTS)
        ]
    )


@pytest.mark.slow  # our sampler and the stock pipeline, with and without CFG: about 30 s
def test_edit_rollout_reproduces_the_stock_pipeline(edit_dir: Path) -> None:
    policy = build_policy("flow_image", pretrained=str(edit_dir), **SIZE)
    assert type(policy).__name__ == "QwenImageEditPolicy"
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    stock = {}
    for guidance in (1.0, 4.0):
        ours = sample_ode(policy, PROMPTS, noise, num_steps=3, guidance_scale=guidance)
        stock[guidance] = stock_call(policy.pipe, noise, guidance)
        assert (stock[guidance] - ours).abs().max() < 1e-4, guidance
    assert (stock[1.0] - stock[4.0]).abs().max() > 1e-3  # the stock call did apply CFG
    # The reference image conditions the sample.
    swapped = [Prompt(str(p), {"images": [reference(7)]}) for p in PROMPTS]
    other = sample_ode(policy, swapped, noise, num_steps=3)
    assert (other - sample_ode(policy, PROMPTS, noise, num_steps=3)).abs().max() > 1e-3


def test_edit_needs_a_reference_image(edit_dir: Path) -> None:
    policy = build_policy("qwenimage_edit", pretrained=str(edit_dir), **SIZE)
    with pytest.raises(ValueError, match="has no reference image"):
        policy.encode_prompts(["make it red"])


def edit_config(tmp_path: Path, directory: Path) -> TrainConfig:
    rows = []
    for i, text in enumerate([*TEXTS, "make the sky green"]):
        path = tmp_path / f"ref{i}.png"
        reference(i).save(path)
        rows.append({"prompt": text, "images": str(path)})
    dataset = tmp_path / "edits.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return TrainConfig(
        recipe="tiny_qwenimage_edit",
        output_dir=str(tmp_path / "run"),
        policy=PolicyConfig(
            name="qwenimage_edit", pretrained=str(directory), lora_rank=4, kwargs=SIZE
        ),
        sampler=SDESamplingConfig(
            num_steps=3, noise_level=0.7, guidance_scale=3.0, eval_num_steps=3
        ),
        reward=[RewardSpec(name="target_color")],
        algorithm=FlowGRPOConfig(clip_range=1e-2, kl_beta=0.01, std_mode="group"),
        prompts=PromptConfig(dataset=str(dataset)),
        train=TrainLoopConfig(
            iterations=2, prompts_per_iteration=2, group_size=2, minibatch_size=6
        ),
        optim=OptimConfig(lr=1e-2),
        eval=EvalConfig(samples_per_prompt=1),
        logging=LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000),
    )


@pytest.mark.slow  # two Flow-GRPO iterations with CFG and an export: about 40 s
def test_edit_trains_with_cfg_and_exports_into_the_stock_pipeline(
    edit_dir: Path, tmp_path: Path
) -> None:
    import diffusers

    from genrl.loop.trainer import Trainer

    trainer = Trainer(edit_config(tmp_path, edit_dir))
    policy = trainer.policy
    before = {
        n: p.detach().clone() for n, p in policy.network.named_parameters() if p.requires_grad
    }
    metrics = trainer.train_iteration()
    # Ratio 1 on the on-policy first minibatch, to float32 rounding: with CFG, a CPU with
    # AVX-512/AMX kernels moves the last bits between sampling and re-scoring (6e-8 measured).
    assert metrics["loss/first_minibatch_ratio_deviation"] < 1e-6
    trainer.train_iteration()
    after = dict(policy.network.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.9 * len(before)

    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(1))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=3)
    with policy.reference():
        base = sample_ode(policy, PROMPTS, noise, num_steps=3)
    assert (ours - base).abs().max() > 1e-4
    exported = trainer.export(tmp_path / "export")
    stock = diffusers.QwenImageEditPipeline.from_pretrained(str(edit_dir))
    stock.load_lora_weights(str(exported))
    assert (stock_call(stock, noise, 1.0) - ours).abs().max() < 1e-4
