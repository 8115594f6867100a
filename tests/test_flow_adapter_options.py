"""Adapter options of the diffusers flow policies that recipes set through ``policy.kwargs``:
the long text encoder's token count, peft's LoRA initialisation, and which CFG branch trains.
On the tiny pipelines of ``tests/diffusers_tiny.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_tiny import build_flux, build_sd3

from pipelines import build_policy

PROMPTS = ["a red cat", "a blue dog"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipelines")
    return {"sd3": build_sd3(root / "sd3"), "flux": build_flux(root / "flux")}


@pytest.mark.parametrize(
    ("family", "length", "expected"),
    [
        ("sd3", None, 77 + 256),  # StableDiffusion3Pipeline's default
        ("sd3", 128, 77 + 128),  # CLIP's 77 tokens, then T5's
        ("flux", None, 512),
        ("flux", 128, 128),
    ],
)
def test_encoded_prompt_length_follows_max_sequence_length(
    tiny: dict[str, Path], family: str, length: int | None, expected: int
) -> None:
    policy = build_policy(
        family, pretrained=str(tiny[family]), height=32, width=32, max_sequence_length=length
    )
    assert policy.encode_prompts(PROMPTS)["prompt_embeds"].shape[:2] == (2, expected)
    if family == "sd3":  # the CFG branch is encoded at the same length
        assert policy.null_condition({"x": torch.zeros(2)})["prompt_embeds"].shape[1] == expected


@pytest.mark.parametrize(("init", "gaussian"), [("gaussian", True), (True, False)])
def test_lora_init_option(tiny: dict[str, Path], init: bool | str, gaussian: bool) -> None:
    torch.manual_seed(0)
    policy = build_policy("sd3", pretrained=str(tiny["sd3"]), lora_init=init)
    policy.setup_training(4, 8, None)
    a = torch.cat(
        [p.detach().flatten() for n, p in policy.network.named_parameters() if "lora_A" in n]
    )
    b = [p for n, p in policy.network.named_parameters() if "lora_B" in n]
    assert all(torch.count_nonzero(p) == 0 for p in b)  # the adapter starts as the identity
    # peft's "gaussian" draws A ~ N(0, 1/r^2); its default is Kaiming-uniform (std ~0.1 here).
    assert (abs(float(a.std()) - 1 / 4) < 0.03) == gaussian


@pytest.mark.parametrize("detach", [True, False])
def test_detach_uncond_sets_which_cfg_branch_is_trained(
    tiny: dict[str, Path], detach: bool
) -> None:
    """Guided velocity ``u + g (c - u)``: its gradient is ``g dc`` with the unconditional
    branch detached, ``g dc + (1 - g) du`` without."""
    policy = build_policy("sd3", pretrained=str(tiny["sd3"]), detach_uncond=detach)
    policy.setup_training(0, 0, None)  # full fine-tune: every weight has a gradient
    params = policy.trainable_parameters()
    shape = (2, *policy.latent_shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.7)
    condition = policy.encode_prompts(PROMPTS)
    null = policy.null_condition(condition)
    weights = torch.randn(shape, generator=torch.Generator().manual_seed(1))

    def grads(velocity: torch.Tensor) -> list[torch.Tensor]:
        return torch.autograd.grad((velocity * weights).sum(), params, allow_unused=True)

    g = 4.5
    guided = grads(policy.velocity(x, sigma, condition, g))
    cond = grads(policy.velocity(x, sigma, condition))
    uncond = grads(policy.velocity(x, sigma, null))
    for got, dc, du in zip(guided, cond, uncond, strict=True):
        if dc is None:
            continue
        du = torch.zeros_like(dc) if du is None else du
        expected = g * dc if detach else g * dc + (1 - g) * du
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)
