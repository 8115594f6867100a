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

Wan 2.2 A14B pairs two transformers, a high-noise expert (``transformer``) for timesteps ``t >=
boundary_ratio * 1000`` and a low-noise one (``transformer_2``) below (``WanPipeline.__call__``).
The policy's network is then ``WanExperts``, both experts in one module that sends each row of a
batch to the expert of its own timestep, so rollouts switch at the boundary as the pipeline does
and every trained step goes through the expert that sampled it. ``train_experts`` puts the LoRA
(or, without LoRA, training) on both experts or one; the other stays frozen. Both experts take
the sampler's CFG scale unless ``guidance_scale_2`` gives the low-noise expert's (the
pipeline's ``guidance_scale_2``; None there too means the same scale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipelines.base import Condition
from pipelines.diffusers.flow_image import FlowImagePolicy

EXPERTS = {"high_noise": "high", "low_noise": "low"}


class WanExperts(nn.Module):
    """Wan 2.2 A14B's two experts as one module: rows whose ``timestep >= boundary`` (1000
    times ``boundary_ratio``) go to ``high`` (the pipeline's ``transformer``), the others to
    ``low`` (``transformer_2``), each with its rows of every batched argument."""

    def __init__(self, high: nn.Module, low: nn.Module, boundary: float) -> None:
        super().__init__()
        self.high, self.low, self.boundary = high, low, boundary

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, **kwargs: Any) -> Any:
        kwargs.pop("return_dict", None)
        n = hidden_states.shape[0]
        time = timestep if timestep.ndim == 1 else timestep[:, 0]
        high = time >= self.boundary
        if bool(high.all()) or not bool(high.any()):
            expert = self.high if bool(high.all()) else self.low
            out = expert(
                hidden_states=hidden_states, timestep=timestep, return_dict=False, **kwargs
            )
            return (self._keep_in_graph(out[0]),)
        rows = [high.nonzero().flatten(), (~high).nonzero().flatten()]
        outputs = []
        for expert, index in zip((self.high, self.low), rows, strict=True):
            picked = {
                k: v[index] if isinstance(v, torch.Tensor) and v.shape[:1] == (n,) else v
                for k, v in kwargs.items()
            }
            outputs.append(
                expert(
                    hidden_states=hidden_states[index],
                    timestep=timestep[index],
                    return_dict=False,
                    **picked,
                )[0]
            )
        order = torch.cat(rows).argsort()
        return (self._keep_in_graph(torch.cat(outputs)[order]),)

    def _keep_in_graph(self, out: torch.Tensor) -> torch.Tensor:
        """With one expert trained (``train_experts``), a minibatch of the frozen expert's steps
        alone would give a loss without a graph: tie it to a trained weight with weight 0, so
        those steps contribute their true gradient, zero."""
        if out.requires_grad or not torch.is_grad_enabled():
            return out
        for parameter in self.parameters():
            if parameter.requires_grad:
                return out + 0.0 * parameter.flatten()[0]
        return out


class WanPolicy(FlowImagePolicy):
    """Wan 2.1 (1.3B, 14B), Wan 2.2 TI2V-5B and Wan 2.2 A14B (two experts) text-to-video.
    Arguments of ``FlowImagePolicy`` (``height``/``width`` default to the pipeline's 480 x 832,
    ``num_frames`` to its 81; ``num_frames - 1`` must be a multiple of the VAE's temporal
    factor, 4; Flow-GRPO trains on fewer frames) plus:

    Args:
        vae_tiling: decode each frame in spatial tiles (``AutoencoderKLWan.enable_tiling``),
            for large resolutions on small GPUs.
        train_experts: for a checkpoint with two experts (Wan 2.2 A14B), which ones training
            changes: ``"both"`` (default), ``"high_noise"`` (``transformer``, timesteps at or
            above the boundary) or ``"low_noise"`` (``transformer_2``); the LoRA sits on those
            alone. The frozen expert's steps then carry zero gradient (they are still
            computed): keep the SDE steps in the trained expert's noise range with
            ``sampler.sde_window_range`` to spend no compute on them. An error for
            one-transformer checkpoints unless ``"both"``.
        guidance_scale_2: the CFG scale of the steps below the boundary (the low-noise
            expert's), as ``WanPipeline``'s ``guidance_scale_2``; None: the sampler's scale at
            every step. CFG runs only when the sampler's scale is not 1, as in the pipeline.
            Two-expert checkpoints only.
    """

    pipeline_class = "WanPipeline"
    per_channel_latents = True

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        vae_tiling: bool = False,
        train_experts: str = "both",
        guidance_scale_2: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(pretrained, **kwargs)
        self.guidance_scale_2 = guidance_scale_2
        if train_experts not in ("both", *EXPERTS):
            raise ValueError(
                f"train_experts must be 'both', 'high_noise' or 'low_noise', got {train_experts!r}"
            )
        self.train_experts = train_experts
        low = getattr(self.pipe, "transformer_2", None)
        self.experts = low is not None
        """Whether the checkpoint pairs two experts (Wan 2.2 A14B)."""
        if low is not None:
            ratio = self.pipe.config.get("boundary_ratio")
            if ratio is None:
                raise ValueError(
                    "this Wan checkpoint has a transformer_2 but no boundary_ratio in its "
                    "model_index.json: which expert denoises which timesteps is undefined"
                )
            if self.pipe.transformer.is_gradient_checkpointing:
                low.enable_gradient_checkpointing()
            self.boundary = ratio * self.pipe.scheduler.config.num_train_timesteps
            self.network = self.module = WanExperts(self.pipe.transformer, low, self.boundary)
        elif guidance_scale_2 is not None:
            raise ValueError(
                "guidance_scale_2 needs a two-expert checkpoint (Wan 2.2 A14B); this one has one "
                "transformer"
            )
        elif train_experts != "both":
            raise ValueError(
                f"train_experts={train_experts!r} needs a two-expert checkpoint (Wan 2.2 A14B); "
                "this one has one transformer"
            )
        if vae_tiling:
            self.pipe.vae.enable_tiling()

    def combine_guidance(
        self, cond: torch.Tensor, uncond: torch.Tensor, sigma: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """The sampler's ``scale`` on the high-noise expert's rows, ``guidance_scale_2`` on the
        low-noise expert's (rows split by the expert switch's own rule)."""
        if self.guidance_scale_2 is None:
            return super().combine_guidance(cond, uncond, sigma, scale)
        # The boundary is kept on the policy: under LoRA ``self.network`` is peft's wrapper.
        high = self.model_time(sigma) >= self.boundary
        scales = torch.where(high, float(scale), float(self.guidance_scale_2))
        return self.guidance.combine(cond, uncond, sigma, scales)

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        """With two experts and ``train_experts`` naming one, the LoRA targets are that
        expert's modules (full names), and under full fine-tuning the other expert stays
        frozen."""
        self._lora_suffixes = target_modules or self.default_lora_targets()
        prefix = EXPERTS.get(self.train_experts)
        if prefix is not None and rank > 0:
            suffixes = self._lora_suffixes
            target_modules = [
                name
                for name, _ in self.network.named_modules()
                if name.startswith(prefix + ".")
                and any(name == s or name.endswith("." + s) for s in suffixes)
            ]
        super().setup_training(rank, alpha, target_modules)
        if prefix is not None and rank == 0:
            other = "low" if prefix == "high" else "high"
            getattr(self.network, other).requires_grad_(False)

    def export(self, directory: str | Path) -> Path:
        """Two experts: the high-noise expert's LoRA in ``directory`` and the low-noise one's in
        ``directory/transformer_2`` (``pipe.load_lora_weights(directory)`` and
        ``pipe.load_lora_weights(directory / "transformer_2", load_into_transformer_2=True)``;
        an expert that was not trained has no file); full fine-tuning saves
        ``directory/transformer`` and ``directory/transformer_2``."""
        if not self.experts:
            return super().export(directory)
        from pipelines.diffusers.flow_export import lora_state, write_lora

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        trained = ["high", "low"] if self.train_experts == "both" else [EXPERTS[self.train_experts]]
        places = {
            "high": ("transformer", directory),
            "low": ("transformer_2", directory / "transformer_2"),
        }
        if not self.is_lora:
            for expert in trained:
                name, _ = places[expert]
                getattr(self.pipe, name).save_pretrained(directory / name)
            return directory
        state = lora_state(self)
        for expert in trained:
            prefix = expert + "."
            part = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
            write_lora(self, places[expert][1], part, targets=self._lora_suffixes)
        return directory

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
