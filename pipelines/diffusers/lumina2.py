"""Lumina-Image 2.0 (``Lumina2Pipeline``) as a flow policy.

What differs from SD3, read from ``Lumina2Pipeline.__call__`` (diffusers 0.42):

* time runs the other way: the transformer takes ``1 - t / 1000`` (0 at pure noise) and
  predicts ``x0 - eps``, minus our velocity (``time_input = "reversed"``,
  ``prediction_sign = -1``);
* CFG is rescaled to the conditional prediction's norm (``cfg_normalization=True`` by default)
  and may stop after a fraction of the steps (``cfg_trunc_ratio``, 1 by default: never). Our
  rollouts see noise levels, not step indices: ``cfg_cutoff_sigma`` is the noise level below
  which CFG stops, and ``flow_hooks.cutoff_for_step_fraction(sigmas, ratio)`` gives the one
  that reproduces a ``cfg_trunc_ratio`` on a schedule;
* prompts are prefixed with a system prompt and ``" <Prompt Start> "``; the negative prompt is
  not. Gemma's penultimate hidden state, padded to ``max_sequence_length`` (256) with a mask.

Latents ``[C, H/8, W/8]``, un-scaled by the VAE's ``scaling_factor``/``shift_factor``.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_hooks import Guidance, flux_style_schedule
from pipelines.diffusers.flow_image import FlowImagePolicy


class Lumina2Policy(FlowImagePolicy):
    """Lumina-Image 2.0. Arguments of ``FlowImagePolicy`` plus:

    Args:
        system_prompt: prefix of every prompt; None uses the pipeline's own.
    """

    pipeline_class = "Lumina2Pipeline"
    default_guidance = Guidance(normalize=True)
    time_input = "reversed"
    prediction_sign = -1.0

    def __init__(
        self, pretrained: str | None = None, *, system_prompt: str | None = None, **kwargs: Any
    ) -> None:
        self.system_prompt = system_prompt
        super().__init__(pretrained, **kwargs)

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            prompts,
            do_classifier_free_guidance=False,
            device=self.device,
            system_prompt=self.system_prompt,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def _encode_negative(self) -> Condition:
        _, _, embeds, mask = self.pipe.encode_prompt(
            [""],
            do_classifier_free_guidance=True,
            negative_prompt=self.negative_prompt,
            device=self.device,
            system_prompt=self.system_prompt,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        # The pipeline's "image_seq_len" is latents.shape[1] of [B, C, H, W] latents: the
        # channel count (it only matters for schedulers with use_dynamic_shifting).
        channels = self.latent_shape[0]
        return flux_style_schedule(self.pipe.scheduler.config, channels, num_steps)

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        return {
            "hidden_states": latents,
            "timestep": time,
            "encoder_hidden_states": condition["prompt_embeds"],
            "encoder_attention_mask": condition["prompt_attention_mask"],
        }
