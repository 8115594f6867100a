"""Train the embedded digit models deterministically and write them to ``genrl/assets/``.

    python scripts/build_assets.py            # train both models, write weights + manifest.json
    python scripts/build_assets.py --check    # verify the shipped files against manifest.json

Data: scikit-learn's bundled ``load_digits`` (1,797 8x8 images, no download), split 80/20,
stratified, with a fixed seed. Everything runs on one CPU thread with deterministic algorithms and
explicit generators, so two runs on the same machine and torch build give identical files.

1. ``DigitClassifier``: a tiny CNN trained with light augmentation (gaussian noise, +-1 pixel
   shifts) so it can serve as a reward model for generated samples; must reach >= 95% held-out
   accuracy.
2. ``DigitFlowModel``: flow matching (``x_s = (1-s) x0 + s eps``, target ``eps - x0``) with
   ``s ~ U(0, 1)`` and 10% label dropout (for classifier-free guidance), for a fixed number of
   steps. It is deliberately left weak so that RL fine-tuning has headroom: 30% of its training
   labels are replaced by random classes, so it draws clean digit shapes that are often the wrong
   digit (held-out reward ~0.55, 0.98 with CFG 3). The build fails unless the held-out reward
   (protocol below) lies in ``FLOW["accept_reward"]``.

Held-out reward protocol (the trainer's evaluation uses exactly this): 32 samples per label
(320 in all, sample ``i`` has label ``i % 10``), initial noise
``torch.randn(320, 1, 8, 8, generator=torch.Generator().manual_seed(1234))``, a deterministic Euler
ODE with 10 steps on ``flow_sigmas(10)`` (no shift, no CFG), image ``to_pixels(x)``, reward = the
classifier's softmax probability of the target label, averaged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # Running as a plain script from a checkout: make the repo's packages importable.
    sys.path.insert(0, str(REPO_ROOT))

from loading.assets import save_model
from pipelines.toy.models import EMBEDDED_FLOW, DigitFlowModel, to_pixels
from samplers import FlowODESampler, flow_sigmas
from tasks.digits import EMBEDDED_CLASSIFIER, DigitClassifier

ASSETS_DIR = REPO_ROOT / "genrl" / "assets"
MANIFEST = "manifest.json"
COMMAND = "python scripts/build_assets.py"

SPLIT = {"test_size": 0.2, "random_state": 0, "stratify": True}

CLASSIFIER = {
    "config": {"channels": 16, "hidden_dim": 64, "num_classes": 10},
    "seed": 0,
    "epochs": 40,
    "batch_size": 64,
    "lr": 2e-3,
    "optimizer": "Adam",
    "augmentation": "per-sample shift in {-1,0,1}^2 (zero fill), gaussian noise std ~ U(0, 0.1), "
    "clamped to [0, 1]",
    "min_heldout_accuracy": 0.95,
}

FLOW = {
    "config": {"hidden_dim": 256, "num_layers": 3, "num_classes": 10},
    "seed": 0,
    "steps": 2000,
    "batch_size": 128,
    "lr": 1e-3,
    "optimizer": "Adam",
    "time_sampling": "s ~ U(0, 1)",
    # Fraction of training labels replaced by a uniformly random class (before label dropout).
    # This is what leaves RL its headroom: the model learns clean digit shapes but its
    # conditional distribution is a mixture of the right class and the others, so samples look
    # like digits yet are often the wrong one (early stopping instead gives noisy blobs).
    "label_noise": 0.3,
    # Fraction of labels replaced by the null label (classifier-free guidance).
    "label_dropout": 0.1,
    "eval_every": 250,
    # The build fails unless the final held-out reward lands here (aim: about 0.45-0.6).
    "accept_reward": [0.3, 0.8],
}

EVAL = {
    "samples_per_label": 32,
    "noise_seed": 1234,
    "num_steps": 10,
    "sigmas": "flow_sigmas(10) == linspace(1, 0, 11), no shift",
    "guidance": 1.0,
    "reward": "softmax probability of the target label under the embedded classifier",
    # The extra "_cfg3" metrics use the same noise with classifier-free guidance 3.
    "cfg_velocity": "v_null + g * (v_cond - v_null), null label = num_classes",
}


def setup_determinism() -> None:
    """One thread, deterministic kernels: the same bits on every run on this machine."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)


def load_split() -> dict[str, torch.Tensor]:
    """Digits as ``[N, 1, 8, 8]`` float pixels 0..16 and long labels, split train/held-out."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(
        list(range(len(labels))),
        test_size=SPLIT["test_size"],
        random_state=SPLIT["random_state"],
        stratify=digits.target if SPLIT["stratify"] else None,
    )
    train_idx, test_idx = torch.tensor(train_idx), torch.tensor(test_idx)
    return {
        "train_images": images[train_idx],
        "train_labels": labels[train_idx],
        "test_images": images[test_idx],
        "test_labels": labels[test_idx],
    }


def augment(images01: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random +-1 pixel shifts (zero fill) and small gaussian noise, clamped to [0, 1]."""
    batch = images01.shape[0]
    padded = F.pad(images01, (1, 1, 1, 1))
    # All 9 shifted crops, then pick one per sample: no per-sample Python loop.
    crops = torch.stack(
        [padded[:, :, dy : dy + 8, dx : dx + 8] for dy in range(3) for dx in range(3)]
    )
    choice = torch.randint(0, 9, (batch,), generator=generator)
    shifted = crops[choice, torch.arange(batch)]
    std = torch.rand(batch, 1, 1, 1, generator=generator) * 0.1
    noisy = shifted + std * torch.randn(shifted.shape, generator=generator)
    return noisy.clamp(0.0, 1.0)


@torch.no_grad()
def accuracy(classifier: DigitClassifier, images01: torch.Tensor, labels: torch.Tensor) -> float:
    classifier.eval()
    return float((classifier(images01).argmax(-1) == labels).float().mean())


def train_classifier(data: dict[str, torch.Tensor]) -> tuple[DigitClassifier, dict[str, Any]]:
    cfg = CLASSIFIER
    torch.manual_seed(cfg["seed"])  # parameter initialisation
    generator = torch.Generator().manual_seed(cfg["seed"])
    model = DigitClassifier(**cfg["config"])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    images01, labels = data["train_images"] / 16.0, data["train_labels"]
    test01, test_labels = data["test_images"] / 16.0, data["test_labels"]
    steps = 0
    for epoch in range(cfg["epochs"]):
        model.train()
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(labels), cfg["batch_size"]):
            idx = order[start : start + cfg["batch_size"]]
            logits = model(augment(images01[idx], generator))
            loss = F.cross_entropy(logits, labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
        if (epoch + 1) % 10 == 0:
            acc = accuracy(model, test01, test_labels)
            print(
                f"  classifier epoch {epoch + 1:3d}  loss {loss.item():.4f}  held-out acc {acc:.4f}"
            )
    acc = accuracy(model, test01, test_labels)
    noisy_gen = torch.Generator().manual_seed(99)
    acc_aug = accuracy(model, augment(test01, noisy_gen), test_labels)
    metrics = {
        "heldout_accuracy": round(acc, 6),
        "heldout_accuracy_augmented": round(acc_aug, 6),
        "train_accuracy": round(accuracy(model, images01, labels), 6),
        "optimizer_steps": steps,
    }
    return model.eval(), metrics


def eval_labels() -> torch.Tensor:
    return torch.arange(10 * EVAL["samples_per_label"]) % 10


@torch.no_grad()
def sample(
    flow: DigitFlowModel, labels: torch.Tensor, noise: torch.Tensor, guidance: float = 1.0
) -> torch.Tensor:
    """Deterministic Euler ODE from ``noise`` (s = 1) to images in [0, 1] (s = 0)."""
    sampler = FlowODESampler(flow_sigmas(EVAL["num_steps"]))
    x = noise.clone()
    null = torch.full_like(labels, flow.num_classes)
    for i in range(sampler.num_steps):
        sigma = sampler.sigmas[i].expand(x.shape[0])
        v = flow(x, sigma, labels)
        if guidance != 1.0:
            # Classifier-free guidance: extrapolate away from the unconditional velocity.
            v_null = flow(x, sigma, null)
            v = v_null + guidance * (v - v_null)
        x = sampler.step(v, i, x).prev_sample
    return to_pixels(x)


@torch.no_grad()
def heldout_reward(
    flow: DigitFlowModel, classifier: DigitClassifier, guidance: float = 1.0
) -> tuple[float, list[float]]:
    """Mean classifier probability of the target label (overall, per label 0..9)."""
    was_training = flow.training
    flow.eval()
    labels = eval_labels()
    noise = torch.randn(
        len(labels), 1, 8, 8, generator=torch.Generator().manual_seed(EVAL["noise_seed"])
    )
    images = sample(flow, labels, noise, guidance)
    probs = classifier(images).softmax(-1).gather(1, labels[:, None]).squeeze(1)
    per_label = [float(probs[labels == k].mean()) for k in range(10)]
    flow.train(was_training)
    return float(probs.mean()), per_label


def train_flow(
    data: dict[str, torch.Tensor], classifier: DigitClassifier
) -> tuple[DigitFlowModel, dict[str, Any]]:
    cfg = FLOW
    torch.manual_seed(cfg["seed"])
    generator = torch.Generator().manual_seed(cfg["seed"])
    model = DigitFlowModel(**cfg["config"])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    x0_all = data["train_images"] / 8.0 - 1.0  # pixel 0..16 -> [-1, 1]
    labels_all = data["train_labels"]
    history: list[list[float]] = []
    for step in range(1, cfg["steps"] + 1):
        model.train()
        idx = torch.randint(0, len(labels_all), (cfg["batch_size"],), generator=generator)
        x0, labels = x0_all[idx], labels_all[idx]
        noisy = torch.rand(labels.shape, generator=generator) < cfg["label_noise"]
        random_labels = torch.randint(0, model.num_classes, labels.shape, generator=generator)
        labels = torch.where(noisy, random_labels, labels)
        drop = torch.rand(labels.shape, generator=generator) < cfg["label_dropout"]
        labels = torch.where(drop, torch.full_like(labels, model.num_classes), labels)
        s = torch.rand(x0.shape[0], generator=generator)
        eps = torch.randn(x0.shape, generator=generator)
        xs = (1 - s)[:, None, None, None] * x0 + s[:, None, None, None] * eps
        loss = F.mse_loss(model(xs, s, labels), eps - x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % cfg["eval_every"] == 0:
            reward, _ = heldout_reward(model, classifier)
            history.append([step, round(reward, 6)])
            print(f"  flow step {step:5d}  loss {loss.item():.4f}  held-out reward {reward:.4f}")
    reward, per_label = heldout_reward(model, classifier)
    reward_cfg, per_label_cfg = heldout_reward(model, classifier, guidance=3.0)
    metrics = {
        "optimizer_steps": cfg["steps"],
        "heldout_reward": round(reward, 6),
        "heldout_reward_per_label": [round(r, 6) for r in per_label],
        "heldout_reward_cfg3": round(reward_cfg, 6),
        "heldout_reward_cfg3_per_label": [round(r, 6) for r in per_label_cfg],
        "reward_history": history,
        "final_train_loss": round(loss.item(), 6),
    }
    low, high = cfg["accept_reward"]
    if not low <= reward <= high:
        raise RuntimeError(
            f"flow model held-out reward {reward:.4f} is outside [{low}, {high}]: the base model "
            "must be neither useless nor converged; adjust FLOW settings"
        )
    return model.eval(), metrics


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_entry(path: Path, model: torch.nn.Module, training: dict, metrics: dict) -> dict:
    return {
        "sha256": sha256(path),
        "size_bytes": path.stat().st_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": model.config,
        "training": training,
        "metrics": metrics,
    }


def check(assets: Path) -> int:
    """Exit status 0 when every file listed in the manifest exists with the recorded sha256."""
    manifest_path = assets / MANIFEST
    if not manifest_path.is_file():
        print(f"missing {manifest_path}; run `{COMMAND}`")
        return 1
    manifest = json.loads(manifest_path.read_text())
    status = 0
    for name, entry in manifest["files"].items():
        path = assets / name
        if not path.is_file():
            print(f"MISSING  {path}")
            status = 1
        elif sha256(path) != entry["sha256"]:
            print(f"MISMATCH {path}: sha256 {sha256(path)} != manifest {entry['sha256']}")
            status = 1
        else:
            print(f"ok       {path} ({entry['size_bytes']} bytes)")
    return status


def build(assets: Path) -> None:
    start = time.perf_counter()
    setup_determinism()
    data = load_split()
    print(f"digits: {len(data['train_labels'])} train / {len(data['test_labels'])} held out")

    print("training classifier ...")
    classifier, clf_metrics = train_classifier(data)
    print(f"classifier held-out accuracy {clf_metrics['heldout_accuracy']:.4f}")
    if clf_metrics["heldout_accuracy"] < CLASSIFIER["min_heldout_accuracy"]:
        raise RuntimeError(f"classifier accuracy too low: {clf_metrics['heldout_accuracy']}")

    print("training flow model ...")
    flow, flow_metrics = train_flow(data, classifier)
    print(
        f"flow model: {flow_metrics['optimizer_steps']} steps, held-out reward "
        f"{flow_metrics['heldout_reward']:.4f} (CFG 3: {flow_metrics['heldout_reward_cfg3']:.4f})"
    )
    print("  per label: " + " ".join(f"{r:.2f}" for r in flow_metrics["heldout_reward_per_label"]))

    assets.mkdir(parents=True, exist_ok=True)
    flow_path, clf_path = assets / EMBEDDED_FLOW, assets / EMBEDDED_CLASSIFIER
    save_model(flow, flow_path)
    save_model(classifier, clf_path)
    split = {
        **SPLIT,
        "train_size": len(data["train_labels"]),
        "heldout_size": len(data["test_labels"]),
    }
    manifest = {
        "description": "Embedded models of the default genrl job (8x8 digits from "
        "sklearn.datasets.load_digits). Pixel p in 0..16 -> flow space p/8 - 1, classifier input "
        "p/16.",
        "command": COMMAND,
        "reproducibility": "bit-identical across runs with the same torch build and CPU type; "
        "other CPUs or torch versions may differ in the last bits",
        "torch_version": torch.__version__,
        "data": {"source": "sklearn.datasets.load_digits", "split": split},
        "heldout_reward_protocol": EVAL,
        "files": {
            EMBEDDED_CLASSIFIER: file_entry(
                clf_path,
                classifier,
                {**CLASSIFIER, "split_seed": SPLIT["random_state"]},
                clf_metrics,
            ),
            EMBEDDED_FLOW: file_entry(
                flow_path, flow, {**FLOW, "split_seed": SPLIT["random_state"]}, flow_metrics
            ),
        },
    }
    # The training configs repeat the model config; keep one copy per file entry.
    for entry in manifest["files"].values():
        entry["training"].pop("config")
    (assets / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for name, entry in manifest["files"].items():
        print(
            f"wrote {assets / name}: {entry['size_bytes']} bytes, sha256 {entry['sha256'][:16]}..."
        )
    print(f"wrote {assets / MANIFEST}; total {time.perf_counter() - start:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="verify shipped files vs manifest")
    parser.add_argument("--out", type=Path, default=ASSETS_DIR, help="assets directory")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.out)
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
