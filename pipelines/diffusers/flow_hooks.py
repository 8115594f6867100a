"""What varies between diffusers flow families, as small pieces the adapter base composes.

``pipelines/diffusers/flow_image.py`` drives every family through one denoising loop; the differences
between the stock pipelines' loops are collected here, each with the pipeline source it follows:

* ``Guidance``: how the conditional and unconditional velocities combine (plain CFG, CFG
  rescaled to the conditional prediction's norm, CFG cut off at low noise levels);
* ``join_padded``: conditional and unconditional prompt embeddings of different lengths in one
  batched forward (zero padding, masked out);
* ``dynamic_shift``: the resolution-dependent schedule shift (``mu``) of FLUX-style pipelines;
* ``latent_statistics``: a VAE's latent normalisation, one scale and shift (SD3, FLUX, SANA,
  Lumina2, HunyuanVideo 1.5) or a mean and std per channel, from the VAE config (Wan,
  QwenImage) or its buffers, over a ``scaling_factor`` (LTX-Video);
* ``vae_compression``: a VAE's spatial and temporal compression, from the VAE itself;
* ``latent_frames``, ``pack_video_tokens`` / ``unpack_video_tokens``: the latent grid of a
  video and LTX's patch tokens over it;
* ``decode_noise``: the decode timestep and decode noise of timestep-conditioned VAEs (LTX);
* ``schedule_sigmas``: the ``sigmas`` (and ``mu``) a pipeline passes to ``set_timesteps``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
      ``r ||v_c||`` (``ZImagePipeline.__call__`` with ``cfg_normalization=r``);
    * ``rescale`` ``phi``: the CFG rescale of Lin et al. ("Common Diffusion Noise Schedules and
      Sample Steps Are Flawed", arXiv 2305.08891, Sec. 3.4, as diffusers' ``rescale_noise_cfg``
      cites it), ``v <- phi v std(v_c) / std(v) + (1 - phi) v`` with
      each sample's standard deviation over all its entries (Bessel-corrected, as torch's
      ``std``), applied to the plain combination first (the ``guidance_rescale`` of
      ``LTXPipeline.__call__`` and of diffusers' other pipelines, ``rescale_noise_cfg``).
    """

    normalize: bool = False
    cutoff_sigma: float = 0.0
    max_norm_ratio: float = 0.0
    rescale: float = 0.0

    def __post_init__(self) -> None:
        if not self.cutoff_sigma >= 0 or not self.max_norm_ratio >= 0:
            raise ValueError(
                f"cfg cutoff_sigma and max_norm_ratio must be >= 0, got {self.cutoff_sigma} and "
                f"{self.max_norm_ratio}"
            )
        if not 0 <= self.rescale <= 1:
            raise ValueError(f"guidance_rescale must be in [0, 1], got {self.rescale}")

    def active(self, sigma: torch.Tensor) -> bool:
        """Whether any row of ``sigma`` ``[B]`` needs the unconditional branch."""
        return self.cutoff_sigma <= 0 or bool((sigma >= self.cutoff_sigma).any())

    def combine(
        self,
        cond: torch.Tensor,
        uncond: torch.Tensor,
        sigma: torch.Tensor,
        scale: float | torch.Tensor,
    ) -> torch.Tensor:
        """Guided velocity ``[B, *event]`` from the two branches (float32); ``scale`` is one
        number or one per row ``[B]`` (Wan 2.2 A14B's second expert guides with its own)."""
        if isinstance(scale, torch.Tensor):
            scale = scale.to(cond).view(-1, *(1,) * (cond.ndim - 1))
        guided = uncond + scale * (cond - uncond)
        if self.rescale > 0:
            dims = list(range(1, cond.ndim))
            ratio = cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True)
            guided = self.rescale * (guided * ratio) + (1 - self.rescale) * guided
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
    vae: Any, per_channel: bool, ndim: int
) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """``(mean, std)`` with ``vae_latent = latent * std + mean`` for latents of ``ndim``
    dimensions ``[B, C, ...]`` of ``vae`` (a VAE module, or its config alone).

    Scalar: ``std = 1 / scaling_factor``, ``mean = shift_factor`` (0 when the VAE has none), as
    the SD3, FLUX, SANA, Lumina2 and HunyuanVideo 1.5 pipelines decode. Per channel:
    ``latents_mean`` and ``latents_std`` of the VAE config (Wan, QwenImage) or else the VAE's
    buffers of those names (LTX-Video), with ``std`` divided by the config's ``scaling_factor``
    where it has one: ``LTXPipeline._denormalize_latents`` is ``latent * std / scaling_factor +
    mean``, and the Wan and QwenImage VAEs have no ``scaling_factor``.
    """
    config = getattr(vae, "config", vae)
    if not per_channel:
        return config.get("shift_factor") or 0.0, 1.0 / config["scaling_factor"]
    shape = (1, -1, *(1,) * (ndim - 2))
    mean = _channel_values(vae, config, "latents_mean").view(shape)
    std = _channel_values(vae, config, "latents_std").view(shape)
    return mean, std / float(config.get("scaling_factor") or 1.0)


def _channel_values(vae: Any, config: Mapping[str, Any], key: str) -> torch.Tensor:
    values = config.get(key)
    if values is not None:
        return torch.tensor([float(v) for v in values])
    buffer = getattr(vae, key, None)
    if isinstance(buffer, torch.Tensor):
        return buffer.detach().float().flatten()
    raise ValueError(
        f"the VAE has no {key!r} in its config or buffers (per-channel latent normalisation)"
    )


def vae_compression(pipe: Any) -> tuple[int, int]:
    """``(spatial, temporal)`` compression of ``pipe.vae``: the VAE's own
    ``spatial_compression_ratio`` / ``temporal_compression_ratio`` (LTX, HunyuanVideo 1.5,
    Wan's spatial one) or its config's ``scale_factor_spatial`` / ``scale_factor_temporal``
    (Wan), else the pipeline's ``vae_scale_factor`` (image VAEs) and no temporal compression
    (1)."""
    vae = pipe.vae
    config = getattr(vae, "config", {})
    spatial = (
        getattr(vae, "spatial_compression_ratio", None)
        or config.get("scale_factor_spatial")
        or getattr(pipe, "vae_scale_factor", None)
    )
    if not spatial:
        raise ValueError(
            f"{type(pipe).__name__}: cannot tell the VAE's spatial compression (no "
            "spatial_compression_ratio, scale_factor_spatial or vae_scale_factor)"
        )
    temporal = getattr(vae, "temporal_compression_ratio", None) or config.get(
        "scale_factor_temporal"
    )
    return int(spatial), int(temporal or 1)


def latent_frames(num_frames: int, temporal: int, family: str = "this model") -> int:
    """Latent frames of a causal video VAE: the first frame alone, every later ``temporal``
    frames in one (``(num_frames - 1) / temporal + 1``, the Wan, LTX and HunyuanVideo
    pipelines' ``prepare_latents``); raises when ``num_frames - 1`` is no multiple."""
    if num_frames < 1 or (num_frames - 1) % temporal:
        below = max((num_frames - 1) // temporal, 0) * temporal + 1
        raise ValueError(
            f"num_frames - 1 must be a multiple of {temporal} for {family}'s VAE (e.g. "
            f"{below} or {below + temporal}), got {num_frames}"
        )
    return (num_frames - 1) // temporal + 1


def pack_video_tokens(latents: torch.Tensor, patch: int, patch_t: int) -> torch.Tensor:
    """``[B, C, F, H, W]`` -> patch tokens ``[B, F/pt * H/p * W/p, C * pt * p * p]`` in (frame,
    row, column) order, each token's features (channel, pt, p, p): ``LTXPipeline._pack_latents``."""
    b, c, f, h, w = latents.shape
    x = latents.reshape(b, c, f // patch_t, patch_t, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack_video_tokens(
    tokens: torch.Tensor, grid: tuple[int, int, int], patch: int, patch_t: int
) -> torch.Tensor:
    """The inverse of ``pack_video_tokens`` for a latent grid ``(F, H, W)``
    (``LTXPipeline._unpack_latents``)."""
    f, h, w = grid
    b = tokens.shape[0]
    x = tokens.reshape(b, f // patch_t, h // patch, w // patch, -1, patch_t, patch, patch)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(b, -1, f, h, w)


def decode_noise(
    latents: torch.Tensor, timestep: float, noise_scale: float | None, seed: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Inputs of a timestep-conditioned VAE decoder (LTX-Video 0.9.1+): the latents blended
    with noise, ``(1 - s) z + s n``, and ``temb = timestep`` per sample, with ``s =
    noise_scale`` (``timestep`` when None), as ``LTXPipeline.__call__`` decodes with
    ``decode_timestep`` and ``decode_noise_scale``. The noise comes from a CPU generator seeded
    with ``seed`` at every call, so a batch decodes alike each time, and equals the stock
    call's with ``generator=torch.Generator().manual_seed(seed)`` and given ``latents``."""
    scale = timestep if noise_scale is None else noise_scale
    n = latents.shape[0]
    temb = torch.full((n,), float(timestep), device=latents.device, dtype=latents.dtype)
    if scale == 0:
        return latents, {"temb": temb}
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(latents.shape, generator=generator, dtype=latents.dtype)
    mixed = (1 - scale) * latents + scale * noise.to(latents.device)
    return mixed, {"temb": temb}


SIGMA_GRIDS = ("scheduler", "flux", "linear")


def schedule_sigmas(
    grid: str, config: Mapping[str, Any], sequence_length: int, num_steps: int
) -> dict[str, Any]:
    """``set_timesteps`` arguments of a pipeline's sigma grid:

    * ``"scheduler"``: none (the scheduler's own ``set_timesteps(num_steps)``);
    * ``"flux"``: ``sigmas = linspace(1, 1/N, N)`` and ``mu`` from ``sequence_length``
      (``flux_style_schedule``; LTX-Video, whose length is the latent grid's ``F * H * W``);
    * ``"linear"``: ``sigmas = linspace(1, 0, N + 1)[:-1]``, shifted by the scheduler
      (``HunyuanVideo15Pipeline.__call__``).
    """
    import numpy as np

    if grid == "scheduler":
        return {}
    if grid == "flux":
        return flux_style_schedule(config, sequence_length, num_steps)
    if grid == "linear":
        return {"sigmas": np.linspace(1.0, 0.0, num_steps + 1)[:-1]}
    raise ValueError(f"unknown sigma_grid {grid!r}; one of {', '.join(SIGMA_GRIDS)}")


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


def pipeline_modules(pipe: Any) -> dict[str, torch.nn.Module]:
    """Every torch module among a diffusers pipeline's components (denoiser, VAE, encoders)."""
    return {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}


def place_frozen(pipe: Any, trained: str, device: torch.device) -> None:
    """Move every component but ``trained`` to ``device``: the trainer moves only the trained
    network, and the frozen encoders and VAE must follow it."""
    for name, module in pipeline_modules(pipe).items():
        if name != trained and module_device(module) != device:
            module.to(device)
