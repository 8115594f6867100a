"""Train the embedded artifact probe of the digits task and write it to
``genrl/assets/artifact_probe``.

    python scripts/build_artifact_probe.py              # train, write probe + manifest
    python scripts/build_artifact_probe.py --check      # verify shipped files against the manifest
    python scripts/build_artifact_probe.py --reproduce  # rebuild in a temp dir, compare sha256s

Data: ``reward_models.artifact.synthetic_digits`` (the embedded generator's ODE samples of every
training prompt as clean images, the same images with noise, blur, duplicated strokes or grid
patterns as artifacts). Backbone: the embedded digit classifier's hidden layer plus the pixels.
Head: an MLP with 32 hidden units, full-batch Adam, 300 epochs, 25% held out. The build fails
unless the held-out accuracy reaches ``MIN_HELDOUT_ACCURACY``. One thread and fixed seeds:
identical bytes on the same machine and torch build (``genrl train-reward artifact`` runs the
same training).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import asset_tools

from genrl.cli.train_reward import train_artifact_probe

OUT_DIR = REPO_ROOT / "genrl" / "assets" / "artifact_probe"
COMMAND = "python scripts/build_artifact_probe.py"
SETTINGS = {"backbone": "digits", "hidden": 32, "epochs": 300, "seed": 0}
MIN_HELDOUT_ACCURACY = 0.9


def build(out: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    _, metrics = train_artifact_probe(out / "probe.safetensors", **SETTINGS)
    if metrics["heldout_accuracy"] < MIN_HELDOUT_ACCURACY:
        raise SystemExit(
            f"held-out accuracy {metrics['heldout_accuracy']} < {MIN_HELDOUT_ACCURACY}"
        )
    manifest = {
        "command": COMMAND,
        "description": "Artifact probe of the embedded digits task (reward artifact_probe).",
        "settings": SETTINGS,
        "metrics": metrics,
        "files": asset_tools.file_entries(out),
    }
    asset_tools.write_manifest(out, manifest)
    print(f"wrote {out}: {metrics}; {time.perf_counter() - start:.1f} s")
    return manifest


def main(argv: list[str] | None = None) -> int:
    return asset_tools.main(argv, __doc__.split("\n", 1)[0], OUT_DIR, COMMAND, build)


if __name__ == "__main__":
    sys.exit(main())
