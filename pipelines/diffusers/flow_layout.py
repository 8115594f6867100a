"""Where a diffusers flow family's latents live: the image (or video) size, the latent shape
and layout, and the VAE side of decoding, as a mixin of ``FlowImagePolicy``
(``pipelines/diffusers/flow_image.py``).

Everything here is read from the pipeline itself, so that a new family, image or video, needs
no override: the size from explicit ``height`` / ``width``, else the pipeline's native size,
else its call's defaults; a video pipeline is one whose ``__call__`` takes ``num_frames``; the
latent grid from the VAE's own spatial and temporal compression (``flow_hooks.vae_compression``);
channels from the VAE for videos; latent statistics from the VAE's config or buffers
(``flow_hooks.latent_statistics``); the decode timestep and noise of timestep-conditioned VAEs
(``flow_hooks.decode_noise``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch

from pipelines.diffusers.flow_hooks import (
    check_divisible,
    decode_noise,
    latent_frames,
    latent_statistics,
    schedule_sigmas,
    unpack_video_tokens,
    vae_compression,
)


class LatentLayout:
    """The latent-side hooks of ``FlowImagePolicy``; see there for the arguments they read
    (``height``, ``width``, ``num_frames``, ``decode_*``)."""

    pipe: Any
    pipeline_class: ClassVar[str] = ""
    height: int
    width: int
    num_frames: int | None
    decode_timestep: float
    decode_noise_scale: float | None
    decode_noise_seed: int

    per_channel_latents: ClassVar[bool] = False
    """The VAE normalises latents per channel (``latents_mean``/``latents_std`` in its config:
    Wan, QwenImage; or as its buffers, over its ``scaling_factor``: LTX-Video) rather than by
    ``scaling_factor``/``shift_factor`` alone."""
    latent_tokens: ClassVar[bool] = False
    """Video latents are kept as the transformer's patch tokens ``[F'/pt * H'/p * W'/p, C * pt
    * p * p]`` over the latent grid (``flow_hooks.pack_video_tokens``, the layout LTX's
    ``latents=`` takes) rather than ``[C, F', H', W']``; decoding unpacks them."""
    sigma_grid: ClassVar[str] = "scheduler"
    """The ``sigmas`` the pipeline passes to ``set_timesteps`` (``flow_hooks.schedule_sigmas``):
    ``"scheduler"`` none, ``"flux"`` ``linspace(1, 1/N, N)`` with ``mu`` from the latent grid's
    size (LTX-Video), ``"linear"`` ``linspace(1, 0, N + 1)[:-1]`` (HunyuanVideo 1.5)."""

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """One sample's latent shape for an image size, checking the size fits: by default
        ``[C, H/f, W/f]`` (images) or ``[C, F', H/f, W/f]`` (videos, ``latent_frames``) with
        ``f`` the VAE's spatial compression and sizes multiples of ``f * patch``; the
        transformer's patch tokens over that grid with ``latent_tokens``."""
        spatial, _ = vae_compression(self.pipe)
        patch_t, patch = self._patch_sizes()
        family = self.pipeline_class.removesuffix("Pipeline")
        check_divisible(height, width, spatial * patch, family)
        grid = self.latent_grid
        if self.num_frames is None:
            return (self.pipe.transformer.config.in_channels, *grid)
        if grid[0] % patch_t:
            raise ValueError(
                f"{family}'s transformer takes {patch_t} latent frames per patch; "
                f"num_frames={self.num_frames} gives {grid[0]}"
            )
        channels = self._latent_channels()
        if not self.latent_tokens:
            return (channels, *grid)
        tokens = grid[0] // patch_t * (grid[1] // patch) * (grid[2] // patch)
        return (tokens, channels * patch_t * patch * patch)

    def _latent_channels(self) -> int:
        """Channels of the VAE latent: the VAE's (``latent_channels``, Wan's ``z_dim``) for
        videos, whose transformers may take more input channels (HunyuanVideo 1.5 adds a
        conditioning latent and mask); the transformer's ``in_channels`` for images."""
        vae_config = self.pipe.vae.config
        if self.num_frames is not None:
            channels = vae_config.get("latent_channels") or vae_config.get("z_dim")
            if channels:
                return int(channels)
        return int(self.pipe.transformer.config.in_channels)

    def _patch_sizes(self) -> tuple[int, int]:
        """``(temporal, spatial)`` patch size of the transformer: ``patch_size`` an int with
        ``patch_size_t`` (LTX, HunyuanVideo 1.5) or a ``(t, h, w)`` tuple (Wan)."""
        config = self.pipe.transformer.config
        patch = config.get("patch_size") or 1
        if isinstance(patch, list | tuple):
            if len(patch) == 3:
                return int(patch[0]), int(patch[1])
            return 1, int(patch[0])
        return int(config.get("patch_size_t") or 1), int(patch)

    @property
    def latent_grid(self) -> tuple[int, ...]:
        """The VAE latent's ``(F', H', W')`` (videos) or ``(H', W')`` (images)."""
        spatial, temporal = vae_compression(self.pipe)
        size = (self.height // spatial, self.width // spatial)
        if self.num_frames is None:
            return size
        return (latent_frames(self.num_frames, temporal, self.pipeline_class), *size)

    def _to_vae_layout(self, latents: torch.Tensor) -> torch.Tensor:
        """Our latents -> the VAE's ``[B, C, ...]`` layout (unpacking tokens, e.g. FLUX, or
        LTX's video patch tokens with ``latent_tokens``)."""
        if self.latent_tokens and self.num_frames is not None:
            patch_t, patch = self._patch_sizes()
            grid = self.latent_grid
            return unpack_video_tokens(latents, (grid[0], grid[1], grid[2]), patch, patch_t)
        return latents

    def _from_vae(self, decoded: torch.Tensor) -> torch.Tensor:
        """The VAE's output -> images ``[B, 3, H, W]`` or videos ``[B, F, 3, H, W]`` (video VAEs
        return ``[B, 3, F, H, W]``)."""
        if self.num_frames is not None and decoded.ndim == 5:
            return decoded.permute(0, 2, 1, 3, 4)
        return decoded

    def _decode_inputs(self, latents: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """VAE-space latents -> ``vae.decode``'s latents and extra keywords: unchanged for most
        VAEs; for timestep-conditioned ones (``timestep_conditioning`` in the VAE config,
        LTX-Video 0.9.1+) blended with decode noise and with ``temb``
        (``flow_hooks.decode_noise``)."""
        if not self.pipe.vae.config.get("timestep_conditioning", False):
            return latents, {}
        return decode_noise(
            latents, self.decode_timestep, self.decode_noise_scale, self.decode_noise_seed
        )

    def _call_default(self, name: str, fallback: Any) -> Any:
        """Default of a ``pipe(...)`` argument, so that our rollouts match a plain call."""
        parameter = inspect.signature(type(self.pipe).__call__).parameters.get(name)
        return fallback if parameter is None else parameter.default

    def _image_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """The explicit size first; what is missing from ``_default_image_size``."""
        if height and width:
            return height, width
        default_height, default_width = self._default_image_size()
        return height or default_height, width or default_width

    def _default_image_size(self) -> tuple[int, int]:
        """The model's native size: SD3/FLUX pipelines name their native latent size, SANA's
        is the transformer's ``sample_size``; else the call's ``height`` / ``width`` defaults
        (Wan, LTX-Video)."""
        size = getattr(self.pipe, "default_sample_size", None)
        size = size or self.pipe.transformer.config.get("sample_size")
        if size:
            factor = getattr(self.pipe, "vae_scale_factor", None) or vae_compression(self.pipe)[0]
            return size * factor, size * factor
        height, width = self._call_default("height", None), self._call_default("width", None)
        if height and width:
            return height, width
        raise ValueError(
            f"{type(self).__name__}: {self.pipeline_class} names no default size; pass "
            "height and width"
        )

    def _num_frames(self, num_frames: int | None) -> int | None:
        """Frames per video (None for an image pipeline: its call takes no ``num_frames``)."""
        default = self._call_default("num_frames", None)
        if default is None:
            if num_frames is not None:
                raise ValueError(
                    f"num_frames is for video pipelines; {self.pipeline_class} makes images"
                )
            return None
        return num_frames or default

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents in the VAE layout -> the VAE's latent space (``latent * std +
        mean``, ``flow_hooks.latent_statistics``)."""
        mean, std = self._latent_statistics(latents)
        return latents * std + mean

    def normalize(self, latents: torch.Tensor) -> torch.Tensor:
        """The inverse of ``denormalize`` (VAE-encoded reference images)."""
        mean, std = self._latent_statistics(latents)
        return (latents - mean) / std

    def _latent_statistics(self, latents: torch.Tensor) -> tuple[Any, Any]:
        mean, std = latent_statistics(self.pipe.vae, self.per_channel_latents, latents.ndim)
        if isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor):
            return mean.to(latents), std.to(latents)
        return mean, std

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        """Extra ``set_timesteps`` arguments the pipeline passes (e.g. FLUX's ``mu``); by
        default those of ``sigma_grid``."""
        if self.sigma_grid == "scheduler":
            return {}
        size = 1
        for n in self.latent_grid:
            size *= n
        return schedule_sigmas(self.sigma_grid, self.pipe.scheduler.config, size, num_steps)
