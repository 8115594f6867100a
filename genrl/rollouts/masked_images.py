"""Masked image-token rollouts (MaskGRPO on images): VQ token grids revealed by unmasking.

The unmasking rollout of ``masked.py`` for a ``MaskedImagePolicy`` (aMUSEd): the completion is
the ``L = generation.max_new_tokens`` tokens of an image grid, revealed in
``generation.diffusion_steps`` steps by aMUSEd's own scheduler (``generation.sampler=maskgit``,
the stock pipeline's samples) or by MaskGRPO's emerge sampler (``emerge``, the paper's rollout
for visual sequences); ``samplers/masked_image.py`` holds both. The rewards score the decoded
images ``[N, 3, H, W]`` in ``[0, 1]``, so every image reward works unchanged.
"""

from __future__ import annotations

from typing import cast

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import MaskedSamples
from genrl.policies.protocols import MaskedImagePolicy
from genrl.rollouts.masked import UnmaskingRolloutBase
from samplers.masked import UnmaskingSampler
from samplers.masked_image import EmergeSampler, MaskGITSampler, MaskingSchedule


class ImageUnmaskingRollout(UnmaskingRolloutBase[MaskedImagePolicy]):
    """Images of a masked image-token generator (``generation.sampler``: maskgit or emerge)."""

    samplers = ("maskgit", "emerge")
    kind = "masked image-token models"

    def check_policy(self, policy: MaskedImagePolicy) -> None:
        """A ``ConfigError`` now, before any sampling, when ``generation.max_new_tokens`` is not
        the policy's token grid."""
        if self.length != policy.num_image_tokens:
            raise ConfigError(
                f"generation.max_new_tokens must be {policy.num_image_tokens}, the image tokens "
                f"of the policy's images, got {self.length}"
            )

    def schedule(self, policy: MaskedImagePolicy) -> MaskingSchedule:
        """``generation.masking_schedule``, or the checkpoint's scheduler's."""
        g = self.train_config.generation
        return cast(MaskingSchedule, g.masking_schedule or policy.masking_schedule)

    def sampler(self, policy: MaskedImagePolicy, temperature: float) -> UnmaskingSampler:
        g = self.train_config.generation
        schedule = self.schedule(policy)
        if g.sampler == "maskgit":
            return MaskGITSampler(self.steps, temperature, g.final_temperature, schedule)
        return EmergeSampler(self.steps, temperature, schedule)

    def valid(self, policy: MaskedImagePolicy, tokens: torch.Tensor) -> torch.Tensor:
        del policy  # no end token: every image token is sampled
        return torch.ones_like(tokens, dtype=torch.bool)

    def completions(
        self, policy: MaskedImagePolicy, tokens: torch.Tensor, valid: torch.Tensor
    ) -> list[str]:
        """Empty texts: the sample is its tokens, decoded for the rewards by ``outputs``."""
        del policy, valid
        return [""] * tokens.shape[0]

    def decoded(
        self, policy: MaskedImagePolicy, tokens: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        del valid
        return policy.decode_images(tokens)

    def outputs(self, policy: MaskedImagePolicy, batch: MaskedSamples) -> torch.Tensor:
        return policy.decode_images(batch.tokens)

    def evaluation_sampling(self) -> str:
        g = self.train_config.generation
        if g.sampler == "maskgit":
            how = (
                f"aMUSEd's MaskGIT sampler, Gumbel temperature {g.eval_temperature:g} -> "
                f"{g.final_temperature:g}, seeded by position"
            )
        else:
            how = (
                f"MaskGRPO's emerge sampler, tokens drawn at temperature "
                f"{g.eval_temperature:g}, seeded by position"
            )
        return f"{how}: {self.length} image tokens in {self.steps} steps"


__all__ = ["ImageUnmaskingRollout"]
