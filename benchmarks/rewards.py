"""Reward throughput on this machine: images/s of each reward, batched vs one image per call, at
a tiny and a realistic size.

Tiny: the test suite's tiny random backbones on small images. Realistic: the real architectures
(CLIP ViT-L/14 for CLIPScore and the aesthetic predictor, open_clip ViT-H-14 for HPS, BLIP
ViT-L/16 + BERT-base for ImageReward, built by the ``image-reward`` package, DINOv2-base for the
DINO rewards) with random weights on 512 px images, which the rewards resize to the backbone's
224 px (the VLM judge: tiny only; a realistic VLM does not fit this CPU's memory in float32); the digit rewards stay at their 8x8
task size. ``remote`` is ``target_color`` behind a loopback ``genrl serve-reward`` server, so its
gap to ``target_color`` is the wire's cost (PNG encoding, HTTP). Random weights cost what trained
ones cost; no download is needed.

    python benchmarks/rewards.py                 # tiny and realistic sizes
    python benchmarks/rewards.py --sizes tiny    # seconds

The last line is one JSON object (benchmarks/README.md): per reward and size, ``images_per_s``
(batched), ``images_per_s_one_by_one`` and ``batched_speedup``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model builders and tokenizer fixtures

SETTINGS = {"tiny": {"batch": 32, "repeats": 3}, "realistic": {"batch": 8, "repeats": 1}}


def images(n: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


def build(name: str, size: str, root: Path) -> tuple[Any, torch.Tensor, Callable[[], None]]:
    """``(reward, batch of images, cleanup)`` for one reward at one size."""
    from reward_models import build_reward

    batch = SETTINGS[size]["batch"]
    big = size == "realistic"
    nothing = lambda: None  # noqa: E731
    if name == "target_color":
        return build_reward("target_color"), images(batch, 3, 512 if big else 64), nothing
    if name in ("digit_classifier", "artifact_probe"):
        return build_reward(name), images(batch, 1, 8), nothing
    if name == "clipscore":
        model = clip_vit_l14(root / "clip") if big else tiny_clip(root / "clip")
        return (
            build_reward("clipscore", model=str(model)),
            images(batch, 3, 512 if big else 64),
            nothing,
        )
    if name in ("dino_similarity", "dino_adversarial"):
        from vision_tiny import write_images

        dino = dinov2_base(root / "dino") if big else tiny_dino(root / "dino")
        references = root / "references"
        if not references.is_dir():
            write_images(references, images(4, 3, 256 if big else 40, seed=1))
        reward = build_reward(name, references=str(references), model=str(dino))
        return reward, images(batch, 3, 512 if big else 40), nothing
    if name == "aesthetic":
        from reward_models.aesthetic import AestheticMLP

        model = clip_vit_l14(root / "clip") if big else tiny_clip(root / "clip")
        head = root / "aesthetic_head.pth"
        torch.save(AestheticMLP(768 if big else 16).state_dict(), head)
        reward = build_reward("aesthetic", model=str(model), head=str(head))
        return reward, images(batch, 3, 512 if big else 64), nothing
    if name == "hps":
        from vision_tiny import build_tiny_hps

        if big:
            import open_clip

            checkpoint = root / "hps_vit_h14.pt"
            if not checkpoint.is_file():
                torch.manual_seed(0)
                model = open_clip.create_model("ViT-H-14", pretrained=None)
                torch.save({"state_dict": model.state_dict()}, checkpoint)
            reward = build_reward("hps", checkpoint=str(checkpoint))
        else:
            reward = build_reward("hps", **build_tiny_hps(root / "hps"))
        return reward, images(batch, 3, 512 if big else 64), nothing
    if name == "image_reward":
        from image_reward_reference import build_reference, package_available

        if not package_available():
            raise SkipSize("needs: pip install --no-deps image-reward==1.5")
        _, kwargs = build_reference(root / "image_reward", realistic=big)
        return build_reward("image_reward", **kwargs), images(batch, 3, 512 if big else 64), nothing
    if name == "artifact_judge":
        if big:
            raise SkipSize("a realistic VLM (7B) does not fit this CPU; use a GPU or an endpoint")
        from vision_tiny import build_llava

        llava = root / "llava"
        if not llava.is_dir():
            build_llava(llava)
        return build_reward("artifact_judge", model=str(llava)), images(batch, 3, 64), nothing
    if name == "remote":
        from reward_models.color import TargetColorReward
        from reward_models.serving.server import RewardServer

        server = RewardServer(TargetColorReward(), port=0).start()
        reward = build_reward("remote", url=server.address, name="target_color", retries=0)
        return reward, images(batch, 3, 512 if big else 64), server.shutdown
    raise ValueError(name)


class SkipSize(Exception):
    """This reward is not measured at this size (the reason is printed)."""


def tiny_clip(directory: Path) -> Path:
    from diffusers_tiny import build_clip

    return directory if directory.is_dir() else build_clip(directory)


def tiny_dino(directory: Path) -> Path:
    from vision_tiny import build_dinov2

    return directory if directory.is_dir() else build_dinov2(directory)


def clip_vit_l14(directory: Path) -> Path:
    """CLIP ViT-L/14 image tower (24 layers, width 1024, 224 px) with random weights; the text
    tower is small (prompts are encoded once per batch and do not scale with images)."""
    if directory.is_dir():
        return directory
    from diffusers_tiny import clip_tokenizer
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer = clip_tokenizer()
    text = {"vocab_size": len(tokenizer), "hidden_size": 256, "intermediate_size": 1024}
    text |= {"num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 77}
    text |= {k: getattr(tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    vision = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24}
    vision |= {"num_attention_heads": 16, "image_size": 224, "patch_size": 14}
    torch.manual_seed(0)
    CLIPModel(
        CLIPConfig(text_config=text, vision_config=vision, projection_dim=768)
    ).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    CLIPImageProcessor(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}
    ).save_pretrained(directory)
    return directory


def dinov2_base(directory: Path) -> Path:
    """DINOv2-base (12 layers, width 768, patch 14) with random weights and its 256 -> 224 px
    processor settings."""
    if directory.is_dir():
        return directory
    from transformers import Dinov2Config, Dinov2Model
    from vision_tiny import build_dinov2

    build_dinov2(directory, image_size=220)  # writes the processor file; the model is replaced
    torch.manual_seed(0)
    Dinov2Model(
        Dinov2Config(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=518,
            patch_size=14,
        )
    ).save_pretrained(directory)
    settings = json.loads((directory / "preprocessor_config.json").read_text())
    settings["size"], settings["crop_size"] = {"shortest_edge": 256}, {"height": 224, "width": 224}
    (directory / "preprocessor_config.json").write_text(json.dumps(settings))
    return directory


def measure(reward: Any, batch: torch.Tensor, repeats: int) -> dict[str, float]:
    prompts = ["a photo of the number 3"] * len(batch)
    reward(batch[:2], prompts[:2])  # load and warm up
    batched, single = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        reward(batch, prompts)
        batched.append(time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(len(batch)):
            reward(batch[i : i + 1], prompts[i : i + 1])
        single.append(time.perf_counter() - start)
    n = len(batch)
    per_s, per_s_single = n / statistics.median(batched), n / statistics.median(single)
    return {
        "images_per_s": round(per_s, 2),
        "images_per_s_one_by_one": round(per_s_single, 2),
        "batched_speedup": round(per_s / per_s_single, 2),
        "batch": n,
        "image_size": int(batch.shape[-1]),
    }


NAMES = (
    "target_color",
    "digit_classifier",
    "artifact_probe",
    "clipscore",
    "aesthetic",
    "hps",
    "image_reward",
    "artifact_judge",
    "dino_similarity",
    "dino_adversarial",
    "remote",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "realistic"], choices=list(SETTINGS))
    parser.add_argument("--rewards", nargs="+", default=list(NAMES), choices=list(NAMES))
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, dict[str, Any]] = {}
    print(
        f"{'reward':<18} {'size':<10} {'px':>4} {'batch':>5} {'img/s batched':>14} {'one by one':>11} {'speedup':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            root = Path(tmp) / size
            for name in args.rewards:
                try:
                    reward, batch, cleanup = build(name, size, root)
                except SkipSize as reason:
                    print(f"{name:<18} {size:<10} skipped: {reason}", flush=True)
                    continue
                try:
                    row = measure(reward, batch, SETTINGS[size]["repeats"])
                finally:
                    cleanup()
                results.setdefault(name, {})[size] = row
                print(
                    f"{name:<18} {size:<10} {row['image_size']:>4} {row['batch']:>5} "
                    f"{row['images_per_s']:>14.1f} {row['images_per_s_one_by_one']:>11.1f} "
                    f"{row['batched_speedup']:>8.2f}",
                    flush=True,
                )
    print(json.dumps({"benchmark": "rewards", "threads": args.threads, "rewards": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
