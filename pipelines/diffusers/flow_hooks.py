"""What varies between diffusers flow families, as small pieces the adapter base composes.

``pipelines/diffusers/flow_image.py`` drives every family through one denoising loop; the differences
between the stock pipelines' loops are collected here, each with the pipeline source it follows:

* ``Guidance``: how the conditional and unconditional velocities combine (plain CFG, CFG
  rescaled to the conditional prediction's norm, CFG cut off at low noise levels);
* ``join_padded``: conditional and unconditional prompt embeddings of different lengths in one
  batched forward (zero padding, masked out);
* ``dynamic_shift``: the resolution-dependent schedule shift (``mu``) of FLUX-style pipelines;
* ``latent_statistics``: a VAE's latent normalisation, one scale and shift (SD3, FLUX, SANA,
  Lumina2) or a mean and std per channel (Wan, QwenImage).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Condition = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Guidance:
    """Classifier-free guidance rule: ``v = v_u + g (v_c - v_u)``, then optionally

    * ``normalize``: rescale ``v`` to the conditional prediction's norm over the last axis,
      ``v * ||v_c|| / ||v||`` (``QwenImagePipeline.__call__`` with ``true_cfg_scale > 1``;
      ``Lumina2Pipeline.__call__`` with ``cfg_normalization=True``; both take ``torch.norm`` over
      ``dim=-1`` of the transformer's output layout: the packed token's channels for QwenImage,
      the latent width for Lumina2);
    * ``cutoff_sigma``: at noise levels ``sigma < cutoff_sigma`` use ``v_c`` alone (Lumina2's
      ``cfg_trunc_ratio``, a fraction of the steps; ``cutoff_for_step_fraction`` converts it;
      Z-Image's ``cfg_truncation`` ``c`` is ``cutoff_sigma = 1 - c``);
    * ``max_norm_ratio``: when ``||v|| > r ||v_c||`` over a whole sample, scale ``v`` down to
      ``r ||v_c||`` (``ZImagePipeline.__call__`` with ``cfg_normalization=r``).
    """

    normalize: bool = False
    cutoff_sigma: float = 0.0
    max_norm_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not self.cutoff_sigma >= 0 or not self.max_norm_ratio >= 0:
            raise ValueError(
                f"cfg cutoff_sigma and max_norm_ratio must be >= 0, got {self.cutoff_sigma} and "
                f"{self.max_norm_ratio}"
            )

    def active(self, sigma: torch.Tensor) -> bool:
        """Whether any row of ``sigma`` ``[B]`` needs the unconditional branch."""
        return self.cutoff_sigma <= 0 or bool((sigma >= self.cutoff_sigma).any())

    def combine(
        self, cond: torch.Tensor, uncond: torch.Tensor, sigma: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Guided velocity ``[B, *event]`` from the two branches (float32)."""
        guided = uncond + scale * (cond - uncond)
        if self.normalize:
            guided = guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
        if self.max_norm_ratio > 0:
            limit = self.max_norm_ratio * cond.flatten(1).norm(dim=1)
            norm = guided.flatten(1).norm(dim=1)
            factor = torch.where(norm > limit, limit / norm, torch.ones_like(norm))
            guided = guided * factor.view(-1, *(1,) * (cond.ndim - 1))
        if self.cutoff_sigma > 0:
            keep = (sigma >= self.cutoff_sigma).view(-1, *(1,) * (cond.ndim - 1))
            guided = torch.where(keep.to(cond.device), guided, cond)
        return guided


def cutoff_for_step_fraction(sigmas: torch.Tensor, ratio: float) -> float:
    """The ``Guidance.cutoff_sigma`` that reproduces ``Lumina2Pipeline``'s ``cfg_trunc_ratio``
    on a schedule ``sigmas`` ``[N + 1]``: the pipeline guides step ``i`` unless
    ``(i + 1) / N > ratio``, i.e. the steps before the first such ``i``."""
    steps = len(sigmas) - 1
    guided = [i for i in range(steps) if not (i + 1) / steps > ratio]
    if not guided:
        return math.inf
    if len(guided) == steps:
        return 0.0
    return float(sigmas[guided[-1]])


def join_padded(a: Condition, b: Condition, masks: Mapping[str, str]) -> Condition:
    """``a`` and ``b`` concatenated along the batch; each embedding named in ``masks``
    (``{embedding key: mask key}``) and its mask are zero-padded along the sequence axis to the
    longer of the two first, so that padding is masked out."""
    joined = {}
    for key in a:
        x, y = a[key], b[key]
        if x.shape[1:] != y.shape[1:]:
            sequence = key in masks or key in masks.values()
            if not sequence or x.shape[2:] != y.shape[2:]:
                raise ValueError(
                    f"condition {key!r} has shapes {tuple(x.shape)} and {tuple(y.shape)}; only "
                    f"masked sequences ({sorted(masks)}) may differ in length"
                )
            width = max(x.shape[1], y.shape[1])
            x, y = _pad_sequence(x, width), _pad_sequence(y, width)
        joined[key] = torch.cat([x, y])
    return joined


def _pad_sequence(tensor: torch.Tensor, width: int) -> torch.Tensor:
    if tensor.shape[1] == width:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:])
    return torch.cat([tensor, pad], dim=1)


def dynamic_shift(config: Mapping[str, Any], image_seq_len: int) -> float:
    """``mu`` of the resolution-dependent shift: linear in the image token count between
    ``(base_image_seq_len, base_shift)`` and ``(max_image_seq_len, max_shift)``
    (``calculate_shift`` in diffusers' FLUX, SD3, QwenImage and Lumina2 pipelines; the
    defaults are theirs)."""
    base_len = config.get("base_image_seq_len", 256)
    max_len = config.get("max_image_seq_len", 4096)
    base, top = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
    slope = (top - base) / (max_len - base_len)
    return image_seq_len * slope + base - slope * base_len


def flux_style_schedule(
    config: Mapping[str, Any], image_seq_len: int, num_steps: int
) -> dict[str, Any]:
    """``set_timesteps`` arguments of FluxPipeline, QwenImagePipeline and Lumina2Pipeline:
    ``sigmas = linspace(1, 1/N, N)`` and ``mu`` from the image token count."""
    import numpy as np

    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    return {"sigmas": sigmas, "mu": dynamic_shift(config, image_seq_len)}


def latent_statistics(
    vae_config: Mapping[str, Any], per_channel: bool, ndim: int
) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """``(mean, std)`` with ``vae_latent = latent * std + mean`` for VAE latents of ``ndim``
    dimensions ``[B, C, ...]``.

    Scalar: ``std = 1 / scaling_factor``, ``mean = shift_factor`` (0 when the VAE has none), as
    the SD3, FLUX, SANA and Lumina2 pipelines decode. Per channel: ``latents_mean`` and
    ``latents_std`` of the VAE config, as the Wan and QwenImage pipelines decode.
    """
    if not per_channel:
        return vae_config.get("shift_factor") or 0.0, 1.0 / vae_config["scaling_factor"]
    shape = (1, -1, *(1,) * (ndim - 2))
    mean = torch.tensor(_floats(vae_config, "latents_mean")).view(shape)
    std = torch.tensor(_floats(vae_config, "latents_std")).view(shape)
    return mean, std


def _floats(config: Mapping[str, Any], key: str) -> Sequence[float]:
    values = config.get(key)
    if values is None:
        raise ValueError(f"the VAE config has no {key!r} (per-channel latent normalisation)")
    return [float(v) for v in values]


def check_divisible(height: int, width: int, multiple: int, family: str = "this model") -> None:
    """Raise a clear error when the image size does not fit the latent grid."""
    if height % multiple or width % multiple:
        raise ValueError(
            f"height and width must be multiples of {multiple} for {family}, got {height}x{width}"
        )


def module_device(module: torch.nn.Module) -> torch.device:
    for parameter in module.parameters():
        return parameter.device
    return torch.device("cpu")
