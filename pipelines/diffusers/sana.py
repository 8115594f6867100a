"""SANA (``SanaPipeline``) as a flow policy.

Condition: Gemma-2 token embeddings ``prompt_embeds [B, L, D]`` with their
``prompt_attention_mask [B, L]``, made by ``pipe.encode_prompt`` (including SANA's "complex human
instruction" prefix, which the pipeline uses by default). The transformer takes
``timestep = 1000 * sigma * timestep_scale``.

Released SANA checkpoints ship a flow DPM-Solver++ scheduler. Rollouts here use Euler steps
(the SDE samplers are Euler-Maruyama steps) on ``FlowMatchEulerDiscreteScheduler``'s grid with
``shift = flow_shift``; DPM-Solver's own sigma grid differs (at 10 steps it ends ``0.43, 0.25, 0``
against Euler's ``0.28, 0.009, 0``), so with a DPM scheduler ``pipe(...)`` is a different ODE
solver. With an Euler scheduler in the pipeline our ODE rollout reproduces ``pipe(...)``.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_image import FlowImagePolicy


class SanaPolicy(FlowImagePolicy):
    """SANA 0.6B/1.6B. Arguments of ``FlowImagePolicy`` plus:

    Args:
        complex_human_instruction: instruction lines prepended to each prompt before Gemma
            encodes it; "default" uses the pipeline's own default, None disables it.
    """

    pipeline_class = "SanaPipeline"

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        complex_human_instruction: list[str] | str | None = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(pretrained, **kwargs)
        if complex_human_instruction == "default":
            complex_human_instruction = self._call_default("complex_human_instruction", None)
        self.complex_human_instruction = complex_human_instruction

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            device=self.device,
            max_sequence_length=self.max_sequence_length,
            complex_human_instruction=self.complex_human_instruction,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def _encode_negative(self) -> Condition:
        _, _, embeds, mask = self.pipe.encode_prompt(
            prompt=[""],
            do_classifier_free_guidance=True,
            negative_prompt=self.negative_prompt,
            device=self.device,
            max_sequence_length=self.max_sequence_length,
            complex_human_instruction=self.complex_human_instruction,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def sigma_schedule(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        if shift is None and "flow_shift" in self.pipe.scheduler.config:
            # DPM-Solver config: Euler on its flow-shifted sigmas.
            shift = float(self.pipe.scheduler.config.flow_shift)
            from diffusers import FlowMatchEulerDiscreteScheduler

            scheduler: Any = FlowMatchEulerDiscreteScheduler(shift=shift)
            scheduler.set_timesteps(num_steps)
            return scheduler.sigmas.float().cpu()
        return super().sigma_schedule(num_steps, shift)

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        return {
            "hidden_states": latents,
            "encoder_hidden_states": condition["prompt_embeds"],
            "encoder_attention_mask": condition["prompt_attention_mask"],
            "timestep": time * self.pipe.transformer.config.timestep_scale,
        }

    def _model_output(self, output: torch.Tensor) -> torch.Tensor:
        config = self.pipe.transformer.config
        if config.out_channels // 2 == config.in_channels:  # learned sigma: keep the mean
            return output.chunk(2, dim=1)[0]
        return output
