"""Wan 2.1 / 2.2 text-to-video (``WanPipeline``) as a flow policy.

A video is one flow sample: latents ``[C, F', H', W']`` with ``F' = (num_frames - 1) / 4 + 1``
latent frames (the causal VAE keeps the first frame on its own and packs every later four into
one) and ``H' = height / 8``, ``W' = width / 8``. Samplers, rollouts and objectives treat it like
any other ``[B, *event]`` sample: log-probs are reduced over all of ``C x F' x H' x W'``.

Condition: UMT5 token embeddings ``prompt_embeds [B, L, D]`` made by ``pipe.encode_prompt``
(which cleans the text and zeroes the embeddings past each prompt's tokens, so the transformer
takes no attention mask). The transformer takes ``timestep = 1000 * sigma``, one per sample, or
one per latent token for checkpoints with ``expand_timesteps`` (Wan 2.2 TI2V-5B).

Decoding un-normalises with the VAE's per-channel ``latents_mean`` / ``latents_std`` and returns
videos ``[B, F, 3, H, W]`` in ``[0, 1]``. ``AutoencoderKLWan`` already decodes one latent frame at
a time with a causal feature cache, so its activations scale with four frames, not the clip;
rollouts decode ``train.rollout_batch_size`` videos at a time, and ``vae_tiling`` also tiles
each frame spatially.

Released Wan 2.1 checkpoints ship a UniPC multistep scheduler (``flow_shift`` 3 or 5); rollouts
take Euler steps (the SDE samplers are Euler-Maruyama steps) on that scheduler's own sigma grid,
as Flow-GRPO's Wan code does (it uses UniPC only for its sigmas), so ``pipe(...)`` with UniPC is
a higher-order solver on the same grid. With an Euler scheduler in the pipeline our ODE rollout
reproduces ``pipe(...)`` exactly. The transformer gets ``1000 * sigma`` as a float where UniPC
passes it rounded down to an integer.

Wan 2.2 A14B pairs two transformers (high-noise and low-noise experts, ``boundary_ratio``); it is
refused with a clear error for now (one trained network per policy).
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_image import FlowImagePolicy


class WanPolicy(FlowImagePolicy):
    """Wan 2.1 (1.3B, 14B) and Wan 2.2 TI2V-5B text-to-video. Arguments of ``FlowImagePolicy``
    (``height``/``width`` default to the pipeline's 480 x 832, ``num_frames`` to its 81;
    ``num_frames - 1`` must be a multiple of the VAE's temporal factor, 4; Flow-GRPO trains on
    fewer frames) plus:

    Args:
        vae_tiling: decode each frame in spatial tiles (``AutoencoderKLWan.enable_tiling``),
            for large resolutions on small GPUs.
    """

    pipeline_class = "WanPipeline"
    per_channel_latents = True

    def __init__(
        self, pretrained: str | None = None, *, vae_tiling: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(pretrained, **kwargs)
        if getattr(self.pipe, "transformer_2", None) is not None:
            raise ValueError(
                "this Wan checkpoint has two transformers (Wan 2.2 A14B's high- and low-noise "
                "experts); genrl trains one network per policy: use Wan 2.1 or Wan 2.2 TI2V-5B"
            )
        if vae_tiling:
            self.pipe.vae.enable_tiling()

    # -- family hooks ----------------------------------------------------------------------------
    def _encode(self, prompts: list[str]) -> Condition:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return {"prompt_embeds": embeds}

    def sigma_schedule(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """The pipeline scheduler's own sigmas (``shift=None``): UniPC's flow grid for the
        released checkpoints, which Flow-GRPO's Wan code steps on with its SDE; a linear
        schedule with a static ``shift`` otherwise."""
        if shift is not None:
            return super().sigma_schedule(num_steps, shift)
        scheduler: Any = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        scheduler.set_timesteps(num_steps)
        sigmas = scheduler.sigmas.float().cpu()
        # UniPC starts at 1 - 1e-6 to keep its log-SNR finite; our samplers treat s = 1 itself
        # specially (the model sees t = 1000 instead of 999.999).
        if 0 < 1 - float(sigmas[0]) < 1e-5:
            sigmas[0] = 1.0
        return sigmas

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        if self.pipe.config.get("expand_timesteps", False):
            # One time per latent token (TI2V-5B); text-to-video denoises every token alike.
            patch_f, patch_h, patch_w = self.pipe.transformer.config.patch_size
            _, frames, height, width = self.latent_shape
            tokens = (frames // patch_f) * (height // patch_h) * (width // patch_w)
            time = time[:, None].expand(-1, tokens)
        return {
            "hidden_states": latents,
            "timestep": time,
            "encoder_hidden_states": condition["prompt_embeds"],
        }
