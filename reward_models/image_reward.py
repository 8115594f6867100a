"""ImageReward (Xu et al. 2023, "ImageReward: Learning and Evaluating Human Preferences for
Text-to-Image Generation") on transformers' BLIP components, without the ``image-reward`` package.

The package (1.5, 2023) does not import on transformers 5 and pins ``timm==0.6.13``, which
conflicts with open_clip. Its model is small to rebuild: a BLIP ViT-L/16 image encoder at 224 px,
a BERT text encoder that cross-attends to the image tokens, and an MLP on the text [CLS] state,

    reward = (mlp(text_encoder(prompt | image)[CLS]) - 0.16717362830052426) / 1.0333394966054072,

with the prompt tokenised by ``bert-base-uncased`` (plus BLIP's ``[DEC]`` and ``[ENC]`` tokens)
to 35 tokens, and images resized (bicubic) and centre-cropped to 224 px with CLIP's
normalisation. The official ``ImageReward.pt`` loads into transformers' ``BlipVisionModel`` and
``BlipTextModel`` after renaming the ViT's timm-style keys; the text encoder's keys already match.
Unlike the package, which scores one image per forward, this scores a batch at once, and
``differentiable`` keeps gradients (ReFL-style reward-gradient methods).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import torch

from loading.hub import require_local_or_reachable
from reward_models.aesthetic import AestheticMLP
from reward_models.base import RewardModel, RewardOutput, local_hint, local_or_hub_file
from reward_models.vision import ImagePreprocess

HUB_REPO = "THUDM/ImageReward"
MEAN, STD = 0.16717362830052426, 1.0333394966054072
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_PROMPT_TOKENS = 35

# timm-style ViT keys of BLIP's visual encoder -> transformers' BlipVisionModel keys.
_VISION_KEYS = [
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.fc(\d)\.", r"encoder.layers.\1.mlp.fc\2."),
    (r"^norm\.", "post_layernorm."),
]


def split_checkpoint(state: dict[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    """``ImageReward.pt`` -> (vision, text, mlp) state dicts in transformers' / our naming."""
    vision, text, mlp = {}, {}, {}
    for key, value in state.items():
        if key.startswith("blip.visual_encoder."):
            name = key.removeprefix("blip.visual_encoder.")
            for pattern, replacement in _VISION_KEYS:
                if re.match(pattern, name):
                    vision[re.sub(pattern, replacement, name)] = value
                    break
            else:
                raise ValueError(f"ImageReward checkpoint: unexpected vision key {key!r}")
        elif key.startswith("blip.text_encoder."):
            text[key.removeprefix("blip.text_encoder.")] = value
        elif key.startswith("mlp."):
            mlp[key.removeprefix("mlp.")] = value
        # blip.vision_proj / text_proj (BLIP pre-training heads) are not used for the reward.
    return vision, text, mlp


def vision_config_from(vision: dict[str, torch.Tensor], num_heads: int, eps: float) -> Any:
    """The ViT's sizes from its weights (heads are not recoverable from shapes)."""
    from transformers import BlipVisionConfig

    width = vision["embeddings.class_embedding"].shape[-1]
    patch = vision["embeddings.patch_embedding.weight"].shape[-1]
    positions = vision["embeddings.position_embedding"].shape[1] - 1
    depth = 1 + max(int(k.split(".")[2]) for k in vision if k.startswith("encoder.layers."))
    return BlipVisionConfig(
        hidden_size=width,
        intermediate_size=vision["encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=depth,
        num_attention_heads=num_heads,
        image_size=math.isqrt(positions) * patch,
        patch_size=patch,
        layer_norm_eps=eps,  # timm's ViT in BLIP: 1e-6
        hidden_act="gelu",
    )


def text_config_from(med_config: dict[str, Any], vocab_size: int, encoder_width: int) -> Any:
    """``med_config.json`` (BERT with cross-attention) as a ``BlipTextConfig``."""
    from transformers import BlipTextConfig

    return BlipTextConfig(
        vocab_size=vocab_size,
        hidden_size=med_config["hidden_size"],
        encoder_hidden_size=encoder_width,
        intermediate_size=med_config["intermediate_size"],
        num_attention_heads=med_config["num_attention_heads"],
        num_hidden_layers=med_config["num_hidden_layers"],
        max_position_embeddings=med_config["max_position_embeddings"],
        layer_norm_eps=med_config.get("layer_norm_eps", 1e-12),
        hidden_act=med_config.get("hidden_act", "gelu"),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=med_config.get("pad_token_id", 0),
        bos_token_id=None,
        eos_token_id=None,
        sep_token_id=None,
    )


class ImageRewardModel(torch.nn.Module):
    """BLIP image encoder + cross-attending text encoder + MLP (scores normalised)."""

    def __init__(self, vision: Any, text: Any, mlp: AestheticMLP) -> None:
        super().__init__()
        self.vision, self.text, self.mlp = vision, text, mlp

    def forward(
        self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        image_embeds = self.vision(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=pixels.device)
        hidden = self.text(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_mask,
        ).last_hidden_state
        return (self.mlp(hidden[:, 0].float()) - MEAN) / STD


class ImageReward(RewardModel):
    """``image_reward``: ImageReward v1.0 score of each image for its prompt.

    Args:
        checkpoint: ``ImageReward.pt``; None downloads it from ``THUDM/ImageReward``.
        med_config: the text encoder's ``med_config.json``; None downloads it too.
        tokenizer: ``bert-base-uncased`` (hub id or directory); BLIP's two tokens are added.
        vision_num_heads: attention heads of the ViT (16 for ViT-L).
        device, dtype: where and in which precision the model runs (the MLP stays float32).
    """

    name = "image_reward"
    accepts = ("images",)

    def __init__(
        self,
        checkpoint: str | None = None,
        med_config: str | None = None,
        tokenizer: str = "bert-base-uncased",
        vision_num_heads: int = 16,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
    ) -> None:
        self.checkpoint, self.med_config, self.tokenizer_id = checkpoint, med_config, tokenizer
        self.vision_num_heads = vision_num_heads
        self.device, self.dtype = torch.device(device), getattr(torch, dtype)
        self._loaded: tuple[ImageRewardModel, Any, ImagePreprocess] | None = None

    def _load(self) -> tuple[ImageRewardModel, Any, ImagePreprocess]:
        if self._loaded is None:
            from transformers import BertTokenizer, BlipTextModel, BlipVisionModel

            state = torch.load(
                local_or_hub_file(self.checkpoint, HUB_REPO, "ImageReward.pt", self.name),
                map_location="cpu",
                weights_only=True,
            )
            med = json.loads(
                local_or_hub_file(
                    self.med_config, HUB_REPO, "med_config.json", self.name, "med_config"
                ).read_text()
            )
            vision_state, text_state, mlp_state = split_checkpoint(state)
            vision = BlipVisionModel(
                vision_config_from(vision_state, self.vision_num_heads, eps=1e-6)
            )
            vision.load_state_dict(vision_state)
            vocab = text_state["embeddings.word_embeddings.weight"].shape[0]
            text = BlipTextModel(
                text_config_from(med, vocab, vision.config.hidden_size), add_pooling_layer=False
            )
            # Not weights: the pooler is unused (no pooling layer) and position ids a buffer.
            text_state = {
                k: v
                for k, v in text_state.items()
                if not k.startswith("pooler.") and not k.endswith("position_ids")
            }
            missing, unexpected = text.load_state_dict(text_state, strict=False)
            missing = [k for k in missing if not k.endswith("position_ids")]
            if missing or unexpected:
                raise ValueError(
                    f"image_reward: text encoder keys do not match (missing {missing[:3]}, "
                    f"unexpected {unexpected[:3]})"
                )
            mlp = AestheticMLP(med["hidden_size"])
            mlp.load_state_dict(mlp_state)
            model = ImageRewardModel(vision.to(self.dtype), text.to(self.dtype), mlp)
            require_local_or_reachable(self.tokenizer_id, local_hint("tokenizer"))
            tokenizer = BertTokenizer.from_pretrained(self.tokenizer_id)
            tokenizer.add_special_tokens({"bos_token": "[DEC]"})
            tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
            size: Any = vision.config.image_size  # an int for BLIP's ViT
            preprocess = ImagePreprocess(size, (size, size), CLIP_MEAN, CLIP_STD)
            self._loaded = (
                model.to(self.device).eval().requires_grad_(False),
                tokenizer,
                preprocess,
            )
        return self._loaded

    def differentiable(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """``[B]`` rewards with gradients w.r.t. ``images``."""
        model, tokenizer, preprocess = self._load()
        tokens = tokenizer(
            list(prompts),
            padding="max_length",
            truncation=True,
            max_length=MAX_PROMPT_TOKENS,
            return_tensors="pt",
        ).to(self.device)
        pixels = preprocess(images, self.device).to(self.dtype)
        return model(pixels, tokens["input_ids"], tokens["attention_mask"])

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        with torch.no_grad():
            return RewardOutput({self.name: self.differentiable(outputs, prompts).float().cpu()})


__all__ = ["ImageReward", "ImageRewardModel", "split_checkpoint"]
