"""HunyuanVideo 1.5 text-to-video (``HunyuanVideo15Pipeline``) as a flow policy.

Latents ``[C, F', H', W']`` with ``F' = (num_frames - 1) / 4 + 1``, ``H' = height / 16`` (the
VAE's own compression ratios). The transformer takes ``C + C + 1`` input channels: the latents,
an image-conditioning latent and its mask, both zero for text-to-video, and zero image
embeddings (``HunyuanVideo15Pipeline.prepare_cond_latents_and_mask``), with ``timestep = 1000 *
sigma``.

Condition: the Qwen2.5-VL hidden states two layers below the top over the chat template (the
system prompt's 108 tokens cropped), padded to ``max_sequence_length`` (the pipeline's 1000)
with their mask, and ByT5 embeddings of quoted text in the prompt (zeros without any), 256
tokens with their mask. The unconditional branch encodes the empty prompt (the pipeline's
default negative); CFG is the pipeline guider's ``v_u + g (v_c - v_u)`` (``ClassifierFreeGuidance``
without ``guidance_rescale``; its ``guidance_scale`` is the sampler's here).

Schedule: ``sigmas = linspace(1, 0, N + 1)[:-1]`` shifted by the scheduler's ``shift``
(``sigma_grid = "linear"``). Decoding divides by the VAE's ``scaling_factor``.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_image import FlowImagePolicy


class HunyuanVideo15Policy(FlowImagePolicy):
    """HunyuanVideo 1.5 (480p / 720p text-to-video); see ``FlowImagePolicy`` for the arguments
    (``num_frames`` defaults to the pipeline's 121; without ``height`` / ``width`` the
    pipeline's 16:9 size for the transformer's ``target_size``)."""

    pipeline_class = "HunyuanVideo15Pipeline"
    sigma_grid = "linear"

    def _default_image_size(self) -> tuple[int, int]:
        # HunyuanVideo15Pipeline.__call__ without height and width: 16:9 at target_size.
        pipe = self.pipe
        width, height = pipe.default_aspect_ratio
        size = pipe.video_processor.calculate_default_height_width(height, width, pipe.target_size)
        return int(size[0]), int(size[1])

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        # diffusers 0.42.1's AutoencoderKLHunyuanVideo15 builds its mid-block attention's causal
        # mask [B, S, S] against queries [B, 1, S, C], which fails for B > 1 (the stock call
        # cannot decode two videos at once either): decode one video at a time.
        decode = super()._decode_latents
        return torch.cat([decode(video[None]) for video in latents])

    def _encode(self, prompts: list[str]) -> Condition:
        pipe = self.pipe
        embeds, mask = pipe._get_mllm_prompt_embeds(
            text_encoder=pipe.text_encoder,
            tokenizer=pipe.tokenizer,
            prompt=prompts,
            device=self.device,
            tokenizer_max_length=self.max_sequence_length,
            system_message=pipe.system_message,
            crop_start=pipe.prompt_template_encode_start_idx,
        )
        glyphs, glyph_mask = pipe._get_byt5_prompt_embeds(
            tokenizer=pipe.tokenizer_2,
            text_encoder=pipe.text_encoder_2,
            prompt=prompts,
            device=self.device,
            tokenizer_max_length=pipe.tokenizer_2_max_length,
        )
        # The pipeline's encode_prompt casts the masks to the embeddings' float dtype too.
        return {
            "prompt_embeds": embeds,
            "prompt_embeds_mask": mask.float(),
            "prompt_embeds_2": glyphs,
            "prompt_embeds_mask_2": glyph_mask.float(),
        }

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        n = latents.shape[0]
        image_latents = torch.zeros_like(latents)
        mask = latents.new_zeros(n, 1, *latents.shape[2:])
        config = self.pipe.transformer.config
        image_embeds = latents.new_zeros(
            n, self.pipe.vision_num_semantic_tokens, config.image_embed_dim
        )
        return {
            "hidden_states": torch.cat([latents, image_latents, mask], dim=1),
            "image_embeds": image_embeds,
            "timestep": time.to(latents.dtype),
            "encoder_hidden_states": condition["prompt_embeds"],
            "encoder_attention_mask": condition["prompt_embeds_mask"],
            "encoder_hidden_states_2": condition["prompt_embeds_2"],
            "encoder_attention_mask_2": condition["prompt_embeds_mask_2"],
        }
