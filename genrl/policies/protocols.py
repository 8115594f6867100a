"""What the core calls on a policy, as typed protocols (one signature per method name).

The adapters of ``pipelines/`` implement them structurally (they never import ``genrl``): every
policy is a ``Policy`` (training setup, the reference, checkpoints, export); flow-matching
image generators are ``FlowPolicy``; epsilon / v-prediction diffusion models (Stable
Diffusion, SDXL) are ``DiffusionPolicy``; causal LMs are ``CausalTokenPolicy``; masked-diffusion
LMs are ``MaskedTokenPolicy`` and masked image-token generators ``MaskedImagePolicy`` (both
``UnmaskingPolicy``); video generators are flow policies whose ``decode`` returns videos,
and vision-language models are causal token policies whose prompts carry images (``model_inputs``). A rollout or objective
names the protocol it needs, and its algorithm's ``build`` checks the run's policy against it
(``require``), so a mismatch (an LM with ``flow_grpo``) fails with a sentence, not an
``AttributeError`` deep in sampling. The type checker (``mypy``, in ``.ci/run``) checks every
call against these signatures and, at the end of this file, that the shipped adapters conform.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from genrl.config.errors import ConfigError
from samplers.autoregressive import Generation, TokenSampler
from samplers.ddim import DDIMSchedule
from samplers.masked import MaskedGeneration, UnmaskingSampler

Condition = dict[str, torch.Tensor]


@runtime_checkable
class Policy(Protocol):
    """Every policy: the model the optimizer trains and everything around it.

    Attributes:
        network: the unwrapped model (peft-wrapped after LoRA setup).
        module: what the trainer hands to ``accelerator.prepare`` (possibly wrapped later).
    """

    network: nn.Module
    module: nn.Module

    @property
    def device(self) -> torch.device:
        """Where the network's parameters live."""
        ...

    def reference(self) -> AbstractContextManager[None]:
        """Inside, every forward uses the reference policy (adapter off, or a frozen copy)."""
        ...

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        """LoRA of ``rank`` (> 0) on ``target_modules`` (None: the adapter's default), or full
        fine-tuning (0)."""
        ...

    def keep_reference(self, offload: bool = False) -> None:
        """Make ``reference()`` usable: nothing under LoRA, a frozen copy of the current weights
        under full fine-tuning (on the CPU between uses with ``offload``)."""
        ...

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def trainable_state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...

    def export(self, directory: str | Path) -> Path:
        """Save the trained weights in the model ecosystem's format; returns the directory."""
        ...


@runtime_checkable
class FlowPolicy(Policy, Protocol):
    """A flow-matching generator: velocities on noised latents ``[B, *latent_shape]``."""

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """The event shape of one sample's latents."""
        ...

    def encode_prompts(self, prompts: list[str]) -> Condition:
        """Encode prompts once; every tensor is ``[B, ...]``."""
        ...

    def null_condition(self, condition: Condition) -> Condition:
        """The unconditional encoding matching ``condition``'s batch (CFG)."""
        ...

    def velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        condition: Condition,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """``[B, *event]`` velocity at noise levels ``sigma [B]``, with CFG when ``!= 1``."""
        ...

    def sigma_schedule(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """``[num_steps + 1]`` noise levels from 1 to 0 (``shift=None``: the model's own)."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents ``[B, *event]`` -> images ``[B, C, H, W]`` or videos
        ``[B, F, C, H, W]`` in ``[0, 1]``."""
        ...


@runtime_checkable
class DiffusionPolicy(Policy, Protocol):
    """A classic diffusion generator (epsilon, v or sample prediction at discrete timesteps:
    Stable Diffusion, SDXL), sampled with DDIM on its scheduler's timesteps."""

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """The event shape of one sample's latents."""
        ...

    def encode_prompts(self, prompts: list[str]) -> Condition:
        """Encode prompts once; every tensor is ``[B, ...]``."""
        ...

    def null_condition(self, condition: Condition) -> Condition:
        """The unconditional encoding matching ``condition``'s batch (CFG)."""
        ...

    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        condition: Condition,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """``[B, *event]`` model output (its ``ddim_schedule``'s ``prediction_type``) at
        timesteps ``[B]``, with CFG when ``!= 1``."""
        ...

    def ddim_schedule(self, num_steps: int) -> DDIMSchedule:
        """The timesteps and ``alphas_cumprod`` of the model's scheduler for ``num_steps``."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents ``[B, *event]`` -> images ``[B, C, H, W]`` in ``[0, 1]``."""
        ...


@runtime_checkable
class TokenPolicy(Policy, Protocol):
    """A language model over token ids; prompts left-padded to ``P``, then the completion."""

    tokenizer: Any
    eos_token_ids: list[int]

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded prompt ids and attention mask."""
        ...

    def model_inputs(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Per-sample inputs besides the token ids that the prompts bring (a VLM's pixels),
        batch-first, to pass back to ``generate`` and ``token_log_probs``; ``{}`` for text."""
        ...

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, T]`` float32 ``log p(targets | input_ids)`` for the last ``T`` columns."""
        ...

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Texts of ``tokens [B, T]`` where ``mask`` (special tokens dropped)."""
        ...


@runtime_checkable
class CausalTokenPolicy(TokenPolicy, Protocol):
    """An autoregressive LM (GRPO family)."""

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: TokenSampler,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> Generation:
        """Up to ``max_new_tokens`` tokens per prompt, with their sampling log-probs."""
        ...

    def cut_at_stop_strings(
        self, tokens: torch.Tensor, mask: torch.Tensor, stop_strings: list[str]
    ) -> torch.Tensor:
        """``mask`` without the tokens after the first completed stop string."""
        ...


@runtime_checkable
class UnmaskingPolicy(Policy, Protocol):
    """A masked-diffusion model (MaskGRPO, diffu-GRPO): a sample is a prompt of ``P`` ids and a
    completion of ``L`` tokens revealed from the mask token; a masked-diffusion LM or a masked
    image-token generator."""

    mask_token_id: int
    eos_token_ids: list[int]
    masks_prompts: bool
    """Whether a prompt token may be replaced by ``mask_token_id`` (d1's prompt masking): yes
    for a masked LM, no for a model whose prompt goes through a separate text encoder."""

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` prompt ids and attention mask."""
        ...

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, L]`` float32 ``log p(targets | input_ids)`` of the last ``L`` positions, the
        completion (partially masked) after the prompt."""
        ...

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: UnmaskingSampler,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        """Exactly ``max_new_tokens`` tokens per prompt, revealed by ``sampler``."""
        ...


@runtime_checkable
class MaskedTokenPolicy(TokenPolicy, UnmaskingPolicy, Protocol):
    """A masked-diffusion LM (MaskGRPO, diffu-GRPO): completions decode to text."""


@runtime_checkable
class MaskedImagePolicy(UnmaskingPolicy, Protocol):
    """A masked image-token generator (aMUSEd): completions are VQ codebook indices of an image
    grid, decoded to pictures."""

    num_image_tokens: int
    """``L``, the image tokens of one sample."""
    masking_schedule: str
    """The checkpoint's mask-rate schedule (``cosine`` or ``linear``)."""

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, L]`` -> images ``[B, 3, H, W]`` in ``[0, 1]``."""
        ...


@runtime_checkable
class EntropyTokenPolicy(TokenPolicy, Protocol):
    """A token policy that also reports the entropy of its distribution at each scored
    position (MSSR's advantage shaping, ``algorithm.advantage=mssr``)."""

    def token_log_probs_and_entropies(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``token_log_probs`` and ``[B, T]`` float32 entropies ``-sum_v p_v log p_v`` of
        ``softmax(logits / temperature)`` at the same positions, from one forward."""
        ...


@runtime_checkable
class EngineTokenPolicy(CausalTokenPolicy, Protocol):
    """A causal LM an inference engine can serve (``generation.engine=vllm``): the engine loads
    ``checkpoint`` and then follows the trainer through ``engine_weights``."""

    checkpoint: str
    """The directory (or hub id) the model was loaded from: config, weights and tokenizer."""

    @property
    def sharded(self) -> bool:
        """Whether the parameters are sharded over processes (FSDP2)."""
        ...

    def engine_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Every weight of the model the policy samples from, in the checkpoint's names (a LoRA
        adapter merged into its base weights)."""
        ...


P = TypeVar("P", bound=Policy)


def require(policy: Policy, protocol: type[P], algorithm: str) -> P:
    """``policy`` as a ``protocol`` policy, or a ``ConfigError`` saying which kind of policy
    ``algorithm`` trains."""
    if not isinstance(policy, protocol):
        kinds = {
            FlowPolicy: "a flow-matching generator (e.g. policy.name=toy_digits, sd3, flux)",
            DiffusionPolicy: "an epsilon / v-prediction diffusion model (policy.name=sd, sdxl)",
            CausalTokenPolicy: "a causal LM or VLM (e.g. policy.name=causal_lm, vlm)",
            MaskedTokenPolicy: "a masked-diffusion LM (e.g. policy.name=masked_lm, sudoku_dllm)",
            UnmaskingPolicy: (
                "a masked-diffusion LM or masked image-token model (e.g. policy.name="
                "masked_lm, sudoku_dllm, amused)"
            ),
        }
        raise ConfigError(
            f"algorithm {algorithm} trains {kinds.get(protocol, protocol.__name__)}, but the "
            f"policy is a {type(policy).__name__}"
        )
    return policy


if TYPE_CHECKING:  # the shipped adapters conform (checked by mypy, never run)
    from pipelines.base import TrainablePolicy
    from pipelines.diffusers.amused import AmusedPolicy
    from pipelines.diffusers.diffusion_unet import DiffusionUNetPolicy
    from pipelines.diffusers.flow_image import FlowImagePolicy
    from pipelines.diffusers.hunyuan_video15 import HunyuanVideo15Policy
    from pipelines.diffusers.ltx import LTXPolicy
    from pipelines.diffusers.wan import WanPolicy
    from pipelines.toy.policy import ToyDigitsPolicy
    from pipelines.transformers.causal_lm import CausalLMPolicy
    from pipelines.transformers.masked_lm import MaskedLMPolicy
    from pipelines.transformers.vlm import VLMPolicy

    def _conformance(
        base: TrainablePolicy,
        toy: ToyDigitsPolicy,
        image: FlowImagePolicy,
        video: WanPolicy,
        ltx: LTXPolicy,
        hunyuan: HunyuanVideo15Policy,
        causal: CausalLMPolicy,
        vlm: VLMPolicy,
        masked: MaskedLMPolicy,
        unet: DiffusionUNetPolicy,
        amused: AmusedPolicy,
    ) -> None:
        _policy: Policy = base
        _toy: FlowPolicy = toy
        _image: FlowPolicy = image
        _video: FlowPolicy = video
        _ltx: FlowPolicy = ltx
        _hunyuan: FlowPolicy = hunyuan
        _causal: CausalTokenPolicy = causal
        _engine: EngineTokenPolicy = causal
        _vlm: CausalTokenPolicy = vlm
        _entropy: EntropyTokenPolicy = causal
        _vlm_entropy: EntropyTokenPolicy = vlm
        _masked: MaskedTokenPolicy = masked
        _unet: DiffusionPolicy = unet
        _amused: MaskedImagePolicy = amused


__all__ = [
    "CausalTokenPolicy",
    "Condition",
    "DiffusionPolicy",
    "EngineTokenPolicy",
    "EntropyTokenPolicy",
    "FlowPolicy",
    "MaskedImagePolicy",
    "MaskedTokenPolicy",
    "Policy",
    "TokenPolicy",
    "UnmaskingPolicy",
    "require",
]
