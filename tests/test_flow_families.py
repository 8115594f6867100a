"""The flow adapter base's family hooks (pipelines/diffusers/flow_hooks.py) on their own and through the
families that need them: norm-rescaled CFG, the CFG cut-off, masked prompt embeddings of
different lengths, latent normalisation, and registering a family by class."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from family_table import PROMPTS, family_kwargs, pipe_call

from genrl.rollouts.flow import sample_ode
from pipelines import build_policy
from pipelines.diffusers.flow_families import FAMILIES, flow_image_class, register_family
from pipelines.diffusers.flow_hooks import Guidance, cutoff_for_step_fraction, join_padded
from pipelines.diffusers.sd3 import SD3Policy


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from diffusers_tiny import build_sd3
    from diffusers_tiny_families import build_lumina2, build_qwenimage, build_zimage

    root = tmp_path_factory.mktemp("families")
    builders = {"sd3": build_sd3, "lumina2": build_lumina2, "qwenimage": build_qwenimage}
    builders["zimage"] = build_zimage
    return {name: build(root / name) for name, build in builders.items()}


def test_guidance_rules_follow_their_formulas() -> None:
    generator = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(2, 3, 5, generator=generator).unbind(0)
    cond, uncond = cond[:, None].expand(3, 2, 5), uncond[:, None].expand(3, 2, 5)
    sigma = torch.tensor([0.9, 0.5, 0.1])
    plain = uncond + 4.0 * (cond - uncond)
    assert torch.equal(Guidance().combine(cond, uncond, sigma, 4.0), plain)
    rescaled = Guidance(normalize=True).combine(cond, uncond, sigma, 4.0)
    # ||v|| over the last axis equals the conditional prediction's, direction of plain CFG.
    assert torch.allclose(rescaled.norm(dim=-1), cond.norm(dim=-1))
    assert torch.allclose(
        rescaled / rescaled.norm(dim=-1, keepdim=True), plain / plain.norm(dim=-1, keepdim=True)
    )
    cut = Guidance(cutoff_sigma=0.5).combine(cond, uncond, sigma, 4.0)
    assert torch.equal(cut[:2], plain[:2]) and torch.equal(cut[2], cond[2])
    assert Guidance(cutoff_sigma=0.5).active(sigma) and not Guidance(cutoff_sigma=0.95).active(
        sigma
    )
    with pytest.raises(ValueError, match="cutoff_sigma"):
        Guidance(cutoff_sigma=-1.0)


def test_cutoff_for_step_fraction_matches_the_step_rule() -> None:
    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    assert cutoff_for_step_fraction(sigmas, 1.0) == 0.0  # every step guided
    assert cutoff_for_step_fraction(sigmas, 0.5) == 0.75  # steps 0 and 1: (i + 1) / 4 <= 0.5
    assert cutoff_for_step_fraction(sigmas, 0.6) == 0.75
    assert math.isinf(cutoff_for_step_fraction(sigmas, 0.2))  # no step guided


def test_join_padded_pads_masked_sequences_only() -> None:
    a = {"e": torch.ones(2, 3, 4), "m": torch.ones(2, 3, dtype=torch.long), "p": torch.ones(2, 6)}
    b = {"e": torch.ones(2, 5, 4), "m": torch.ones(2, 5, dtype=torch.long), "p": torch.ones(2, 6)}
    joined = join_padded(a, b, {"e": "m"})
    assert joined["e"].shape == (4, 5, 4) and joined["m"].shape == (4, 5)
    assert joined["m"][:2, 3:].eq(0).all() and joined["e"][:2, 3:].eq(0).all()
    assert joined["m"][2:].eq(1).all()
    with pytest.raises(ValueError, match="only masked sequences"):
        join_padded(a, b, {})


def test_lumina2_cfg_cut_off_reproduces_cfg_trunc_ratio(dirs) -> None:
    kwargs = family_kwargs("lumina2")
    probe = build_policy("lumina2", pretrained=str(dirs["lumina2"]), **kwargs)
    cutoff = cutoff_for_step_fraction(probe.sigma_schedule(4), 0.5)
    assert 0 < cutoff < 1
    policy = build_policy(
        "lumina2", pretrained=str(dirs["lumina2"]), cfg_cutoff_sigma=cutoff, **kwargs
    )
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=4.0)
    truncated = pipe_call(policy, "lumina2", noise, 4.0, "latent", cfg_trunc_ratio=0.5)
    assert (truncated - ours).abs().max() < 1e-4
    full = pipe_call(policy, "lumina2", noise, 4.0, "latent")
    assert (full - truncated).abs().max() > 1e-3


def test_lumina2_without_cfg_normalization(dirs) -> None:
    kwargs = family_kwargs("lumina2")
    policy = build_policy(
        "lumina2", pretrained=str(dirs["lumina2"]), cfg_normalization=False, **kwargs
    )
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(4))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=4.0)
    stock = pipe_call(policy, "lumina2", noise, 4.0, "latent", cfg_normalization=False)
    assert (stock - ours).abs().max() < 1e-4
    normalized = pipe_call(policy, "lumina2", noise, 4.0, "latent")
    assert (stock - normalized).abs().max() > 1e-3


def test_zimage_norm_clamp_and_cfg_truncation_reproduce_the_pipeline(dirs) -> None:
    """Z-Image's ``cfg_normalization=r`` (clamp of the guided norm) and ``cfg_truncation=c``
    (CFG only where ``1 - sigma <= c``) as ``cfg_max_norm_ratio`` and ``cfg_cutoff_sigma``."""
    kwargs = family_kwargs("zimage")
    policy = build_policy(
        "zimage",
        pretrained=str(dirs["zimage"]),
        cfg_max_norm_ratio=1.1,
        cfg_cutoff_sigma=0.5,
        **kwargs,
    )
    noise = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(5))
    ours = sample_ode(policy, PROMPTS, noise, num_steps=4, guidance_scale=4.0)
    stock = pipe_call(
        policy, "zimage", noise, 4.0, "latent", cfg_normalization=1.1, cfg_truncation=0.5
    )
    assert (stock - ours).abs().max() < 1e-4
    plain = pipe_call(policy, "zimage", noise, 4.0, "latent")
    assert (stock - plain).abs().max() > 1e-3
    clamp_only = Guidance(max_norm_ratio=1.0).combine(
        torch.ones(1, 2, 2), torch.zeros(1, 2, 2), torch.ones(1), 3.0
    )
    assert torch.allclose(clamp_only, torch.ones(1, 2, 2))  # ||v|| clamped to ||v_c||


def test_qwenimage_prompt_embeddings_vary_in_length_with_a_mask(dirs) -> None:
    policy = build_policy(
        "qwenimage", pretrained=str(dirs["qwenimage"]), **family_kwargs("qwenimage")
    )
    condition = policy.encode_prompts(PROMPTS)
    null = policy.null_condition(condition)
    lengths = condition["prompt_embeds_mask"].sum(dim=1).tolist()
    # Padded to the longest prompt of the batch, not to max_sequence_length (512).
    assert condition["prompt_embeds"].shape[1] == max(lengths) < policy.max_sequence_length
    assert lengths[0] < lengths[1]
    assert null["prompt_embeds"].shape[1] != condition["prompt_embeds"].shape[1]
    joined = policy.join_conditions(condition, null)
    assert (
        joined["prompt_embeds"].shape[:2] == joined["prompt_embeds_mask"].shape == (4, max(lengths))
    )


def test_latent_normalisation_scalar_and_per_channel(dirs) -> None:
    sd3 = build_policy("sd3", pretrained=str(dirs["sd3"]), **family_kwargs("sd3"))
    config = sd3.pipe.vae.config
    x = torch.randn(2, 4, 8, 8)
    expected = x / config.scaling_factor + config.shift_factor
    assert torch.allclose(sd3.denormalize(x), expected, atol=1e-6)
    qwen = build_policy(
        "qwenimage", pretrained=str(dirs["qwenimage"]), **family_kwargs("qwenimage")
    )
    vae = qwen.pipe.vae.config
    y = torch.randn(2, 4, 1, 4, 4)
    mean = torch.tensor(vae.latents_mean).view(1, 4, 1, 1, 1)
    std = torch.tensor(vae.latents_std).view(1, 4, 1, 1, 1)
    assert torch.allclose(qwen.denormalize(y), y * std + mean)
    assert torch.allclose(qwen.normalize(qwen.denormalize(y)), y, atol=1e-6)


def test_register_family_by_class(dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipelines.diffusers.flow_families.FAMILIES", dict(FAMILIES))

    class MySD3(SD3Policy):
        pass

    register_family(MySD3)
    assert flow_image_class(str(dirs["sd3"])) is MySD3
    policy = build_policy("flow_image", pretrained=str(dirs["sd3"]), **family_kwargs("sd3"))
    assert type(policy) is MySD3
    with pytest.raises(ValueError, match="needs both"):
        register_family("pipelines.diffusers.sd3:SD3Policy")
    with pytest.raises(TypeError, match="FlowImagePolicy subclass"):
        register_family(int)  # type: ignore[arg-type]


def test_flow_rollouts_with_prompt_embeddings_of_different_lengths_concatenate() -> None:
    """Dynamic sampling concatenates rounds; QwenImage's embeddings are as long as each round's
    longest prompt, so the shorter round's are zero-padded (its mask marks the padding)."""
    from genrl.data.batches import FlowTrajectory

    def round_of(length: int) -> FlowTrajectory:
        return FlowTrajectory(
            prompts=["a", "b"],
            group_ids=torch.tensor([0, 0]),
            condition={
                "prompt_embeds": torch.ones(2, length, 3),
                "prompt_embeds_mask": torch.ones(2, length, dtype=torch.long),
                "pooled": torch.ones(2, 5),
            },
            latents=torch.zeros(2, 3, 4),
            log_probs=torch.zeros(2, 2),
            trainable_steps=torch.ones(2, 2, dtype=torch.bool),
        )

    joined = FlowTrajectory.concatenate([round_of(4), round_of(6)])
    assert joined.condition["prompt_embeds"].shape == (4, 6, 3)
    assert joined.condition["prompt_embeds_mask"].sum(dim=1).tolist() == [4, 4, 6, 6]
    assert joined.condition["prompt_embeds"][:2, 4:].eq(0).all()
    assert joined.condition["pooled"].shape == (4, 5)
