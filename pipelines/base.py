"""Adapter contracts: what every trainable policy shares, and the flow-policy contract.

``TrainablePolicy`` holds what does not depend on the modality: the trainable parameters (LoRA
through peft, or all of them), the reference-policy context (adapter disabled, or a frozen copy
under full fine-tuning, made only when the run uses it), state dicts for checkpoints, and export. ``FlowPolicy`` adds what
flow-matching algorithms need: prompt encoding, velocity with optional classifier-free guidance,
the noise schedule and decoding to images. Token policies (``pipelines/transformers/causal_lm.py``) derive from
``TrainablePolicy`` too.
"""

from __future__ import annotations

import abc
import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

Condition = dict[str, torch.Tensor]


def cat_conditions(a: Condition, b: Condition) -> Condition:
    """Concatenate two prompt encodings along the batch dimension."""
    return {k: torch.cat([a[k], b[k]]) for k in a}


def disable_dropout(model: nn.Module) -> None:
    """Turn every dropout off (TRL's ``disable_dropout``): old log-probs are computed in eval
    mode and the loss in train mode, and dropout noise would make the first update
    off-policy. Covers ``nn.Dropout`` modules and the float ``*dropout*`` attributes that
    attention layers pass to their kernels."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


class TrainablePolicy:
    """Base of every adapter. Subclasses set ``self.network`` (the model, later peft-wrapped) and
    ``self.module`` (what the trainer hands to ``accelerator.prepare``; afterwards possibly a DDP
    wrapper, which is why the unwrapped model stays in ``self.network``)."""

    module: nn.Module
    network: nn.Module
    lora_init: bool | str = True
    """peft's ``init_lora_weights`` for ``setup_training``: True (peft's default, Kaiming-uniform
    ``A``) or e.g. ``"gaussian"`` (``A ~ N(0, 1/r^2)``, Flow-GRPO's and DiffusionNFT's choice);
    ``B`` starts at zero either way."""

    def __init__(self) -> None:
        self._frozen_reference: nn.Module | None = None
        self._reference_offload = False
        self._storage_dtypes: dict[str, torch.dtype] = {}
        self._use_reference = False

    @property
    def device(self) -> torch.device:
        """Where the network's parameters live (inputs are moved there)."""
        return next(self.network.parameters()).device

    def _active_module(self) -> nn.Module:
        if self._use_reference and self._frozen_reference is not None:
            return self._frozen_reference
        return self.network if self._use_reference else self.module

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Inside this context ``velocity`` uses the reference policy: the base model with the
        LoRA adapter disabled (no second copy), or under full fine-tuning the frozen copy that
        ``keep_reference`` made (moved to the network's device for the context, and back to the
        CPU afterwards when offloaded)."""
        if not self.is_lora and self._frozen_reference is None:
            raise RuntimeError(
                "policy.reference() under full fine-tuning needs a frozen copy of the initial "
                "weights, and none was kept: call policy.keep_reference() after setup_training "
                "(the trainer does when the rollout or objective says uses_reference)"
            )
        frozen = self._frozen_reference
        if frozen is not None:
            # The trainer moves only the trained network to the accelerator; follow it.
            frozen.to(self.device)
        self._use_reference = True
        try:
            if self.is_lora:
                with self.network.disable_adapter():  # type: ignore[operator]
                    yield
            else:
                yield
        finally:
            self._use_reference = False
            if frozen is not None and self._reference_offload:
                frozen.to("cpu")

    def keep_reference(self, offload: bool = False) -> None:
        """Make the reference policy available to ``reference()``: under LoRA nothing to do (the
        adapter is switched off); under full fine-tuning a frozen copy of the current weights,
        so call it after ``setup_training`` and before any update. ``offload`` keeps the copy
        on the CPU between uses. Algorithms that never use the reference skip this, and no
        copy exists (e.g. Flow-GRPO at ``kl_beta=0``)."""
        self._reference_offload = offload
        if self.is_lora or self._frozen_reference is not None:
            return
        frozen = copy.deepcopy(self.network).requires_grad_(False).eval()
        if offload:
            frozen.to("cpu")
        for name, param in frozen.named_parameters():
            stored = self._storage_dtypes.get(name, param.dtype)
            if param.dtype != stored:
                param.data = param.data.to(stored)
        self._frozen_reference = frozen

    @property
    def reference_bytes(self) -> dict[str, int]:
        """Bytes of reference-only parameters by device type (empty when there is no separate
        copy: LoRA, or a run that never uses the reference)."""
        held: dict[str, int] = {}
        if self._frozen_reference is not None:
            for param in self._frozen_reference.parameters():
                kind = param.device.type
                held[kind] = held.get(kind, 0) + param.numel() * param.element_size()
        return held

    @property
    def sharded(self) -> bool:
        """Whether the network is sharded over processes (FSDP2: its parameters are
        ``DTensor``s), so that every forward is a collective."""
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for p in self.network.parameters())

    @property
    def is_lora(self) -> bool:
        return hasattr(self.network, "disable_adapter") and hasattr(self.network, "peft_config")

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        """Make the network trainable: wrap it with a LoRA adapter (``rank > 0``) or unfreeze it
        all. A reference for full fine-tuning is a separate step (``keep_reference``), taken
        only by runs whose algorithm uses one."""
        if rank > 0:
            from peft import LoraConfig, get_peft_model

            targets = target_modules or self.default_lora_targets()
            lora = LoraConfig(
                r=rank,
                lora_alpha=alpha or 2 * rank,  # type: ignore[arg-type]  # peft says int; floats scale alike
                target_modules=targets,
                init_lora_weights=self.lora_init,  # type: ignore[arg-type]  # True or a peft init name
            )
            self.network.requires_grad_(False)
            self.network = get_peft_model(self.network, lora)
        else:
            # What each weight was stored as: adapters make trained weights float32 after this,
            # and the reference copy goes back to these (a bf16 model keeps a bf16 reference).
            self._storage_dtypes = {n: p.dtype for n, p in self.network.named_parameters()}
            self.network.requires_grad_(True)
        self.module = self.network

    def default_lora_targets(self) -> list[str]:
        return [n for n, m in self.network.named_modules() if isinstance(m, nn.Linear)]

    def trainable_in_float32(self) -> None:
        """Store the trainable weights in float32 whatever the base dtype, as the adapters do
        after ``setup_training``: updates of ~1e-4 relative size would round away in bf16."""
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.float()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.network.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainable weights, whole and on the CPU. Under FSDP2 every shard is gathered
        (a collective: every process calls this)."""
        from torch.distributed.tensor import DTensor

        out = {}
        for n, p in self.network.named_parameters():
            if p.requires_grad:
                value = p.detach()
                out[n] = (
                    (value.full_tensor() if isinstance(value, DTensor) else value).cpu().clone()
                )
        return out

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.network.named_parameters())
        missing = [n for n, p in params.items() if p.requires_grad and n not in state]
        unexpected = [n for n in state if n not in params]
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match the policy: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]} (was it saved with another LoRA/full setting?)"
            )
        with torch.no_grad():
            for n, value in state.items():
                params[n].copy_(value)

    def export(self, directory: str | Path) -> Path:
        """Save the trained weights for use outside genrl; returns the directory.

        The base class writes the trainable parameters as one safetensors file; real-model
        adapters save in their ecosystem's format (e.g. diffusers LoRA weights).
        """
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file(self.trainable_state_dict(), str(directory / "trainable.safetensors"))
        return directory


class FlowPolicy(TrainablePolicy, abc.ABC):
    """Flow-matching adapter: subclasses implement ``encode_prompts``, ``null_condition``,
    ``forward_model`` and ``decode`` and set ``latent_shape``."""

    latent_shape: tuple[int, ...]
    detach_uncond: bool = True
    """With CFG, stop gradients through the unconditional branch (only the conditional one is
    trained); False lets them flow through both, as Flow-GRPO's scripts do since its commit
    a482878 ("fix cfg gradient detach", 2025-08-19)."""

    # -- to implement ---------------------------------------------------------------------------
    @abc.abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Condition:
        """Encode prompts once; every tensor is ``[B, ...]``."""

    @abc.abstractmethod
    def null_condition(self, condition: Condition) -> Condition:
        """The unconditional encoding matching ``condition``'s batch, for CFG."""

    @abc.abstractmethod
    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        """Velocity ``[B, *event]`` of ``module`` at noise level ``sigma`` ``[B]``."""

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents ``[B, *event]`` -> images ``[B, C, H, W]`` or videos
        ``[B, F, C, H, W]`` in ``[0, 1]``."""

    # -- shared ---------------------------------------------------------------------------------
    def sigma_schedule(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """``[num_steps + 1]`` noise levels from 1 down to 0 for sampling.

        ``shift=None`` means the model's own schedule; the base class has a linear one (shift
        1). Adapters of real models override this to reproduce their pipeline's scheduler.
        """
        from samplers.schedules import flow_sigmas

        return flow_sigmas(num_steps, 1.0 if shift is None else shift)

    def join_conditions(self, condition: Condition, null: Condition) -> Condition:
        """The conditional and unconditional encodings as one ``[2B, ...]`` batch for CFG
        (adapters whose prompt embeddings vary in length pad them here)."""
        return cat_conditions(condition, null)

    def guidance_active(self, sigma: torch.Tensor) -> bool:
        """Whether CFG needs the unconditional branch at noise levels ``sigma`` ``[B]``."""
        del sigma
        return True

    def combine_guidance(
        self, cond: torch.Tensor, uncond: torch.Tensor, sigma: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """The guided velocity from the two branches: plain CFG ``v_u + g (v_c - v_u)``."""
        del sigma
        return uncond + scale * (cond - uncond)

    def velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        condition: Condition,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """Velocity with classifier-free guidance (``combine_guidance``; plain CFG
        ``v_u + g * (v_c - v_u)`` by default) when ``g != 1``.

        Conditional and unconditional branches go through one batched forward; with
        ``detach_uncond`` the unconditional branch is detached so that gradients flow only
        through the conditional one, otherwise through both (``(1 - g) dv_u + g dv_c``).
        """
        module = self._active_module()
        if guidance_scale == 1.0 or not self.guidance_active(sigma):
            return self.forward_model(module, latents, sigma, condition)
        both = self.forward_model(
            module,
            torch.cat([latents, latents]),
            torch.cat([sigma, sigma]),
            self.join_conditions(condition, self.null_condition(condition)),
        )
        # Guidance is combined in float32 so that a bf16 forward does not round the difference.
        cond, uncond = both.float().chunk(2)
        if self.detach_uncond:
            uncond = uncond.detach()
        return self.combine_guidance(cond, uncond, sigma, guidance_scale)
