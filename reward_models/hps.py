"""HPSv2 / HPSv2.1 (Wu et al. 2023, "Human Preference Score v2"): cosine similarity of image and
prompt under an open_clip ViT-H-14 fine-tuned on human preferences.

The checkpoint (``HPS_v2.1_compressed.pt`` or ``HPS_v2_compressed.pt`` of the ``xswu/HPSv2`` hub
repository, or a local file) is a ``{"state_dict": ...}`` for open_clip's ``ViT-H-14``, loaded
strictly into ``open_clip.create_model(arch, pretrained=None)``; the prompt goes through
open_clip's own tokenizer, whose BPE file ships with open_clip (the ``hpsv2`` wheel misses its
copy, so it is not used). The score is the cosine of the normalised embeddings, no scale, as
``hpsv2.score``. Images are preprocessed in torch with the model's own settings (bicubic resize
of the short side, centre crop, OpenAI CLIP normalisation): batched, on the device, and
differentiable.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput, local_or_hub_file
from reward_models.vision import ImagePreprocess

HUB_REPO = "xswu/HPSv2"
CHECKPOINTS = {"v2.1": "HPS_v2.1_compressed.pt", "v2.0": "HPS_v2_compressed.pt"}


class HPSReward(RewardModel):
    """``hps``: HPSv2.x cosine of each image with its prompt.

    Args:
        checkpoint: local checkpoint file; None downloads ``version``'s from ``xswu/HPSv2``.
        version: ``v2.1`` (default) or ``v2.0``.
        architecture: open_clip model name (``ViT-H-14``).
        model_config: a JSON model config to register with open_clip first (custom sizes).
        device: where to run.
        precision: open_clip precision (``fp32``, ``bf16``, ``fp16``).
    """

    name = "hps"
    accepts = ("images",)

    def __init__(
        self,
        checkpoint: str | None = None,
        version: str = "v2.1",
        architecture: str = "ViT-H-14",
        model_config: str | None = None,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
    ) -> None:
        self.checkpoint, self.version = checkpoint, version
        self.architecture, self.model_config = architecture, model_config
        self.device, self.precision = torch.device(device), precision
        self._loaded: tuple[Any, Any, ImagePreprocess] | None = None

    def _load(self) -> tuple[Any, Any, ImagePreprocess]:
        if self._loaded is None:
            import open_clip

            if self.model_config is not None:
                open_clip.add_model_config(self.model_config)
            if self.version not in CHECKPOINTS:
                raise ValueError(
                    f"hps: version must be one of {sorted(CHECKPOINTS)}, got {self.version!r}"
                )
            filename = CHECKPOINTS[self.version]
            path = local_or_hub_file(self.checkpoint, HUB_REPO, filename, "hps")
            model = open_clip.create_model(
                self.architecture, pretrained=None, precision=self.precision, device=self.device
            )
            state = torch.load(path, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state) if isinstance(state, dict) else state
            try:
                model.load_state_dict(state)
            except RuntimeError as err:
                raise ValueError(
                    f"hps: {path} does not fit open_clip {self.architecture!r}: "
                    f"{str(err).splitlines()[0]}"
                ) from err
            model = model.eval().requires_grad_(False)
            cfg = model.visual.preprocess_cfg
            size = cfg["size"] if isinstance(cfg["size"], int) else min(cfg["size"])
            crop = (size, size) if isinstance(cfg["size"], int) else tuple(cfg["size"])
            preprocess = ImagePreprocess(size, crop, tuple(cfg["mean"]), tuple(cfg["std"]))
            self._loaded = (model, open_clip.get_tokenizer(self.architecture), preprocess)
        return self._loaded

    def differentiable(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """``[B]`` HPS with gradients w.r.t. ``images`` (reward-gradient methods)."""
        model, tokenizer, preprocess = self._load()
        distinct = list(dict.fromkeys(prompts))  # groups repeat prompts: encode each once
        with torch.no_grad():
            text = model.encode_text(tokenizer(distinct).to(self.device), normalize=True).float()
        text = text[[distinct.index(p) for p in prompts]]
        pixels = preprocess(images, self.device).to(next(model.parameters()).dtype)
        image = model.encode_image(pixels, normalize=True).float()
        return (image * text).sum(dim=-1)

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        with torch.no_grad():
            return RewardOutput({self.name: self.differentiable(outputs, prompts).cpu()})


__all__ = ["HPSReward"]
