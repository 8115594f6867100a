"""FLUX.2 (``Flux2Pipeline``: FLUX.2 [dev]; ``Flux2KleinPipeline``: FLUX.2 [klein]) as flow
policies.

What differs from FLUX.1, read from ``Flux2Pipeline.__call__`` and
``Flux2KleinPipeline.__call__`` (diffusers 0.42; Black Forest Labs' ``flux2`` repository,
``src/flux2/sampling.py``, which diffusers follows):

* the condition is several hidden states of the text encoder stacked along the channels
  (Mistral-Small-3.1 layers 10/20/30 for [dev], Qwen3 layers 9/18/27 for [klein];
  ``text_encoder_out_layers``), padded to ``max_sequence_length`` with no mask given to the
  transformer; [dev] prefixes a short system message (``pipe.system_message``);
* latents are the VAE latent cut into 2x2 patches (4 C channels), normalised per patchified
  channel by the VAE's BatchNorm running statistics (not by a config scale or
  ``latents_mean``/``latents_std``), then flattened row-major into tokens
  ``[(H/2f) * (W/2f), 4 C]``; positions are 4-axis ids ``(t, h, w, l)`` for image and text tokens;
* the schedule is ``linspace(1, 1/N, N)`` shifted by ``mu = compute_empirical_mu(tokens, N)``,
  an empirical fit of the resolution *and* the step count (not FLUX.1's linear ``mu``);
* the transformer takes ``timestep = sigma`` (``1000 s`` rounded to the latent dtype, / 1000);
* [dev] is guidance-distilled: ``guidance_scale`` (default 4) feeds a guidance embedding
  (``embedded_guidance`` here) and the pipeline has no true CFG; ``sampler.guidance_scale > 1``
  adds true CFG on top, as ``FluxPolicy`` does. [klein] base has no guidance embedding and does
  plain CFG against the empty prompt (``guidance_scale``; ignored by the step-distilled
  [klein] checkpoints, ``is_distilled``).

LoRA targets: the double-stream blocks' attention projections, as for FLUX.1, and the
single-stream blocks' fused QKV + MLP input projection ``to_qkv_mlp_proj`` (the targets
diffusers' own Flux2 LoRA tests use to reach every block).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_image import ATTENTION_PROJECTIONS, FlowImagePolicy, check_divisible


class Flux2Policy(FlowImagePolicy):
    """FLUX.2 [dev]. Arguments of ``FlowImagePolicy`` (``embedded_guidance`` defaults to the
    pipeline's ``guidance_scale`` 4.0; ``max_sequence_length`` to its 512) plus:

    Args:
        text_encoder_out_layers: hidden states of the text encoder stacked into the condition
            (None: the pipeline's default).
    """

    pipeline_class = "Flux2Pipeline"
    default_embedded_guidance: ClassVar[float | None] = 4.0
    time_input = "sigma"

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        text_encoder_out_layers: tuple[int, ...] | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(pretrained, **kwargs)
        default = self._call_default("text_encoder_out_layers", (10, 20, 30))
        self.text_encoder_out_layers = tuple(text_encoder_out_layers or default)
        self._ids: dict[tuple[str, int, str], torch.Tensor] = {}

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, _ = self.pipe.encode_prompt(
            [str(p) for p in prompts],
            device=self.device,
            max_sequence_length=self.max_sequence_length,
            text_encoder_out_layers=self.text_encoder_out_layers,
        )
        return {"prompt_embeds": embeds}

    def default_lora_targets(self) -> list[str]:
        return [*ATTENTION_PROJECTIONS, "to_qkv_mlp_proj"]

    # -- latent layout: 2x2 patches as channels, BatchNorm statistics, row-major tokens ------------
    def _grid(self) -> tuple[int, int]:
        factor = self.pipe.vae_scale_factor * 2
        return self.height // factor, self.width // factor

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor * 2
        check_divisible(height, width, factor, "FLUX.2 (VAE factor x 2x2 patches)")
        channels = self.pipe.transformer.config.in_channels  # 4x the VAE channels
        return ((height // factor) * (width // factor), channels)

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        return {"sigmas": sigmas, "mu": compute_empirical_mu(self.latent_shape[0], num_steps)}

    def _latent_statistics(self, latents: torch.Tensor) -> tuple[Any, Any]:
        """Per patchified channel: the VAE BatchNorm's running mean and ``sqrt(var + eps)``."""
        bn = self.pipe.vae.bn
        shape = (1, -1, *(1,) * (latents.ndim - 2))
        std = torch.sqrt(bn.running_var + self.pipe.vae.config.batch_norm_eps)
        return bn.running_mean.view(shape).to(latents), std.view(shape).to(latents)

    def _to_vae_layout(self, latents: torch.Tensor) -> torch.Tensor:
        """Tokens ``[B, h w, 4C]`` -> patchified latents ``[B, 4C, h, w]`` (still normalised)."""
        h, w = self._grid()
        return latents.transpose(1, 2).reshape(len(latents), -1, h, w)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        # Normalisation is per patchified channel, so it comes before un-patchifying.
        patched = self.denormalize(self._to_vae_layout(latents))
        return self.pipe.vae.decode(self.pipe._unpatchify_latents(patched), return_dict=False)[0]

    def from_vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE latents ``[B, C, H/f, W/f]`` -> our normalised tokens (the inverse of the decode
        path; what ``Flux2KleinPipeline(output_type="latent")`` returns maps back this way)."""
        patched = self.normalize(self.pipe._patchify_latents(latents.to(self.device)))
        return patched.flatten(2).transpose(1, 2)

    # -- the transformer call -----------------------------------------------------------------------
    def _position_ids(self, kind: str, length: int, device: torch.device) -> torch.Tensor:
        """``[length, 4]`` ``(t, h, w, l)`` ids as the pipeline builds them (cached): text tokens
        ``(0, 0, 0, i)``, image tokens ``(0, row, col, 0)`` in row-major order."""
        key = (kind, length, str(device))
        if key not in self._ids:
            if kind == "text":
                ids = self.pipe._prepare_text_ids(torch.zeros(1, length, 1))[0]
            else:
                h, w = self._grid()
                ids = self.pipe._prepare_latent_ids(torch.zeros(1, 1, h, w))[0]
            self._ids[key] = ids.to(device)
        return self._ids[key]

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        n, device = latents.shape[0], latents.device
        embeds = condition["prompt_embeds"]
        return {
            "hidden_states": latents,
            "timestep": time,
            "guidance": self.embedded_guidance_input(n),
            "encoder_hidden_states": embeds,
            "txt_ids": self._position_ids("text", embeds.shape[1], device).expand(n, -1, -1),
            "img_ids": self._position_ids("image", latents.shape[1], device).expand(n, -1, -1),
        }


class Flux2KleinPolicy(Flux2Policy):
    """FLUX.2 [klein] (Qwen3 text encoder, no guidance embedding). Its pipeline always guides
    against the empty prompt, which is also ``negative_prompt``'s default here."""

    pipeline_class = "Flux2KleinPipeline"
    default_embedded_guidance = None
