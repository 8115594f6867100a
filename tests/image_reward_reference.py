"""The ``image-reward`` package (1.5) made importable for reference scores in tests.

The package targets transformers 4.2x and timm 0.6: on transformers 5 three helpers left
``transformers.modeling_utils`` (one was removed), and ``PreTrainedModel`` lost
``invert_attention_mask`` and ``get_head_mask``; its package ``__init__`` files import tools
with more dependencies (ReFL training, other scorers), and its ViT imports ``fairscale``
(activation checkpointing). These shims
restore exactly what the package's scoring path calls, with the transformers 4.x semantics, so
that a tiny random ImageReward built by the package can be compared with ours.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import torch


def _install_shims() -> None:
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils
    from transformers import PreTrainedModel

    modeling_utils.apply_chunking_to_forward = pytorch_utils.apply_chunking_to_forward
    modeling_utils.prune_linear_layer = pytorch_utils.prune_linear_layer
    modeling_utils.find_pruneable_heads_and_indices = _find_pruneable_heads_and_indices

    def invert_attention_mask(self: Any, mask: torch.Tensor) -> torch.Tensor:
        extended = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None, :, :]
        extended = extended.to(self.dtype)
        return (1.0 - extended) * torch.finfo(self.dtype).min

    def get_head_mask(self: Any, head_mask: Any, num_layers: int, *args: Any) -> list:
        return [None] * num_layers if head_mask is None else head_mask

    PreTrainedModel.invert_attention_mask = invert_attention_mask  # type: ignore[attr-defined]
    PreTrainedModel.get_head_mask = get_head_mask  # type: ignore[attr-defined]
    # The package's __init__ files import its other tools (ReFL training with datasets and
    # diffusers, CLIP and aesthetic scorers with OpenAI's clip); ImageReward's scoring path needs
    # none of them, so the two packages are entered without running their __init__.
    import importlib.machinery
    import importlib.util

    root = importlib.util.find_spec("ImageReward")
    assert root is not None and root.submodule_search_locations is not None
    for name, sub in (("ImageReward", ""), ("ImageReward.models", "models")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(Path(p) / sub) for p in root.submodule_search_locations]
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = package.__path__
            package.__spec__ = spec  # so that find_spec(name) still answers
            sys.modules[name] = package
    if "fairscale" not in sys.modules:  # activation checkpointing, off when scoring
        names = ["fairscale", "fairscale.nn", "fairscale.nn.checkpoint"]
        names.append("fairscale.nn.checkpoint.checkpoint_activations")
        for name in names:
            sys.modules[name] = types.ModuleType(name)
        sys.modules["fairscale.nn.checkpoint.checkpoint_activations"].checkpoint_wrapper = (  # type: ignore[attr-defined]
            lambda module, **kwargs: module
        )


def _find_pruneable_heads_and_indices(  # type: ignore[no-untyped-def]
    heads: Any, n_heads: int, head_size: int, already_pruned: Any
):
    """transformers 4.x's helper (removed in 5): the heads still to prune and the indices of the
    rows of a ``[n_heads * head_size]`` projection that remain."""
    heads = set(heads) - set(already_pruned)
    mask = torch.ones(n_heads, head_size)
    for head in heads:
        mask[head - sum(1 for h in already_pruned if h < head)] = 0
    index = torch.arange(mask.numel())[mask.view(-1).eq(1)].long()
    return heads, index


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "cat", "blue", "dog", "photo"]
WORDS += ["of", "the"]


def package_available() -> bool:
    """Whether the ``image-reward`` package is installed (found without importing it)."""
    import importlib.util

    return importlib.util.find_spec("ImageReward") is not None


def build_reference(directory: Path, realistic: bool = False) -> tuple[Any, dict[str, Any]]:
    """A random ImageReward built by the package itself, with a word-level BERT tokenizer
    (``WORDS``). Tiny: ViT 32 px / patch 8 / width 32 / depth 2 / 2 heads and a one-layer text
    encoder of width 768 (the package's MLP input). ``realistic``: the released sizes (ViT-L/16
    at 224 px, a 12-layer BERT-base with cross-attention). Returns the package's model and the
    ``image_reward`` reward's keyword arguments for the saved checkpoint."""
    import json

    tokenizer_dir = directory / "tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    (tokenizer_dir / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    _install_shims()
    from ImageReward import ImageReward as package  # the module ImageReward/ImageReward.py
    from ImageReward.models.BLIP import blip_pretrain, med

    # transformers 5 initialises (and ties) weights in post_init(); the package calls the old
    # init_weights() from __init__.
    original_init_weights = med.BertPreTrainedModel.init_weights

    def init_weights(self: Any) -> None:
        if self.__dict__.get("_in_post_init"):  # post_init() calls init_weights() itself
            original_init_weights(self)
            return
        self.__dict__["_in_post_init"] = True
        self.post_init()

    med.BertPreTrainedModel.init_weights = init_weights
    from ImageReward.models.BLIP.vit import VisionTransformer
    from transformers import BertTokenizer

    def tiny_vit(*args: Any, **kwargs: Any) -> tuple[Any, int]:
        vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
        return vit, 32

    def tokenizer() -> Any:
        tok = BertTokenizer.from_pretrained(str(tokenizer_dir))
        tok.add_special_tokens({"bos_token": "[DEC]"})
        tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        return tok

    if not realistic:
        blip_pretrain.create_vit = tiny_vit
    blip_pretrain.init_tokenizer = tokenizer
    vocab = len(tokenizer())
    layers, heads, inner, width = (12, 12, 3072, 1024) if realistic else (1, 2, 64, 32)
    med = {
        "architectures": ["BertModel"], "hidden_size": 768, "num_hidden_layers": layers,
        "num_attention_heads": heads, "intermediate_size": inner, "max_position_embeddings": 512,
        "vocab_size": vocab, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-12, "type_vocab_size": 2,
        "initializer_range": 0.02, "pad_token_id": 0, "add_type_embeddings": False,
        "encoder_width": width, "add_cross_attention": True,
    }  # fmt: skip
    med_path = directory / "med_config.json"
    med_path.write_text(json.dumps(med))
    torch.manual_seed(0)
    model = package.ImageReward(med_config=str(med_path), device="cpu").eval()
    if not realistic:
        model.preprocess = package._transform(32)  # the tiny ViT's resolution
    checkpoint = directory / "ImageReward.pt"
    torch.save(model.state_dict(), checkpoint)
    return model, {
        "checkpoint": str(checkpoint),
        "med_config": str(med_path),
        "tokenizer": str(tokenizer_dir),
        "vision_num_heads": 16 if realistic else 2,
    }
